"""The spans of :func:`.relevance.spans` kept up to date event by event: what a controller that
watches the cluster once runs to publish to each Node only the remote Pods its plans read
(issue 46).  :func:`.relevance.spans` re-walks every policy on each call; :class:`SpanIndex`
takes the watches' objects one at a time and does work in proportion to what an event touches.

The relation, as :mod:`.relevance` states it, is made of *groups* of Pods (:class:`Group`): a
policy's subjects (a fixed namespace and a podSelector, or a ClusterNetworkPolicy's namespace
and Pod selectors), its pod peers (a namespace, fixed or picked by a namespaceSelector, and a
podSelector) and an egress rule's named-port group (every Pod with one of its named ports).
Each policy is a multiset of *terms* over groups:

- ``NODES S→T``: the Pods of T are read on every Node where S has a Pod (a NetworkPolicy's
  isolating rules' peers, a ClusterNetworkPolicy's ingress peers; S its subjects);
- ``EVERYWHERE S→T``: the Pods of T are read everywhere while S has a Pod (a
  ClusterNetworkPolicy's egress peers);
- ``POPULATED S``, ``EVERYWHERE_SUBJECT S``: the Pods of S are read on every Node with a Pod
  (a NetworkPolicy isolating egress) or on every Node (a ClusterNetworkPolicy with egress).

Each distinct group exists once, with its members, how many of them each Node has, and, summed
over the terms that reach it, the Nodes its Pods are read on (``reach``: Node -> weight) and
whether they are read everywhere.  A Pod keeps, per Node, in how many of its groups that Node
is reached.  Only transitions travel: a Node gaining its first member of S raises ``reach`` of
the T's S points to, and only a ``reach`` going from zero to some (or back) touches T's members;
so a Pod joining a policy on a Node that already had one of its Pods changes no peer.  A policy
edit applies the difference of its old and new terms.

Indexes make an event's cost follow what it touches: Pods by namespace, by (namespace, label,
value) and by named port; groups by the namespace they are fixed to, by namespaceSelector (and
per namespace, the selectors its labels match), by named port, each table keyed by a
single-value ``In`` of the group's podSelector when it has one; so a Pod event evaluates only the
groups that may hold it, and a Namespace relabel only the groups whose namespaceSelector's
verdict on it changes.

The Pods whose span changed since the last :meth:`SpanIndex.take_changes` are what the
controller publishes.  Inputs are taken as the watch delivers them: the same object again, or
an older one after a newer one, is just another upsert (the last delivery wins); a delete of
what is not there is nothing.  A Pod whose Namespace object is not (or no longer) there is read
with the labels ``{}``, as :class:`.plan.PodIndex` does."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple, TypeVar

from . import selector as sel
from .cnp.model import ClusterPolicy
from .model import Peer, Pod, Policy
from .plan import Inputs
from .relevance import Labels, Span

NO_LABELS: Mapping[str, str] = MappingProxyType({})
_K = TypeVar("_K")


@dataclass(frozen=True)
class Group:
    """A set of Pods a policy names: those ``pods`` picks in ``namespace``, or in the
    namespaces ``namespaces`` picks; or (``ports`` not empty) every Pod with a container port
    of one of these (name, protocol)."""

    namespace: str | None = None
    namespaces: sel.Selector | None = None
    pods: sel.Selector = sel.EVERYTHING
    ports: frozenset[tuple[str, str]] = frozenset()

    def holds(self, pod: Pod, labels: Mapping[str, str], ns_labels: Mapping[str, str]) -> bool:
        if self.ports:
            return any(pod.port_number(name, proto) is not None for name, proto in self.ports)
        if self.namespace is not None:
            if pod.namespace != self.namespace:
                return False
        elif self.namespaces is None or not self.namespaces.matches(ns_labels):
            return False
        return self.pods.matches(labels)


NODES, EVERYWHERE, POPULATED, EVERYWHERE_SUBJECT = "nodes", "everywhere", "populated", "everywhere-subject"


class Term(NamedTuple):
    """One part of a policy's reach (module docstring); ``target`` is None for the subject terms."""

    kind: str
    source: Group
    target: Group | None = None


@dataclass(frozen=True)
class GroupReach:
    """Where a group's members are read: on ``nodes`` (which may hold the members' own Nodes), on
    every Node (``everywhere``), or on every Node with a Pod (``populated``); what the group's
    PeerSlices are labelled with (``controller/slices.py``)."""

    nodes: frozenset[str] = frozenset()
    everywhere: bool = False
    populated: bool = False

    @property
    def anywhere(self) -> bool:
        return bool(self.nodes) or self.everywhere or self.populated


@dataclass(frozen=True)
class GroupView:
    """A group as :meth:`SpanIndex.take_group_changes` gives it: its members and its reach."""

    members: frozenset[str]
    reach: GroupReach


def np_peer_group(policy_ns: str, peer: Peer) -> Group:
    pods = peer.pod_selector or sel.EVERYTHING
    if peer.namespace_selector is None:
        return Group(namespace=policy_ns, pods=pods)
    return Group(namespaces=peer.namespace_selector, pods=pods)


def policy_terms(policy: Policy, remote_egress: bool = True) -> dict[Term, int]:
    """A NetworkPolicy as terms (:func:`.relevance.spans`: its isolating rules' pod peers, and
    for an egress rule without ``to`` its named ports' group, read where its subjects are; its
    subjects read on every Node with a Pod if it isolates egress and ``remote_egress``)."""
    subject = Group(namespace=policy.namespace, pods=policy.pod_selector)
    out: dict[Term, int] = {}

    def add(t: Term) -> None:
        out[t] = out.get(t, 0) + 1

    if remote_egress and policy.isolates_egress:
        add(Term(POPULATED, subject))
    rules = ([("ingress", r) for r in policy.ingress] if policy.isolates_ingress else []) + \
        ([("egress", r) for r in policy.egress] if policy.isolates_egress else [])
    for direction, rule in rules:
        for peer in rule.peers or ():
            if peer.ip_block is None:
                add(Term(NODES, subject, np_peer_group(policy.namespace, peer)))
        if direction == "egress" and rule.peers is None:
            named = frozenset((p.port, p.protocol) for p in rule.ports if isinstance(p.port, str))
            if named:
                add(Term(NODES, subject, Group(ports=named)))
    return out


def cluster_policy_terms(cp: ClusterPolicy, remote_egress: bool = True) -> dict[Term, int]:
    """A ClusterNetworkPolicy as terms: with egress rules its subjects and its egress pod peers
    read everywhere (while it has a subject), its ingress pod peers read where its subjects are;
    without ``remote_egress`` its egress pod peers too are read where its subjects are, and its
    subjects nowhere else."""
    subject = Group(namespaces=cp.subject.namespaces, pods=cp.subject.pods or sel.EVERYTHING)
    out: dict[Term, int] = {}

    def add(t: Term) -> None:
        out[t] = out.get(t, 0) + 1

    if remote_egress and cp.egress:
        add(Term(EVERYWHERE_SUBJECT, subject))
    for kind, rules in ((EVERYWHERE if remote_egress else NODES, cp.egress), (NODES, cp.ingress)):
        for rule in rules:
            for peer in rule.peers or ():
                if peer.pods is not None:
                    add(Term(kind, subject, Group(namespaces=peer.pods.namespaces,
                                                  pods=peer.pods.pods or sel.EVERYTHING)))
    return out


def group_views(inputs: Inputs, tiers: Sequence[ClusterPolicy] = (), remote_egress: bool = True
                ) -> dict[Group, GroupView]:
    """The reference for :meth:`SpanIndex.groups`: every group the policies name, its members by
    :meth:`Group.holds` over every Pod, its reach from the terms (``NODES S→T``: T is read on
    the Nodes of S's members; ``EVERYWHERE S→T``: everywhere while S has a member; ``POPULATED``
    and ``EVERYWHERE_SUBJECT``: S's own flags).  A Pod's span is the union of its groups' reach
    without its own Node (``tests/routesync/policy/test_spanindex.py`` holds that to
    :func:`.relevance.spans`)."""
    terms: Counter[Term] = Counter()
    for policy in inputs.policies:
        terms.update(policy_terms(policy, remote_egress))
    for cp in tiers:
        terms.update(cluster_policy_terms(cp, remote_egress))
    members: dict[Group, set[str]] = {}
    nodes: dict[Group, set[str]] = {}
    for t in terms:
        for g in (t.source, t.target):
            if g is not None and g not in members:
                members[g], nodes[g] = set(), set()
                for pod in inputs.pods:
                    if g.holds(pod, dict(pod.labels), dict(inputs.namespaces.get(pod.namespace, ()))):
                        members[g].add(pod.key)
                        nodes[g].add(pod.node)
    reach: dict[Group, set[str]] = {g: set() for g in members}
    everywhere: set[Group] = set()
    populated: set[Group] = set()
    for t in terms:
        if t.kind == POPULATED:
            populated.add(t.source)
        elif t.kind == EVERYWHERE_SUBJECT:
            everywhere.add(t.source)
        elif t.target is not None and t.kind == NODES:
            reach[t.target] |= nodes[t.source]
        elif t.target is not None and members[t.source]:
            everywhere.add(t.target)
    return {g: GroupView(frozenset(members[g]), GroupReach(frozenset(reach[g]), g in everywhere, g in populated))
            for g in members}


class _GroupState:
    """A group's members and what reaches them (module docstring)."""

    __slots__ = ("everywhere_in", "everywhere_subject", "members", "nodes", "populated", "reach", "to_everywhere",
                 "to_nodes", "users")

    def __init__(self) -> None:
        self.members: set[str] = set()
        self.nodes: dict[str, int] = {}  # Node -> members on it
        self.reach: dict[str, int] = {}  # Node -> weight of the NODES terms into it whose source has a Pod there
        self.everywhere_in = 0  # weight of the EVERYWHERE terms into it whose source has a member
        self.populated = 0  # POPULATED terms on it
        self.everywhere_subject = 0  # EVERYWHERE_SUBJECT terms on it
        self.to_nodes: dict[Group, int] = {}  # NODES terms from it
        self.to_everywhere: dict[Group, int] = {}  # EVERYWHERE terms from it
        self.users = 0  # terms naming it (as source or target)


@dataclass
class _PodState:
    pod: Pod
    labels: dict[str, str]
    groups: set[Group] = field(default_factory=set)
    nodes: Counter[str] = field(default_factory=Counter)  # Node -> groups of it reached there (none at 0)
    everywhere: int = 0
    populated: int = 0


class _Table:
    """Groups of one scope (a namespace, a namespaceSelector, ...) by a single-value ``In`` of
    their podSelector: a Pod's candidates are the loose ones and those keyed by its labels."""

    __slots__ = ("all", "keyed", "loose")

    def __init__(self) -> None:
        self.all: set[Group] = set()
        self.keyed: dict[tuple[str, str], set[Group]] = {}
        self.loose: set[Group] = set()

    @staticmethod
    def _anchors(g: Group) -> list[tuple[str, str]] | None:
        for r in g.pods.requirements:
            if r.operator == "In":
                return [(r.key, v) for v in r.values]
        return None

    def add(self, g: Group) -> None:
        self.all.add(g)
        anchors = self._anchors(g)
        if anchors is None:
            self.loose.add(g)
        else:
            for a in anchors:
                self.keyed.setdefault(a, set()).add(g)

    def remove(self, g: Group) -> None:
        self.all.discard(g)
        anchors = self._anchors(g)
        if anchors is None:
            self.loose.discard(g)
        else:
            for a in anchors:
                s = self.keyed[a]
                s.discard(g)
                if not s:
                    del self.keyed[a]

    def candidates(self, labels: Iterable[tuple[str, str]], into: set[Group]) -> None:
        into |= self.loose
        for kv in labels:
            hit = self.keyed.get(kv)
            if hit:
                into |= hit


class SpanIndex:
    """:func:`.relevance.spans` of the objects delivered so far, kept event by event (module
    docstring), and the Pods whose span changed since the last :meth:`take_changes`.
    ``remote_egress``: the planners' flag the spans are for (:func:`.relevance.spans`; False,
    route-sync's ``policyPeers: peerSlices``: no POPULATED or EVERYWHERE term, a
    ClusterNetworkPolicy's egress peers are NODES terms)."""

    def __init__(self, remote_egress: bool = True) -> None:
        self.remote_egress = remote_egress
        self._pods: dict[str, _PodState] = {}
        self._ns_labels: dict[str, dict[str, str]] = {}
        self._by_ns: dict[str, set[str]] = {}
        self._by_label: dict[tuple[str, str, str], set[str]] = {}
        self._by_port: dict[tuple[str, str], set[str]] = {}
        self._groups: dict[Group, _GroupState] = {}
        self._fixed: dict[str, _Table] = {}  # namespace -> its groups
        self._selected: dict[sel.Selector, _Table] = {}  # namespaceSelector -> its groups
        self._ns_match: dict[str, set[sel.Selector]] = {}  # namespace -> the namespaceSelectors it matches (a cache)
        self._ported: dict[tuple[str, str], set[Group]] = {}  # (name, protocol) -> named-port groups
        self._terms: dict[tuple[str, str], dict[Term, int]] = {}  # ("np"|"cnp", key) -> its terms
        self._dirty: set[str] = set()
        self._published: dict[str, Span] = {}
        self._touched: set[Group] = set()  # groups whose members or reach changed since take_group_changes
        self._group_published: dict[Group, GroupView] = {}

    # -- reading -------------------------------------------------------------------------------
    def span(self, key: str) -> Span | None:
        """The Nodes that read Pod ``key`` (None: no Node, or no such Pod)."""
        st = self._pods.get(key)
        if st is None or not (st.nodes or st.everywhere or st.populated):
            return None
        return Span(frozenset(st.nodes) - {st.pod.node}, st.everywhere > 0, st.populated > 0)

    def spans(self) -> dict[str, Span]:
        """Every Pod some Node reads, as :func:`.relevance.spans` of the same objects."""
        out: dict[str, Span] = {}
        for key in self._pods:
            s = self.span(key)
            if s is not None:
                out[key] = s
        return out

    def group(self, g: Group) -> GroupView | None:
        """Group ``g``'s members and reach; None when no policy names it."""
        gs = self._groups.get(g)
        if gs is None:
            return None
        reach = GroupReach(frozenset(gs.reach), gs.everywhere_in > 0 or gs.everywhere_subject > 0, gs.populated > 0)
        return GroupView(frozenset(gs.members), reach)

    def groups(self) -> dict[Group, GroupView]:
        """Every group some policy names, as :func:`group_views` of the same objects."""
        out: dict[Group, GroupView] = {}
        for g in self._groups:
            v = self.group(g)
            assert v is not None
            out[g] = v
        return out

    def take_group_changes(self) -> dict[Group, GroupView | None]:
        """The groups whose members or reach are not what the last call returned for them (None:
        no policy names it any more); what a controller that publishes by group writes."""
        out: dict[Group, GroupView | None] = {}
        for g in self._touched:
            now = self.group(g)
            if now != self._group_published.get(g):
                out[g] = now
                if now is None:
                    del self._group_published[g]
                else:
                    self._group_published[g] = now
        self._touched.clear()
        return out

    def drop_span_changes(self) -> None:
        """Forget which Pods' spans changed, for a reader that takes groups only
        (:meth:`take_group_changes`); :meth:`take_changes` then starts again from nothing."""
        self._dirty.clear()
        self._published.clear()

    def sizes(self) -> dict[str, int]:
        """What the index holds, by kind (a controller's metrics; all 0 once everything went)."""
        return {"pods": len(self._pods), "namespaces": len(self._ns_labels), "policies": len(self._terms),
                "groups": len(self._groups), "indexed": len(self._by_ns) + len(self._by_label) + len(self._by_port),
                "tables": len(self._fixed) + len(self._selected) + len(self._ported),
                "cached_namespaces": len(self._ns_match), "pending": len(self._dirty),
                "published": len(self._published), "touched_groups": len(self._touched),
                "published_groups": len(self._group_published)}

    def take_changes(self) -> dict[str, Span | None]:
        """The Pods whose span is not what the last call returned for them (None: read by no
        Node any more, or gone); what a controller publishes."""
        out: dict[str, Span | None] = {}
        for key in self._dirty:
            now = self.span(key)
            if now != self._published.get(key):
                out[key] = now
                if now is None:
                    del self._published[key]
                else:
                    self._published[key] = now
        self._dirty.clear()
        return out

    # -- events --------------------------------------------------------------------------------
    def upsert_pod(self, pod: Pod) -> None:
        key = pod.key
        st = self._pods.get(key)
        if st is not None and st.pod == pod:
            return
        labels = dict(pod.labels)
        new_groups = {g for g in self._candidates(pod) if g.holds(pod, labels, self._labels_of(pod.namespace))}
        if st is None:
            st = self._pods[key] = _PodState(pod, labels)
            self._index(pod, 1)
            for g in new_groups:
                self._join(g, st)
            self._dirty.add(key)
            return
        old = st.pod
        if old.node != pod.node:  # every group's Node counts move: leave all, join again
            self._leave_all(st)
            join = new_groups
        else:
            join = new_groups - st.groups
            for g in st.groups - new_groups:
                self._leave(g, st)
        self._index(old, -1)
        st.pod, st.labels = pod, labels
        self._index(pod, 1)
        for g in join:
            self._join(g, st)
        self._dirty.add(key)

    def delete_pod(self, key: str) -> None:
        st = self._pods.get(key)
        if st is None:
            return
        self._leave_all(st)
        self._index(st.pod, -1)
        del self._pods[key]
        self._forget(st.pod.namespace)
        self._dirty.add(key)

    def upsert_namespace(self, name: str, labels: Labels) -> None:
        self._namespace_event(name, dict(labels))

    def delete_namespace(self, name: str) -> None:
        if name in self._ns_labels:
            self._namespace_event(name, None)

    def upsert_policy(self, policy: Policy) -> None:
        self._set_terms(("np", policy.key), policy_terms(policy, self.remote_egress))

    def delete_policy(self, key: str) -> None:
        self._set_terms(("np", key), {})

    def upsert_cluster_policy(self, cp: ClusterPolicy) -> None:
        self._set_terms(("cnp", cp.name), cluster_policy_terms(cp, self.remote_egress))

    def delete_cluster_policy(self, name: str) -> None:
        self._set_terms(("cnp", name), {})

    # -- Pods ----------------------------------------------------------------------------------
    def _labels_of(self, ns: str) -> Mapping[str, str]:
        return self._ns_labels.get(ns, NO_LABELS)

    def _index(self, pod: Pod, d: int) -> None:
        key = pod.key
        _file(self._by_ns, pod.namespace, key, d)
        for k, v in pod.labels:
            _file(self._by_label, (pod.namespace, k, v), key, d)
        for p in pod.ports:
            _file(self._by_port, (p.name, p.protocol), key, d)

    def _candidates(self, pod: Pod) -> set[Group]:
        out: set[Group] = set()
        t = self._fixed.get(pod.namespace)
        if t is not None:
            t.candidates(pod.labels, out)
        for s in self._matching(pod.namespace):
            self._selected[s].candidates(pod.labels, out)
        for p in pod.ports:
            hit = self._ported.get((p.name, p.protocol))
            if hit:
                out |= hit
        return out

    def _matching(self, ns: str) -> set[sel.Selector]:
        hit = self._ns_match.get(ns)
        if hit is None:
            labels = self._labels_of(ns)
            hit = self._ns_match[ns] = {s for s in self._selected if s.matches(labels)}
        return hit

    def _forget(self, ns: str) -> None:
        """Drop ``ns``'s cached selectors once nothing names it (no object, no Pod)."""
        if ns not in self._ns_labels and ns not in self._by_ns:
            self._ns_match.pop(ns, None)

    # -- Namespaces ----------------------------------------------------------------------------
    def _namespace_event(self, name: str, labels: dict[str, str] | None) -> None:
        before = self._labels_of(name)
        if labels is None:
            del self._ns_labels[name]
        else:
            self._ns_labels[name] = labels
        after = self._labels_of(name)
        self._forget(name)
        if before == after:
            return
        self._ns_match.pop(name, None)
        keys = self._by_ns.get(name)
        if not keys:
            return
        for s, table in self._selected.items():
            was, now = s.matches(before), s.matches(after)
            if was == now:
                continue
            for g in table.all:
                for key in keys:
                    st = self._pods[key]
                    if not g.pods.matches(st.labels):
                        continue
                    if now:
                        self._join(g, st)
                    else:
                        self._leave(g, st)

    # -- groups --------------------------------------------------------------------------------
    def _acquire(self, g: Group) -> _GroupState:
        gs = self._groups.get(g)
        if gs is not None:
            return gs
        gs = self._groups[g] = _GroupState()
        self._touched.add(g)
        if g.ports:
            for np_ in g.ports:
                self._ported.setdefault(np_, set()).add(g)
            keys: set[str] = set()
            for np_ in g.ports:
                keys |= self._by_port.get(np_, set())
        elif g.namespace is not None:
            self._fixed.setdefault(g.namespace, _Table()).add(g)
            keys = self._select(g.namespace, g.pods)
        else:
            assert g.namespaces is not None
            s = g.namespaces
            if s not in self._selected:
                self._selected[s] = _Table()
                for ns, matching in self._ns_match.items():
                    if s.matches(self._labels_of(ns)):
                        matching.add(s)
            self._selected[s].add(g)
            keys = set()
            for ns in self._by_ns:
                if s.matches(self._labels_of(ns)):
                    keys |= self._select(ns, g.pods)
        for key in keys:  # nothing reaches the new group yet: its members only
            st = self._pods[key]
            if g.holds(st.pod, st.labels, self._labels_of(st.pod.namespace)):
                gs.members.add(key)
                st.groups.add(g)
                gs.nodes[st.pod.node] = gs.nodes.get(st.pod.node, 0) + 1
        return gs

    def _select(self, ns: str, pods: sel.Selector) -> set[str]:
        candidates = self._by_ns.get(ns, set())
        for r in pods.requirements:  # narrow by the smallest single-value In
            if r.operator == "In" and len(r.values) == 1:
                (value,) = r.values
                narrowed = self._by_label.get((ns, r.key, value), set())
                if len(narrowed) < len(candidates):
                    candidates = narrowed
        return {k for k in candidates if pods.matches(self._pods[k].labels)}

    def _release(self, g: Group) -> None:
        gs = self._groups.get(g)
        if gs is None or gs.users:
            return
        for key in gs.members:
            self._pods[key].groups.discard(g)  # nothing reaches it: the Pods' counts hold nothing of it
        del self._groups[g]
        self._touched.add(g)
        if g.ports:
            for np_ in g.ports:
                s = self._ported[np_]
                s.discard(g)
                if not s:
                    del self._ported[np_]
        elif g.namespace is not None:
            t = self._fixed[g.namespace]
            t.remove(g)
            if not t.all:
                del self._fixed[g.namespace]
        else:
            assert g.namespaces is not None
            t = self._selected[g.namespaces]
            t.remove(g)
            if not t.all:
                del self._selected[g.namespaces]
                for matching in self._ns_match.values():
                    matching.discard(g.namespaces)

    def _join(self, g: Group, st: _PodState) -> None:
        gs = self._groups[g]
        key, node = st.pod.key, st.pod.node
        gs.members.add(key)
        st.groups.add(g)
        self._touched.add(g)
        st.everywhere += (gs.everywhere_in > 0) + gs.everywhere_subject
        st.populated += gs.populated
        if gs.reach:
            st.nodes.update(gs.reach.keys())
        self._dirty.add(key)
        c = gs.nodes.get(node, 0)
        gs.nodes[node] = c + 1
        if c == 0:
            for t, m in gs.to_nodes.items():
                self._reach(t, (node,), m)
        if len(gs.members) == 1:
            for t, m in gs.to_everywhere.items():
                self._everywhere_in(t, m)

    def _leave(self, g: Group, st: _PodState) -> None:
        gs = self._groups[g]
        self._shrink(gs, st.pod.node)
        st.everywhere -= (gs.everywhere_in > 0) + gs.everywhere_subject
        st.populated -= gs.populated
        _uncount(st.nodes, gs.reach)
        gs.members.discard(st.pod.key)
        st.groups.discard(g)
        self._touched.add(g)
        self._dirty.add(st.pod.key)

    def _leave_all(self, st: _PodState) -> None:
        """``st`` out of every group (deleted, or moving to another Node): its own counts just
        start again from nothing."""
        key = st.pod.key
        groups, st.groups = st.groups, set()
        self._touched |= groups
        for g in groups:
            gs = self._groups[g]
            gs.members.discard(key)
            self._shrink(gs, st.pod.node, gone=True)
        st.nodes.clear()
        st.everywhere = st.populated = 0
        self._dirty.add(key)

    def _shrink(self, gs: _GroupState, node: str, gone: bool = False) -> None:
        """A member on ``node`` leaves ``gs`` (``gone``: already out of ``gs.members``): what
        the group reaches changes when it was its last there, or its last."""
        c = gs.nodes[node]
        if c == 1:
            del gs.nodes[node]
            for t, m in gs.to_nodes.items():
                self._reach(t, (node,), -m)
        else:
            gs.nodes[node] = c - 1
        if len(gs.members) == (0 if gone else 1):
            for t, m in gs.to_everywhere.items():
                self._everywhere_in(t, -m)

    def _reach(self, g: Group, nodes: Iterable[str], d: int) -> None:
        """The weight ``d`` on ``g``'s reach at each of ``nodes``: the Nodes that start or stop
        reaching it go to its members."""
        gs = self._groups[g]
        reach = gs.reach
        up: list[str] = []
        down: list[str] = []
        for node in nodes:
            before = reach.get(node, 0)
            after = before + d
            if after:
                reach[node] = after
            else:
                del reach[node]
            if before <= 0 < after:
                up.append(node)
            elif after <= 0 < before:
                down.append(node)
        if not (up or down):
            return
        self._touched.add(g)
        pods, dirty = self._pods, self._dirty
        if len(up) + len(down) == 1:  # one Node (a Pod's event): only the members it is new or gone for
            (node,) = up or down
            for key in gs.members:
                counts = pods[key].nodes
                c = counts.get(node, 0)
                if up:
                    counts[node] = c + 1
                    if not c:
                        dirty.add(key)
                elif c == 1:
                    del counts[node]
                    dirty.add(key)
                else:
                    counts[node] = c - 1
            return
        for key in gs.members:  # many (a policy's event): counted in C, every member looked at again
            counts = pods[key].nodes
            if up:
                counts.update(up)
            if down:
                _uncount(counts, down)
        dirty |= gs.members

    def _everywhere_in(self, g: Group, d: int) -> None:
        gs = self._groups[g]
        before = gs.everywhere_in
        gs.everywhere_in = after = before + d
        if (before > 0) != (after > 0):
            self._touched.add(g)
            self._flag(gs.members, "everywhere", 1 if after > 0 else -1)

    def _flag(self, members: set[str], which: str, d: int) -> None:
        """``d`` on the ``which`` count of ``members``: those whose count starts or stops are changed."""
        pods, dirty = self._pods, self._dirty
        for key in members:
            st = pods[key]
            before = getattr(st, which)
            setattr(st, which, before + d)
            if (before > 0) != (before + d > 0):
                dirty.add(key)

    # -- policies ------------------------------------------------------------------------------
    def _set_terms(self, key: tuple[str, str], terms: dict[Term, int]) -> None:
        old = self._terms.get(key, {})
        if old == terms:
            return
        if terms:
            self._terms[key] = terms
        else:
            self._terms.pop(key, None)
        delta = dict(terms)
        for t, w in old.items():
            delta[t] = delta.get(t, 0) - w
        gained = [(t, w) for t, w in delta.items() if w > 0]
        lost = [(t, w) for t, w in delta.items() if w < 0]
        for t, w in gained:  # first what comes: a reach both lose and gain weight on never falls to 0 between
            self._term(t, w)
        for t, w in lost:
            self._term(t, w)
        for t, _w in lost:
            self._release(t.source)
            if t.target is not None:
                self._release(t.target)

    def _term(self, t: Term, w: int) -> None:
        s = self._acquire(t.source)
        s.users += w
        if t.kind in (POPULATED, EVERYWHERE_SUBJECT):
            self._touched.add(t.source)
        if t.kind == POPULATED:
            s.populated += w
            self._flag(s.members, "populated", w)
            return
        if t.kind == EVERYWHERE_SUBJECT:
            s.everywhere_subject += w
            self._flag(s.members, "everywhere", w)
            return
        assert t.target is not None
        tg = self._acquire(t.target)
        tg.users += w
        if t.kind == NODES:
            _bump(s.to_nodes, t.target, w)
            self._reach(t.target, list(s.nodes), w)
        else:
            _bump(s.to_everywhere, t.target, w)
            if s.members:
                self._everywhere_in(t.target, w)


def _file(index: dict[_K, set[str]], k: _K, key: str, d: int) -> None:
    if d > 0:
        index.setdefault(k, set()).add(key)
        return
    s = index.get(k)
    if s is not None:
        s.discard(key)
        if not s:
            del index[k]


def _uncount(counts: Counter[str], nodes: Iterable[str]) -> None:
    for n in nodes:
        c = counts[n] - 1
        if c:
            counts[n] = c
        else:
            del counts[n]


def _bump(d: dict[Group, int], k: Group, w: int) -> None:
    c = d.get(k, 0) + w
    if c:
        d[k] = c
    else:
        del d[k]
