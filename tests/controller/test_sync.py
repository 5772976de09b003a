"""ferry-controller's loop (controller/sync.py) held to the full reference, as the watches feed it.

Random sequences of Pod, Namespace, NetworkPolicy and ClusterNetworkPolicy events (the span
index's differential test's generator: objects created, edited, moved, deleted, delivered twice,
an older copy after a newer one, a Namespace gone before its Pods) land in in-memory journals
that behave as :class:`routesync.sources.reflector.Reflector`'s do (a re-delivery of what is held
notes nothing, a delete of what is not there notes nothing, a key's latest value wins); a few
events at a time, then one :meth:`Sync.step` (the events of one wake-up coalesce), its writes
applied to a store that refuses a create of an existing name, an update or delete of a missing one
and an update that changes nothing.  After every step the store holds, Pod for Pod, what
:func:`plan_slices` of the Pods and :func:`spanindex.group_views` (the full recompute; tied to
:func:`relevance.spans` by the span index's test) hold: per group, the same records, in slices of
the group's audience, each Pod in exactly one of the group's slices of at most ``max_pods``.

Every so often a failover: a new :class:`Sync` from the store's objects over freshly listed
journals (a new leader lists everything); its first step writes nothing when nothing changed,
and, when events came in between, exactly what brings the store to the reference.

``FERRY_SYNC_EVENTS`` sets how many events in all (default 12,000)."""

from __future__ import annotations

import json
import os
import random
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from controller.slices import Writes, plan_slices
from controller.sources import Feeds
from controller.sync import Sync, run
from routesync.policy import peerslice, spanindex
from routesync.policy.cnp.model import ClusterPolicy
from routesync.policy.model import Pod, Policy, policy_from
from tests.controller.test_slices import Store
from tests.routesync.policy.test_spanindex import Feed

EVENTS = int(os.environ.get("FERRY_SYNC_EVENTS", "12000"))
PER_SEQUENCE = 600
MAX = 3  # small: audiences take several slices and Pods move between them


class Journal:
    """A Reflector's cache and journal, in memory (``synced`` once listed)."""

    def __init__(self, items: Mapping[str, Any] | None = None, synced: bool = True) -> None:
        self.items: dict[str, Any] = dict(items or {})
        self.journal: dict[str, Any] = dict(self.items)  # a fresh list notes every key
        self.synced = threading.Event()
        self.drains = 0
        if synced:
            self.synced.set()

    def put(self, key: str, value: Any) -> None:
        if self.items.get(key) != value:
            self.items[key] = value
            self.journal[key] = value

    def remove(self, key: str) -> None:
        if self.items.pop(key, None) is not None:
            self.journal[key] = None

    def drain(self, snapshot: bool = False) -> tuple[int, dict[str, Any], list[Any] | None]:
        self.drains += 1
        changes, self.journal = self.journal, {}
        return 0, changes, list(self.items.values()) if snapshot else None


class Watches:
    """The four journals, taking :meth:`Feed.deliver`'s calls as the Reflectors take watch events."""

    def __init__(self, feed: Feed | None = None, synced: bool = True) -> None:
        self.pods = Journal(feed.pods if feed else None, synced)
        self.namespaces = Journal({k: (k, v) for k, v in feed.namespaces.items()} if feed else None, synced)
        self.policies = Journal(feed.policies if feed else None, synced)
        self.cluster_policies = Journal(feed.cluster_policies if feed else None, synced)

    def feeds(self) -> Feeds:
        return Feeds(self.pods, self.namespaces, self.policies, self.cluster_policies)

    def upsert_pod(self, pod: Pod) -> None:
        self.pods.put(pod.key, pod)

    def delete_pod(self, key: str) -> None:
        self.pods.remove(key)

    def upsert_namespace(self, name: str, labels: tuple[tuple[str, str], ...]) -> None:
        self.namespaces.put(name, (name, labels))

    def delete_namespace(self, name: str) -> None:
        self.namespaces.remove(name)

    def upsert_policy(self, policy: Policy) -> None:
        self.policies.put(policy.key, policy)

    def delete_policy(self, key: str) -> None:
        self.policies.remove(key)

    def upsert_cluster_policy(self, cp: ClusterPolicy) -> None:
        self.cluster_policies.put(cp.name, cp)

    def delete_cluster_policy(self, name: str) -> None:
        self.cluster_policies.remove(name)


Published = dict[tuple[str, str], tuple[Pod, peerslice.Audience]]


def published(objects: Mapping[str, Mapping[str, Any]], where: str) -> Published:
    """(group, Pod key) -> (its record, its slice's audience), over the objects; each Pod once in
    a group, each slice of 1..MAX Pods and labelled for its group and audience."""
    out: Published = {}
    for name, obj in objects.items():
        rs = peerslice.from_object(obj)
        assert 1 <= len(rs.spec.pods) <= MAX, f"{where}: {name} holds {len(rs.spec.pods)} Pods"
        assert rs.labels == peerslice.slice_labels(rs.spec.group, rs.spec.audience), f"{where}: {name}'s labels"
        for p in rs.spec.pods:
            assert (rs.spec.group, p.key) not in out, f"{where}: {p.key} twice in {rs.spec.group}"
            out[(rs.spec.group, p.key)] = (p, rs.spec.audience)
    return out


def reference(feed: Feed, by_subscription: bool = False) -> Published:
    """What :func:`plan_slices` publishes of :func:`spanindex.group_views` (the full recompute), for
    the planners that judge egress at its source only."""
    views = spanindex.group_views(feed.inputs(), feed.tier_policies(), remote_egress=False)
    named = {peerslice.group_name(g): v for g, v in views.items()}
    return {(spec.group, p.key): (p, spec.audience)
            for spec in plan_slices(feed.pods, named, MAX, by_subscription).values() for p in spec.pods}


def check(store: Store, feed: Feed, where: str, by_subscription: bool = False) -> int:
    got, want = published(store.objects, where), reference(feed, by_subscription)
    wrong = sorted(k for k in got.keys() | want.keys() if got.get(k) != want.get(k))
    assert not wrong, f"{where}: published differs from the reference at {wrong[:5]}"
    return len(want)


def leader(store: Store, watches: Watches, where: list[str], by_subscription: bool = False) -> Sync:
    """A leader's loop over ``watches``, from the store's objects as listed (JSON, as the wire)."""
    objects = json.loads(json.dumps(list(store.objects.values())))
    return Sync(watches.feeds(), objects, lambda w: store.write(w, where[0]), MAX, by_subscription)


def replay(seed: int, events: int, by_subscription: bool = False, switch: bool = False) -> dict[str, int]:
    """With ``switch``, each failover's leader delivers the other way (an operator changing
    ``--delivery``): its first step rewrites what the other wrote, then goes on."""
    rng = random.Random(seed)
    feed, store = Feed(rng), Store()
    watches = Watches()
    where = [""]
    sync = leader(store, watches, where, by_subscription)
    seen = {"events": 0, "steps": 0, "writes": 0, "published": 0, "failovers": 0, "quiet_failovers": 0}
    while seen["events"] < events:
        for _ in range(rng.choice((1, 1, 2, 3, 5, 8))):
            feed.deliver(feed.event(), watches)  # type: ignore[arg-type]  # the journals take a SpanIndex's calls
            seen["events"] += 1
        where[0] = f"seed {seed} after {seen['events']} events"
        w = sync.step()
        assert w is not None
        seen["steps"] += 1
        seen["writes"] += w.count
        seen["published"] += check(store, feed, where[0], by_subscription)
        if seen["steps"] % 15 == 0:  # failover: a new leader lists everything and rebuilds from the objects
            quiet = seen["failovers"] % 2 == 0  # every other one with nothing changed in between
            if not quiet:  # what came while no leader was writing
                for _ in range(rng.randrange(1, 6)):
                    feed.deliver(feed.event(), watches)  # type: ignore[arg-type]
                    seen["events"] += 1
            watches = Watches(feed)
            by_subscription ^= switch
            sync = leader(store, watches, where, by_subscription)
            where[0] += ", failover"
            w = sync.step()
            assert w is not None
            if quiet and not switch:
                assert w.count == 0, f"{where[0]}: a failover with nothing changed writes {w}"
                seen["quiet_failovers"] += 1
            seen["failovers"] += 1
            check(store, feed, where[0], by_subscription)
    return seen


@pytest.mark.parametrize("seed", range(max(1, EVENTS // PER_SEQUENCE)))
def test_the_published_slices_equal_the_reference_after_every_step(seed: int) -> None:
    seen = replay(seed, min(PER_SEQUENCE, EVENTS), by_subscription=seed % 2 == 1)
    print(f"seed {seed}: {seen}")
    # not vacuous: writes happened, Pods were published, leaders failed over quietly and not
    assert seen["writes"] > 20 and seen["published"] > 100, seen
    assert seen["quiet_failovers"] >= 1 and seen["failovers"] > seen["quiet_failovers"], seen


def test_repeated_steps_write_nothing() -> None:
    """A wake-up with nothing new in the journals (a change the parsers do not see) writes nothing."""
    rng = random.Random(8)  # a seed whose 200 events leave Pods that some Node reads (the precondition below)
    feed, store, watches, where = Feed(rng), Store(), Watches(), ["repeat"]
    sync = leader(store, watches, where)
    for _ in range(200):
        feed.deliver(feed.event(), watches)  # type: ignore[arg-type]
    first = sync.step()
    assert first is not None and first.count > 0
    again = sync.step()
    assert again == Writes()
    check(store, feed, "repeat")


@pytest.mark.parametrize("missing", ["pods", "namespaces", "policies", "cluster_policies"])
def test_nothing_is_written_before_every_resource_has_listed(missing: str) -> None:
    """Fail closed: with the slices of a running cluster in the store and one resource not
    listed yet, a step drains nothing and writes nothing (from empty caches it would delete every
    slice); once it has listed, the step writes what the reference says."""
    rng = random.Random(11)
    feed, store = Feed(rng), Store()
    watches, where = Watches(), ["before"]
    sync = leader(store, watches, where)
    for _ in range(300):
        feed.deliver(feed.event(), watches)  # type: ignore[arg-type]
    sync.step()
    assert check(store, feed, "running") > 0
    before = json.loads(json.dumps(store.objects))
    # a new leader whose ``missing`` watch has not listed; the others have, and know of a change
    for _ in range(30):
        feed.deliver(feed.event(), watches)  # type: ignore[arg-type]
    fresh = Watches(feed)
    getattr(fresh, missing).synced.clear()
    written: list[Writes] = []
    sync = Sync(fresh.feeds(), json.loads(json.dumps(list(store.objects.values()))), written.append, MAX)
    for _ in range(3):
        assert sync.step() is None
    assert written == [] and store.objects == before
    assert all(j.drains == 0 for j in (fresh.pods, fresh.namespaces, fresh.policies, fresh.cluster_policies))
    getattr(fresh, missing).synced.set()
    w = sync.step()
    assert w is not None
    store.write(w, "listed")
    check(store, feed, "listed")


def test_run_steps_on_each_wake_up_until_stopped() -> None:
    """:func:`run`: a step at once, then one per wake-up; what arrived in between is in the next."""
    rng = random.Random(3)
    feed, store, watches = Feed(rng), Store(), Watches()
    steps: list[int] = []
    wake, stop = threading.Event(), threading.Event()

    class Counting(Sync):
        def step(self) -> Writes | None:
            w = super().step()
            steps.append(w.count if w is not None else -1)
            if len(steps) == 3:
                stop.set()  # and ``wake``, to end the wait
            else:
                for _ in range(50):
                    feed.deliver(feed.event(), watches)  # type: ignore[arg-type]
            wake.set()
            return w

    sync = Counting(watches.feeds(), [], lambda w: store.write(w, "run"), MAX)
    run(sync, wake, stop)
    assert len(steps) == 3 and steps[0] == 0 and sum(steps) > 0
    Sync.step(sync)  # the last deliveries, without delivering more
    check(store, feed, "run")


def test_a_pod_gone_during_a_failover_and_back_unread_is_not_published() -> None:
    """A new leader forgets, with the Pod, the audience the listed slices gave it: the Pod deleted
    while no leader wrote, then created again where no Node reads it, is in no slice."""
    db = Pod("a", "db", "n1", (("app", "db"),), ("10.0.1.2",))
    web = Pod("a", "web", "n2", (("app", "web"),), ("10.0.2.2",))
    policy = policy_from({"metadata": {"namespace": "a", "name": "db"},
                          "spec": {"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"],
                                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}})
    store, watches, where = Store(), Watches(), ["failover"]
    watches.upsert_namespace("a", (("kubernetes.io/metadata.name", "a"),))
    watches.upsert_policy(policy)
    for p in (db, web):
        watches.upsert_pod(p)
    leader(store, watches, where).step()
    assert {k for _g, k in published(store.objects, "before")} == {"a/web"}
    watches.delete_pod(web.key)  # while no leader writes
    fresh = Watches()
    for name, j in (("pods", watches.pods), ("namespaces", watches.namespaces), ("policies", watches.policies)):
        getattr(fresh, name).items.update(j.items)
        getattr(fresh, name).journal.update(j.items)
    sync = leader(store, fresh, where)
    sync.step()
    assert published(store.objects, "after the failover") == {}
    fresh.upsert_pod(Pod("a", "web", "n2", (("app", "other"),), ("10.0.2.2",)))  # back, and no Node reads it
    sync.step()
    assert published(store.objects, "back") == {}


@pytest.mark.parametrize("seed", range(3))
def test_a_leader_of_the_other_delivery_takes_over_what_the_last_one_wrote(seed: int) -> None:
    """``--delivery`` changed between leaders (each failover here): the new leader's first step
    brings every slice to its own delivery, and the published Pods equal the reference throughout."""
    seen = replay(seed, 600, by_subscription=False, switch=True)
    assert seen["failovers"] >= 2 and seen["writes"] > 20, seen
