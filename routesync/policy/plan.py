"""One Node's NetworkPolicy flows, from the cluster's Pods, Namespaces and policies: pure.

Per direction (ingress: IngressRule/IngressDefault; egress: EgressRule/EgressDefault, see
:mod:`cni.pipeline.tables`), every rule of every policy that selects a Pod *of this Node* is
one OVS conjunction ``conj_id=N`` of 2 or 3 clauses:

    1. the Pods it applies to:  ``nw_dst=<Pod IP>`` (ingress) / ``nw_src=<Pod IP>`` (egress)
    2. its peers:               ``nw_src=<peer IP or block>`` / ``nw_dst=...``; a rule
                                without from/to has one ``ip`` and one ``ipv6`` flow here
    3. its ports, if it has any: ``tcp,tp_dst=80``, ``udp,tp_dst=0x1000/0xf000`` (a range), ...

plus the flow ``conj_id=N`` that allows (egress: on to IngressRule; ingress: on to
ConntrackCommit) and whose counters are the rule's.  So a rule costs the *sum* of its sizes in
flows, not their product.  A flow that serves several rules (a Pod in two rules, the ``ip``
flow of every rule without peers) is one flow with one ``conjunction()`` action per rule.
Named ports resolve per Pod: on the Pods the rule applies to (ingress) or on the peer Pods
(egress), each group of Pods that gives the name one number becoming a conjunction of its own;
a named port never matches an ``ipBlock`` peer.

A Pod that some policy isolates in a direction gets a drop in that direction's Default table
(what no rule allowed), and with the denied log on (``NodeFacts.denied_log``) one above it for
its new connections that also sends their first packet up to route-sync, metered
(:mod:`.deniedlog`); the Node's own addresses may always reach its Pods (kubelet probes);
egress to the Service CIDRs is judged after the host's DNAT, when the packet comes back into
OVS with the backend's address.

A *remote* Pod isolated for egress is judged here too (unless ``NodeFacts.remote_egress`` is
False: then at its source only), on what it sends to this Node's Pods: in
routed modes a DNATed Service connection to a backend on another Node leaves the client's Node
through its host without re-entering OVS there.  Its policies' egress rules become conjunctions
of their own (``Plan.remote_rules``) whose clause 2 holds only the peers that can be here (this
Node's Pods; ``ipBlock``s as they are), and one conjunction in EgressDefault
(``REMOTE_ISOLATED``, below the local drops) drops the rest: those Pods as sources, this Node's
Pods as destinations; sums again.  Cookies are per flow (:func:`cni.pipeline.tables.policy_cookie`
of its identity), so a change replaces exactly the flows whose actions or existence change."""

from __future__ import annotations

import heapq
import ipaddress
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cni.pipeline import match as m
from cni.pipeline.actions import DROP, Conjunction, Controller, goto
from cni.pipeline.match import IP, IPV6
from cni.pipeline.services import to_service_cidr
from cni.pipeline.tables import (
    DENIED_LOG_METER,
    Cookie,
    EgressDefault,
    EgressRule,
    Flow,
    IngressDefault,
    IngressRule,
    Table,
    policy_cookie,
)

from . import deniedlog, ranges
from . import selector as sel
from .model import Peer, Pod, Policy, Rule

INGRESS, EGRESS = deniedlog.INGRESS, deniedlog.EGRESS
DENIED_LOG_MAX_LEN = 128  # bytes of a denied packet sent up: Ethernet, IPv6 (with an extension header), ports

_PROTOS = {("TCP", 4): m.TCP, ("UDP", 4): m.UDP, ("SCTP", 4): m.SCTP,
           ("TCP", 6): m.TCP6, ("UDP", 6): m.UDP6, ("SCTP", 6): m.SCTP6}
_PORT_FIELD = {"TCP": m.TCP_DST, "UDP": m.UDP_DST, "SCTP": m.SCTP_DST}


@dataclass(frozen=True)
class Inputs:
    """The cluster as policy sees it: Pods with addresses, Namespace labels, policies."""

    pods: tuple[Pod, ...]
    namespaces: Mapping[str, tuple[tuple[str, str], ...]]
    policies: tuple[Policy, ...]


@dataclass(frozen=True)
class NodeFacts:
    node: str
    host_addresses: tuple[str, ...] = ()  # the gateway's addresses: what the Node's own traffic comes from
    service_cidrs: tuple[str, ...] = ()
    denied_log: bool = False  # isolation also sends each new connection's first packet up (routesync.policy.deniedlog)
    pod_cidrs: tuple[str, ...] = ()  # the Node's own Pod CIDRs (none in networkPolicyOnly): its Pods' addresses
    # a remote client's egress judged here too (Plan.remote_rules, the remote isolation; the tiers'
    # egress rules on remote subjects: cnp.plan.Facts.remote_egress).  False (route-sync's
    # ``policyPeers: peerSlices``): egress is judged at its source only (docs/design/scale.md)
    remote_egress: bool = True


@dataclass(frozen=True)
class RuleInfo:
    """One conjunction as installed: which rule of which policy, on which Pods of this Node."""

    conj_id: int
    policy: str  # namespace/name
    direction: str
    index: int  # the rule's position in the policy's ingress/egress list
    pods: tuple[str, ...]  # namespace/name of the local Pods it applies to (remote ones: Plan.remote_rules)
    port: str = ""  # a named port's resolution, "http=8080/TCP" ("" for the rest)


@dataclass(frozen=True)
class HostRule:
    """One local conjunction as the host's judge reads it (:mod:`.hostjudge`): connections
    that kube-proxy's NAT takes past OVS are judged on the host by the same rule."""

    conj_id: int
    direction: str
    applied: tuple[str, ...]  # the local Pods' addresses
    peers: tuple[str, ...] | None  # addresses and blocks; None: any
    ports: tuple[tuple[str, int | None, int | None], ...] | None  # (protocol, first, last); None: any


@dataclass
class Plan:
    flows: list[Flow] = field(default_factory=list)
    rules: list[RuleInfo] = field(default_factory=list)
    isolated: dict[str, tuple[bool, bool]] = field(default_factory=dict)  # local Pod -> (ingress, egress)
    policies_of: dict[str, list[str]] = field(default_factory=dict)  # local Pod -> policies selecting it
    local_pods: list[Pod] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # policies Ferry could not read whole
    policy_namespaces: list[str] = field(default_factory=list)  # every namespace with a policy
    # A remote client's egress, judged where it arrives (:func:`plan`): its rules (``pods``: the
    # remote Pods), the remote Pods isolated for egress, and the conjunction that drops the rest.
    remote_rules: list[RuleInfo] = field(default_factory=list)
    remote_isolated: list[str] = field(default_factory=list)
    remote_isolation_id: int | None = None
    # the denied log's reading of a remote drop (its userdata names no Pod): source address ->
    # (the remote Pod, the policies isolating its egress)
    remote_sources: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    host_rules: list[HostRule] = field(default_factory=list)  # the local rules, for the host's judge


class ConjIds:
    """Conjunction ids, stable for a rule across plans (a changed rule elsewhere renumbers
    nothing), reused once freed (the smallest free one first).  The caller keeps one per Node.

    An id is a function of the rule's identity (its key: policy, direction, rule, named-port
    group) and of this allocator's state: :func:`plan` and the incremental planner
    (:mod:`.incremental`) share it, so with the same state both give every conjunction the same
    id (:meth:`get` of a key held already changes nothing; :meth:`copy` lets a full plan check
    an incremental one without touching its ids)."""

    def __init__(self, first: int = 1) -> None:
        self._ids: dict[str, int] = {}
        self._free: list[int] = []  # a heap: the smallest free id first
        self._next = self._first = first
        self._used: set[str] = set()
        self.cookies: dict[str, Cookie] = {}  # flow identity -> its cookie, across plans

    def get(self, key: str) -> int:
        self._used.add(key)
        return self.acquire(key)

    def acquire(self, key: str) -> int:
        """``key``'s id, allocating one if it has none (without marking it used for :meth:`sweep`)."""
        n = self._ids.get(key)
        if n is None:
            if self._free:
                n = heapq.heappop(self._free)
            else:
                n = self._next
                self._next += 1
            self._ids[key] = n
        return n

    def release(self, key: str) -> None:
        """Free ``key``'s id now (the incremental planner: its last user went)."""
        n = self._ids.pop(key, None)
        if n is not None:
            heapq.heappush(self._free, n)

    def held(self) -> dict[str, int]:
        """Every key with its id (a copy)."""
        return dict(self._ids)

    def copy(self) -> ConjIds:
        """The same ids and free list (the cookie memo shared: it is a cache)."""
        out = ConjIds(self._first)
        out._ids, out._free, out._next, out._used = dict(self._ids), list(self._free), self._next, set(self._used)
        out.cookies = self.cookies
        return out

    def sweep(self) -> None:
        """Free every id not asked for since the last sweep (and forget cookies when the
        memo grew well past what one plan uses)."""
        if len(self.cookies) > 4 * max(1, len(self._used)) + 100_000:
            self.cookies.clear()
        for key in [k for k in self._ids if k not in self._used]:
            self._free.append(self._ids.pop(key))
        heapq.heapify(self._free)
        self._used = set()


class PodIndex:
    """Pods by namespace and by (namespace, label, value): a selector's candidates without a
    pass over every Pod, and each selector's answer computed once per plan."""

    def __init__(self, pods: Iterable[Pod], namespaces: Mapping[str, tuple[tuple[str, str], ...]],
                 node: str = "") -> None:
        self.node = node  # this Node: :meth:`local_peers` keeps its Pods
        self.by_ns: dict[str, list[Pod]] = defaultdict(list)
        self.by_label: dict[tuple[str, str, str], list[Pod]] = defaultdict(list)
        for p in pods:
            self.by_ns[p.namespace].append(p)
            for k, v in p.labels:
                self.by_label[(p.namespace, k, v)].append(p)
        self.ns_labels = {n: dict(labels) for n, labels in namespaces.items()}
        self._cache: dict[tuple[str, sel.Selector], tuple[Pod, ...]] = {}
        self._ns_cache: dict[sel.Selector, tuple[str, ...]] = {}
        self._addr_cache: dict[tuple[str, Peer], tuple[str, ...]] = {}
        self._local_cache: dict[tuple[str, Peer], tuple[Pod, ...]] = {}
        self._local_addr_cache: dict[tuple[str, Peer], tuple[str, ...]] = {}
        self._block_cache: dict[tuple[str, tuple[str, ...]], tuple[str, ...]] = {}

    def in_namespace(self, ns: str, selector: sel.Selector) -> tuple[Pod, ...]:
        key = (ns, selector)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        candidates: Sequence[Pod] = self.by_ns.get(ns, ())
        for r in selector.requirements:  # narrow by the smallest single-value In
            if r.operator == "In" and len(r.values) == 1:
                (value,) = r.values
                narrowed = self.by_label.get((ns, r.key, value), ())
                if len(narrowed) < len(candidates):
                    candidates = narrowed
        out = tuple(p for p in candidates if selector.matches(dict(p.labels)))
        self._cache[key] = out
        return out

    def namespaces(self, selector: sel.Selector) -> tuple[str, ...]:
        hit = self._ns_cache.get(selector)
        if hit is None:
            names = set(self.ns_labels) | set(self.by_ns)
            hit = tuple(sorted(n for n in names if selector.matches(self.ns_labels.get(n, {}))))
            self._ns_cache[selector] = hit
        return hit

    def block(self, cidr: str, excepts: tuple[str, ...]) -> tuple[str, ...]:
        """An ``ipBlock`` as prefixes (:func:`ranges.block_minus`), once per plan."""
        hit = self._block_cache.get((cidr, excepts))
        if hit is None:
            hit = self._block_cache[(cidr, excepts)] = tuple(map(block_text, ranges.block_minus(cidr, list(excepts))))
        return hit

    def peer_addresses(self, policy_ns: str, peer: Peer) -> tuple[str, ...]:
        """The addresses of :meth:`peers`, once per (namespace, peer) in a plan."""
        key = (policy_ns, peer)
        hit = self._addr_cache.get(key)
        if hit is None:
            hit = self._addr_cache[key] = tuple(ip for p in self.peers(policy_ns, peer) for ip in p.ips)
        return hit

    def local_peers(self, policy_ns: str, peer: Peer) -> tuple[Pod, ...]:
        """:meth:`peers` on this Node only, once per (namespace, peer) in a plan."""
        key = (policy_ns, peer)
        hit = self._local_cache.get(key)
        if hit is None:
            node = self.node
            hit = self._local_cache[key] = tuple(p for p in self.peers(policy_ns, peer) if p.node == node)
        return hit

    def local_peer_addresses(self, policy_ns: str, peer: Peer) -> tuple[str, ...]:
        key = (policy_ns, peer)
        hit = self._local_addr_cache.get(key)
        if hit is None:
            hit = self._local_addr_cache[key] = tuple(ip for p in self.local_peers(policy_ns, peer) for ip in p.ips)
        return hit

    def peers(self, policy_ns: str, peer: Peer) -> tuple[Pod, ...]:
        namespaces = (policy_ns,) if peer.namespace_selector is None else self.namespaces(peer.namespace_selector)
        pod_sel = peer.pod_selector or sel.EVERYTHING
        out: list[Pod] = []
        for ns in namespaces:
            out.extend(self.in_namespace(ns, pod_sel))
        return tuple(out)


class Addresses:
    """``ip,nw_src=...`` (or dst, or IPv6) for an address (matched exactly) or a block (by
    prefix), each built once per plan with its text: a Pod's address is in many rules."""

    def __init__(self) -> None:
        self.by_side: dict[bool, dict[str, tuple[tuple[m.MatchItem, ...], str]]] = {True: {}, False: {}}

    def match(self, addr: str, source: bool) -> tuple[tuple[m.MatchItem, ...], str]:
        side = self.by_side[source]
        hit = side.get(addr)
        if hit is None:
            six = ":" in addr
            spec = (m.IPV6_SRC if source else m.IPV6_DST) if six else (m.IPV4_SRC if source else m.IPV4_DST)
            proto = IPV6 if six else IP
            match: tuple[m.MatchItem, ...] = (proto, m.address(spec, addr))
            # the text m.match_text would render, without rendering (a key and a cookie only)
            hit = side[addr] = (match, f"{proto.name},{spec.match_name}={addr}")
        return hit


def block_text(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
    return str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)


def port_matches(ports: Iterable[tuple[str, int | None, int | None]]) -> list[tuple[m.MatchItem, ...]]:
    """(protocol, first, last) → the matches of clause 3, both families."""
    out: list[tuple[m.MatchItem, ...]] = []
    for proto, first, last in sorted(set(ports), key=lambda p: (p[0], p[1] or 0, p[2] or 0)):
        for family in (4, 6):
            shorthand = _PROTOS[(proto, family)]
            if first is None:
                out.append((shorthand,))
            elif last is None or last == first:
                out.append((shorthand, _PORT_FIELD[proto](first)))
            else:
                out += [(shorthand, m.masked(_PORT_FIELD[proto], v, mask))
                        for v, mask in ranges.port_masks(first, last)]
    return out


@dataclass(frozen=True)
class _Part:
    """A rule, or one named-port group of it: whom it applies to, its peers, its ports."""

    applied: tuple[Pod, ...]
    peers: tuple[str, ...] | None  # addresses and blocks; None: any
    ports: tuple[tuple[str, int | None, int | None], ...] | None  # None: any
    tag: str = ""


def _parts(direction: str, policy: Policy, rule: Rule, applied: tuple[Pod, ...], index: PodIndex,
           peers_here: bool = False) -> list[_Part]:
    """``rule`` as conjunctions; ``peers_here``: its Pod peers only those of this Node (a remote
    client's egress, judged where it arrives: :func:`plan`)."""
    numeric = [(p.protocol, p.port if isinstance(p.port, int) else None, p.end_port)
               for p in rule.ports if not isinstance(p.port, str)]
    # a named port listed twice (``{port: http}`` beside ``{port: http, protocol: TCP}``) is one
    # conjunction: twice, it was two rules with one id, and the host's judge two sets of one name
    named = list({(p.port, p.protocol): p for p in rule.ports if isinstance(p.port, str)}.values())
    all_peers: tuple[str, ...] | None = None
    if rule.peers is not None:
        addrs: list[str] = []
        for peer in rule.peers:
            if peer.ip_block is not None:
                addrs += index.block(peer.ip_block.cidr, peer.ip_block.excepts)
            elif peers_here:
                addrs += index.local_peer_addresses(policy.namespace, peer)
            else:
                addrs += index.peer_addresses(policy.namespace, peer)
        all_peers = tuple(dict.fromkeys(addrs))
    out: list[_Part] = []
    if not rule.ports or numeric:
        out.append(_Part(applied, all_peers, tuple(numeric) if rule.ports else None))
    if not named:
        return out
    if direction == INGRESS:  # the name is the applied-to Pod's port
        candidates: Iterable[Pod] = applied
    elif rule.peers is not None:  # egress: the peer Pod's (an ipBlock has no named ports)
        peers_of = index.local_peers if peers_here else index.peers
        candidates = dict.fromkeys(p for peer in rule.peers if peer.ip_block is None
                                   for p in peers_of(policy.namespace, peer))
    else:
        candidates = [p for p in index_all(index) if p.node == index.node] if peers_here else index_all(index)
    for pm in named:
        assert isinstance(pm.port, str)
        groups: dict[int, list[Pod]] = defaultdict(list)
        for pod in candidates:
            number = pod.port_number(pm.port, pm.protocol)
            if number is not None:
                groups[number].append(pod)
        for number, pods in sorted(groups.items()):
            tag = f"{pm.port}={number}/{pm.protocol}"
            if direction == INGRESS:
                out.append(_Part(tuple(pods), all_peers, ((pm.protocol, number, None),), tag))
            else:
                out.append(_Part(applied, tuple(dict.fromkeys(ip for p in pods for ip in p.ips)),
                                 ((pm.protocol, number, None),), tag))
    return out


def index_all(index: PodIndex) -> list[Pod]:
    return [p for pods in index.by_ns.values() for p in pods]


class FlowSet:
    """Flows being built, merged by identity: a clause flow several rules share is one flow
    with each rule's ``conjunction()`` action.  One bucket per (table, priority), keyed by the
    match's text: ``[match, actions]``."""

    def __init__(self, cookies: dict[str, Cookie]) -> None:
        self.addresses = Addresses()
        self._buckets: dict[tuple[int, int], dict[str, list[Any]]] = {}
        self._cookies = cookies  # kept across plans by the caller (ConjIds)

    def _bucket(self, table: Table, priority: int) -> dict[str, list[Any]]:
        key = (int(table), priority)
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = {}
        return b

    def add(self, table: Table, priority: int, match: tuple[m.MatchItem, ...], actions: Sequence[Any],
            text: str | None = None) -> None:
        """A flow with ``actions``; at a key that has one already, a ``conjunction()`` joins
        the others (each rule adds each of its clause flows once), a terminal action leaves
        the first writer's (the same allow or drop)."""
        bucket = self._bucket(table, priority)
        key = text if text is not None else m.match_text(match)
        have = bucket.get(key)
        if have is None:
            bucket[key] = [match, list(actions)]
        elif have[1] and actions and isinstance(actions[0], Conjunction) and isinstance(have[1][0], Conjunction):
            have[1].extend(actions)

    def conjunction(self, table: Table, priority: int, addrs: Iterable[str], source: bool, conj: Conjunction) -> None:
        """:meth:`add` of ``conj`` on the address flow of each of ``addrs`` (distinct): the
        planner's inner loop, two dict lookups by string per address."""
        bucket = self._bucket(table, priority)
        side, build = self.addresses.by_side[source], self.addresses.match
        for addr in addrs:
            hit = side.get(addr) or build(addr, source)
            have = bucket.get(hit[1])
            if have is None:
                bucket[hit[1]] = [hit[0], [conj]]
            else:
                acts = have[1]
                if acts and type(acts[0]) is Conjunction:
                    acts.append(conj)

    def address(self, table: Table, priority: int, addr: str, source: bool, actions: Sequence[Any]) -> None:
        match, text = self.addresses.match(addr, source)
        self.add(table, priority, match, actions, text)

    def flows(self) -> list[Flow]:
        out = []
        cookies = self._cookies
        for table, priority in sorted(self._buckets, key=lambda k: (k[0], -k[1])):
            bucket = self._buckets[(table, priority)]
            t = Table(table)
            for text in sorted(bucket):
                match, actions = bucket[text]
                if actions and type(actions[0]) is Conjunction:
                    actions = sorted(actions, key=conj_order)
                ident = f"{table}|{priority}|{text}"
                cookie = cookies.get(ident)
                if cookie is None:
                    cookie = cookies[ident] = policy_cookie(ident)
                out.append(Flow(t, priority, match, tuple(actions), cookie))
        return out


def conj_order(a: Conjunction) -> tuple[int, int]:
    return (a.id, a.clause)


def plan(inputs: Inputs, facts: NodeFacts, ids: ConjIds | None = None) -> Plan:
    ids = ids if ids is not None else ConjIds()
    index = PodIndex(inputs.pods, inputs.namespaces, facts.node)
    here = facts.node
    local = [p for p in inputs.pods if p.node == here]
    out = Plan(local_pods=local, policy_namespaces=policy_namespaces(inputs.policies))
    fl = FlowSet(ids.cookies)
    iso: dict[str, list[bool]] = {p.key: [False, False] for p in local}
    remote_isolated: dict[str, Pod] = {}  # remote Pods isolated for egress, judged here too
    remote_by: dict[str, list[str]] = defaultdict(list)  # remote Pod -> the policies isolating its egress
    local_ips = {ip for p in local for ip in p.ips}  # a remote Pod that holds one (a stale record) is not judged here
    isolated_by: dict[tuple[str, str], list[str]] = defaultdict(list)  # (Pod, direction) -> policies (denied log)
    for policy in sorted(inputs.policies, key=lambda p: p.key):
        if policy.errors:
            out.errors += [f"{policy.key}: {e}" for e in policy.errors]
        selected = index.in_namespace(policy.namespace, policy.pod_selector)
        applied = tuple(p for p in selected if p.node == here)
        if facts.remote_egress and policy.isolates_egress and local and len(applied) < len(selected):
            remote = tuple(p for p in selected if p.node != here and local_ips.isdisjoint(p.ips))
            for p in remote:
                remote_isolated[p.key] = p
                remote_by[p.key].append(policy.key)
            for i, rule in enumerate(policy.egress):
                for part in _parts(EGRESS, policy, rule, remote, index, peers_here=True):
                    _add_rule(fl, out, ids, EGRESS, policy, i, part, remote=True)
        if not applied:
            continue
        for p in applied:
            out.policies_of.setdefault(p.key, []).append(policy.key)
            iso[p.key][0] |= policy.isolates_ingress
            iso[p.key][1] |= policy.isolates_egress
            for direction, on in ((INGRESS, policy.isolates_ingress), (EGRESS, policy.isolates_egress)):
                if on:
                    isolated_by[(p.key, direction)].append(policy.key)
        for direction, rules, isolating in ((INGRESS, policy.ingress, policy.isolates_ingress),
                                            (EGRESS, policy.egress, policy.isolates_egress)):
            if not isolating:
                continue  # rules of a direction the policy does not isolate mean nothing
            for i, rule in enumerate(rules):
                for part in _parts(direction, policy, rule, applied, index):
                    _add_rule(fl, out, ids, direction, policy, i, part)
    if remote_isolated:
        _remote_isolation(fl, out, ids, list(remote_isolated.values()), local_destinations(local, facts.pod_cidrs),
                          remote_by if facts.denied_log else None)
    ids.sweep()
    for pod in local:
        ingress, egress = iso[pod.key]
        out.isolated[pod.key] = (ingress, egress)
        for ip in pod.ips:
            if ingress:
                fl.address(Table.INGRESS_DEFAULT, IngressDefault.ISOLATED, ip, False, DROP)
            if egress:
                fl.address(Table.EGRESS_DEFAULT, EgressDefault.ISOLATED, ip, True, DROP)
        if facts.denied_log:
            _denied_log_flows(fl, pod, isolated_by)
    for a in facts.host_addresses:
        fl.address(Table.INGRESS_RULE, IngressRule.HOST, str(ipaddress.ip_interface(a).ip), True,
                   (goto(Table.CONNTRACK_COMMIT),))
    for cidr in facts.service_cidrs:
        fl.address(Table.EGRESS_RULE, EgressRule.SERVICE, block_text(ipaddress.ip_network(cidr, strict=False)), False,
                   to_service_cidr())
    out.flows = fl.flows()
    return out


def _denied_log_flows(fl: FlowSet, pod: Pod, isolating: Mapping[tuple[str, str], list[str]]) -> None:
    """Above each isolation drop, its new connections' drop that also sends the first packet up to
    route-sync (``controller()``, at most 128 bytes of it, through the denied log's meter), with
    the Pod, the direction and the policies that isolate it in that direction
    (:func:`deniedlog.userdata`)."""
    new = m.ct_state(m.CT_NEW | m.CT_TRK)
    for direction, table, rung in ((INGRESS, Table.INGRESS_DEFAULT, IngressDefault.ISOLATED_NEW),
                                   (EGRESS, Table.EGRESS_DEFAULT, EgressDefault.ISOLATED_NEW)):
        policies = isolating.get((pod.key, direction))
        if not policies:
            continue
        up = (Controller(deniedlog.userdata(direction, pod.key, policies), DENIED_LOG_MAX_LEN, DENIED_LOG_METER),)
        for ip in pod.ips:
            match, text = fl.addresses.match(ip, direction == EGRESS)
            fl.add(table, rung, (*match, new), up, f"{text},{new.text()}")


REMOTE_ISOLATION_KEY = "|remote-egress-isolated|"  # the conjunction id of :func:`_remote_isolation`


def local_destinations(local: Iterable[Pod], pod_cidrs: Sequence[str]) -> list[str]:
    """This Node's Pods as destinations: its Pod CIDRs (a Pod route-sync has not seen yet is
    covered too), and the address of each local Pod outside them (networkPolicyOnly: every one)."""
    nets = [ipaddress.ip_network(c, strict=False) for c in pod_cidrs]
    out = [block_text(n) for n in nets]
    for pod in local:
        for ip in pod.ips:
            addr = ipaddress.ip_address(ip)
            if not any(addr in n for n in nets):
                out.append(ip)
    return list(dict.fromkeys(out))


def _remote_isolation(fl: FlowSet, out: Plan, ids: ConjIds, remote: list[Pod], destinations: list[str],
                      logged_by: Mapping[str, list[str]] | None = None) -> None:
    """The drop of what no rule allowed a remote egress-isolated Pod to send to this Node's Pods
    (:func:`local_destinations`): one conjunction (its sources × those, in the sum of their
    flows) below the local Pods' own drops in EgressDefault, so it never meets a local source.

    ``logged_by`` (the denied log on: remote Pod -> the policies isolating it): above the drop,
    the same conj_id's new connections also go up to route-sync.  One flow for every remote
    Pod, so its userdata names none (:data:`deniedlog.REMOTE`); the listener reads the Pod and
    its policies off the packet's source (``Plan.remote_sources``)."""
    if not destinations:
        return
    n = ids.get(REMOTE_ISOLATION_KEY)
    out.remote_isolated = sorted(p.key for p in remote)
    out.remote_isolation_id = n
    prio = EgressDefault.REMOTE_ISOLATED
    fl.conjunction(Table.EGRESS_DEFAULT, prio, dict.fromkeys(ip for p in remote for ip in p.ips), True,
                   Conjunction(n, 1, 2))
    fl.conjunction(Table.EGRESS_DEFAULT, prio, destinations, False, Conjunction(n, 2, 2))
    fl.add(Table.EGRESS_DEFAULT, prio, (m.CONJ_ID(n),), DROP)
    if logged_by is not None:
        new = m.ct_state(m.CT_NEW | m.CT_TRK)
        up = Controller(deniedlog.userdata(EGRESS, deniedlog.REMOTE, ()), DENIED_LOG_MAX_LEN, DENIED_LOG_METER)
        fl.add(Table.EGRESS_DEFAULT, EgressDefault.REMOTE_ISOLATED_NEW, (m.CONJ_ID(n), new), (up,))
        for p in remote:
            for ip in p.ips:
                out.remote_sources[str(ipaddress.ip_address(ip))] = (p.key, tuple(sorted(set(logged_by[p.key]))))


def _add_rule(fl: FlowSet, out: Plan, ids: ConjIds, direction: str, policy: Policy, index: int, part: _Part,
              remote: bool = False) -> None:
    """One conjunction for ``part``; ``remote``: a remote client's egress, judged here on what
    it sends to this Node's Pods (recorded in ``Plan.remote_rules``)."""
    if part.peers is not None and not part.peers or part.ports is not None and not part.ports or not part.applied:
        return  # it allows nothing
    table = Table.INGRESS_RULE if direction == INGRESS else Table.EGRESS_RULE
    conj = IngressRule.CONJ if direction == INGRESS else EgressRule.CONJ
    then = goto(Table.CONNTRACK_COMMIT) if direction == INGRESS else goto(Table.INGRESS_ADMIN)
    n = ids.get(f"{policy.key}|{direction}{'-remote' if remote else ''}|{index}|{part.tag}")
    info = RuleInfo(n, policy.key, direction, index, tuple(p.key for p in part.applied), part.tag)
    (out.remote_rules if remote else out.rules).append(info)
    if not remote:
        out.host_rules.append(HostRule(n, direction, tuple(ip for pod in part.applied for ip in pod.ips),
                                       part.peers, part.ports))
    add_conjunction(fl, table, conj, n, [ip for pod in part.applied for ip in pod.ips], direction == EGRESS,
                    part.peers, part.ports, (then,))


def add_conjunction(fl: FlowSet, table: Table, prio: int, n: int, applied: Iterable[str], applied_is_src: bool,
                    peers: Sequence[str] | None, ports: Sequence[tuple[str, int | None, int | None]] | None,
                    then: Sequence[Any]) -> None:
    """Conjunction ``n`` at ``prio``: clause 1 the addresses it applies to (sources when
    ``applied_is_src``), clause 2 its peers (None: any, one ``ip`` and one ``ipv6`` flow), clause 3
    its ports if it has any; its ``conj_id`` flow does ``then``.  NetworkPolicy's and the
    ClusterNetworkPolicy tiers' rules (:mod:`.cnp.plan`) alike."""
    clauses = 3 if ports is not None else 2
    fl.conjunction(table, prio, applied, applied_is_src, Conjunction(n, 1, clauses))
    if peers is None:
        for proto in (IP, IPV6):
            fl.add(table, prio, (proto,), (Conjunction(n, 2, clauses),))
    else:
        fl.conjunction(table, prio, peers, not applied_is_src, Conjunction(n, 2, clauses))
    if ports is not None:
        for match in port_matches(ports):
            fl.add(table, prio, match, (Conjunction(n, 3, clauses),))
    fl.add(table, prio, (m.CONJ_ID(n),), then)


def policy_namespaces(policies: Iterable[Policy]) -> list[str]:
    """Namespaces with at least one policy: where a new Pod starts pending (the state file)."""
    return sorted({p.namespace for p in policies})
