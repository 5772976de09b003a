"""One Node's NetworkPolicy flows kept up to date event by event: what :func:`.plan.plan` computes
from scratch, held as indexed state that a Pod, Namespace or policy event changes in proportion
to what it touches.

The plan is a merge of *contributions*: each conjunction (a rule, or one named-port group of it;
a remote client's rule; the remote isolation) puts one ``conjunction()`` action on each flow of
its clauses and a terminal action on its ``conj_id`` flow; each local Pod its isolation drops
and denied-log flows; the Node its host and Service flows.  A flow, keyed by (table, priority,
match text) as :class:`.plan` keys it, is the multiset of the conjunction actions on it (or, for
a terminal flow, its first writer's actions, in the full planner's order).  The sets a clause is
made of are reference-counted address sets (:class:`AddrSet`): the Pods a policy applies to
here (``applied``) or remotely (``remote``), a rule's peers (blocks and the Pods its selectors
pick), a named port's group; a set that gains or loses an address tells the conjunctions built
on it, which add or remove that one action.  A conjunction exists while each of its clauses is
non-empty; its id comes from :class:`.plan.ConjIds` by its identity, so the full planner run on
the same ids gives the same numbers (the differential test does that after every event).

Indexes make an event's cost follow what it touches: Pods by namespace, label and address;
policies by namespace; the selector peers of the rules in force here by the namespace they may
pick from (a fixed one, or the namespaces a ``namespaceSelector`` matches, kept per selector);
a rule's state (its peers' members, its named-port groups) exists only while the policy applies
to some Pod (here, or remotely for egress): so a Pod event evaluates the selectors of its
namespace's policies and of the peers that may pick it, and changes the flows of the
conjunctions whose clauses it enters or leaves.  Two things rebuild everything, as the full
planner would: other :class:`.plan.NodeFacts`, and this Node gaining its first or losing its
last Pod (what remote Pods are judged here depends on it).

Everything the daemon and the host's judge read of a :class:`.plan.Plan` is kept too
(:meth:`IncrementalPlanner.snapshot`), and the flows that changed since the last
:meth:`IncrementalPlanner.take_delta`.  Inputs are taken as the watch delivers them: the same
object again, or an older one after a newer one, is just another upsert; a delete of what is not
there is nothing."""

from __future__ import annotations

import bisect
import ipaddress
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any

from cni.pipeline import match as m
from cni.pipeline.actions import DROP, Conjunction, Controller, goto
from cni.pipeline.match import IP, IPV6
from cni.pipeline.services import to_service_cidr
from cni.pipeline.tables import (
    DENIED_LOG_METER,
    EgressDefault,
    EgressRule,
    Flow,
    IngressDefault,
    IngressRule,
    Table,
    policy_cookie,
)

from . import deniedlog
from . import selector as sel
from .model import Pod, Policy, Rule
from .plan import (
    DENIED_LOG_MAX_LEN,
    EGRESS,
    INGRESS,
    REMOTE_ISOLATION_KEY,
    Addresses,
    ConjIds,
    HostRule,
    Inputs,
    NodeFacts,
    Plan,
    RuleInfo,
    block_text,
    port_matches,
)
from .ranges import block_minus

if TYPE_CHECKING:
    from cni.pipeline.actions import Action

    # a terminal contribution: table, priority, match, text, order (first writer: the smallest), actions
    Terminal = tuple[int, int, tuple[m.MatchItem, ...], str, str, tuple[Action, ...]]

FlowKey = tuple[int, int, str]  # (table, priority, match text): a flow's identity
Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Changes:
    """Objects by key as they are now (None: gone), as the watches deliver them: Pods and
    policies by namespace/name, Namespaces by name with their labels."""

    pods: Mapping[str, Pod | None] = field(default_factory=dict)
    namespaces: Mapping[str, Labels | None] = field(default_factory=dict)
    policies: Mapping[str, Policy | None] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.pods or self.namespaces or self.policies)

    def describe(self, most: int = 5) -> str:
        out = []
        for kind, d in (("Pods", self.pods), ("Namespaces", self.namespaces), ("policies", self.policies)):
            if d:
                keys = sorted(d)
                out.append(f"{len(d)} {kind} ({', '.join(keys[:most])}{', ...' if len(keys) > most else ''})")
        return "; ".join(out) or "nothing"
View = tuple[Pod, bool, bool]  # a Pod, whether it is local, whether its egress may be judged here


@dataclass(frozen=True)
class FlowDelta:
    """The flows that changed: ``removed`` as they were, ``added`` as they are (a changed flow
    is in both)."""

    added: tuple[Flow, ...] = ()
    removed: tuple[Flow, ...] = ()

    def __len__(self) -> int:
        return len(self.added) + len(self.removed)


class AddrSet:
    """A multiset of addresses (or block texts); each change is told to the conjunctions built
    on it (``subs``: (part, clause))."""

    __slots__ = ("count", "subs")

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.subs: list[tuple[Part, int]] = []

    def add(self, addr: str) -> None:
        c = self.count.get(addr, 0)
        self.count[addr] = c + 1
        for part, role in self.subs:
            part.changed(role, addr, 1, c == 0)

    def remove(self, addr: str) -> None:
        c = self.count[addr]
        if c == 1:
            del self.count[addr]
        else:
            self.count[addr] = c - 1
        for part, role in self.subs:
            part.changed(role, addr, -1, c == 1)

    def unsubscribe(self, part: Part, role: int) -> None:
        self.subs.remove((part, role))


class Part:
    """One conjunction: clause 1 ``a`` (the Pods it applies to; each address once per Pod
    holding it, ``a_multi``, or once), clause 2 ``b`` (its peers, each once; None: one ``ip`` and
    one ``ipv6`` flow), clause 3 its port flows (none: 2 clauses), and its terminal flows
    (``terminals(id)``).  ``mult``: the same conjunction listed that many times (a rule naming
    one port twice), as the full planner adds it."""

    __slots__ = (
        "a",
        "a_multi",
        "b",
        "clauses",
        "conjs",
        "key",
        "mult",
        "n",
        "owner",
        "pl",
        "ports",
        "prio",
        "src",
        "table",
        "terminals",
    )

    def __init__(self, pl: IncrementalPlanner, owner: RuleState | None, key: str, table: int, prio: int,
                 a: AddrSet, a_multi: bool, src: bool, b: AddrSet | None,
                 ports: list[tuple[tuple[m.MatchItem, ...], str]] | None,
                 terminals: Callable[[int], list[tuple[int, int, tuple[m.MatchItem, ...], tuple[Action, ...]]]],
                 mult: int = 1) -> None:
        self.pl, self.owner, self.key, self.table, self.prio = pl, owner, key, table, prio
        self.a, self.a_multi, self.src, self.b, self.ports = a, a_multi, src, b, ports
        self.terminals, self.mult = terminals, mult
        self.clauses = 3 if ports is not None else 2
        self.n: int | None = None
        self.conjs: tuple[Conjunction, ...] = ()
        a.subs.append((self, 1))
        if b is not None:
            b.subs.append((self, 2))

    def exists(self) -> bool:
        return bool(self.a.count) and (self.b is None or bool(self.b.count))

    def changed(self, role: int, addr: str, d: int, flip: bool) -> None:
        if not flip and (role == 2 or not self.a_multi):
            return
        if self.n is None:
            if self.exists():
                self._create()
            return
        if self.owner is not None:
            self.owner.version += 1
        if self.exists():
            self._addr(role, addr, d)
        else:  # that clause's last address just went
            self._addr(role, addr, -1)
            self._emit(-1, skip=role)
            self._drop()

    def refresh(self) -> None:
        if self.n is None and self.exists():
            self._create()

    def destroy(self) -> None:
        if self.n is not None:
            self._emit(-1)
            self._drop()

    def detach(self) -> None:
        self.destroy()
        self.a.unsubscribe(self, 1)
        if self.b is not None:
            self.b.unsubscribe(self, 2)

    def _create(self) -> None:
        n = self.n = self.pl.ref_id(self.key)
        self.conjs = tuple(self.pl.conj(n, c, self.clauses) for c in range(1, self.clauses + 1))
        if self.owner is not None:
            self.owner.version += 1
        self._emit(1)

    def _drop(self) -> None:
        self.pl.unref_id(self.key)
        self.n = None
        if self.owner is not None:
            self.owner.version += 1

    def _addr(self, role: int, addr: str, d: int) -> None:
        src = self.src if role == 1 else not self.src
        self.pl.conj_addr(self.table, self.prio, addr, src, self.conjs[role - 1], d * self.mult)

    def _emit(self, sign: int, skip: int = 0) -> None:
        pl, table, prio, mult = self.pl, self.table, self.prio, self.mult
        assert self.n is not None
        if skip != 1:
            c1 = self.conjs[0]
            for addr, c in self.a.count.items():
                pl.conj_addr(table, prio, addr, self.src, c1, (c if self.a_multi else 1) * mult * sign)
        if skip != 2:
            c2 = self.conjs[1]
            if self.b is None:
                for match, text in pl.any_peer:
                    pl.conj_match(table, prio, match, text, c2, mult * sign)
            else:
                for addr in self.b.count:
                    pl.conj_addr(table, prio, addr, not self.src, c2, mult * sign)
        if self.ports is not None:
            c3 = self.conjs[2]
            for pm, text in self.ports:
                pl.conj_match(table, prio, pm, text, c3, mult * sign)
        for t, p, tm, actions in self.terminals(self.n):
            pl.terminal(t, p, tm, m.match_text(tm), "", actions, mult * sign)


class _Group:
    """A named port's Pods that give it one number: its addresses and its conjunction."""

    __slots__ = ("addrs", "part", "pods")

    def __init__(self) -> None:
        self.pods: dict[str, Pod] = {}
        self.addrs = AddrSet()
        self.part: Part | None = None


class _NsSelector:
    """A ``namespaceSelector`` of the rules in force: the namespaces it matches, and its peers
    (local variants: every Pod; remote variants: this Node's only)."""

    __slots__ = ("local_peers", "matched", "peers", "selector")

    def __init__(self, selector: sel.Selector) -> None:
        self.selector = selector
        self.matched: set[str] = set()
        self.peers: set[tuple[RuleState, int]] = set()
        self.local_peers: set[tuple[RuleState, int]] = set()


_conj_key = operator.attrgetter("id", "clause")  # conj_order's key, in C


def _same_actions(a: tuple[Action, ...], b: tuple[Action, ...]) -> bool:
    """Two flows of one key are the same when their actions are (table, priority, match and
    cookie follow from the key).  Conjunctions come from :meth:`IncrementalPlanner.conj`, one
    object per value, so two lists of them are equal when they are the same objects: no record
    equality (a policy edit changes thousands of flows of the same length).  Should that fail (its
    memo dropped), a flow is written again as it was: never one left out."""
    if len(a) != len(b):
        return False
    if all(map(operator.is_, a, b)):
        return True
    if a and type(a[0]) is Conjunction and type(b[0]) is Conjunction:
        return False
    return a == b


def _policy_state(p: Policy | None) -> tuple[Policy, tuple[str, ...]] | None:
    return None if p is None else (p, p.errors)


def _pod_order(p: Pod) -> str:
    return p.key


def _peer_order(p: Pod) -> tuple[str, str]:
    return (p.namespace, p.name)  # = (namespace, key): the full planner's order of a peer's Pods


class RuleState:
    """One rule of a policy in force: local (its Pods here) or remote (a remote client's egress,
    judged here: its peers this Node's Pods), with its peers' members, its named-port groups and
    its conjunctions."""

    def __init__(self, pl: IncrementalPlanner, ps: PolicyState, direction: str, index: int, rule: Rule,
                 remote: bool) -> None:
        self.pl, self.ps, self.direction, self.index, self.rule, self.remote = pl, ps, direction, index, rule, remote
        self.closed = False
        self._version = 0
        self._info: tuple[int, list[RuleInfo], list[HostRule]] | None = None
        self.a = ps.ra if remote else ps.a
        self.applied = ps.remote if remote else ps.applied
        policy = ps.policy
        ingress = direction == INGRESS
        self.key = f"{policy.key}|{direction}{'-remote' if remote else ''}|{index}|"
        self.table = int(Table.INGRESS_RULE if ingress else Table.EGRESS_RULE)
        self.prio = int(IngressRule.CONJ if ingress else EgressRule.CONJ)
        self.then: tuple[Action, ...] = (goto(Table.CONNTRACK_COMMIT) if ingress else goto(Table.INGRESS_ADMIN),)
        self.src = not ingress  # the Pods it applies to are the sources (egress)
        numeric = [(p.protocol, p.port if isinstance(p.port, int) else None, p.end_port)
                   for p in rule.ports if not isinstance(p.port, str)]
        # each (name, protocol) once, as the full planner takes them
        self.named = list(dict.fromkeys((p.port, p.protocol) for p in rule.ports if isinstance(p.port, str)))
        self.mult: dict[tuple[str, str], int] = {}
        for name_proto in self.named:
            self.mult[name_proto] = self.mult.get(name_proto, 0) + 1
        self.groups: dict[tuple[str, str], dict[int, _Group]] = {k: {} for k in self.mult}
        self.cand: dict[str, list[Any]] = {}  # egress named ports: candidate Pod -> [peers holding it, Pod]
        self.all_candidates = bool(self.named) and not ingress and rule.peers is None
        self.b: AddrSet | None = None
        self.members: list[dict[str, Pod] | None] = []
        # peer -> its members in the full planner's order: their orders and their addresses, made at
        # the first look and then kept by bisection (a snapshot joins them without sorting again)
        self._sorted: dict[int, tuple[list[tuple[str, str]], list[tuple[str, ...]]]] = {}
        self.blocks: list[tuple[str, ...]] = []
        if rule.peers is not None:
            b = self.b = AddrSet()
            for k, peer in enumerate(rule.peers):
                if peer.ip_block is not None:
                    prefixes = pl.block(peer.ip_block.cidr, peer.ip_block.excepts)
                    self.blocks.append(prefixes)
                    self.members.append(None)
                    for t in prefixes:
                        b.add(t)
                    continue
                self.blocks.append(())
                mem: dict[str, Pod] = {}
                self.members.append(mem)
                for pod in pl.register_peer(self, k):
                    mem[pod.key] = pod
                    for ip in pod.ips:
                        b.add(ip)
        self.np: Part | None = None
        if not rule.ports or numeric:
            ports = tuple(numeric) if rule.ports else None
            self.np_ports = ports
            self.np = Part(pl, self, self.key, self.table, self.prio, self.a, True, self.src, self.b,
                           pl.port_flows(ports), self.terminals)
        if self.named:
            if ingress:
                for pod in self.applied.values():
                    self._group_change(None, pod)
            elif self.all_candidates:
                pl.register_all(self)
                for pod in (pl.local if remote else pl.pods).values():
                    self._group_change(None, pod)
            else:
                for mem_ in self.members:
                    for pod in (mem_ or {}).values():
                        self._cand(None, pod, 1)
        if self.np is not None:
            self.np.refresh()

    @property
    def version(self) -> int:
        """Moves whenever what :meth:`infos` lists may have moved."""
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        self._version = value
        if self.remote:
            self.ps.remote_infos_kept = None
        else:
            self.ps.local_infos_kept = None

    def terminals(self, n: int) -> list[tuple[int, int, tuple[m.MatchItem, ...], tuple[Action, ...]]]:
        return [(self.table, self.prio, (m.CONJ_ID(n),), self.then)]

    def parts(self) -> list[Part]:
        out = [self.np] if self.np is not None else []
        out += [g.part for groups in self.groups.values() for g in groups.values() if g.part is not None]
        return out

    def close(self) -> None:
        self.closed = True
        for p in self.parts():
            p.detach()
        self.groups = {k: {} for k in self.mult}
        self.pl.unregister(self)

    # -- changes -------------------------------------------------------------------------------
    def peer_change(self, k: int, old: Pod | None, new: Pod | None) -> None:
        """A Pod entered (``old`` None), left (``new`` None) or changed in peer ``k``'s members."""
        self.version += 1
        order = self._sorted.get(k)
        if order is not None:
            keys, ips = order
            if old is not None:
                o = _peer_order(old)
                i = bisect.bisect_left(keys, o)
                if i < len(keys) and keys[i] == o:
                    del keys[i]
                    del ips[i]
            if new is not None:
                o = _peer_order(new)
                i = bisect.bisect_left(keys, o)
                keys.insert(i, o)
                ips.insert(i, new.ips)
        mem = self.members[k]
        assert mem is not None and self.b is not None
        b = self.b
        if new is not None:
            mem[new.key] = new
            for ip in new.ips:
                b.add(ip)
        if old is not None:
            for ip in old.ips:
                b.remove(ip)
            if new is None:
                del mem[old.key]
        if self.named and self.direction == EGRESS:
            self._cand(old, new, (new is not None) - (old is not None))

    def _cand(self, old: Pod | None, new: Pod | None, delta: int) -> None:
        key = (new or old).key  # type: ignore[union-attr]
        entry = self.cand.get(key)
        before = entry[1] if entry is not None else None
        if entry is None:
            entry = self.cand[key] = [0, None]
        entry[0] += delta
        if new is not None:
            entry[1] = new
        after = entry[1] if entry[0] > 0 else None
        if entry[0] <= 0:
            del self.cand[key]
        if before is not after:
            self._group_change(before, after)

    def all_change(self, old: Pod | None, new: Pod | None) -> None:
        """Egress named ports without peers: every Pod (here only, remote) is a candidate."""
        self.version += 1
        self._group_change(old, new)

    def applied_change(self, old: Pod | None, new: Pod | None) -> None:
        """A Pod it applies to entered, left or changed (its addresses: through ``self.a``)."""
        self.version += 1
        if self.named and self.direction == INGRESS:
            self._group_change(old, new)

    def _group_change(self, old: Pod | None, new: Pod | None) -> None:
        ingress = self.direction == INGRESS
        for (name, proto), groups in self.groups.items():
            on = old.port_number(name, proto) if old is not None else None
            nn = new.port_number(name, proto) if new is not None else None
            if new is not None and nn is not None:
                g = groups.get(nn)
                if g is None:
                    g = groups[nn] = _Group()
                    tag = f"{name}={nn}/{proto}"
                    ports = self.pl.port_flows(((proto, nn, None),))
                    mult = self.mult[(name, proto)]
                    if ingress:
                        g.part = Part(self.pl, self, self.key + tag, self.table, self.prio, g.addrs, True, self.src,
                                      self.b, ports, self.terminals, mult)
                    else:
                        g.part = Part(self.pl, self, self.key + tag, self.table, self.prio, self.a, True, self.src,
                                      g.addrs, ports, self.terminals, mult)
                    self.version += 1
                g.pods[new.key] = new
                for ip in new.ips:
                    g.addrs.add(ip)
            if old is not None and on is not None:
                g = groups[on]
                for ip in old.ips:
                    g.addrs.remove(ip)
                if new is None or nn != on:
                    del g.pods[old.key]
                    if not g.pods:
                        assert g.part is not None
                        g.part.detach()
                        del groups[on]
                        self.version += 1

    # -- what the plan lists ---------------------------------------------------------------------
    def infos(self) -> tuple[list[RuleInfo], list[HostRule]]:
        """Its conjunctions as the full planner lists them (``Plan.rules``/``remote_rules``, and
        the host's judge's ``host_rules``), rebuilt when something changed."""
        if self._info is not None and self._info[0] == self.version:
            return self._info[1], self._info[2]
        rules: list[RuleInfo] = []
        hosts: list[HostRule] = []
        policy = self.ps.policy.key
        applied = sorted(self.applied.values(), key=_pod_order)
        all_peers = self._all_peers()

        def add(part: Part, pods: Sequence[Pod], tag: str, peers: tuple[str, ...] | None,
                ports: tuple[tuple[str, int | None, int | None], ...] | None) -> None:
            assert part.n is not None
            rules.append(RuleInfo(part.n, policy, self.direction, self.index, tuple(p.key for p in pods), tag))
            if not self.remote:
                hosts.append(HostRule(part.n, self.direction, tuple(ip for p in pods for ip in p.ips), peers, ports))

        if self.np is not None and self.np.n is not None:
            add(self.np, applied, "", all_peers, self.np_ports)
        if self.named:
            order = self._candidate_order() if self.direction == EGRESS else {}
            for name, proto in self.named:
                groups = self.groups[(name, proto)]
                for number in sorted(groups):
                    g = groups[number]
                    if g.part is None or g.part.n is None:
                        continue
                    tag = f"{name}={number}/{proto}"
                    ports = ((proto, number, None),)
                    if self.direction == INGRESS:
                        add(g.part, sorted(g.pods.values(), key=_pod_order), tag, all_peers, ports)
                    else:
                        pods = sorted(g.pods.values(), key=lambda p: order[p.key])
                        add(g.part, applied, tag, tuple(dict.fromkeys(ip for p in pods for ip in p.ips)), ports)
        if self._info is not None and hosts:
            hosts = _kept_hosts(self._info[2], hosts)
        self._info = (self.version, rules, hosts)
        return rules, hosts

    def _all_peers(self) -> tuple[str, ...] | None:
        if self.rule.peers is None:
            return None
        out: list[str] = []
        for k, mem in enumerate(self.members):
            if mem is None:
                out += self.blocks[k]
                continue
            order = self._sorted.get(k)
            if order is None:
                pods = sorted(mem.values(), key=_peer_order)
                order = self._sorted[k] = ([_peer_order(p) for p in pods], [p.ips for p in pods])
            out += chain.from_iterable(order[1])
        if self.b is not None and len(out) == len(self.b.count):
            return tuple(out)  # ``b`` holds the same addresses as a multiset: each once, nothing to drop
        return tuple(dict.fromkeys(out))

    def _candidate_order(self) -> dict[str, int]:
        """Egress named ports: the full planner's order of the candidate Pods."""
        if self.all_candidates:
            pods = sorted((self.pl.local if self.remote else self.pl.pods).values(), key=_pod_order)
            return {p.key: i for i, p in enumerate(pods)}
        order: dict[str, int] = {}
        for mem in self.members:
            for p in sorted((mem or {}).values(), key=_peer_order):
                order.setdefault(p.key, len(order))
        return order


class PolicyState:
    """A policy: the Pods it applies to here and, isolating egress, remotely; its rules in force."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.applied: dict[str, Pod] = {}
        self.a = AddrSet()
        self.remote: dict[str, Pod] = {}
        self.ra = AddrSet()
        self.local_rules: list[RuleState] = []
        self.remote_rules: list[RuleState] = []
        # its rules' infos joined, until one of them moves (RuleState.version) or the rules are
        # replaced (IncrementalPlanner._activate, _deactivate)
        self.local_infos_kept: tuple[list[RuleInfo], list[HostRule]] | None = None
        self.remote_infos_kept: list[RuleInfo] | None = None

    def local_infos(self) -> tuple[list[RuleInfo], list[HostRule]]:
        """Its local rules' :meth:`RuleState.infos`, joined: a snapshot walks the policies whose
        rules moved, not every rule in force."""
        kept = self.local_infos_kept
        if kept is None:
            rules: list[RuleInfo] = []
            hosts: list[HostRule] = []
            for r in self.local_rules:
                ri, hr = r.infos()
                rules += ri
                hosts += hr
            kept = self.local_infos_kept = (rules, hosts)
        return kept

    def remote_infos(self) -> list[RuleInfo]:
        """Its remote rules' :meth:`RuleState.infos`, joined."""
        kept = self.remote_infos_kept
        if kept is None:
            kept = self.remote_infos_kept = [i for r in self.remote_rules for i in r.infos()[0]]
        return kept


class IncrementalPlanner:
    """:func:`.plan.plan` for one Node, kept by events (see the module's docstring).

    ``ids`` is shared with whoever plans in full for comparison (with a :meth:`ConjIds.copy`):
    the incremental planner holds an id while a conjunction of that identity exists and frees it
    when its last one goes (at the end of the event, so an edit keeps its ids)."""

    def __init__(self, facts: NodeFacts, ids: ConjIds | None = None) -> None:
        self.facts = facts
        self.ids = ids if ids is not None else ConjIds()
        self._flows: dict[FlowKey, Flow] = {}
        self._base: dict[FlowKey, Flow | None] = {}  # what changed since take_delta: as it was then
        self._refs: dict[str, int] = {}
        self._maybe_free: set[str] = set()
        self.addresses = Addresses()
        self.any_peer = [((IP,), m.match_text((IP,))), ((IPV6,), m.match_text((IPV6,)))]
        self._port_cache: dict[tuple[tuple[str, int | None, int | None], ...],
                               list[tuple[tuple[m.MatchItem, ...], str]]] = {}
        self._block_cache: dict[tuple[str, tuple[str, ...]], tuple[str, ...]] = {}
        self._conjs: dict[tuple[int, int, int], Conjunction] = {}  # one object per value (see conj), kept by load
        self._unsorted: set[FlowKey] | None = None  # during a load: flows whose conjunctions are not sorted yet
        self.events = 0  # events taken
        self.version = 0  # events that changed something (each: a new snapshot)
        self.pods: dict[str, Pod] = {}
        self.namespaces: dict[str, Labels] = {}
        self.policies: dict[str, Policy] = {}
        self._reset()
        self._commit()

    # -- state -----------------------------------------------------------------------------------
    def _reset(self) -> None:
        """Every derived structure empty (the inputs, ids, flows installed and delta base kept)."""
        facts = self.facts
        # key -> [match, its conjunctions, {order: [actions, n]} | None]: a flow's conjunctions kept
        # sorted by (id, clause) as the full planner orders them, so one comes or goes by bisection
        # on a flow thousands share and its actions are one copy
        self._table: dict[FlowKey, list[Any]] = {}
        self._dirty: set[FlowKey] = set(self._flows)
        self._maybe_free |= set(self._refs)
        self._refs = {}
        self.by_ns: dict[str, dict[str, Pod]] = {}
        self.by_label: dict[tuple[str, str, str], set[str]] = {}
        self.by_ip: dict[str, set[str]] = {}
        self.local: dict[str, Pod] = {}
        self.local_by_ns: dict[str, dict[str, Pod]] = {}
        self.local_ips: dict[str, int] = {}
        self.universe: set[str] = set()
        self.ns_labels: dict[str, dict[str, str]] = {}
        self.ps: dict[str, PolicyState] = {}
        self.policies_by_ns: dict[str, dict[str, PolicyState]] = {}
        self.fixed: dict[str, set[tuple[RuleState, int]]] = {}
        self.fixed_local: dict[str, set[tuple[RuleState, int]]] = {}
        self.nssels: dict[sel.Selector, _NsSelector] = {}
        self.ns_entries: dict[str, set[_NsSelector]] = {}
        self.all_rules: set[RuleState] = set()
        self.all_rules_local: set[RuleState] = set()
        self.pol_of: dict[str, set[str]] = {}
        self.iso_in: dict[str, set[str]] = {}
        self.iso_eg: dict[str, set[str]] = {}
        self._units: dict[str, list[Terminal]] = {}
        self._unit_dirty: set[str] = set()
        self.remote_by: dict[str, set[str]] = {}
        self.remote_pod: dict[str, Pod] = {}
        self._remote_dirty: set[str] = set()
        self.remote_sorted: list[str] = []
        self.remote_sources: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._ip_remote: dict[str, set[str]] = {}
        self.active_local: list[str] = []
        self.active_remote: list[str] = []
        self._errors: list[str] | None = None
        self._namespaces_of: dict[str, int] = {}
        self._local_sorted: list[Pod] | None = None
        self._nets = [ipaddress.ip_network(c, strict=False) for c in facts.pod_cidrs]
        self.dests = AddrSet()
        for n in self._nets:
            self.dests.add(block_text(n))
        self.remote_ips = AddrSet()
        new = m.ct_state(m.CT_NEW | m.CT_TRK)
        up = Controller(deniedlog.userdata(EGRESS, deniedlog.REMOTE, ()), DENIED_LOG_MAX_LEN, DENIED_LOG_METER)
        edef = int(Table.EGRESS_DEFAULT)

        def isolation(n: int) -> list[tuple[int, int, tuple[m.MatchItem, ...], tuple[Action, ...]]]:
            out: list[tuple[int, int, tuple[m.MatchItem, ...], tuple[Action, ...]]] = [
                (edef, int(EgressDefault.REMOTE_ISOLATED), (m.CONJ_ID(n),), DROP)]
            if facts.denied_log:
                out.append((edef, int(EgressDefault.REMOTE_ISOLATED_NEW), (m.CONJ_ID(n), new), (up,)))
            return out

        self.isolation = Part(self, None, REMOTE_ISOLATION_KEY, edef, int(EgressDefault.REMOTE_ISOLATED),
                              self.remote_ips, False, True, self.dests, None, isolation)
        commit = (goto(Table.CONNTRACK_COMMIT),)
        for a in facts.host_addresses:
            match, text = self.addresses.match(str(ipaddress.ip_interface(a).ip), True)
            self.terminal(int(Table.INGRESS_RULE), int(IngressRule.HOST), match, text, "", commit, 1)
        for cidr in facts.service_cidrs:
            match, text = self.addresses.match(block_text(ipaddress.ip_network(cidr, strict=False)), False)
            self.terminal(int(Table.EGRESS_RULE), int(EgressRule.SERVICE), match, text, "", to_service_cidr(), 1)

    def load(self, inputs: Inputs) -> None:
        """Everything again from ``inputs`` (a start, a resync that found drift): like a full
        plan; the delta is against the flows held before."""
        self.pods = {}
        self.namespaces = dict(inputs.namespaces)
        self.policies = {}
        self._reset()
        self._unsorted = set()
        for name, labels in self.namespaces.items():
            self.ns_labels[name] = dict(labels)
            self.universe.add(name)
        for pod in inputs.pods:
            old = self.pods.get(pod.key)
            if old is not None:
                self._index_remove(old)
            self._index_add(pod)
        for pod in self.local.values():
            self._local_dests(None, pod)
            self._unit_dirty.add(pod.key)
        for policy in inputs.policies:
            if policy.key in self.ps:
                self._remove_policy(policy.key)
            self._add_policy(policy)
        self._commit()

    def _rebuild(self) -> None:
        self.load(self.inputs())

    def inputs(self) -> Inputs:
        """What it holds, as the full planner takes it (sorted as the watch hands it over)."""
        return Inputs(tuple(sorted(self.pods.values(), key=_pod_order)), dict(self.namespaces),
                      tuple(sorted(self.policies.values(), key=lambda p: p.key)))

    def apply(self, changes: Changes) -> None:
        """Each changed object as an event: Namespaces first, then Pods, then policies."""
        for name, labels in changes.namespaces.items():
            if labels is None:
                self.delete_namespace(name)
            else:
                self.upsert_namespace(name, labels)
        for key, pod in changes.pods.items():
            if pod is None:
                self.delete_pod(key)
            else:
                self.upsert_pod(pod)
        for key, policy in changes.policies.items():
            if policy is None:
                self.delete_policy(key)
            else:
                self.upsert_policy(policy)

    def sync(self, inputs: Inputs) -> Changes:
        """What differs between what it holds and ``inputs``, applied: the objects that moved."""
        pods = {p.key: p for p in inputs.pods}
        policies = {p.key: p for p in inputs.policies}
        out = Changes(
            {k: pods.get(k) for k in self.pods.keys() | pods.keys() if self.pods.get(k) != pods.get(k)},
            {k: inputs.namespaces.get(k) for k in self.namespaces.keys() | inputs.namespaces.keys()
             if self.namespaces.get(k) != inputs.namespaces.get(k)},
            {k: policies.get(k) for k in self.policies.keys() | policies.keys()
             if _policy_state(self.policies.get(k)) != _policy_state(policies.get(k))})
        self.apply(out)
        return out

    def set_facts(self, facts: NodeFacts) -> None:
        if facts != self.facts:
            self.facts = facts
            self._rebuild()

    # -- events ----------------------------------------------------------------------------------
    def upsert_pod(self, pod: Pod) -> None:
        self._pod_event(pod.key, pod)

    def delete_pod(self, key: str) -> None:
        self._pod_event(key, None)

    def upsert_namespace(self, name: str, labels: Labels) -> None:
        self._namespace_event(name, labels)

    def delete_namespace(self, name: str) -> None:
        self._namespace_event(name, None)

    def upsert_policy(self, policy: Policy) -> None:
        self.events += 1
        old = self.policies.get(policy.key)
        if old is not None and old == policy and old.errors == policy.errors:
            return
        if old is not None:
            self._remove_policy(policy.key)
        self._add_policy(policy)
        self._commit()

    def delete_policy(self, key: str) -> None:
        self.events += 1
        if key in self.policies:
            self._remove_policy(key)
            self._commit()

    def _view(self, key: str) -> View | None:
        pod = self.pods.get(key)
        if pod is None:
            return None
        if pod.node == self.facts.node:
            return (pod, True, False)
        return (pod, False, self._eligible(pod))

    def _eligible(self, pod: Pod) -> bool:
        """A remote Pod whose egress is judged here: remote egress is (``NodeFacts.remote_egress``),
        this Node has Pods, none holds its addresses."""
        if not self.local or not self.facts.remote_egress:
            return False
        li = self.local_ips
        return not any(ip in li for ip in pod.ips)

    def _pod_event(self, key: str, new: Pod | None) -> None:
        self.events += 1
        old = self.pods.get(key)
        if old == new:
            return
        here = self.facts.node
        had_local = bool(self.local)
        shared: set[str] = set()  # addresses whose holding by a local Pod may change
        if old is not None and old.node == here:
            shared.update(old.ips)
        if new is not None and new.node == here:
            shared.update(new.ips)
        others = {k for ip in shared for k in self.by_ip.get(ip, ()) if k != key}
        before = {k: self._view(k) for k in others}
        old_view = self._view(key)
        if old is not None:
            self._index_remove(old)
        if new is not None:
            self._index_add(new)
        if bool(self.local) != had_local:
            self._rebuild()
            return
        self._apply_view(old_view, self._view(key))
        for k in others:
            after = self._view(k)
            if after != before[k]:
                self._apply_view(before[k], after)
        ns = (new or old).namespace  # type: ignore[union-attr]
        if ns not in self.by_ns and ns not in self.namespaces:
            self._ns_vanish(ns)
        self._commit()

    def _index_add(self, pod: Pod) -> None:
        key, ns = pod.key, pod.namespace
        if ns not in self.universe:
            self.universe.add(ns)
            self._ns_appear(ns)
        self.pods[key] = pod
        self.by_ns.setdefault(ns, {})[key] = pod
        for k, v in pod.labels:
            self.by_label.setdefault((ns, k, v), set()).add(key)
        for ip in pod.ips:
            self.by_ip.setdefault(ip, set()).add(key)
        if pod.node == self.facts.node:
            self.local[key] = pod
            self.local_by_ns.setdefault(ns, {})[key] = pod
            for ip in pod.ips:
                self.local_ips[ip] = self.local_ips.get(ip, 0) + 1
            self._local_sorted = None

    def _index_remove(self, pod: Pod) -> None:
        key, ns = pod.key, pod.namespace
        del self.pods[key]
        pods = self.by_ns[ns]
        del pods[key]
        if not pods:
            del self.by_ns[ns]
        for k, v in pod.labels:
            s = self.by_label[(ns, k, v)]
            s.discard(key)
            if not s:
                del self.by_label[(ns, k, v)]
        for ip in pod.ips:
            holders = self.by_ip.get(ip)
            if holders is not None:
                holders.discard(key)
                if not holders:
                    del self.by_ip[ip]
        if key in self.local:
            del self.local[key]
            lp = self.local_by_ns[ns]
            del lp[key]
            if not lp:
                del self.local_by_ns[ns]
            for ip in pod.ips:
                c = self.local_ips[ip] - 1
                if c:
                    self.local_ips[ip] = c
                else:
                    del self.local_ips[ip]
            self._local_sorted = None

    def _apply_view(self, ov: View | None, nv: View | None) -> None:
        """One Pod as the plan saw it (``ov``) and sees it now (``nv``)."""
        op = ov[0] if ov is not None else None
        np_ = nv[0] if nv is not None else None
        some = np_ if np_ is not None else op
        assert some is not None
        ns, key = some.namespace, some.key
        ol = dict(op.labels) if op is not None else None
        nl = dict(np_.labels) if np_ is not None else None
        o_local = ov is not None and ov[1]
        n_local = nv is not None and nv[1]
        moved = op != np_ or o_local != n_local
        # the peers that may pick it, taken before any rule is made or closed below: a rule made
        # now is built from the index as it is (with this Pod), one closed needs nothing
        peers = self._peer_candidates(ns, False) if moved else []
        local_peers = self._peer_candidates(ns, True) if moved and (o_local or n_local) else []
        all_rules = list(self.all_rules) if moved else []
        all_local = list(self.all_rules_local) if moved and (o_local or n_local) else []
        for ps in list(self.policies_by_ns.get(ns, {}).values()):
            s = ps.policy.pod_selector
            osel = ol is not None and s.matches(ol)
            nsel = nl is not None and s.matches(nl)
            if not (osel or nsel):
                continue
            oa = op if osel and o_local else None
            na = np_ if nsel and n_local else None
            if oa != na:
                self._applied_change(ps, oa, na)
            if ps.policy.isolates_egress:
                orr = op if osel and ov is not None and ov[2] else None
                nrr = np_ if nsel and nv is not None and nv[2] else None
                if orr != nrr:
                    self._remote_change(ps, orr, nrr)
        for cands, local_only in ((peers, False), (local_peers, True)):
            for rule, k in cands:
                if rule.closed:
                    continue
                peer = rule.rule.peers[k]  # type: ignore[index]
                ps_ = peer.pod_selector or sel.EVERYTHING
                o_in = op if ol is not None and (o_local or not local_only) and ps_.matches(ol) else None
                n_in = np_ if nl is not None and (n_local or not local_only) and ps_.matches(nl) else None
                if o_in != n_in:
                    rule.peer_change(k, o_in, n_in)
        for rule in all_rules:
            if not rule.closed:
                rule.all_change(op, np_)
        for rule in all_local:
            if not rule.closed:
                rule.all_change(op if o_local else None, np_ if n_local else None)
        if o_local or n_local:
            self._local_dests(op if o_local else None, np_ if n_local else None)
            self._unit_dirty.add(key)

    def _local_dests(self, old: Pod | None, new: Pod | None) -> None:
        """This Node's Pods as the remote isolation's destinations: those outside its Pod CIDRs."""
        nets = self._nets
        if new is not None:
            for ip in new.ips:
                a = ipaddress.ip_address(ip)
                if not any(a in n for n in nets):
                    self.dests.add(ip)
        if old is not None:
            for ip in old.ips:
                a = ipaddress.ip_address(ip)
                if not any(a in n for n in nets):
                    self.dests.remove(ip)

    def _peer_candidates(self, ns: str, local: bool) -> list[tuple[RuleState, int]]:
        out = list((self.fixed_local if local else self.fixed).get(ns, ()))
        for entry in self.ns_entries.get(ns, ()):
            out.extend(entry.local_peers if local else entry.peers)
        return out

    def _namespace_event(self, name: str, labels: Labels | None) -> None:
        self.events += 1
        old = self.namespaces.get(name)
        if old == labels:
            return
        if labels is None:
            del self.namespaces[name]
        else:
            self.namespaces[name] = labels
        present = labels is not None or name in self.by_ns
        if present and name not in self.universe:
            self.universe.add(name)
        self.ns_labels[name] = dict(labels or ())
        now = self.ns_labels[name]
        entries = self.ns_entries.setdefault(name, set())
        pods = self.by_ns.get(name, {})
        local = self.local_by_ns.get(name, {})
        for entry in list(self.nssels.values()):
            was = name in entry.matched
            is_ = present and entry.selector.matches(now)
            if was == is_:
                continue
            if is_:
                entry.matched.add(name)
                entries.add(entry)
            else:
                entry.matched.discard(name)
                entries.discard(entry)
            for members, peers in ((pods, entry.peers), (local, entry.local_peers)):
                for rule, k in list(peers):
                    if rule.closed:
                        continue
                    peer = rule.rule.peers[k]  # type: ignore[index]
                    for pod in self.select(members, name, peer.pod_selector or sel.EVERYTHING):
                        if is_:
                            rule.peer_change(k, None, pod)
                        else:
                            rule.peer_change(k, pod, None)
        if not present:
            self.universe.discard(name)
            self.ns_entries.pop(name, None)
            self.ns_labels.pop(name, None)
        if not entries:
            self.ns_entries.pop(name, None)
        self._commit()

    def _ns_appear(self, ns: str) -> None:
        labels = self.ns_labels.setdefault(ns, dict(self.namespaces.get(ns, ())))
        for entry in self.nssels.values():
            if entry.selector.matches(labels):
                entry.matched.add(ns)
                self.ns_entries.setdefault(ns, set()).add(entry)

    def _ns_vanish(self, ns: str) -> None:
        self.universe.discard(ns)
        for entry in self.ns_entries.pop(ns, ()):
            entry.matched.discard(ns)
        self.ns_labels.pop(ns, None)

    # -- selection and registration --------------------------------------------------------------
    def select(self, pool: dict[str, Pod], ns: str, selector: sel.Selector) -> list[Pod]:
        """The Pods of ``pool`` (one namespace's) that ``selector`` picks, narrowed by its
        smallest single-value ``In`` first."""
        if not pool:
            return []
        best: set[str] | None = None
        for r in selector.requirements:
            if r.operator == "In" and len(r.values) == 1:
                (value,) = r.values
                s = self.by_label.get((ns, r.key, value), set())
                if best is None or len(s) < len(best):
                    best = s
        cands: Iterable[Pod] = pool.values()
        if best is not None and len(best) < len(pool):
            cands = [pool[k] for k in best if k in pool]
        if selector.everything:
            return list(cands)
        return [p for p in cands if selector.matches(dict(p.labels))]

    def register_peer(self, rule: RuleState, k: int) -> list[Pod]:
        """Peer ``k`` of ``rule`` told of the Pods that may enter it; the Pods it picks now."""
        peer = rule.rule.peers[k]  # type: ignore[index]
        ns_of_policy = rule.ps.policy.namespace
        pod_sel = peer.pod_selector or sel.EVERYTHING
        pools = self.local_by_ns if rule.remote else self.by_ns
        if peer.namespace_selector is None:
            index = self.fixed_local if rule.remote else self.fixed
            index.setdefault(ns_of_policy, set()).add((rule, k))
            return self.select(pools.get(ns_of_policy, {}), ns_of_policy, pod_sel)
        entry = self.nssels.get(peer.namespace_selector)
        if entry is None:
            entry = self.nssels[peer.namespace_selector] = _NsSelector(peer.namespace_selector)
            for ns in self.universe:
                if entry.selector.matches(self.ns_labels.get(ns, {})):
                    entry.matched.add(ns)
                    self.ns_entries.setdefault(ns, set()).add(entry)
        (entry.local_peers if rule.remote else entry.peers).add((rule, k))
        out: list[Pod] = []
        for ns in entry.matched:
            out += self.select(pools.get(ns, {}), ns, pod_sel)
        return out

    def register_all(self, rule: RuleState) -> None:
        (self.all_rules_local if rule.remote else self.all_rules).add(rule)

    def unregister(self, rule: RuleState) -> None:
        if rule.rule.peers is not None:
            ns_of_policy = rule.ps.policy.namespace
            for k, peer in enumerate(rule.rule.peers):
                if peer.ip_block is not None:
                    continue
                if peer.namespace_selector is None:
                    index = self.fixed_local if rule.remote else self.fixed
                    s = index.get(ns_of_policy)
                    if s is not None:
                        s.discard((rule, k))
                        if not s:
                            del index[ns_of_policy]
                    continue
                entry = self.nssels.get(peer.namespace_selector)
                if entry is None:
                    continue
                (entry.local_peers if rule.remote else entry.peers).discard((rule, k))
                if not entry.peers and not entry.local_peers:
                    del self.nssels[peer.namespace_selector]
                    for ns in entry.matched:
                        es = self.ns_entries.get(ns)
                        if es is not None:
                            es.discard(entry)
                            if not es:
                                del self.ns_entries[ns]
        (self.all_rules_local if rule.remote else self.all_rules).discard(rule)

    def block(self, cidr: str, excepts: tuple[str, ...]) -> tuple[str, ...]:
        hit = self._block_cache.get((cidr, excepts))
        if hit is None:
            hit = self._block_cache[(cidr, excepts)] = tuple(map(block_text, block_minus(cidr, list(excepts))))
        return hit

    def port_flows(self, ports: tuple[tuple[str, int | None, int | None], ...] | None
                   ) -> list[tuple[tuple[m.MatchItem, ...], str]] | None:
        if ports is None:
            return None
        hit = self._port_cache.get(ports)
        if hit is None:
            hit = self._port_cache[ports] = [(match, m.match_text(match)) for match in port_matches(ports)]
        return hit

    # -- policies --------------------------------------------------------------------------------
    def _add_policy(self, policy: Policy) -> None:
        key, ns = policy.key, policy.namespace
        self.policies[key] = policy
        ps = self.ps[key] = PolicyState(policy)
        self.policies_by_ns.setdefault(ns, {})[key] = ps
        self._errors = None
        self._namespaces_of[ns] = self._namespaces_of.get(ns, 0) + 1
        pool = self.by_ns if policy.isolates_egress and self.facts.remote_egress else self.local_by_ns
        here = self.facts.node
        for pod in self.select(pool.get(ns, {}), ns, policy.pod_selector):
            if pod.node == here:
                ps.applied[pod.key] = pod
                for ip in pod.ips:
                    ps.a.add(ip)
            elif self._eligible(pod):
                ps.remote[pod.key] = pod
                for ip in pod.ips:
                    ps.ra.add(ip)
        if ps.applied:
            self._activate(ps, False)
            for pk in ps.applied:
                self._select_local(ps, pk, True)
        if ps.remote:
            self._activate(ps, True)
            for pk in ps.remote:
                self._remote_by(pk, key, True)

    def _remove_policy(self, key: str) -> None:
        ps = self.ps.pop(key)
        policy = ps.policy
        del self.policies[key]
        byns = self.policies_by_ns[policy.namespace]
        del byns[key]
        if not byns:
            del self.policies_by_ns[policy.namespace]
        self._errors = None
        c = self._namespaces_of[policy.namespace] - 1
        if c:
            self._namespaces_of[policy.namespace] = c
        else:
            del self._namespaces_of[policy.namespace]
        if ps.local_rules or ps.applied:
            self._deactivate(ps, False)
        if ps.remote_rules or ps.remote:
            self._deactivate(ps, True)
        for pk in ps.applied:
            self._select_local(ps, pk, False)
        for pk in ps.remote:
            self._remote_by(pk, key, False)

    def _activate(self, ps: PolicyState, remote: bool) -> None:
        policy = ps.policy
        if remote:
            ps.remote_rules = [RuleState(self, ps, EGRESS, i, r, True) for i, r in enumerate(policy.egress)]
            ps.remote_infos_kept = None
            bisect.insort(self.active_remote, policy.key)
            return
        rules = []
        for direction, rs, on in ((INGRESS, policy.ingress, policy.isolates_ingress),
                                  (EGRESS, policy.egress, policy.isolates_egress)):
            if on:
                rules += [RuleState(self, ps, direction, i, r, False) for i, r in enumerate(rs)]
        ps.local_rules = rules
        ps.local_infos_kept = None
        bisect.insort(self.active_local, policy.key)

    def _deactivate(self, ps: PolicyState, remote: bool) -> None:
        for r in ps.remote_rules if remote else ps.local_rules:
            r.close()
        active = self.active_remote if remote else self.active_local
        i = bisect.bisect_left(active, ps.policy.key)
        if i < len(active) and active[i] == ps.policy.key:
            del active[i]
        if remote:
            ps.remote_rules, ps.remote_infos_kept = [], None
        else:
            ps.local_rules, ps.local_infos_kept = [], None

    def _select_local(self, ps: PolicyState, pod: str, on: bool) -> None:
        """Local Pod ``pod`` selected by ``ps`` (``on``) or no longer: its policies, isolation."""
        policy = ps.policy
        for d, cond in ((self.pol_of, True), (self.iso_in, policy.isolates_ingress),
                        (self.iso_eg, policy.isolates_egress)):
            if not cond:
                continue
            if on:
                d.setdefault(pod, set()).add(policy.key)
            else:
                s = d.get(pod)
                if s is not None:
                    s.discard(policy.key)
                    if not s:
                        del d[pod]
        self._unit_dirty.add(pod)

    def _applied_change(self, ps: PolicyState, old: Pod | None, new: Pod | None) -> None:
        was = bool(ps.applied)
        if new is not None:
            ps.applied[new.key] = new
            for ip in new.ips:
                ps.a.add(ip)
        if old is not None:
            for ip in old.ips:
                ps.a.remove(ip)
            if new is None:
                del ps.applied[old.key]
        if not was and ps.applied:
            self._activate(ps, False)
        elif ps.applied:
            for r in ps.local_rules:
                r.applied_change(old, new)
        else:
            self._deactivate(ps, False)
        if (old is None) != (new is None):
            self._select_local(ps, (new or old).key, new is not None)  # type: ignore[union-attr]

    def _remote_change(self, ps: PolicyState, old: Pod | None, new: Pod | None) -> None:
        was = bool(ps.remote)
        if new is not None:
            ps.remote[new.key] = new
            for ip in new.ips:
                ps.ra.add(ip)
        if old is not None:
            for ip in old.ips:
                ps.ra.remove(ip)
            if new is None:
                del ps.remote[old.key]
        if not was and ps.remote:
            self._activate(ps, True)
        elif ps.remote:
            for r in ps.remote_rules:
                r.version += 1
        else:
            self._deactivate(ps, True)
        key = (new or old).key  # type: ignore[union-attr]
        if (old is None) != (new is None):
            self._remote_by(key, ps.policy.key, new is not None)
        else:
            self._remote_dirty.add(key)

    def _remote_by(self, pod: str, policy: str, on: bool) -> None:
        if on:
            self.remote_by.setdefault(pod, set()).add(policy)
        else:
            s = self.remote_by.get(pod)
            if s is not None:
                s.discard(policy)
                if not s:
                    del self.remote_by[pod]
        self._remote_dirty.add(pod)

    # -- the flow table --------------------------------------------------------------------------
    def ref_id(self, key: str) -> int:
        self._refs[key] = self._refs.get(key, 0) + 1
        return self.ids.acquire(key)

    def unref_id(self, key: str) -> None:
        c = self._refs[key] - 1
        if c:
            self._refs[key] = c
        else:
            del self._refs[key]
            self._maybe_free.add(key)

    def conj_addr(self, table: int, prio: int, addr: str, source: bool, conj: Conjunction, d: int) -> None:
        match, text = self.addresses.match(addr, source)
        self.conj_match(table, prio, match, text, conj, d)

    def conj_match(self, table: int, prio: int, match: tuple[m.MatchItem, ...], text: str, conj: Conjunction,
                   d: int) -> None:
        key = (table, prio, text)
        e = self._table.get(key)
        if e is None:
            e = self._table[key] = [match, [], None]
        objs = e[1]
        unsorted = self._unsorted
        if unsorted is not None:  # a load: appended, sorted once at its commit
            if d > 0:
                objs += [conj] * d
                unsorted.add(key)
                self._dirty.add(key)
                return
            if key in unsorted:
                objs.sort(key=_conj_key)
                unsorted.discard(key)
        ck = (conj.id, conj.clause)
        if d == 1:
            objs.insert(bisect.bisect_right(objs, ck, key=_conj_key), conj)
        elif d > 0:
            i = bisect.bisect_right(objs, ck, key=_conj_key)
            objs[i:i] = [conj] * d
        elif d == -1:
            i = bisect.bisect_left(objs, ck, key=_conj_key)
            if i == len(objs) or _conj_key(objs[i]) != ck:
                raise ValueError(f"{conj.text()} is not on {text}")
            del objs[i]
        else:
            i = bisect.bisect_left(objs, ck, key=_conj_key)
            if i - d > len(objs) or any(_conj_key(c) != ck for c in objs[i:i - d]):
                raise ValueError(f"{conj.text()} is not on {text} {-d} times")
            del objs[i:i - d]
        self._dirty.add(key)

    def conj(self, n: int, clause: int, clauses: int) -> Conjunction:
        """The one Conjunction object of that value: flows compare by identity first, so an
        unchanged flow of thousands of conjunctions compares without the records' equality."""
        k = (n, clause, clauses)
        c = self._conjs.get(k)
        if c is None:
            if len(self._conjs) > 4 * len(self._refs) + 10_000:
                self._conjs = {}
            c = self._conjs[k] = Conjunction(n, clause, clauses)
        return c

    def terminal(self, table: int, prio: int, match: tuple[m.MatchItem, ...], text: str, order: str,
                 actions: tuple[Action, ...], d: int) -> None:
        key = (table, prio, text)
        e = self._table.get(key)
        if e is None:
            e = self._table[key] = [match, [], None]
        terms = e[2]
        if terms is None:
            terms = e[2] = {}
        have = terms.get(order)
        if have is None:
            terms[order] = [actions, d]
        else:
            have[1] += d
            if have[1] == 0:
                del terms[order]
        self._dirty.add(key)

    def _unit(self, key: str) -> None:
        """A local Pod's own flows: its isolation drops and, with the denied log, the flows
        above them that send a new connection's first packet up."""
        for t in self._units.pop(key, ()):
            self.terminal(*t, -1)
        pod = self.local.get(key)
        if pod is None:
            return
        out: list[Terminal] = []
        ing, eg = self.iso_in.get(key), self.iso_eg.get(key)
        match = self.addresses.match
        for ip in pod.ips:
            if ing:
                mt, text = match(ip, False)
                out.append((int(Table.INGRESS_DEFAULT), int(IngressDefault.ISOLATED), mt, text, key, DROP))
            if eg:
                mt, text = match(ip, True)
                out.append((int(Table.EGRESS_DEFAULT), int(EgressDefault.ISOLATED), mt, text, key, DROP))
        if self.facts.denied_log:
            new = m.ct_state(m.CT_NEW | m.CT_TRK)
            for direction, table, rung, pols in (
                    (INGRESS, Table.INGRESS_DEFAULT, IngressDefault.ISOLATED_NEW, ing),
                    (EGRESS, Table.EGRESS_DEFAULT, EgressDefault.ISOLATED_NEW, eg)):
                if not pols:
                    continue
                up: tuple[Action, ...] = (Controller(deniedlog.userdata(direction, key, sorted(pols)),
                                                     DENIED_LOG_MAX_LEN, DENIED_LOG_METER),)
                for ip in pod.ips:
                    mt, text = match(ip, direction == EGRESS)
                    out.append((int(table), int(rung), (*mt, new), f"{text},{new.text()}", key, up))
        for t in out:
            self.terminal(*t, 1)
        self._units[key] = out

    def _remote_pod(self, key: str, touched: set[str]) -> None:
        """A remote Pod isolated for egress (by any policy) or no longer: the remote
        isolation's sources, ``remote_isolated``, ``remote_sources``."""
        pols = self.remote_by.get(key)
        want = self.pods.get(key) if pols else None
        have = self.remote_pod.get(key)
        if want != have:
            if want is not None:
                self.remote_pod[key] = want
                for ip in want.ips:
                    self.remote_ips.add(ip)
                    self._ip_remote.setdefault(str(ipaddress.ip_address(ip)), set()).add(key)
            if have is not None:
                for ip in have.ips:
                    self.remote_ips.remove(ip)
                if want is None:
                    del self.remote_pod[key]
                for ip in have.ips:
                    nip = str(ipaddress.ip_address(ip))
                    if want is None or nip not in {str(ipaddress.ip_address(i)) for i in want.ips}:
                        s = self._ip_remote.get(nip)
                        if s is not None:
                            s.discard(key)
                            if not s:
                                del self._ip_remote[nip]
            if (have is None) != (want is None):
                i = bisect.bisect_left(self.remote_sorted, key)
                if want is not None:
                    self.remote_sorted.insert(i, key)
                else:
                    del self.remote_sorted[i]
        if self.facts.denied_log:
            for pod in (have, want):
                for ip in pod.ips if pod is not None else ():
                    touched.add(str(ipaddress.ip_address(ip)))

    def _remote_source(self, nip: str) -> None:
        """``remote_sources`` of one address: the full planner's last writer, the remote Pod
        isolated first by the last policy in its order (each Pod at its first policy)."""
        holders = self._ip_remote.get(nip)
        if not holders:
            self.remote_sources.pop(nip, None)
            return
        by = self.remote_by
        winner = max(holders, key=lambda k: (min(by[k]), k))
        self.remote_sources[nip] = (winner, tuple(sorted(by[winner])))

    def _commit(self) -> None:
        """The end of an event: Pods' own flows, remote Pods, then each touched flow rebuilt and
        compared with what it was; ids no conjunction holds any more freed."""
        self.version += 1
        while self._remote_dirty or self._unit_dirty:
            remote, self._remote_dirty = self._remote_dirty, set()
            touched: set[str] = set()
            for pk in remote:
                self._remote_pod(pk, touched)
            for nip in touched:
                self._remote_source(nip)
            units, self._unit_dirty = self._unit_dirty, set()
            for pk in units:
                self._unit(pk)
        if self._unsorted is not None:
            for key in self._unsorted:
                e = self._table.get(key)
                if e is not None:
                    e[1].sort(key=_conj_key)  # stable: the full planner's order
            self._unsorted = None
        cookies = self.ids.cookies
        flows, base = self._flows, self._base
        for key in self._dirty:
            e = self._table.get(key)
            flow: Flow | None = None
            was = flows.get(key)
            if e is not None:
                acts: tuple[Action, ...] | None = None
                if e[1]:
                    acts = tuple(e[1])  # in the full planner's order (conj_order), each as often as held
                elif e[2]:
                    acts = e[2][min(e[2])][0]
                if acts is None:
                    del self._table[key]
                elif was is not None and _same_actions(was.actions, acts):
                    continue  # the same flow: its table, priority, match and cookie follow from its key
                else:
                    table, prio, text = key
                    ident = f"{table}|{prio}|{text}"
                    cookie = cookies.get(ident)
                    if cookie is None:
                        cookie = cookies[ident] = policy_cookie(ident)
                    flow = Flow(Table(table), prio, e[0], acts, cookie)
            if was is None and flow is None:
                continue
            if key not in base:
                base[key] = was
            if flow is None:
                del flows[key]
            else:
                flows[key] = flow
        self._dirty = set()
        for ident in self._maybe_free:
            if ident not in self._refs:
                self.ids.release(ident)
        self._maybe_free = set()
        if len(self.addresses.by_side[True]) + len(self.addresses.by_side[False]) > 4 * len(flows) + 100_000:
            self.addresses = Addresses()

    # -- what it exposes -------------------------------------------------------------------------
    def take_delta(self) -> FlowDelta:
        """The flows added and removed since the last call (a changed one in both)."""
        added, removed = [], []
        for key, was in self._base.items():
            now = self._flows.get(key)
            if was is now:
                continue
            # table, priority, match and cookie follow from the key: equal actions, the same flow,
            # which keeps the object handed over before (whoever holds it by identity finds it)
            if was is not None and now is not None and _same_actions(was.actions, now.actions):
                self._flows[key] = was
                continue
            if was is not None:
                removed.append(was)
            if now is not None:
                added.append(now)
        self._base = {}
        return FlowDelta(tuple(added), tuple(removed))

    def flows(self, ordered: bool = False) -> list[Flow]:
        """The flows in force; ``ordered``: in the full planner's order (by table, priority
        down, match text), else as held."""
        if not ordered:
            return list(self._flows.values())
        return [self._flows[k] for k in sorted(self._flows, key=lambda k: (k[0], -k[1], k[2]))]

    def snapshot(self, ordered: bool = False) -> Plan:
        """A :class:`.plan.Plan` equal to what :func:`.plan.plan` makes of :meth:`inputs` with
        these ids (flows in that order with ``ordered``)."""
        if self._local_sorted is None:
            self._local_sorted = sorted(self.local.values(), key=_pod_order)
        local = self._local_sorted
        rules: list[RuleInfo] = []
        hosts: list[HostRule] = []
        ps = self.ps
        for key in self.active_local:
            ri, hr = ps[key].local_infos()
            rules += ri
            hosts += hr
        remote_rules: list[RuleInfo] = []
        for key in self.active_remote:
            remote_rules += ps[key].remote_infos()
        if self._errors is None:
            self._errors = [f"{k}: {e}" for k in sorted(self.policies) for e in self.policies[k].errors]
        n = self.isolation.n
        return Plan(
            flows=self.flows(ordered), rules=rules,
            isolated={p.key: (bool(self.iso_in.get(p.key)), bool(self.iso_eg.get(p.key))) for p in local},
            policies_of={p.key: sorted(self.pol_of[p.key]) for p in local if self.pol_of.get(p.key)},
            local_pods=list(local), errors=list(self._errors), policy_namespaces=sorted(self._namespaces_of),
            remote_rules=remote_rules, remote_isolated=list(self.remote_sorted) if n is not None else [],
            remote_isolation_id=n, remote_sources=dict(self.remote_sources) if n is not None else {},
            host_rules=hosts)


def _kept_hosts(was: Sequence[HostRule], now: list[HostRule]) -> list[HostRule]:
    """``now`` with what did not move kept as ``was``'s objects: an equal rule as the very rule,
    else its equal address tuples.  A rule's version moves with more than the host's judge reads
    (its flows, a remote side), and the judge is rendered again by identity (the rule, its Pods'
    and its peers' tuples): an equal tuple handed over anew would cost its every address there."""
    old = {(h.conj_id, h.direction): h for h in was}
    out: list[HostRule] = []
    for h in now:
        o = old.get((h.conj_id, h.direction))
        if o is None:
            out.append(h)
            continue
        applied = o.applied if o.applied == h.applied else h.applied
        peers = o.peers if o.peers == h.peers else h.peers
        if applied is o.applied and peers is o.peers and o.ports == h.ports:
            out.append(o)
        else:
            out.append(HostRule(h.conj_id, h.direction, applied, peers, h.ports))
    return out
