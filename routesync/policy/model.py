"""The Kubernetes objects NetworkPolicy is computed from, as plain data read from their JSON.

Only what policy needs is kept: a Pod's namespace, name, Node, labels, addresses and named
container ports; a Namespace's labels; a NetworkPolicy's selectors, rules and types.  Reading a
policy never fails as a whole: a rule Ferry cannot read is dropped and named in
``Policy.errors``, so the policy still isolates the Pods it selects and the broken rule allows
nothing (fail closed).  Only a policy whose ``podSelector`` cannot be read selects every Pod of
its namespace, for the same reason."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import selector as sel

PROTOCOLS = ("TCP", "UDP", "SCTP")
INACTIVE_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class NamedPort:
    name: str
    protocol: str
    number: int


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    node: str
    labels: tuple[tuple[str, str], ...]
    ips: tuple[str, ...]  # plain addresses, IPv4 and IPv6
    ports: tuple[NamedPort, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def port_number(self, name: str, protocol: str) -> int | None:
        for p in self.ports:
            if p.name == name and p.protocol == protocol:
                return p.number
        return None


@dataclass(frozen=True)
class PortMatch:
    """One entry of a rule's ``ports``: ``port`` None matches every port of ``protocol``."""

    protocol: str
    port: int | str | None = None  # a number, or a container port's name
    end_port: int | None = None


@dataclass(frozen=True)
class IPBlock:
    cidr: str
    excepts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Peer:
    """``from``/``to`` entry: Pods (by selectors) or an address block."""

    pod_selector: sel.Selector | None = None
    namespace_selector: sel.Selector | None = None
    ip_block: IPBlock | None = None


@dataclass(frozen=True)
class Rule:
    peers: tuple[Peer, ...] | None  # None: every peer (the rule has no from/to)
    ports: tuple[PortMatch, ...] = ()  # empty: every port and protocol


@dataclass(frozen=True)
class Policy:
    namespace: str
    name: str
    pod_selector: sel.Selector
    ingress: tuple[Rule, ...] = ()
    egress: tuple[Rule, ...] = ()
    isolates_ingress: bool = True
    isolates_egress: bool = False
    errors: tuple[str, ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class ObjectError(ValueError):
    """An object without what Ferry needs (name, namespace)."""


def _meta(obj: Mapping[str, Any], kind: str) -> tuple[str, str, dict[str, str]]:
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ObjectError(f"{kind} without metadata.name")
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        raise ObjectError(f"{kind} {name}: metadata.labels is not an object")
    return str(meta.get("namespace") or ""), name, {str(k): str(v) for k, v in labels.items()}


def pod_from(obj: Mapping[str, Any]) -> Pod | None:
    """A Pod object → :class:`Pod`; None when policy has nothing to do with it (host network,
    finished, no address yet)."""
    ns, name, labels = _meta(obj, "Pod")
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if spec.get("hostNetwork") or status.get("phase") in INACTIVE_PHASES:
        return None
    ips = [i.get("ip") for i in status.get("podIPs") or [] if isinstance(i, dict)]
    if not ips and status.get("podIP"):
        ips = [status["podIP"]]
    addrs = []
    for ip in ips:
        try:
            addrs.append(str(ipaddress.ip_address(str(ip))))
        except (ValueError, TypeError):
            continue
    if not addrs:
        return None
    ports = []
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        for p in (c or {}).get("ports") or []:
            if isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("containerPort"), int):
                ports.append(NamedPort(p["name"], str(p.get("protocol") or "TCP"), p["containerPort"]))
    return Pod(ns, name, str(spec.get("nodeName") or ""), tuple(sorted(labels.items())), tuple(addrs), tuple(ports))


def namespace_from(obj: Mapping[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
    _ns, name, labels = _meta(obj, "Namespace")
    return name, tuple(sorted(labels.items()))


def service_cidrs_from(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """A ServiceCIDR (``networking.k8s.io/v1``) → its CIDRs (one per family at most)."""
    _ns, name, _labels = _meta(obj, "ServiceCIDR")
    out = []
    for c in (obj.get("spec") or {}).get("cidrs") or []:
        try:
            out.append(str(ipaddress.ip_network(str(c), strict=False)))
        except ValueError as e:
            raise ObjectError(f"ServiceCIDR {name}: spec.cidrs: {e}") from None
    return tuple(out)


def _port(doc: Any, where: str) -> PortMatch:
    if not isinstance(doc, dict):
        raise sel.SelectorError(f"{where}: not an object")
    proto = doc.get("protocol") or "TCP"
    if proto not in PROTOCOLS:
        raise sel.SelectorError(f"{where}.protocol: {proto!r} is not one of {', '.join(PROTOCOLS)}")
    port, end = doc.get("port"), doc.get("endPort")
    if port is not None and not isinstance(port, (int, str)) or isinstance(port, bool):
        raise sel.SelectorError(f"{where}.port: not a number or a name")
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    if isinstance(port, int) and not 1 <= port <= 65535:
        raise sel.SelectorError(f"{where}.port: {port} out of 1-65535")
    if end is not None:
        if not isinstance(port, int):
            raise sel.SelectorError(f"{where}.endPort: needs a numeric port")
        if not isinstance(end, int) or isinstance(end, bool) or not port <= end <= 65535:
            raise sel.SelectorError(f"{where}.endPort: {end!r} not in {port}-65535")
    return PortMatch(proto, port, end)


def _peer(doc: Any, where: str) -> Peer:
    if not isinstance(doc, dict):
        raise sel.SelectorError(f"{where}: not an object")
    block = doc.get("ipBlock")
    if block is not None:
        if doc.get("podSelector") is not None or doc.get("namespaceSelector") is not None:
            raise sel.SelectorError(f"{where}: ipBlock with a selector")
        if not isinstance(block, dict) or not isinstance(block.get("cidr"), str):
            raise sel.SelectorError(f"{where}.ipBlock.cidr: missing")
        try:
            cidr = str(ipaddress.ip_network(block["cidr"], strict=False))
            excepts = tuple(str(ipaddress.ip_network(e, strict=False)) for e in block.get("except") or [])
        except (ValueError, TypeError) as e:
            raise sel.SelectorError(f"{where}.ipBlock: {e}") from None
        return Peer(ip_block=IPBlock(cidr, excepts))
    pods, nss = doc.get("podSelector"), doc.get("namespaceSelector")
    if pods is None and nss is None:
        raise sel.SelectorError(f"{where}: none of podSelector, namespaceSelector, ipBlock")
    return Peer(sel.parse(pods, f"{where}.podSelector") if pods is not None else None,
                sel.parse(nss, f"{where}.namespaceSelector") if nss is not None else None)


def _rule(doc: Any, peers_key: str, where: str) -> Rule:
    if not isinstance(doc, dict):
        raise sel.SelectorError(f"{where}: not an object")
    raw_peers, raw_ports = doc.get(peers_key), doc.get("ports")
    if (raw_peers is not None and not isinstance(raw_peers, list)
            or raw_ports is not None and not isinstance(raw_ports, list)):
        raise sel.SelectorError(f"{where}: {peers_key} and ports must be lists")
    peers = tuple(_peer(p, f"{where}.{peers_key}[{i}]") for i, p in enumerate(raw_peers)) if raw_peers else None
    ports = tuple(_port(p, f"{where}.ports[{i}]") for i, p in enumerate(raw_ports or []))
    return Rule(peers, ports)


def policy_from(obj: Mapping[str, Any]) -> Policy:
    ns, name, _labels = _meta(obj, "NetworkPolicy")
    spec = obj.get("spec") or {}
    where = f"NetworkPolicy {ns}/{name}: spec"
    errors: list[str] = []
    try:
        pod_selector = sel.parse(spec.get("podSelector") or {}, f"{where}.podSelector")
    except sel.SelectorError as e:
        errors.append(f"{e}; selecting every Pod of {ns} instead")
        pod_selector = sel.EVERYTHING
    rules: dict[str, list[Rule]] = {"ingress": [], "egress": []}
    for direction, peers_key in (("ingress", "from"), ("egress", "to")):
        raw = spec.get(direction) or []
        if not isinstance(raw, list):
            errors.append(f"{where}.{direction}: not a list; no rule of it allows anything")
            continue
        for i, r in enumerate(raw):
            try:
                rules[direction].append(_rule(r, peers_key, f"{where}.{direction}[{i}]"))
            except sel.SelectorError as e:
                errors.append(f"{e}; the rule allows nothing")
    types = spec.get("policyTypes")
    if isinstance(types, list) and types:
        ingress_t, egress_t = "Ingress" in types, "Egress" in types
    else:
        ingress_t, egress_t = True, bool(spec.get("egress"))
    return Policy(ns, name, pod_selector, tuple(rules["ingress"]), tuple(rules["egress"]), ingress_t, egress_t,
                  tuple(errors))
