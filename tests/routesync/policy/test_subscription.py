"""A Node's subscriptions, told from its own Pods, held to the controller's view of the whole
cluster: the random event sequences of ``test_spanindex.py`` (Pods added, deleted, relabelled,
moved between Nodes; Namespaces relabelled and deleted; NetworkPolicies and
ClusterNetworkPolicies created, edited, deleted; stale copies and duplicates), each delivered to
every Node's :class:`Subscriptions` as its route-sync's watches would (its own Pods by
``spec.nodeName``: a Pod that moves away arrives elsewhere), and after *every* event, for every
Node, :meth:`Subscriptions.groups` equal to :func:`subscribed` over every Pod, and
:meth:`Subscriptions.take_changes` (called after some events only) the difference from the
reference when it was last called.

``FERRY_SPAN_DIFF_EVENTS`` sets how many events in all (default 12,000; a quarter of them here)."""

from __future__ import annotations

import random

import pytest

from routesync.policy.cnp.model import ClusterPolicy
from routesync.policy.model import Pod, Policy, policy_from
from routesync.policy.relevance import Labels
from routesync.policy.subscription import Subscriptions, subscribed
from tests.routesync.policy.test_spanindex import EVENTS, NODES, PER_SEQUENCE, Feed


class EveryNode:
    """The watches of every Node's route-sync: each event to each Node's :class:`Subscriptions`,
    a Pod event as the Node's field-selected watch gives it (to its Node an upsert; to a Node it
    moved away from, a delete; to the others nothing)."""

    def __init__(self) -> None:
        self.subs = {n: Subscriptions(n) for n in NODES}
        self.node_of: dict[str, str] = {}

    def upsert_pod(self, pod: Pod) -> None:
        old = self.node_of.get(pod.key)
        if old is not None and old != pod.node:
            self.subs[old].delete_pod(pod.key)
        self.node_of[pod.key] = pod.node
        self.subs[pod.node].upsert_pod(pod)

    def delete_pod(self, key: str) -> None:
        node = self.node_of.pop(key, None)
        if node is not None:
            self.subs[node].delete_pod(key)

    def upsert_namespace(self, name: str, labels: Labels) -> None:
        for s in self.subs.values():
            s.upsert_namespace(name, labels)

    def delete_namespace(self, name: str) -> None:
        for s in self.subs.values():
            s.delete_namespace(name)

    def upsert_policy(self, policy: Policy) -> None:
        for s in self.subs.values():
            s.upsert_policy(policy)

    def delete_policy(self, key: str) -> None:
        for s in self.subs.values():
            s.delete_policy(key)

    def upsert_cluster_policy(self, cp: ClusterPolicy) -> None:
        for s in self.subs.values():
            s.upsert_cluster_policy(cp)

    def delete_cluster_policy(self, name: str) -> None:
        for s in self.subs.values():
            s.delete_cluster_policy(name)


def replay(seed: int, events: int) -> dict[str, int]:
    rng = random.Random(seed)
    feed = Feed(rng)
    nodes = EveryNode()
    before = {n: frozenset[str]() for n in NODES}
    seen = {"subscribed": 0, "added": 0, "removed": 0}
    for i in range(events):
        ev = feed.event()
        batch = [ev, ev] if rng.random() < 0.03 else [ev]
        for e in batch:
            feed.deliver(e, nodes)  # type: ignore[arg-type]  # the methods SpanIndex has
            for n, subs in nodes.subs.items():
                want = subscribed(n, feed.inputs(), feed.tier_policies())
                where = f"seed {seed} event {i} ({e[0]} {e[1]}), Node {n}"
                got = subs.groups()
                assert got == want, f"{where}: {sorted(got ^ want)} differ"
                seen["subscribed"] += len(want)
                if rng.random() < 0.4:
                    continue  # taken later: what came and went in between is in neither
                added, removed = subs.take_changes()
                assert (added, removed) == (want - before[n], before[n] - want), where
                before[n] = want
                seen["added"] += len(added)
                seen["removed"] += len(removed)
    return seen


@pytest.mark.parametrize("seed", range(max(1, EVENTS // PER_SEQUENCE // 4)))
def test_a_nodes_own_pods_tell_the_groups_the_controller_publishes_for_it(seed: int) -> None:
    seen = replay(seed, PER_SEQUENCE)
    assert seen["subscribed"] and seen["added"] and seen["removed"], seen  # not vacuous


def test_a_pod_moving_away_takes_its_subscriptions_with_it() -> None:
    pol = policy_from({"metadata": {"namespace": "a", "name": "db"},
                       "spec": {"podSelector": {"matchLabels": {"app": "db"}},
                                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}})
    subs = Subscriptions("n1")
    subs.upsert_policy(pol)
    assert subs.groups() == frozenset()
    db = Pod("a", "db", "n1", (("app", "db"),), ("10.0.0.2",))
    subs.upsert_pod(db)
    (web_group,) = subs.groups()
    assert subs.take_changes() == (frozenset({web_group}), frozenset())
    subs.upsert_pod(Pod("a", "db", "n2", (("app", "db"),), ("10.0.0.2",)))  # moved: n1's watch no longer holds it
    assert subs.groups() == frozenset()
    assert subs.take_changes() == (frozenset(), frozenset({web_group}))
