"""One Node's ClusterNetworkPolicy flows kept up to date event by event: what :func:`.plan.plan`
computes from scratch, held as state that a Pod, Namespace, Node or policy event changes in
proportion to what it touches.

Each rule of each policy is one or more *parts* (:class:`.plan.Part`: one conjunction each).  A
part holds the addresses it applies to and its peers' addresses as reference counts; while both
are non-empty it exists: it has a ``conj_id`` (from the shared :class:`..plan.ConjIds`, by the
same key the full planner uses) and puts one ``conjunction()`` action on the flow of each of its
addresses, its any-peer flows, its port flows, and its ``conj_id`` flow.  An address whose count
goes 0 → 1 adds that one action, 1 → 0 removes it; a part that starts or stops existing writes or
removes its whole conjunction.  Flows are merged by identity (table, priority, match text) as
:class:`..plan.FlowSet` merges them, so rules that share a rung share a flow.

What an event costs:

- a Pod: for each policy whose subject or pod peers may pick from its Namespace (an index by
  Namespace), whether it is a subject or a peer now and before; the addresses that moved;
- a Namespace (its labels, its first Pod or its last): each policy's Namespace selectors
  evaluated against it, then the Pods of that Namespace for the policies whose selection moved;
- a Node: the rules with a ``nodes`` peer;
- a policy: its own size (removed, then added), and nothing else's.

A rule with a named port is planned again as a whole (:func:`.plan.parts`) when a Pod it reads
moved: which Pods share a port number is a grouping, not a set.  Other facts (the Node's name,
the denied log or the remote subjects' egress switched) rebuild everything; Service CIDRs move
only their own flows.  A conjunction id freed in an event is released at its end, so a policy
replaced by itself keeps its ids.

The full planner stays the reference: route-sync compares the two at every full pass
(``routesync.policy.node``) and a randomized differential test holds them equal event by
event."""

from __future__ import annotations

import bisect
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cni.pipeline import match as m
from cni.pipeline.actions import Conjunction
from cni.pipeline.match import IP, IPV6
from cni.pipeline.services import to_service_cidr
from cni.pipeline.tables import Cookie, EgressAdmin, Flow, Table, policy_cookie

from .. import selector as sel
from ..incremental import Changes
from ..model import Pod
from ..plan import Addresses, ConjIds, block_text, conj_order, port_matches
from .model import ClusterPolicy, NodeInfo, Rule, Selection
from .plan import (
    EGRESS,
    FIRST_CONJ_ID,
    INGRESS,
    TABLES,
    Facts,
    Inputs,
    Select,
    TierHostRule,
    TierPlan,
    TierRule,
    order,
    parts,
    pod_key,
    rule_actions,
    rung,
)

if TYPE_CHECKING:
    from cni.pipeline.actions import Action

FlowKey = tuple[int, int, str]  # (table, priority, match text): a flow's identity
Ports = tuple[tuple[str, int | None, int | None], ...]


class MergedFlows:
    """The tier flows, merged by identity: per flow its match and either the conjunction
    actions on it (counted) or its terminal actions; each :class:`Flow` built again only when
    its key was touched."""

    def __init__(self, cookies: dict[str, Cookie]) -> None:
        self.addresses = Addresses()
        self._conj: dict[FlowKey, tuple[tuple[m.MatchItem, ...], dict[Conjunction, int]]] = {}
        self._terminal: dict[FlowKey, tuple[tuple[m.MatchItem, ...], tuple[Action, ...]]] = {}
        self._built: dict[FlowKey, Flow] = {}
        self._dirty: set[FlowKey] = set()
        self._cookies = cookies  # ConjIds.cookies: shared with the full planner (a memo)
        # per key built again since the last take_delta: its flow before (None: there was none)
        self._was: dict[FlowKey, Flow | None] = {}

    def address(self, table: int, prio: int, addr: str, source: bool, conj: Conjunction, d: int) -> None:
        match, text = self.addresses.match(addr, source)
        self.conjunction((table, prio, text), match, conj, d)

    def conjunction(self, key: FlowKey, match: tuple[m.MatchItem, ...], conj: Conjunction, d: int) -> None:
        have = self._conj.get(key)
        if have is None:
            have = self._conj[key] = (match, {})
        counts = have[1]
        n = counts.get(conj, 0) + d
        if n > 0:
            counts[conj] = n
        else:
            counts.pop(conj, None)
            if not counts:
                del self._conj[key]
        self._dirty.add(key)

    def terminal(self, key: FlowKey, match: tuple[m.MatchItem, ...], actions: tuple[Action, ...] | None) -> None:
        if actions is None:
            self._terminal.pop(key, None)
        else:
            self._terminal[key] = (match, actions)
        self._dirty.add(key)

    def flows(self) -> list[Flow]:
        was = self._was
        for key in self._dirty:
            if key not in was:
                was[key] = self._built.get(key)
            table, prio, text = key
            conj = self._conj.get(key)
            actions: tuple[Action, ...]
            if conj is not None:
                ordered: list[Conjunction] = sorted(conj[1], key=conj_order)
                match, actions = conj[0], tuple(ordered)
            elif key in self._terminal:
                match, actions = self._terminal[key]
            else:
                self._built.pop(key, None)
                continue
            ident = f"{table}|{prio}|{text}"
            cookie = self._cookies.get(ident)
            if cookie is None:
                cookie = self._cookies[ident] = policy_cookie(ident)
            self._built[key] = Flow(Table(table), prio, match, actions, cookie)
        self._dirty.clear()
        return list(self._built.values())

    def take_delta(self) -> tuple[list[Flow], list[Flow]]:
        """The flows :meth:`flows` built (added) and dropped (removed) since the last take; a flow
        built again with the same actions is no change (its key fixes the rest), and keeps the
        object handed over before, as NetworkPolicy's planner does."""
        added: list[Flow] = []
        removed: list[Flow] = []
        for key, old in self._was.items():
            new = self._built.get(key)
            if new is old:
                continue
            if old is not None and new is not None and old.actions == new.actions:
                self._built[key] = old
                continue
            if old is not None:
                removed.append(old)
            if new is not None:
                added.append(new)
        self._was = {}
        return added, removed


def _text(match: tuple[m.MatchItem, ...]) -> str:
    return m.match_text(match)


class PartState:
    """One conjunction of a rule: its addresses and peers counted, its id while it exists."""

    def __init__(self, rule: RuleState, tag: str, ports: Ports | None, any_peer: bool) -> None:
        self.rule = rule
        self.tag = tag
        self.ports = ports
        self.applied: dict[str, int] = {}
        self.peers: dict[str, int] | None = None if any_peer else {}
        self.local: tuple[Pod, ...] | None = None  # a named part's own local Pods; None: the policy's
        self.n: int | None = None
        self._ordered: list[str] = []  # the peers' addresses, kept sorted (the host's judge reads them)
        self._sorted_peers: tuple[str, ...] | None = None

    @property
    def key(self) -> str:
        r = self.rule
        return f"{r.policy.policy.name}|{r.direction}|{r.index}|{self.tag}"

    def wanted(self) -> bool:
        return bool(self.applied) and (self.peers is None or bool(self.peers))

    def peer_moved(self, addr: str, present: bool) -> None:
        if present:
            bisect.insort(self._ordered, addr)
        else:
            del self._ordered[bisect.bisect_left(self._ordered, addr)]
        self._sorted_peers = None

    def sorted_peers(self) -> tuple[str, ...] | None:
        if self.peers is None:
            return None
        if self._sorted_peers is None:
            self._sorted_peers = tuple(self._ordered)
        return self._sorted_peers

    @property
    def clauses(self) -> int:
        return 3 if self.ports is not None else 2


class RuleState:
    """One rule of one policy: which Pods its pod peers pick (``members``), its Node and block
    peers, its parts."""

    def __init__(self, policy: PolicyState, direction: str, index: int, rule: Rule, denied_log: bool) -> None:
        self.policy = policy
        self.direction = direction
        self.egress = direction == EGRESS
        self.index = index
        self.rule = rule
        p = policy.policy
        table, top = TABLES[(p.tier, direction)]
        self.table, self.prio = int(table), rung(top, p.priority, index)
        self.then = rule_actions(p, direction, index, rule, denied_log)
        peers = rule.peers
        self.pod_peers: list[tuple[Selection, set[str]]] = [(q.pods, set()) for q in peers or () if q.pods is not None]
        self.node_peers = [q.nodes for q in peers or () if q.nodes is not None]
        self.networks = [block_text(ipaddress.ip_network(n, strict=False)) for q in peers or () for n in q.networks]
        self.members: dict[str, Pod] = {}
        self.named = rule.ports is not None and any(q.name is not None for q in rule.ports)
        numeric: Ports | None = None
        if rule.ports is not None:
            numeric = tuple((q.protocol, q.first, q.last) for q in rule.ports
                            if q.name is None and q.protocol is not None)
        self.parts: list[PartState] = []
        if not self.named and (rule.ports is None or numeric):
            self.parts.append(PartState(self, "", numeric, peers is None))

    @property
    def main(self) -> PartState | None:
        return None if self.named or not self.parts else self.parts[0]


class PolicyState:
    def __init__(self, policy: ClusterPolicy, denied_log: bool) -> None:
        self.policy = policy
        self.label = f"{policy.tier}/{policy.priority}/{policy.name}"
        self.order = order(policy)
        self.subject_ns: set[str] = set()
        self.subjects: dict[str, Pod] = {}
        self.local: dict[str, Pod] = {}
        self.rules = ([RuleState(self, EGRESS, i, r, denied_log) for i, r in enumerate(policy.egress)]
                      + [RuleState(self, INGRESS, i, r, denied_log) for i, r in enumerate(policy.ingress)])
        # what the snapshot takes of it (its rules, host rules, local subjects), until it moves
        self.shown: tuple[list[TierRule], list[TierHostRule], tuple[Pod, ...]] | None = None

    def local_sorted(self) -> tuple[Pod, ...]:
        return tuple(sorted(self.local.values(), key=pod_key))

    def show(self) -> tuple[list[TierRule], list[TierHostRule], tuple[Pod, ...]]:
        if self.shown is not None:
            return self.shown
        p = self.policy
        rules: list[TierRule] = []
        host: list[TierHostRule] = []
        local = self.local_sorted()
        for r in self.rules:
            for part in r.parts:
                if part.n is None:
                    continue
                mine = part.local if part.local is not None else local
                rules.append(TierRule(part.n, p.name, p.tier, p.priority, r.direction, r.index, r.rule.name,
                                      r.rule.action, tuple(q.key for q in mine), part.tag))
                if mine:
                    host.append(TierHostRule(part.n, p.tier, r.direction, r.rule.action,
                                             tuple(ip for q in mine for ip in q.ips), part.sorted_peers(), part.ports))
        self.shown = (rules, host, local)
        return self.shown


@dataclass(frozen=True)
class TierChanges:
    """ClusterNetworkPolicies by name and Nodes by name as they are now (None: gone)."""

    policies: Mapping[str, ClusterPolicy | None]
    nodes: Mapping[str, NodeInfo | None]

    def __bool__(self) -> bool:
        return bool(self.policies or self.nodes)


class TierPlanner:
    """The tiers' plan of one Node, event by event (see the module)."""

    def __init__(self, facts: Facts, ids: ConjIds | None = None) -> None:
        self.facts = facts
        self.ids = ids if ids is not None else ConjIds(FIRST_CONJ_ID)
        self.version = 0
        self.events = 0
        self._reset()

    def _reset(self) -> None:
        self.pods: dict[str, Pod] = {}
        self.by_ns: dict[str, dict[str, Pod]] = {}
        self.namespaces: dict[str, tuple[tuple[str, str], ...]] = {}
        self._ns_labels: dict[str, dict[str, str]] = {}
        self.nodes: dict[str, NodeInfo] = {}
        self.policies: dict[str, PolicyState] = {}
        self._node_policies: set[str] = set()  # those with a ``nodes`` peer
        self._subject_index: dict[str, set[str]] = {}  # namespace -> policies whose subject may pick from it
        self._peer_index: dict[str, set[str]] = {}  # namespace -> policies whose pod peers may
        self._flows = MergedFlows(self.ids.cookies)
        self._delta_from: bool | None = None  # whether flows were out at the last take_flow_delta (None: not known)
        self._touched: dict[int, PartState] = {}
        self._named_dirty: dict[int, RuleState] = {}
        self._releasing: set[str] = set()
        self._services: tuple[FlowKey, ...] = ()
        self._snapshot: tuple[int, TierPlan] | None = None

    # -- what it holds -------------------------------------------------------------------------
    def inputs(self) -> Inputs:
        """What it holds, as the full planner takes it."""
        return Inputs(tuple(sorted(self.pods.values(), key=pod_key)), dict(self.namespaces),
                      tuple(sorted((ps.policy for ps in self.policies.values()), key=lambda p: p.name)),
                      tuple(sorted(self.nodes.values(), key=lambda n: n.name)))

    def load(self, inputs: Inputs) -> None:
        """Everything again from ``inputs`` (a start, a repair); ids of what is gone released."""
        self._reset()
        self.version += 1
        for name, labels in inputs.namespaces.items():
            self.namespaces[name] = labels
            self._ns_labels[name] = dict(labels)
        for pod in inputs.pods:
            self.pods[pod.key] = pod
            self.by_ns.setdefault(pod.namespace, {})[pod.key] = pod
        self.nodes = {n.name: n for n in inputs.nodes}
        for policy in sorted(inputs.policies, key=order):
            self._add_policy(policy)
        self._commit()
        used = {part.key for ps in self.policies.values() for r in ps.rules for part in r.parts if part.n is not None}
        for key in self.ids.held():
            if key not in used:
                self.ids.release(key)

    def set_facts(self, facts: Facts) -> None:
        if facts == self.facts:
            return
        node_moved = (facts.node != self.facts.node or facts.denied_log != self.facts.denied_log
                      or facts.remote_egress != self.facts.remote_egress)
        self.facts = facts
        if node_moved:
            self.load(self.inputs())
        else:
            self.version += 1
            self._commit()

    # -- events --------------------------------------------------------------------------------
    def apply(self, changes: Changes) -> None:
        """The Pods and Namespaces of NetworkPolicy's journal (its policies are not ours)."""
        for name, labels in changes.namespaces.items():
            self.namespace_event(name, labels)
        for key, pod in changes.pods.items():
            self.pod_event(key, pod)

    def apply_tiers(self, changes: TierChanges) -> None:
        for name, node in changes.nodes.items():
            self.node_event(name, node)
        for name, policy in changes.policies.items():
            self.policy_event(name, policy)

    def sync(self, inputs: Inputs) -> tuple[Changes, TierChanges]:
        """What differs between what it holds and ``inputs``, applied: the objects that moved."""
        pods = {p.key: p for p in inputs.pods}
        moved = Changes({k: pods.get(k) for k in self.pods.keys() | pods.keys() if self.pods.get(k) != pods.get(k)},
                        {k: inputs.namespaces.get(k) for k in self.namespaces.keys() | inputs.namespaces.keys()
                         if self.namespaces.get(k) != inputs.namespaces.get(k)})
        self.apply(moved)
        return moved, self.sync_tiers(inputs.policies, inputs.nodes)

    def sync_tiers(self, policies: Iterable[ClusterPolicy], nodes: Iterable[NodeInfo]) -> TierChanges:
        """The policies and Nodes as the watch holds them now: what moved, applied."""
        want_p = {p.name: p for p in policies}
        want_n = {n.name: n for n in nodes}
        held = {k: ps.policy for k, ps in self.policies.items()}
        out = TierChanges({k: want_p.get(k) for k in held.keys() | want_p.keys()
                           if not _same(held.get(k), want_p.get(k))},
                          {k: want_n.get(k) for k in self.nodes.keys() | want_n.keys()
                           if self.nodes.get(k) != want_n.get(k)})
        self.apply_tiers(out)
        return out

    def pod_event(self, key: str, new: Pod | None) -> None:
        self.events += 1
        old = self.pods.get(key)
        if old == new:
            return
        self.version += 1
        ns = (new or old).namespace  # type: ignore[union-attr]
        affected = self._affected(ns)
        present = self._present(ns)
        if new is None:
            del self.pods[key]
            del self.by_ns[ns][key]
            if not self.by_ns[ns]:
                del self.by_ns[ns]
        else:
            self.pods[key] = new
            self.by_ns.setdefault(ns, {})[key] = new
        if self._present(ns) != present:
            self._namespace_moved(ns)
            affected |= self._affected(ns)
        for ps in self._ordered(affected):
            self._evaluate(ps, key, new)
        self._commit()

    def namespace_event(self, name: str, labels: tuple[tuple[str, str], ...] | None) -> None:
        self.events += 1
        if self.namespaces.get(name) == labels:
            return
        self.version += 1
        if labels is None:
            self.namespaces.pop(name, None)
            self._ns_labels.pop(name, None)
        else:
            self.namespaces[name] = labels
            self._ns_labels[name] = dict(labels)
        self._namespace_moved(name)
        self._commit()

    def node_event(self, name: str, node: NodeInfo | None) -> None:
        self.events += 1
        old = self.nodes.get(name)
        if old == node:
            return
        self.version += 1
        if node is None:
            del self.nodes[name]
        else:
            self.nodes[name] = node
        for ps in self._ordered(self._node_policies):
            for r in ps.rules:
                if not r.node_peers:
                    continue
                if r.named:
                    self._named_dirty[id(r)] = r
                    continue
                part = r.parts[0] if r.parts else None
                if part is None:
                    continue
                for addr in _node_addresses(r, node):
                    self._peer(part, addr, 1)
                for addr in _node_addresses(r, old):
                    self._peer(part, addr, -1)
        self._commit()

    def policy_event(self, name: str, policy: ClusterPolicy | None) -> None:
        self.events += 1
        old = self.policies.get(name)
        if _same(old.policy if old else None, policy):
            return
        self.version += 1
        if old is not None:
            self._remove_policy(old)
        if policy is not None:
            self._add_policy(policy)
        self._commit()

    # -- the plan ------------------------------------------------------------------------------
    def snapshot(self) -> TierPlan:
        """Everything the daemon, the report and the host's judge read, as the full planner
        gives it (taken again only after a change)."""
        snap = self._snapshot
        if snap is not None and snap[0] == self.version:
            return snap[1]
        out = TierPlan()
        if self.policies:
            out.flows = self._flows.flows()
            for ps in self._ordered(self.policies):
                out.errors += [f"{ps.policy.name}: {e}" for e in ps.policy.errors]
                rules, host, local = ps.show()
                for pod in local:
                    out.tiers_of.setdefault(pod.key, []).append(ps.label)
                out.rules += rules
                out.host_rules += host
            out.subject_namespaces = sorted(ns for ns, held in self._subject_index.items() if held)
        else:
            self._flows.flows()  # forget what was dirty: nothing is installed without a policy
        self._snapshot = (self.version, out)
        return out

    def take_flow_delta(self) -> tuple[list[Flow], list[Flow]] | None:
        """The flows of :meth:`snapshot` added and removed since the last call, None when not
        known (the first call after a load: compare them whole).  Without a policy a snapshot has
        no flow, so a first policy or the last one gone is not known either."""
        self.snapshot()
        out = self._flows.take_delta()
        out_now = bool(self.policies)
        since, self._delta_from = self._delta_from, out_now
        if since is None or since != out_now:
            return None
        return out if out_now else ([], [])

    # -- PodLookup, for the named-port rules' parts (.plan.Select) ----------------------------
    def namespace_names(self, selector: sel.Selector) -> tuple[str, ...]:
        return tuple(sorted(n for n in self._universe() if selector.matches(self._ns_labels.get(n, {}))))

    def in_namespace(self, ns: str, selector: sel.Selector) -> Sequence[Pod]:
        return [p for p in self.by_ns.get(ns, {}).values() if selector.matches(dict(p.labels))]

    # -- internals -----------------------------------------------------------------------------
    def _universe(self) -> set[str]:
        return set(self.namespaces) | set(self.by_ns)

    def _present(self, ns: str) -> bool:
        return ns in self.namespaces or ns in self.by_ns

    def _affected(self, ns: str) -> set[str]:
        return self._subject_index.get(ns, set()) | self._peer_index.get(ns, set())

    def _ordered(self, names: Iterable[str]) -> list[PolicyState]:
        return sorted((self.policies[n] for n in names if n in self.policies), key=lambda ps: ps.order)

    def _ns_selections(self, ps: PolicyState, ns: str) -> bool:
        """Each of ``ps``'s Namespace selections against ``ns`` as it is now; True if one moved."""
        present = self._present(ns)
        labels = self._ns_labels.get(ns, {})
        moved = False
        want = present and ps.policy.subject.namespaces.matches(labels)
        if want != (ns in ps.subject_ns):
            moved = True
            if want:
                ps.subject_ns.add(ns)
                self._subject_index.setdefault(ns, set()).add(ps.policy.name)
            else:
                ps.subject_ns.discard(ns)
                _discard(self._subject_index, ns, ps.policy.name)
        peer_any = False
        for r in ps.rules:
            for selection, nss in r.pod_peers:
                want = present and selection.namespaces.matches(labels)
                if want != (ns in nss):
                    moved = True
                    (nss.add if want else nss.discard)(ns)
                peer_any = peer_any or ns in nss
        if peer_any:
            self._peer_index.setdefault(ns, set()).add(ps.policy.name)
        else:
            _discard(self._peer_index, ns, ps.policy.name)
        return moved

    def _namespace_moved(self, ns: str) -> None:
        for ps in self._ordered(self.policies):
            if self._ns_selections(ps, ns):
                for key, pod in list(self.by_ns.get(ns, {}).items()):
                    self._evaluate(ps, key, pod)

    def _evaluate(self, ps: PolicyState, key: str, pod: Pod | None) -> None:
        """``pod`` (None: gone) as a subject and a peer of ``ps``, against how it was held."""
        labels = dict(pod.labels) if pod is not None else {}
        subject = ps.policy.subject
        want = pod if pod is not None and pod.namespace in ps.subject_ns and (
            subject.pods is None or subject.pods.matches(labels)) else None
        prev = ps.subjects.get(key)
        here = self.facts.node
        if prev != want:
            ps.shown = None
            if want is None:
                del ps.subjects[key]
            else:
                ps.subjects[key] = want
            was_local, is_local = prev is not None and prev.node == here, want is not None and want.node == here
            if is_local:
                ps.local[key] = want  # type: ignore[assignment]
            else:
                ps.local.pop(key, None)
            for r in ps.rules:
                if r.named:
                    self._named_dirty[id(r)] = r
                    continue
                part = r.main
                if part is None:
                    continue
                every = r.egress and self.facts.remote_egress  # applies to remote subjects too
                if every or is_local:
                    for ip in want.ips if want is not None else ():
                        self._applied(part, ip, 1)
                if every or was_local:
                    for ip in prev.ips if prev is not None else ():
                        self._applied(part, ip, -1)
        for r in ps.rules:
            if not r.pod_peers:
                continue
            member = pod if pod is not None and any(
                pod.namespace in nss and (s.pods is None or s.pods.matches(labels)) for s, nss in r.pod_peers) else None
            before = r.members.get(key)
            if before == member:
                continue
            ps.shown = None
            if member is None:
                del r.members[key]
            else:
                r.members[key] = member
            if r.named:
                self._named_dirty[id(r)] = r
                continue
            part = r.main
            if part is None:
                continue
            for ip in member.ips if member is not None else ():
                self._peer(part, ip, 1)
            for ip in before.ips if before is not None else ():
                self._peer(part, ip, -1)

    def _add_policy(self, policy: ClusterPolicy) -> None:
        ps = self.policies[policy.name] = PolicyState(policy, self.facts.denied_log)
        if any(r.node_peers for r in ps.rules):
            self._node_policies.add(policy.name)
        for ns in self._universe():
            self._ns_selections(ps, ns)
        nss = ps.subject_ns | {ns for r in ps.rules for _s, n in r.pod_peers for ns in n}
        for r in ps.rules:
            part = r.main
            if part is not None:
                for addr in r.networks:
                    self._peer(part, addr, 1)
                for node in self.nodes.values():
                    for addr in _node_addresses(r, node):
                        self._peer(part, addr, 1)
            if r.named:
                self._named_dirty[id(r)] = r
        for ns in sorted(nss):
            for key, pod in self.by_ns.get(ns, {}).items():
                self._evaluate(ps, key, pod)

    def _remove_policy(self, ps: PolicyState) -> None:
        name = ps.policy.name
        for r in ps.rules:
            for part in r.parts:
                self._destroy(part)
            self._named_dirty.pop(id(r), None)
        for index in (self._subject_index, self._peer_index):
            for ns in [ns for ns, held in index.items() if name in held]:
                _discard(index, ns, name)
        del self.policies[name]
        self._node_policies.discard(name)

    def _applied(self, part: PartState, addr: str, d: int) -> None:
        part.rule.policy.shown = None
        n = part.applied.get(addr, 0) + d
        if n > 0:
            part.applied[addr] = n
        else:
            del part.applied[addr]
        if part.n is not None and (n == 0 or n == d):
            r = part.rule
            self._flows.address(r.table, r.prio, addr, r.egress, Conjunction(part.n, 1, part.clauses), 1 if n else -1)
        self._touched[id(part)] = part

    def _peer(self, part: PartState, addr: str, d: int) -> None:
        peers = part.peers
        if peers is None:
            return
        part.rule.policy.shown = None
        n = peers.get(addr, 0) + d
        if n > 0:
            peers[addr] = n
        else:
            del peers[addr]
        if n == 0 or n == d:
            part.peer_moved(addr, n > 0)
            if part.n is not None:
                r = part.rule
                self._flows.address(r.table, r.prio, addr, not r.egress, Conjunction(part.n, 2, part.clauses),
                                    1 if n else -1)
        self._touched[id(part)] = part

    def _emit(self, part: PartState, d: int) -> None:
        """Every flow of ``part``'s conjunction, added (1) or removed (-1)."""
        r, n, c = part.rule, part.n, part.clauses
        assert n is not None
        fl = self._flows
        for addr in part.applied:
            fl.address(r.table, r.prio, addr, r.egress, Conjunction(n, 1, c), d)
        if part.peers is None:
            for proto in (IP, IPV6):
                fl.conjunction((r.table, r.prio, _text((proto,))), (proto,), Conjunction(n, 2, c), d)
        else:
            for addr in part.peers:
                fl.address(r.table, r.prio, addr, not r.egress, Conjunction(n, 2, c), d)
        if part.ports is not None:
            for match in port_matches(part.ports):
                fl.conjunction((r.table, r.prio, _text(match)), match, Conjunction(n, 3, c), d)
        match = (m.CONJ_ID(n),)
        fl.terminal((r.table, r.prio, _text(match)), match, r.then if d > 0 else None)

    def _settle(self, part: PartState) -> None:
        part.rule.policy.shown = None
        if part.wanted() and part.n is None:
            key = part.key
            self._releasing.discard(key)
            part.n = self.ids.acquire(key)
            self._emit(part, 1)
        elif not part.wanted() and part.n is not None:
            self._destroy(part)

    def _destroy(self, part: PartState) -> None:
        part.rule.policy.shown = None
        if part.n is not None:
            self._emit(part, -1)
            part.n = None
            self._releasing.add(part.key)

    def _replan_named(self, r: RuleState) -> None:
        """A named-port rule's parts again (:func:`.plan.parts`), each moved by what differs."""
        ps = r.policy
        applied = (tuple(sorted(ps.subjects.values(), key=pod_key)) if r.egress and self.facts.remote_egress
                   else ps.local_sorted())
        fresh = parts(r.direction, r.rule, applied, Select(_Lookup(self), self.nodes_sorted())) if applied else []
        old = {part.tag: part for part in r.parts}
        here = self.facts.node
        out: list[PartState] = []
        for p in fresh:
            state = old.pop(p.tag, None)
            if state is not None and (state.ports != p.ports or (state.peers is None) != (p.peers is None)):
                self._destroy(state)
                state = None
            if state is None:
                state = PartState(r, p.tag, p.ports, p.peers is None)
            self._set(state, _counts(ip for pod in p.applied for ip in pod.ips),
                      None if p.peers is None else _counts(p.peers))
            state.local = tuple(q for q in p.applied if q.node == here)
            out.append(state)
        for state in old.values():
            self._destroy(state)
        r.parts = out
        ps.shown = None

    def _set(self, part: PartState, applied: dict[str, int], peers: dict[str, int] | None) -> None:
        for addr in applied.keys() - part.applied.keys():
            self._applied(part, addr, applied[addr])
        for addr in part.applied.keys() - applied.keys():
            self._applied(part, addr, -part.applied[addr])
        if peers is not None and part.peers is not None:
            for addr in peers.keys() - part.peers.keys():
                self._peer(part, addr, peers[addr])
            for addr in part.peers.keys() - peers.keys():
                self._peer(part, addr, -part.peers[addr])
        self._touched[id(part)] = part

    def nodes_sorted(self) -> tuple[NodeInfo, ...]:
        return tuple(sorted(self.nodes.values(), key=lambda n: n.name))

    def _commit(self) -> None:
        while self._named_dirty:
            _k, r = self._named_dirty.popitem()
            if r.policy.policy.name in self.policies and self.policies[r.policy.policy.name] is r.policy:
                self._replan_named(r)
        for part in self._touched.values():
            if part.rule.policy.policy.name in self.policies and part in part.rule.parts:
                self._settle(part)
        self._touched = {}
        self._services_now()
        for key in self._releasing:
            self.ids.release(key)
        self._releasing = set()

    def _services_now(self) -> None:
        """Egress to a Service CIDR skips the tiers while there is a policy (.plan)."""
        want: list[FlowKey] = []
        if self.policies:
            for cidr in self.facts.service_cidrs:
                match, text = self._flows.addresses.match(block_text(ipaddress.ip_network(cidr, strict=False)), False)
                key = (int(Table.EGRESS_ADMIN), EgressAdmin.SERVICE, text)
                want.append(key)
                if key not in self._services:
                    self._flows.terminal(key, match, to_service_cidr())
        for key in self._services:
            if key not in want:
                self._flows.terminal(key, (), None)
        self._services = tuple(want)


class _Lookup:
    """The planner's live index as :class:`.plan.PodLookup` reads it."""

    def __init__(self, planner: TierPlanner) -> None:
        self._planner = planner

    def namespaces(self, selector: sel.Selector) -> tuple[str, ...]:
        return self._planner.namespace_names(selector)

    def in_namespace(self, ns: str, selector: sel.Selector) -> Sequence[Pod]:
        return self._planner.in_namespace(ns, selector)


def _same(a: ClusterPolicy | None, b: ClusterPolicy | None) -> bool:
    return a == b and (a is None or b is None or a.errors == b.errors)


def _discard(index: dict[str, set[str]], ns: str, name: str) -> None:
    held = index.get(ns)
    if held is not None:
        held.discard(name)
        if not held:
            del index[ns]


def _node_addresses(r: RuleState, node: NodeInfo | None) -> list[str]:
    if node is None:
        return []
    labels = dict(node.labels)
    return [a for s in r.node_peers if s.matches(labels) for a in node.addresses]


def _counts(addrs: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in addrs:
        out[a] = out.get(a, 0) + 1
    return out
