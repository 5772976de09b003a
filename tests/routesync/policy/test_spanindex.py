"""The incremental spans held to the full recompute: randomized event sequences as the watches
deliver them (Pods added, deleted, relabelled, moved between Nodes, re-addressed, their named
ports changed; Namespaces created, relabelled, deleted with or without their Pods first;
NetworkPolicies and ClusterNetworkPolicies of every shape created, edited, deleted; deletes of
what is not there; the same event twice; an older copy of an object after a newer one; two
events swapped) and, after *every* event, :meth:`SpanIndex.spans` equal to
:func:`relevance.spans` of the objects delivered so far, and :meth:`SpanIndex.take_changes`
naming exactly the Pods whose span differs from the previous event's reference; both for the
planners that judge a remote client's egress (``remote_egress``, ``policyPeers: cluster``) and
for those that judge egress at its source only (``peerSlices``).

``FERRY_SPAN_DIFF_EVENTS`` sets how many events in all (default 12,000)."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from routesync.policy import plan as pp
from routesync.policy import relevance, spanindex
from routesync.policy.cnp.model import ClusterPolicy, cluster_policy_from
from routesync.policy.model import NamedPort, Pod, Policy, policy_from
from routesync.policy.relevance import Span
from routesync.policy.spanindex import SpanIndex
from tests.routesync.policy.cnp.test_incremental import World as TierWorld
from tests.routesync.policy.test_incremental import World as PolicyWorld

EVENTS = int(os.environ.get("FERRY_SPAN_DIFF_EVENTS", "12000"))
PER_SEQUENCE = 300
NAMESPACES = ("a", "b", "a-b", "c", "d")
NODES = ("n1", "n2", "n3", "n4")

Event = tuple[str, Any]


class Feed:
    """What the watches have delivered (the reference's inputs), and the next event: the objects
    are the two planners' differential tests' generators', their vocabularies mixed so that the
    NetworkPolicies' and the ClusterNetworkPolicies' selectors both pick Pods and Namespaces."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.np = PolicyWorld(rng)
        self.tiers = TierWorld(rng)
        self.pods: dict[str, Pod] = {}
        self.namespaces: dict[str, tuple[tuple[str, str], ...]] = {}
        self.policies: dict[str, Policy] = {}
        self.cluster_policies: dict[str, ClusterPolicy] = {}
        self.history: list[Event] = []  # recent upserts: stale copies to deliver again
        self.queue: list[Event] = []  # the rest of a multi-event change (a Namespace's Pods, then it)

    def inputs(self) -> pp.Inputs:
        return pp.Inputs(tuple(sorted(self.pods.values(), key=lambda p: p.key)), dict(self.namespaces),
                         tuple(sorted(self.policies.values(), key=lambda p: p.key)))

    def tier_policies(self) -> tuple[ClusterPolicy, ...]:
        return tuple(sorted(self.cluster_policies.values(), key=lambda p: p.name))

    # -- objects -------------------------------------------------------------------------------
    def labels(self) -> tuple[tuple[str, str], ...]:
        out = dict(self.np.labels())
        if self.rng.random() < 0.5:
            out.update(self.tiers.labels())
        return tuple(sorted(out.items()))

    def ports(self) -> tuple[NamedPort, ...]:
        if self.rng.random() < 0.7:
            return self.np.ports()
        return self.tiers.pod("a", "x").ports

    def pod(self, ns: str, name: str) -> Pod:
        rng = self.rng
        return Pod(ns, name, rng.choice(NODES), self.labels(), self.np.ips(), self.ports())

    def namespace_labels(self, ns: str) -> tuple[tuple[str, str], ...]:
        rng = self.rng
        labels = {"kubernetes.io/metadata.name": ns}
        if rng.random() < 0.7:
            labels["team"] = rng.choice(("t1", "t2", "a", "b"))
        if rng.random() < 0.5:
            labels["env"] = rng.choice(("prod", "dev"))
        if rng.random() < 0.3:
            labels["tier"] = "1"
        return tuple(sorted(labels.items()))

    # -- events --------------------------------------------------------------------------------
    def event(self) -> Event:
        rng = self.rng
        if self.queue:
            return self.queue.pop(0)
        r = rng.random()
        if r < 0.07 and self.history:  # an older copy of something, or the same again
            return rng.choice(self.history)
        if r < 0.42:
            ns, name = rng.choice(NAMESPACES), f"p{rng.randrange(8)}"
            old = self.pods.get(f"{ns}/{name}")
            if old is None or rng.random() < 0.15:
                return ("pod", self.pod(ns, name))
            change = rng.randrange(5)
            if change == 0:  # relabelled
                return ("pod", Pod(ns, name, old.node, self.labels(), old.ips, old.ports))
            if change == 1:  # moved
                return ("pod", Pod(ns, name, rng.choice(NODES), old.labels, old.ips, old.ports))
            if change == 2:  # re-addressed
                return ("pod", Pod(ns, name, old.node, old.labels, self.np.ips(), old.ports))
            if change == 3:  # named ports changed
                return ("pod", Pod(ns, name, old.node, old.labels, old.ips, self.ports()))
            return ("pod", Pod(ns, name, rng.choice(NODES), self.labels(), old.ips, old.ports))
        if r < 0.52:
            if self.pods and rng.random() < 0.9:
                return ("pod-", rng.choice(sorted(self.pods)))
            return ("pod-", "a/never")
        if r < 0.64:
            ns = rng.choice(NAMESPACES)
            return ("ns", (ns, self.namespace_labels(ns)))
        if r < 0.68:
            ns = rng.choice(NAMESPACES)
            if rng.random() < 0.5:  # as the API server does it: its Pods go first
                self.queue = [("pod-", k) for k in sorted(self.pods) if self.pods[k].namespace == ns]
                self.queue.append(("ns-", ns))
                return self.queue.pop(0)
            return ("ns-", ns)  # or a watch that saw the Namespace go before its Pods
        if r < 0.86:
            ns, name = rng.choice(NAMESPACES), f"pol{rng.randrange(4)}"
            if f"{ns}/{name}" in self.policies and rng.random() < 0.25:
                return ("policy-", f"{ns}/{name}")
            if rng.random() < 0.03:
                return ("policy-", "a/never")
            return ("policy", self.np.policy(ns, name))
        name = f"cnp{rng.randrange(4)}"
        if name in self.cluster_policies and rng.random() < 0.25:
            return ("cnp-", name)
        if rng.random() < 0.03:
            return ("cnp-", "never")
        return ("cnp", self.tiers.policy(name))

    def deliver(self, ev: Event, idx: SpanIndex) -> None:
        kind, obj = ev
        if kind == "pod":
            self.pods[obj.key] = obj
            idx.upsert_pod(obj)
        elif kind == "pod-":
            self.pods.pop(obj, None)
            idx.delete_pod(obj)
        elif kind == "ns":
            self.namespaces[obj[0]] = obj[1]
            idx.upsert_namespace(*obj)
        elif kind == "ns-":
            self.namespaces.pop(obj, None)
            idx.delete_namespace(obj)
        elif kind == "policy":
            self.policies[obj.key] = obj
            idx.upsert_policy(obj)
        elif kind == "policy-":
            self.policies.pop(obj, None)
            idx.delete_policy(obj)
        elif kind == "cnp":
            self.cluster_policies[obj.name] = obj
            idx.upsert_cluster_policy(obj)
        else:
            self.cluster_policies.pop(obj, None)
            idx.delete_cluster_policy(obj)
        if kind in ("pod", "ns", "policy", "cnp"):
            self.history.append(ev)
            del self.history[:-40]


def spans_of_groups(inputs: pp.Inputs, groups: dict[spanindex.Group, spanindex.GroupView]) -> dict[str, Span]:
    """Each Pod's span as the union of its groups' reach without its own Node (what a Node receives
    when PeerSlices are written per group)."""
    node_of = {p.key: p.node for p in inputs.pods}
    nodes: dict[str, set[str]] = {}
    everywhere: set[str] = set()
    populated: set[str] = set()
    for view in groups.values():
        for key in view.members:
            if view.reach.anywhere:
                nodes.setdefault(key, set()).update(view.reach.nodes)
            if view.reach.everywhere:
                everywhere.add(key)
            if view.reach.populated:
                populated.add(key)
    return {k: Span(frozenset(nodes.get(k, ())) - {node_of[k]}, k in everywhere, k in populated)
            for k in nodes.keys() | everywhere | populated}


def replay(seed: int, events: int, remote_egress: bool = True) -> dict[str, int]:
    """``events`` random events from ``seed``, both properties checked after each; counts of
    what the sequence exercised (so a test can tell it was not vacuous)."""
    rng = random.Random(seed)
    feed = Feed(rng)
    idx = SpanIndex(remote_egress)
    before: dict[str, Span] = {}
    groups_before: dict[spanindex.Group, spanindex.GroupView] = {}
    seen = {"group_changes": 0, "changes": 0, "everywhere": 0, "populated": 0, "nodes": 0, "kinds": 0}
    kinds: set[str] = set()
    pending: Event | None = None
    for i in range(events):
        ev = feed.event()
        if pending is None and not feed.queue and rng.random() < 0.05:
            pending = ev  # delivered after the next one
            continue
        batch = [ev, ev] if rng.random() < 0.03 else [ev]  # the same event twice
        if pending is not None:
            batch.append(pending)
            pending = None
        for e in batch:
            feed.deliver(e, idx)
            kinds.add(e[0])
            where = f"seed {seed} event {i}: {e[0]} {e[1]}"
            want = relevance.spans(feed.inputs(), feed.tier_policies(), remote_egress)
            got = idx.spans()
            assert got == want, (f"{where}: spans differ at "
                                 f"{sorted(k for k in got.keys() | want.keys() if got.get(k) != want.get(k))}")
            changed = {k: want.get(k) for k in before.keys() | want.keys() if before.get(k) != want.get(k)}
            taken = idx.take_changes()
            assert taken == changed, f"{where}: take_changes {taken}, the spans that changed {changed}"
            for k in list(want)[:3]:
                assert idx.span(k) == want[k], where
            want_groups = spanindex.group_views(feed.inputs(), feed.tier_policies(), remote_egress)
            got_groups = idx.groups()
            differ = [g for g in got_groups.keys() | want_groups.keys() if got_groups.get(g) != want_groups.get(g)]
            assert got_groups == want_groups, f"{where}: groups differ at {differ}"
            changed_groups = {g: want_groups.get(g) for g in groups_before.keys() | want_groups.keys()
                              if groups_before.get(g) != want_groups.get(g)}
            taken_groups = idx.take_group_changes()
            assert taken_groups == changed_groups, f"{where}: take_group_changes differs"
            assert spans_of_groups(feed.inputs(), want_groups) == want, f"{where}: groups' reach is not the spans"
            groups_before = want_groups
            seen["group_changes"] += len(taken_groups)
            before = want
            seen["changes"] += len(taken)
            seen["everywhere"] += sum(s.everywhere for s in want.values())
            seen["populated"] += sum(s.populated for s in want.values())
            seen["nodes"] += sum(len(s.nodes) for s in want.values())
    seen["kinds"] = len(kinds)
    return seen


@pytest.mark.parametrize("remote_egress", [True, False], ids=["cluster", "peerSlices"])
@pytest.mark.parametrize("seed", range(4))
def test_everything_deleted_leaves_nothing_held(seed: int, remote_egress: bool) -> None:
    rng = random.Random(seed)
    feed = Feed(rng)
    idx = SpanIndex(remote_egress)
    for _ in range(PER_SEQUENCE):
        feed.deliver(feed.event(), idx)
    assert idx.sizes()["groups"] > 0
    for kind, keys in (("pod-", feed.pods), ("policy-", feed.policies), ("cnp-", feed.cluster_policies),
                       ("ns-", feed.namespaces)):
        for k in list(keys):
            feed.deliver((kind, k), idx)
    idx.take_changes()
    idx.take_group_changes()
    assert set(idx.sizes().values()) == {0}, idx.sizes()


@pytest.mark.parametrize("remote_egress", [True, False], ids=["cluster", "peerSlices"])
@pytest.mark.parametrize("seed", range(max(1, EVENTS // PER_SEQUENCE)))
def test_the_index_equals_the_full_recompute_after_every_event(seed: int, remote_egress: bool) -> None:
    seen = replay(seed, min(PER_SEQUENCE, EVENTS), remote_egress)
    # not vacuous: every kind of event came, and every kind of span there is with this flag
    assert seen["kinds"] == 8 and seen["changes"] > 0 and seen["group_changes"] > 0 and seen["nodes"], seen
    if remote_egress:
        assert seen["everywhere"] and seen["populated"], seen
    else:
        assert not (seen["everywhere"] or seen["populated"]), seen


# -- behaviour, by name ----------------------------------------------------------------------------

def pod(ns: str, name: str, node: str, ports: tuple[NamedPort, ...] = (), **labels: str) -> Pod:
    return Pod(ns, name, node, tuple(sorted(labels.items())), ("10.0.0.1",), ports)


def np(ns: str, name: str, spec: dict[str, Any]) -> Policy:
    return policy_from({"metadata": {"namespace": ns, "name": name}, "spec": spec})


DB_FROM_WEB = np("a", "db-from-web", {"podSelector": {"matchLabels": {"app": "db"}},
                                      "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]})


def db_and_webs() -> SpanIndex:
    idx = SpanIndex()
    idx.upsert_namespace("a", (("kubernetes.io/metadata.name", "a"),))
    idx.upsert_pod(pod("a", "db1", "n2", app="db"))
    idx.upsert_pod(pod("a", "web1", "n1", app="web"))
    idx.upsert_pod(pod("a", "web2", "n3", app="web"))
    idx.upsert_policy(DB_FROM_WEB)
    assert idx.take_changes() == {"a/web1": Span(frozenset({"n2"})), "a/web2": Span(frozenset({"n2"}))}
    return idx


def test_an_event_elsewhere_changes_no_span() -> None:
    idx = db_and_webs()
    idx.upsert_pod(pod("a", "web1", "n1", app="web"))  # the same again
    idx.upsert_pod(pod("a", "cache", "n1", app="cache"))  # selected by nothing
    idx.upsert_pod(pod("b", "web", "n4", app="web"))  # another namespace
    idx.upsert_namespace("b", (("team", "t1"),))  # no namespaceSelector in use
    idx.upsert_policy(np("b", "deny", {"podSelector": {"matchLabels": {"app": "none"}}}))  # selects no Pod
    idx.upsert_pod(Pod("a", "web1", "n1", (("app", "web"),), ("10.0.0.9",)))  # re-addressed: spans hold no address
    assert idx.take_changes() == {}
    idx.delete_pod("a/never")
    idx.delete_policy("a/never")
    idx.delete_namespace("never")
    idx.delete_cluster_policy("never")
    assert idx.take_changes() == {}


def test_a_pod_joining_a_policy_on_a_node_that_has_one_changes_no_peer() -> None:
    idx = db_and_webs()
    idx.upsert_pod(pod("a", "db2", "n2", app="db"))  # n2 already has the policy's db1
    assert idx.take_changes() == {}
    idx.delete_pod("a/db1")  # db2 still holds n2
    assert idx.take_changes() == {}
    idx.upsert_pod(pod("a", "db3", "n4", app="db"))  # a Node the policy had no Pod on
    assert idx.take_changes() == {"a/web1": Span(frozenset({"n2", "n4"})), "a/web2": Span(frozenset({"n2", "n4"}))}
    idx.upsert_pod(pod("a", "db2", "n1", app="db"))  # moved: n2 gone, n1 joins; web1 is on n1 itself
    assert idx.take_changes() == {"a/web1": Span(frozenset({"n4"})), "a/web2": Span(frozenset({"n1", "n4"}))}


def test_a_namespace_relabel_moves_its_pods_in_and_out_of_a_namespace_selector() -> None:
    idx = SpanIndex()
    idx.upsert_namespace("a", (("team", "t1"),))
    idx.upsert_namespace("b", ())
    idx.upsert_pod(pod("a", "db", "n1", app="db"))
    idx.upsert_pod(pod("b", "client", "n2", app="client"))
    t1 = {"namespaceSelector": {"matchLabels": {"team": "t1"}}}
    idx.upsert_policy(np("a", "from-t1", {"podSelector": {}, "ingress": [{"from": [t1]}]}))
    assert idx.take_changes() == {"a/db": Span()}  # read by its own Node only: a span without Nodes
    idx.upsert_namespace("b", (("team", "t1"),))
    assert idx.take_changes() == {"b/client": Span(frozenset({"n1"}))}
    idx.delete_namespace("b")  # a Pod whose Namespace went is read with no labels
    assert idx.take_changes() == {"b/client": None}
    idx.upsert_namespace("b", (("team", "t1"),))
    idx.upsert_namespace("a", (("team", "t2"),))  # a's own Pod leaves the peers too
    assert idx.take_changes() == {"a/db": None, "b/client": Span(frozenset({"n1"}))}
    assert idx.spans() == {"b/client": Span(frozenset({"n1"}))}


def test_the_last_delivery_wins() -> None:
    idx = db_and_webs()
    old, new = pod("a", "web1", "n1", app="web"), pod("a", "web1", "n1", app="other")
    idx.upsert_pod(new)
    assert idx.take_changes() == {"a/web1": None}
    idx.upsert_pod(old)  # an older copy after the newer one: it is what the index holds now
    assert idx.take_changes() == {"a/web1": Span(frozenset({"n2"}))}
    edited = np("a", "db-from-web", {"podSelector": {"matchLabels": {"app": "db"}}, "ingress": [{}]})
    idx.upsert_policy(edited)
    idx.upsert_policy(DB_FROM_WEB)
    idx.upsert_policy(edited)
    assert idx.take_changes() == {"a/web1": None, "a/web2": None}


def test_egress_named_ports_and_the_tiers() -> None:
    idx = SpanIndex()
    http = (NamedPort("http", "TCP", 8080),)
    idx.upsert_pod(pod("a", "client", "n1", app="client"))
    idx.upsert_pod(pod("b", "server", "n2", http, app="server"))
    idx.upsert_pod(pod("b", "other", "n3", app="server"))
    idx.upsert_policy(np("a", "out-http", {"podSelector": {"matchLabels": {"app": "client"}}, "policyTypes": ["Egress"],
                                           "egress": [{"ports": [{"port": "http"}]}]}))
    # the client: isolated for egress, judged wherever a Pod is; the Pods with an "http" port: read where it is
    assert idx.take_changes() == {"a/client": Span(populated=True), "b/server": Span(frozenset({"n1"}))}
    idx.upsert_pod(pod("b", "other", "n3", http, app="server"))
    assert idx.take_changes() == {"b/other": Span(frozenset({"n1"}))}
    cnp = cluster_policy_from({"metadata": {"name": "to-servers"}, "spec": {
        "tier": "Admin", "priority": 1, "subject": {"pods": {"namespaceSelector": {},
                                                             "podSelector": {"matchLabels": {"app": "nobody"}}}},
        "egress": [{"action": "Deny", "to": [{"pods": {"namespaceSelector": {},
                                                         "podSelector": {"matchLabels": {"app": "server"}}}}]}]}})
    idx.upsert_cluster_policy(cnp)
    assert idx.take_changes() == {}  # without a subject its egress reads nothing
    idx.upsert_pod(pod("c", "nobody", "n4", app="nobody"))
    assert idx.take_changes() == {"c/nobody": Span(everywhere=True),
                                  "b/server": Span(frozenset({"n1"}), everywhere=True),
                                  "b/other": Span(frozenset({"n1"}), everywhere=True)}
    idx.delete_cluster_policy("to-servers")
    idx.delete_policy("a/out-http")
    assert idx.take_changes() == {"a/client": None, "b/server": None, "b/other": None, "c/nobody": None}
    assert idx.spans() == {}


def test_without_remote_egress_egress_is_read_where_its_subjects_are() -> None:
    idx = SpanIndex(remote_egress=False)
    http = (NamedPort("http", "TCP", 8080),)
    idx.upsert_pod(pod("a", "client", "n1", app="client"))
    idx.upsert_pod(pod("b", "server", "n2", http, app="server"))
    idx.upsert_policy(np("a", "out-http", {"podSelector": {"matchLabels": {"app": "client"}}, "policyTypes": ["Egress"],
                                           "egress": [{"ports": [{"port": "http"}]}]}))
    # the client is judged at its source only: read by no other Node; its peers where it is
    assert idx.take_changes() == {"b/server": Span(frozenset({"n1"}))}
    cnp = cluster_policy_from({"metadata": {"name": "to-servers"}, "spec": {
        "tier": "Admin", "priority": 1, "subject": {"pods": {"namespaceSelector": {},
                                                             "podSelector": {"matchLabels": {"app": "nobody"}}}},
        "egress": [{"action": "Deny", "to": [{"pods": {"namespaceSelector": {},
                                                         "podSelector": {"matchLabels": {"app": "server"}}}}]}]}})
    idx.upsert_cluster_policy(cnp)
    assert idx.take_changes() == {}
    idx.upsert_pod(pod("c", "nobody", "n4", app="nobody"))  # a subject on n4: its egress peers are read there
    assert idx.take_changes() == {"b/server": Span(frozenset({"n1", "n4"}))}
    idx.delete_cluster_policy("to-servers")
    idx.delete_policy("a/out-http")
    assert idx.take_changes() == {"b/server": None}
    assert idx.spans() == {}
