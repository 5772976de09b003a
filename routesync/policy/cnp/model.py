"""ClusterNetworkPolicy objects (sigs.k8s.io/network-policy-api v0.3.0, ``v1beta1``) as plain data.

What Ferry reads: the tier (Admin or Baseline), the priority (0-1000, lower first), the subject
(every Pod of the Namespaces a selector picks, or Pods by a Namespace and a Pod selector), and
per direction up to 25 rules in order, each with an action (Accept, Deny, Pass), peers and
protocols.  Peers: ``namespaces``, ``pods`` (both directions), ``networks`` and the experimental
``nodes`` (egress); ``domainNames`` (experimental) is read and matches nothing: Ferry does not
resolve names yet, and an Accept that matches nothing is what failing closed means for it.

Reading never fails as a whole, and what cannot be read fails closed the way the API says
(``ClusterNetworkPolicyIngressPeer``'s comment): a rule with a peer or a protocol Ferry cannot
read matches nothing if it accepts, and denies everything if it denies or passes (a Pass that
cannot be read is a Deny all); an action it does not know is a Deny all.  A subject that cannot be
read selects every Pod; a tier it does not know is read as Admin (its Accept rules then match
nothing).  Each such reading is named in ``ClusterPolicy.errors``."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import selector as sel
from ..model import ObjectError

GROUP, VERSION, PLURAL = "policy.networking.k8s.io", "v1beta1", "clusternetworkpolicies"
ADMIN, BASELINE = "Admin", "Baseline"
ACCEPT, DENY, PASS = "Accept", "Deny", "Pass"
ACTIONS = (ACCEPT, DENY, PASS)
PROTOCOLS = {"tcp": "TCP", "udp": "UDP", "sctp": "SCTP"}
MAX_PRIORITY = 1000
MAX_RULES = 25


@dataclass(frozen=True)
class Selection:
    """Pods: of the Namespaces ``namespaces`` picks, those ``pods`` picks (None: every one)."""

    namespaces: sel.Selector
    pods: sel.Selector | None = None


@dataclass(frozen=True)
class Peer:
    """One entry of ``from``/``to``: exactly one of its fields."""

    pods: Selection | None = None
    nodes: sel.Selector | None = None
    networks: tuple[str, ...] = ()
    domain_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Port:
    """One entry of ``protocols``: a protocol's destination port, range or every port, or a
    named port (``name``; its protocol is the container port's)."""

    protocol: str | None  # None with a name
    first: int | None = None
    last: int | None = None
    name: str | None = None


@dataclass(frozen=True)
class Rule:
    name: str
    action: str
    peers: tuple[Peer, ...] | None  # None: every peer (a rule read as "Deny all")
    ports: tuple[Port, ...] | None = None  # None: every protocol and port


@dataclass(frozen=True)
class ClusterPolicy:
    name: str
    tier: str
    priority: int
    subject: Selection
    ingress: tuple[Rule, ...] = ()
    egress: tuple[Rule, ...] = ()
    errors: tuple[str, ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        return self.name


DENY_ALL = (None, None)  # (peers, ports) of a rule read as "Deny all"


def _selection(doc: Any, where: str) -> Selection:
    """``subject``, or a peer's ``namespaces``/``pods`` (``doc`` is the enclosing object)."""
    if not isinstance(doc, dict):
        raise sel.SelectorError(f"{where}: not an object")
    nss, pods = doc.get("namespaces"), doc.get("pods")
    if (nss is None) == (pods is None):
        raise sel.SelectorError(f"{where}: exactly one of namespaces, pods")
    if nss is not None:
        return Selection(sel.parse(nss, f"{where}.namespaces"))
    if not isinstance(pods, dict):
        raise sel.SelectorError(f"{where}.pods: not an object")
    return Selection(sel.parse(pods.get("namespaceSelector") or {}, f"{where}.pods.namespaceSelector"),
                     sel.parse(pods.get("podSelector") or {}, f"{where}.pods.podSelector"))


def _peer(doc: Any, where: str, egress: bool) -> Peer:
    if not isinstance(doc, dict):
        raise sel.SelectorError(f"{where}: not an object")
    known = ("namespaces", "pods", "nodes", "networks", "domainNames") if egress else ("namespaces", "pods")
    present = [k for k, v in doc.items() if v is not None]
    unknown = [k for k in present if k not in known]
    if unknown or len(present) != 1:
        raise sel.SelectorError(f"{where}: needs exactly one of {', '.join(known)}"
                                + (f" (not {', '.join(sorted(unknown))})" if unknown else ""))
    (kind,) = present
    if kind in ("namespaces", "pods"):
        return Peer(pods=_selection(doc, where))
    if kind == "nodes":
        return Peer(nodes=sel.parse(doc["nodes"], f"{where}.nodes"))
    raw = doc[kind]
    if not isinstance(raw, list) or not raw or not all(isinstance(x, str) for x in raw):
        raise sel.SelectorError(f"{where}.{kind}: not a list of strings")
    if kind == "domainNames":
        return Peer(domain_names=tuple(raw))
    nets = []
    for i, cidr in enumerate(raw):
        try:
            nets.append(str(ipaddress.ip_network(cidr, strict=False)))
        except ValueError as e:
            raise sel.SelectorError(f"{where}.networks[{i}]: {e}") from None
    return Peer(networks=tuple(nets))


def _number(v: Any, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 65535:
        raise sel.SelectorError(f"{where}: {v!r} is not a port (1-65535)")
    return v


def _port(doc: Any, where: str) -> Port:
    if not isinstance(doc, dict):
        raise sel.SelectorError(f"{where}: not an object")
    present = [k for k, v in doc.items() if v is not None]
    if len(present) != 1 or present[0] not in (*PROTOCOLS, "destinationNamedPort"):
        raise sel.SelectorError(f"{where}: needs exactly one of tcp, udp, sctp, destinationNamedPort")
    (kind,) = present
    if kind == "destinationNamedPort":
        name = doc[kind]
        if not isinstance(name, str) or not name:
            raise sel.SelectorError(f"{where}.destinationNamedPort: not a name")
        return Port(None, name=name)
    proto, body = PROTOCOLS[kind], doc[kind]
    if not isinstance(body, dict):
        raise sel.SelectorError(f"{where}.{kind}: not an object")
    dp = body.get("destinationPort")
    if dp is None:
        return Port(proto)
    if not isinstance(dp, dict) or (dp.get("number") is None) == (dp.get("range") is None):
        raise sel.SelectorError(f"{where}.{kind}.destinationPort: needs exactly one of number, range")
    if dp.get("number") is not None:
        n = _number(dp["number"], f"{where}.{kind}.destinationPort.number")
        return Port(proto, n, n)
    r = dp["range"]
    if not isinstance(r, dict):
        raise sel.SelectorError(f"{where}.{kind}.destinationPort.range: not an object")
    first = _number(r.get("start"), f"{where}.{kind}.destinationPort.range.start")
    last = _number(r.get("end"), f"{where}.{kind}.destinationPort.range.end")
    if last < first:
        raise sel.SelectorError(f"{where}.{kind}.destinationPort.range: end {last} before start {first}")
    return Port(proto, first, last)


def _rule(doc: Any, where: str, egress: bool, errors: list[str]) -> Rule | None:
    """One rule; what cannot be read fails closed (module docstring); None: matches nothing."""
    if not isinstance(doc, dict):
        errors.append(f"{where}: not an object; read as Deny all")
        return Rule("", DENY, *DENY_ALL)
    name = str(doc.get("name") or "")
    action = doc.get("action")
    if action not in ACTIONS:
        errors.append(f"{where}.action: {action!r} is not one of {', '.join(ACTIONS)}; read as Deny all")
        return Rule(name, DENY, *DENY_ALL)
    peers_key = "to" if egress else "from"
    try:
        raw = doc.get(peers_key)
        if not isinstance(raw, list) or not raw:
            raise sel.SelectorError(f"{where}.{peers_key}: not a list of at least one peer")
        peers = tuple(_peer(p, f"{where}.{peers_key}[{i}]", egress) for i, p in enumerate(raw))
        raw_ports = doc.get("protocols")
        if raw_ports is not None and (not isinstance(raw_ports, list) or not raw_ports):
            raise sel.SelectorError(f"{where}.protocols: not a list of at least one protocol")
        ports = None if raw_ports is None else tuple(_port(p, f"{where}.protocols[{i}]")
                                                     for i, p in enumerate(raw_ports))
    except sel.SelectorError as e:
        if action == ACCEPT:
            errors.append(f"{e}; the Accept rule matches nothing")
            return None
        errors.append(f"{e}; the {action} rule is read as Deny all")
        return Rule(name, DENY, *DENY_ALL)
    return Rule(name, str(action), peers, ports)


def cluster_policy_from(obj: Mapping[str, Any]) -> ClusterPolicy:
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ObjectError("ClusterNetworkPolicy without metadata.name")
    spec = obj.get("spec") or {}
    where = f"ClusterNetworkPolicy {name}: spec"
    errors: list[str] = []
    tier = spec.get("tier")
    if tier not in (ADMIN, BASELINE):
        errors.append(f"{where}.tier: {tier!r} is not Admin or Baseline; read as Admin")
        tier = ADMIN
    priority = spec.get("priority")
    if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= MAX_PRIORITY:
        errors.append(f"{where}.priority: {priority!r} is not in 0-{MAX_PRIORITY}; read as "
                      f"{MAX_PRIORITY if isinstance(priority, int) and priority > MAX_PRIORITY else 0}")
        priority = MAX_PRIORITY if isinstance(priority, int) and not isinstance(priority, bool) \
            and priority > MAX_PRIORITY else 0
    try:
        subject = _selection(spec.get("subject"), f"{where}.subject")
    except sel.SelectorError as e:
        errors.append(f"{e}; selecting every Pod instead")
        subject = Selection(sel.EVERYTHING)
    rules: dict[str, list[Rule]] = {"ingress": [], "egress": []}
    for direction in ("ingress", "egress"):
        raw = spec.get(direction) or []
        if not isinstance(raw, list):
            errors.append(f"{where}.{direction}: not a list; read as one Deny all rule")
            rules[direction].append(Rule("", DENY, *DENY_ALL))
            continue
        if len(raw) > MAX_RULES:
            errors.append(f"{where}.{direction}: {len(raw)} rules, more than {MAX_RULES}; the first {MAX_RULES} read")
        for i, r in enumerate(raw[:MAX_RULES]):
            rule = _rule(r, f"{where}.{direction}[{i}]", direction == "egress", errors)
            # a rule that matches nothing keeps its place: the rules after it keep their rungs
            rules[direction].append(rule if rule is not None else Rule(str((r or {}).get("name") or "")
                                                                       if isinstance(r, dict) else "", ACCEPT, ()))
    return ClusterPolicy(name, str(tier), int(priority), subject, tuple(rules["ingress"]), tuple(rules["egress"]),
                         tuple(errors))


@dataclass(frozen=True)
class NodeInfo:
    """A Node as the ``nodes`` peer reads it: its labels and the IPs of ``status.addresses``."""

    name: str
    labels: tuple[tuple[str, str], ...]
    addresses: tuple[str, ...]


def node_info_from(obj: Mapping[str, Any]) -> NodeInfo:
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ObjectError("Node without metadata.name")
    labels = meta.get("labels") or {}
    addrs = []
    for a in (obj.get("status") or {}).get("addresses") or []:
        try:
            addrs.append(str(ipaddress.ip_address(str((a or {}).get("address")))))
        except ValueError:
            continue  # a Hostname
    return NodeInfo(name, tuple(sorted((str(k), str(v)) for k, v in labels.items())), tuple(sorted(set(addrs))))
