"""One Node's ClusterNetworkPolicy flows: the Admin and Baseline tiers, from the cluster's Pods,
Namespaces, Nodes and ClusterNetworkPolicies: pure.

Evaluation order, per direction (the API's, :mod:`cni.pipeline.tables`): EgressAdmin →
EgressRule/EgressDefault (NetworkPolicy) → EgressBaseline, then IngressAdmin →
IngressRule/IngressDefault → IngressBaseline.  Each rule of each policy is one conjunction, as
NetworkPolicy's (:mod:`routesync.policy.plan`): the subject's addresses, the peers' addresses
and blocks, the protocols' ports if it names any, so a rule costs the sum of its sizes in flows.
Its rung is its precedence: ``TOP - 26 * priority - index`` (lower priority values first, then
the order rules are written in).  Its ``conj_id`` flow acts:

    Accept: egress on to IngressAdmin; ingress on to ConntrackCommit (no later tier looks)
    Deny:   drop
    Pass:   Admin: on to the NetworkPolicy tables of its direction; Baseline: as Accept

Egress rules apply to every subject Pod of the cluster, not only this Node's: a remote client's
egress is judged again where it arrives (the same verdict, from the same objects), because a
Service connection that kube-proxy DNATs to a backend on another Node may leave the client's Node
without crossing its OVS (routed modes), and because NetworkPolicy's judging of remote egress
(``Plan.remote_rules``, its drop in EgressDefault) must not drop what an Admin rule accepted at
the source.  Ingress rules apply to this Node's subject Pods.  Egress to a Service CIDR skips the
tiers (EgressAdmin.SERVICE): it is judged when it comes back from the host's DNAT with the
backend's address.  With ``Facts.remote_egress`` False (route-sync's ``policyPeers:
peerSlices``) egress rules apply to this Node's subjects only, as NetworkPolicy's then do: egress
is judged at its source alone, which covers every path (OVS, and the host's judge for what
kube-proxy's NAT takes past it).  Stateful like NetworkPolicy: replies skip every policy table
(ConntrackState)."""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from cni.pipeline.actions import DROP, Controller, goto
from cni.pipeline.services import to_service_cidr
from cni.pipeline.tables import (
    DENIED_LOG_METER,
    EgressAdmin,
    EgressBaseline,
    Flow,
    IngressAdmin,
    IngressBaseline,
    Table,
)

from .. import deniedlog
from .. import selector as sel
from ..model import Pod
from ..plan import DENIED_LOG_MAX_LEN, ConjIds, FlowSet, PodIndex, add_conjunction, block_text
from .model import ADMIN, BASELINE, DENY, PASS, ClusterPolicy, NodeInfo, Peer, Rule, Selection

if TYPE_CHECKING:
    from cni.pipeline.actions import Action

INGRESS, EGRESS = "ingress", "egress"
RUNGS_PER_PRIORITY = 26  # 25 rules per direction at most, and one rung between priorities
FIRST_CONJ_ID = 1 << 24  # apart from NetworkPolicy's ids (readable in a dump; OpenFlow scopes them per table)

TABLES = {(ADMIN, EGRESS): (Table.EGRESS_ADMIN, EgressAdmin.TOP),
           (ADMIN, INGRESS): (Table.INGRESS_ADMIN, IngressAdmin.TOP),
           (BASELINE, EGRESS): (Table.EGRESS_BASELINE, EgressBaseline.TOP),
           (BASELINE, INGRESS): (Table.INGRESS_BASELINE, IngressBaseline.TOP)}


@dataclass(frozen=True)
class Inputs:
    pods: tuple[Pod, ...]
    namespaces: Mapping[str, tuple[tuple[str, str], ...]]
    policies: tuple[ClusterPolicy, ...]
    nodes: tuple[NodeInfo, ...] = ()


@dataclass(frozen=True)
class Facts:
    node: str
    service_cidrs: tuple[str, ...] = ()
    denied_log: bool = False  # Deny rules send what they drop up, metered (routesync.policy.deniedlog)
    # egress rules also on remote subjects (a remote client's egress judged here too); False: on
    # this Node's subjects only, egress judged at its source (..plan.NodeFacts.remote_egress, which sets it)
    remote_egress: bool = True


@dataclass(frozen=True)
class TierRule:
    """One conjunction as installed: which rule of which ClusterNetworkPolicy."""

    conj_id: int
    policy: str
    tier: str
    priority: int
    direction: str
    index: int
    name: str
    action: str
    pods: tuple[str, ...]  # namespace/name of the local subject Pods
    port: str = ""  # a named port's resolution, "http=8080/TCP"


@dataclass(frozen=True)
class TierHostRule:
    """One local conjunction as the host's judge reads it (:mod:`..hostjudge`), in precedence order."""

    conj_id: int
    tier: str
    direction: str
    action: str
    applied: tuple[str, ...]  # this Node's subject Pods' addresses
    peers: tuple[str, ...] | None  # None: any
    ports: tuple[tuple[str, int | None, int | None], ...] | None  # None: any


@dataclass
class TierPlan:
    flows: list[Flow] = field(default_factory=list)
    rules: list[TierRule] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    subject_namespaces: list[str] = field(default_factory=list)  # where a new Pod may be a subject: starts pending
    tiers_of: dict[str, list[str]] = field(default_factory=dict)  # local Pod -> its policies, in evaluation order
    host_rules: list[TierHostRule] = field(default_factory=list)  # the local rules, for the host's judge


def rung(top: int, priority: int, index: int) -> int:
    return top - RUNGS_PER_PRIORITY * priority - index


def action_of(tier: str, direction: str, action: str) -> tuple[Action, ...]:
    """Where a rule's ``conj_id`` flow sends what it matched (see the module)."""
    if action == DENY:
        return DROP
    if action == PASS and tier == ADMIN:
        return (goto(Table.EGRESS_RULE if direction == EGRESS else Table.INGRESS_RULE),)
    return (goto(Table.INGRESS_ADMIN if direction == EGRESS else Table.CONNTRACK_COMMIT),)


def rule_actions(policy: ClusterPolicy, direction: str, index: int, rule: Rule, denied_log: bool
                 ) -> tuple[Action, ...]:
    """:func:`action_of`; with the denied log on a Deny also sends the packet up, naming the rule
    (:func:`..deniedlog.tier_userdata`; sending it nowhere else is the drop)."""
    if rule.action == DENY and denied_log:
        label = f"{policy.tier}/{policy.priority}/{policy.name}"
        return (Controller(deniedlog.tier_userdata(direction, label, index, rule.name), DENIED_LOG_MAX_LEN,
                           DENIED_LOG_METER),)
    return action_of(policy.tier, direction, rule.action)


def order(p: ClusterPolicy) -> tuple[int, int, str]:
    return (0 if p.tier == ADMIN else 1, p.priority, p.name)


class PodLookup(Protocol):
    """What a selection reads: :class:`..plan.PodIndex` (a full plan) or the incremental
    planner's live index (:mod:`.incremental`)."""

    def namespaces(self, selector: sel.Selector) -> tuple[str, ...]: ...

    def in_namespace(self, ns: str, selector: sel.Selector) -> Sequence[Pod]: ...


class Select:
    """Selections over a Pod index, each computed once, each in the order of the Pods' keys
    (a plan does not depend on the order the watch delivered them in)."""

    def __init__(self, index: PodLookup, nodes: Iterable[NodeInfo]) -> None:
        self.index = index
        self.nodes = tuple(nodes)
        self._pods: dict[Selection, tuple[Pod, ...]] = {}
        self._node_addrs: dict[sel.Selector, tuple[str, ...]] = {}

    def pods(self, s: Selection) -> tuple[Pod, ...]:
        hit = self._pods.get(s)
        if hit is None:
            pod_sel = s.pods or sel.EVERYTHING
            hit = self._pods[s] = tuple(sorted((p for ns in self.index.namespaces(s.namespaces)
                                                for p in self.index.in_namespace(ns, pod_sel)), key=pod_key))
        return hit

    def node_addresses(self, s: sel.Selector) -> tuple[str, ...]:
        hit = self._node_addrs.get(s)
        if hit is None:
            hit = self._node_addrs[s] = tuple(a for n in self.nodes if s.matches(dict(n.labels)) for a in n.addresses)
        return hit


def pod_key(p: Pod) -> str:
    return p.key


@dataclass(frozen=True)
class Part:
    """One conjunction of a rule: the Pods it applies to, its peers' addresses (sorted), its
    ports; ``tag`` names a named port's resolution ("" for the rest)."""

    applied: tuple[Pod, ...]
    peers: tuple[str, ...] | None  # None: any
    ports: tuple[tuple[str, int | None, int | None], ...] | None  # None: any
    tag: str = ""


def _peer_pods(rule: Rule, s: Select) -> list[Pod]:
    return sorted({p for peer in rule.peers or () if peer.pods is not None for p in s.pods(peer.pods)}, key=pod_key)


def parts(direction: str, rule: Rule, applied: tuple[Pod, ...], s: Select) -> list[Part]:
    """The conjunctions of ``rule`` over ``applied`` (in the order the plan lists them)."""
    peers: tuple[str, ...] | None = None
    if rule.peers is not None:
        addrs: list[str] = []
        for peer in rule.peers:
            addrs += _peer_addresses(peer, s)
        peers = tuple(sorted(set(addrs)))
    if rule.ports is None:
        return [Part(applied, peers, None)]
    numeric = tuple((p.protocol, p.first, p.last) for p in rule.ports if p.name is None and p.protocol is not None)
    out = [Part(applied, peers, numeric)] if numeric else []
    for name in dict.fromkeys(p.name for p in rule.ports if p.name is not None):
        # the destination's container port: the subject's (ingress), the peer Pod's (egress)
        candidates = applied if direction == INGRESS else _peer_pods(rule, s)
        groups: dict[tuple[str, int], list[Pod]] = defaultdict(list)
        for pod in candidates:
            for np in pod.ports:
                if np.name == name:
                    groups[(np.protocol, np.number)].append(pod)
        for (proto, number), pods in sorted(groups.items()):
            tag = f"{name}={number}/{proto}"
            if direction == INGRESS:
                out.append(Part(tuple(pods), peers, ((proto, number, None),), tag))
            else:
                out.append(Part(applied, tuple(sorted({ip for p in pods for ip in p.ips})),
                                 ((proto, number, None),), tag))
    return out


def _peer_addresses(peer: Peer, s: Select) -> list[str]:
    if peer.pods is not None:
        return [ip for p in s.pods(peer.pods) for ip in p.ips]
    if peer.nodes is not None:
        return list(s.node_addresses(peer.nodes))
    return [block_text(ipaddress.ip_network(n, strict=False)) for n in peer.networks]  # domainNames: nothing


def plan(inputs: Inputs, facts: Facts, ids: ConjIds | None = None) -> TierPlan:
    ids = ids if ids is not None else ConjIds(FIRST_CONJ_ID)
    out = TierPlan()
    if not inputs.policies:
        ids.sweep()
        return out
    index = PodIndex(inputs.pods, inputs.namespaces, facts.node)
    s = Select(index, inputs.nodes)
    fl = FlowSet(ids.cookies)
    here = facts.node
    subject_ns: set[str] = set()
    for policy in sorted(inputs.policies, key=order):
        out.errors += [f"{policy.name}: {e}" for e in policy.errors]
        subject_ns.update(index.namespaces(policy.subject.namespaces))
        subjects = s.pods(policy.subject)
        local = tuple(p for p in subjects if p.node == here)
        for p in local:
            out.tiers_of.setdefault(p.key, []).append(f"{policy.tier}/{policy.priority}/{policy.name}")
        egress_applied = subjects if facts.remote_egress else local
        for direction, rules, applied in ((EGRESS, policy.egress, egress_applied), (INGRESS, policy.ingress, local)):
            if not applied:
                continue
            table, top = TABLES[(policy.tier, direction)]
            for i, rule in enumerate(rules):
                prio = rung(top, policy.priority, i)
                then = rule_actions(policy, direction, i, rule, facts.denied_log)
                for part in parts(direction, rule, applied, s):
                    _add(fl, out, ids, table, prio, then, policy, direction, i, rule, part, here)
    for cidr in facts.service_cidrs:
        fl.address(Table.EGRESS_ADMIN, EgressAdmin.SERVICE, block_text(ipaddress.ip_network(cidr, strict=False)),
                   False, to_service_cidr())
    ids.sweep()
    out.subject_namespaces = sorted(subject_ns)
    out.flows = fl.flows()
    return out


def _add(fl: FlowSet, out: TierPlan, ids: ConjIds, table: Table, prio: int, then: tuple[Action, ...],
         policy: ClusterPolicy, direction: str, index: int, rule: Rule, part: Part, here: str) -> None:
    if part.peers is not None and not part.peers or part.ports is not None and not part.ports or not part.applied:
        return  # it matches nothing
    n = ids.get(f"{policy.name}|{direction}|{index}|{part.tag}")
    local = [p for p in part.applied if p.node == here]
    out.rules.append(TierRule(n, policy.name, policy.tier, policy.priority, direction, index, rule.name,
                              rule.action, tuple(p.key for p in local), part.tag))
    if local:
        out.host_rules.append(TierHostRule(n, policy.tier, direction, rule.action,
                                           tuple(ip for p in local for ip in p.ips), part.peers, part.ports))
    add_conjunction(fl, table, prio, n, dict.fromkeys(ip for pod in part.applied for ip in pod.ips),
                    direction == EGRESS, part.peers, part.ports, then)
