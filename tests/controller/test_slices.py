"""PeerSlices (controller/slices.py) held to the contract they carry: each Node receives the
members of every group whose audience holds it.

The randomized test plays ferry-controller and the API server together: random Pod records and
groups change (Pods added, changed, moved between Nodes, removed; a group's members and its reach
among explicit Node sets, everywhere, populated, reaching nobody, gone), one at a time or a few
in one batch, some delivered twice; the :class:`SliceBook`'s writes go into a store that refuses a
create of an existing name, an update or delete of a missing one and an update that changes
nothing; and every Node reads the store through its own label selectors, filtered as the API
server's watch cache does.  After every event: each slice holds 1..``max_pods`` Pods of one
published group, labelled with the group's name and audience; each group's slices hold each of its
members that has a record exactly once, as :func:`plan_slices` does; every Node receives exactly
the members of the groups whose audience holds it, each with its current record; a Pod record
change writes at most one slice per group it is in, a membership change one slice per Pod that
joins or leaves, a reach change only the group's own slices.  Every so often the book is thrown
away and rebuilt from the store's objects, as a new leader does: given every Pod and group it
writes nothing, and carries on."""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller import slices
from controller.slices import SliceBook, Writes
from routesync.policy import peerslice
from routesync.policy.model import NamedPort, Pod
from routesync.policy.peerslice import Audience, SliceError
from routesync.policy.spanindex import GroupReach, GroupView

LONG = "node-" + "x" * 70 + ".example.com"  # longer than a label key's name may be
NODES = ("n1", "n2", "node.example.com", LONG, "h-7", "empty")  # "empty" never has a Pod
POD_NODES = NODES[:-1]
KEYS = tuple(f"ns{i % 3}/p{i}" for i in range(30))
GROUPS = tuple(f"g{i}" for i in range(6))
# a label key's name part as the API server checks it (apimachinery's qualifiedNameFmt, 63 characters at most)
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
HASH_FORM = re.compile(r"^span\.ferry\.io/h-[0-9a-f]{32}$")
MAX = 3  # small, so groups take several slices


def make_pod(rng: random.Random, key: str) -> Pod:
    ns, name = key.split("/")
    labels = tuple(sorted({f"k{rng.randrange(3)}": f"v{rng.randrange(2)}" for _ in range(rng.randrange(3))}.items()))
    ips = (f"10.0.{rng.randrange(4)}.{rng.randrange(1, 250)}",) + (("fd00::7",) if rng.random() < 0.3 else ())
    ports = tuple(NamedPort(f"port{i}", rng.choice(("TCP", "UDP", "SCTP")), rng.randrange(1, 65536))
                  for i in range(rng.randrange(3)))
    return Pod(ns, name, rng.choice(POD_NODES), labels, ips, ports)


def make_reach(rng: random.Random) -> GroupReach:
    r = rng.random()
    if r < 0.15:
        return GroupReach()  # reaches nobody
    nodes = frozenset(rng.sample(POD_NODES, rng.choice((1, 1, 2, 3))))
    if r < 0.7:
        return GroupReach(nodes)
    if r < 0.85:
        return GroupReach(nodes if rng.random() < 0.3 else frozenset(), everywhere=True)
    return GroupReach(nodes if rng.random() < 0.3 else frozenset(), populated=True)


def make_group_change(rng: random.Random, old: GroupView | None) -> GroupView | None:
    r = rng.random()
    if r < 0.07:
        return None
    if old is None or r < 0.2:
        return GroupView(frozenset(rng.sample(KEYS, rng.randrange(0, 12))), make_reach(rng))
    if r < 0.5:  # its reach alone
        return GroupView(old.members, make_reach(rng))
    members = set(old.members)  # a few Pods join or leave
    for _ in range(rng.choice((1, 1, 2))):
        members ^= {rng.choice(KEYS)}
    return GroupView(frozenset(members), old.reach)


class Store:
    """The API server's PeerSlices: refuses what a real one would, and what would be a needless write."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    def write(self, w: Writes, where: str) -> None:
        for obj in w.create:
            name = obj["metadata"]["name"]
            assert name not in self.objects, f"{where}: create of existing {name}"
            self.objects[name] = json.loads(json.dumps(obj))  # what goes over the wire is JSON
        for obj in w.update:
            name = obj["metadata"]["name"]
            assert name in self.objects, f"{where}: update of missing {name}"
            assert self.objects[name] != obj, f"{where}: update of {name} that changes nothing"
            self.objects[name] = json.loads(json.dumps(obj))
        for name in w.delete:
            assert name in self.objects, f"{where}: delete of missing {name}"
            del self.objects[name]

    def received(self, node: str, subscribed: frozenset[str] | None = None) -> dict[str, dict[str, Any]]:
        """What ``node``'s watches hold: Pod key -> entry, over the slices its selectors match (a
        Pod in several groups the Node receives in several slices, the same record in each); its
        selectors are its labels', or, delivered by subscription, those of the groups ``subscribed``."""
        out: dict[str, dict[str, Any]] = {}
        texts = peerslice.node_selectors(node) if subscribed is None else \
            peerslice.group_selectors(subscribed, per_selector=2)  # several selectors, as many groups make
        selectors = [peerslice.parse_selector(s) for s in texts]  # matches(), parsed once
        for name, obj in self.objects.items():
            labels = obj["metadata"].get("labels") or {}
            if any(s.matches(labels) for s in selectors):
                for entry in obj["pods"]:
                    key = f"{entry['namespace']}/{entry['name']}"
                    assert out.setdefault(key, entry) == entry, f"{node} receives two records of {key} ({name})"
                    out[key] = entry
        return out


def by_group(specs: Mapping[str, peerslice.SliceSpec]) -> dict[str, tuple[Audience, set[str]]]:
    out: dict[str, tuple[Audience, set[str]]] = {}
    for spec in specs.values():
        aud, keys = out.setdefault(spec.group, (spec.audience, set()))
        assert aud == spec.audience, f"{spec.group}: two audiences"
        keys.update(p.key for p in spec.pods)
    return out


def subscribed(node: str, groups: Mapping[str, GroupView]) -> frozenset[str]:
    """The groups ``node`` asks for when slices are delivered by subscription: those whose reach
    holds it (route-sync tells them from its own Pods: routesync/policy/subscription.py)."""
    return frozenset(g for g, v in groups.items() if (aud := peerslice.audience(v.reach)) and aud.receives(node))


def check(store: Store, book: SliceBook, pods: Mapping[str, Pod], groups: Mapping[str, GroupView],
          where: str) -> int:
    """Every property of the module docstring; returns how many (Node, Pod) deliveries there are."""
    assert store.objects == {o["metadata"]["name"]: o for o in book.objects()}, f"{where}: book and store differ"
    placed: set[tuple[str, str]] = set()
    read = {}
    for name, obj in store.objects.items():
        rs = peerslice.from_object(obj)
        read[name] = rs.spec
        assert 1 <= len(rs.spec.pods) <= MAX, f"{where}: {name} holds {len(rs.spec.pods)} Pods"
        assert rs.labels == peerslice.slice_labels(rs.spec.group, rs.spec.audience), f"{where}: {name}'s labels"
        view = groups.get(rs.spec.group)
        assert view is not None and rs.spec.audience == peerslice.audience(view.reach, book.by_subscription), \
            f"{where}: {name} is not its group's audience"
        for p in rs.spec.pods:
            assert (rs.spec.group, p.key) not in placed, f"{where}: {p.key} twice in {rs.spec.group}"
            placed.add((rs.spec.group, p.key))
    assert by_group(read) == by_group(slices.plan_slices(pods, groups, MAX, book.by_subscription)), \
        f"{where}: groups hold other Pods than plan_slices'"
    deliveries = 0
    for node in NODES:
        got = store.received(node, subscribed(node, groups) if book.by_subscription else None)
        want = {k for v in groups.values() for k in v.members
                if k in pods and (aud := peerslice.audience(v.reach)) is not None and aud.receives(node)}
        assert set(got) == want, f"{where}: {node} receives {sorted(set(got) ^ want)} wrongly"
        for key, entry in got.items():
            assert peerslice.pod_from_entry(entry) == pods[key], f"{where}: {node} holds a stale {key}"
        deliveries += len(got)
    return deliveries


def bound(book: SliceBook, pc: Mapping[str, Pod | None], gc: Mapping[str, GroupView | None],
          groups_before: Mapping[str, GroupView], slices_before: Mapping[str, peerslice.SliceSpec]) -> int:
    """The most writes one change may take: a record, one slice per group that holds the Pod; a
    group, one slice per member that joins or leaves, and all its slices when its audience changes."""
    if pc:
        (key,) = pc
        return sum(key in v.members for v in groups_before.values())
    (gname,) = gc
    old, new = groups_before.get(gname), gc[gname]
    old_members = old.members if old else frozenset()
    new_members = new.members if new else frozenset()
    n = len(old_members ^ new_members)
    old_aud = peerslice.audience(old.reach, book.by_subscription) if old else None
    new_aud = peerslice.audience(new.reach, book.by_subscription) if new else None
    if old_aud != new_aud:
        n += sum(spec.group == gname for spec in slices_before.values()) + math.ceil(len(new_members) / MAX)
    return n


@pytest.mark.parametrize("by_subscription", [False, True], ids=["labels", "subscription"])
@pytest.mark.parametrize("seed", range(4))
def test_slices_deliver_to_each_node_exactly_the_groups_it_is_in(seed: int, by_subscription: bool) -> None:
    rng = random.Random(seed)
    book, store = SliceBook(MAX, by_subscription), Store()
    pods: dict[str, Pod] = {}
    groups: dict[str, GroupView] = {}
    events = deliveries = rebuilds = relabels = most = 0
    last: tuple[dict[str, Pod | None], dict[str, GroupView | None]] = ({}, {})
    for step in range(2600):
        r = rng.random()
        pod_changes: dict[str, Pod | None] = {}
        group_changes: dict[str, GroupView | None] = {}
        if r < 0.08 and (last[0] or last[1]):
            pod_changes, group_changes = last  # delivered again
        else:
            for _ in range(rng.choice((1, 1, 1, 1, 1, 2, 4))):
                if rng.random() < 0.5:
                    key = rng.choice(KEYS)
                    old = pods.get(key)
                    if old is not None and rng.random() < 0.2:
                        pod_changes[key] = None
                    elif old is not None and rng.random() < 0.3:  # moves Node, nothing else
                        pod_changes[key] = Pod(old.namespace, old.name, rng.choice(POD_NODES), old.labels, old.ips,
                                               old.ports)
                    else:
                        pod_changes[key] = make_pod(rng, key)
                else:
                    gname = rng.choice(GROUPS)
                    group_changes[gname] = make_group_change(rng, group_changes.get(gname, groups.get(gname)))
        # a batch is one apply (what a watch coalesced), or its changes one by one in another order
        deliveries_in: list[tuple[dict[str, Pod | None], dict[str, GroupView | None]]] = [(pod_changes, group_changes)]
        if len(pod_changes) + len(group_changes) > 1 and rng.random() < 0.5:
            deliveries_in = [({k: v}, {}) for k, v in pod_changes.items()] + \
                [({}, {k: v}) for k, v in group_changes.items()]
            rng.shuffle(deliveries_in)
        for pc, gc in deliveries_in:
            groups_before, slices_before = dict(groups), book.specs()
            for key, pod in pc.items():
                if pod is None:
                    pods.pop(key, None)
                else:
                    pods[key] = pod
            for gname, view in gc.items():
                if view is None:
                    groups.pop(gname, None)
                else:
                    groups[gname] = view
            where = f"seed {seed} step {step}: pods {pc} groups {gc}"
            w = book.apply(pc, gc)
            store.write(w, where)
            events += len(pc) + len(gc)
            if (pc, gc) == last:
                assert w.count == 0, f"{where}: a change delivered again writes {w}"
            elif len(pc) + len(gc) == 1:
                assert w.count <= bound(book, pc, gc, groups_before, slices_before), f"{where}: {w}"
            relabels += sum(slices_before[o["metadata"]["name"]].labels != o["metadata"]["labels"] for o in w.update)
            deliveries += check(store, book, pods, groups, where)
            most = max(most, len(store.objects))
        last = (pod_changes, group_changes)
        if step % 97 == 96:  # failover: a new leader rebuilds from the objects, then hears everything
            rebuilt = SliceBook.from_objects(list(store.objects.values()), MAX, by_subscription)
            assert rebuilt.errors == ()
            everything: dict[str, GroupView | None] = {g: None for g in rebuilt.group_names()}
            everything.update(groups)
            w = rebuilt.apply(dict(pods), everything)
            assert w.count == 0, f"{where}: the rebuilt book writes {w}"
            assert rebuilt.specs() == book.specs()
            book, rebuilds = rebuilt, rebuilds + 1
            check(store, book, pods, groups, f"{where}, rebuilt")
    # not vacuous: events enough, Pods delivered, slices relabelled (delivered by subscription: never,
    # a slice's labels name its group alone), books rebuilt and carried on
    assert events >= 2500 and deliveries > 0 and rebuilds >= 20, (events, deliveries)
    assert relabels == 0 if by_subscription else relabels > 100, relabels
    print(f"seed {seed}: {events} events, {deliveries} deliveries, {relabels} relabels, {rebuilds} rebuilds, "
          f"{most} slices at most")
    assert most > len(GROUPS)  # groups took several slices


def slice_pods(obj: Mapping[str, Any]) -> set[str]:
    return {f"{e['namespace']}/{e['name']}" for e in obj["pods"]}


def pod(key: str, node: str = "n1", **labels: str) -> Pod:
    ns, name = key.split("/")
    return Pod(ns, name, node, tuple(sorted(labels.items())), ("10.0.0.1",))


def seeded_book() -> tuple[SliceBook, Store, dict[str, Pod], dict[str, GroupView]]:
    """Ten Pods; group "web" (p0..p4) read on n2, group "all" (every Pod) read on n3."""
    pods = {f"a/p{i}": pod(f"a/p{i}", "n1", app=str(i)) for i in range(10)}
    keys = sorted(pods)
    groups = {"web": GroupView(frozenset(keys[:5]), GroupReach(frozenset({"n2"}))),
              "all": GroupView(frozenset(keys), GroupReach(frozenset({"n3"})))}
    book, store = SliceBook(max_pods=3), Store()
    store.write(book.apply(pods, groups), "seed")
    assert len(store.objects) == 6  # five Pods in two slices, ten in four
    return book, store, pods, groups


def test_a_pod_record_change_is_one_update_of_each_slice_that_holds_it() -> None:
    book, store, _pods, _groups = seeded_book()
    before = {k: dict(v) for k, v in store.objects.items()}
    changed = pod("a/p3", "n1", app="3", tier="web")
    w = book.apply({"a/p3": changed})
    assert (len(w.create), len(w.update), len(w.delete)) == (0, 2, 0)  # it is in both groups
    names = {o["metadata"]["name"] for o in w.update}
    assert names == book.slices_of("a/p3") and {n.split("-")[0] for n in names} == {"web", "all"}
    for obj in w.update:
        entries = {f"{e['namespace']}/{e['name']}": e for e in obj["pods"]}
        assert entries["a/p3"] == peerslice.pod_to_entry(changed)
        assert {k: e for k, e in entries.items() if k != "a/p3"} == \
            {f"{e['namespace']}/{e['name']}": e for e in before[obj["metadata"]["name"]]["pods"] if e["name"] != "p3"}
    store.write(w, "change")
    assert {k: v for k, v in store.objects.items() if k not in names} == \
        {k: v for k, v in before.items() if k not in names}
    assert book.apply({"a/p3": changed}).count == 0  # the same record again: nothing
    assert book.apply({"a/p7": pod("a/p7", "n2")}).count == 1  # in one group: one slice


def test_a_reach_change_relabels_the_groups_slices_and_moves_no_pod() -> None:
    book, store, _pods, groups = seeded_book()
    web = sorted(n for n in store.objects if n.startswith("web-"))
    held = {n: slice_pods(store.objects[n]) for n in web}
    w = book.apply(groups={"web": GroupView(groups["web"].members, GroupReach(frozenset({"n2", "n4"})))})
    assert not w.create and not w.delete and sorted(o["metadata"]["name"] for o in w.update) == web
    for obj in w.update:
        assert slice_pods(obj) == held[obj["metadata"]["name"]]
        assert obj["metadata"]["labels"] == {"ferry.io/group": "web", "span.ferry.io/n2": "", "span.ferry.io/n4": ""}
    store.write(w, "widened")
    assert "a/p1" in store.received("n4") and "a/p7" not in store.received("n4")
    # everywhere and populated are one audience, every Node: between them nothing is written
    assert book.apply(groups={"web": GroupView(groups["web"].members, GroupReach(everywhere=True))}).count == 2
    assert book.apply(groups={"web": GroupView(groups["web"].members, GroupReach(populated=True))}).count == 0
    w = book.apply(groups={"web": GroupView(groups["web"].members, GroupReach())})  # read nowhere: gone
    assert sorted(w.delete) == web and w.count == 2


def test_a_member_joining_or_leaving_writes_one_slice() -> None:
    book, store, pods, groups = seeded_book()
    w = book.apply(groups={"web": GroupView(groups["web"].members | {"a/p8"}, groups["web"].reach)})
    assert w.count == 1 and "a/p8" in slice_pods((w.update or w.create)[0])
    store.write(w, "join")
    w = book.apply(groups={"web": GroupView(groups["web"].members - {"a/p0"} | {"a/p8"}, groups["web"].reach)})
    assert w.count == 1 and "a/p0" not in slice_pods(w.update[0])
    store.write(w, "leave")
    assert "a/p0" in store.received("n3") and "a/p0" not in store.received("n2")
    w = book.apply({"a/p8": None})  # no record: out of every slice, each written once
    assert {o["metadata"]["name"] for o in w.update} | set(w.delete) == {n for n, o in store.objects.items()
                                                                         if "a/p8" in slice_pods(o)}
    assert len(pods) == 10


def test_a_node_outside_a_reach_is_never_in_the_labels() -> None:
    rng = random.Random(7)
    for _ in range(500):
        reach = make_reach(rng)
        aud = peerslice.audience(reach)
        if aud is None:
            assert not reach.anywhere
            continue
        labels = peerslice.slice_labels("g", aud)
        for node in NODES:
            inside = reach.everywhere or reach.populated or node in reach.nodes
            assert (peerslice.node_label_key(node) in labels) == (node in reach.nodes and aud.everyone is False)
            assert any(peerslice.matches(s, labels) for s in peerslice.node_selectors(node)) == inside, (reach, node)
        assert all(k in (peerslice.GROUP_LABEL, peerslice.SPAN_ALL_LABEL) or k.startswith(peerslice.NODE_LABEL_PREFIX)
                   for k in labels)


def test_long_and_unusual_node_names_take_the_hash_form() -> None:
    short, long_ = "a" * 63, "a" * 64
    assert peerslice.node_label_key(short) == peerslice.NODE_LABEL_PREFIX + short
    hashed = peerslice.node_label_key(long_)
    assert HASH_FORM.match(hashed) and hashed == peerslice.node_label_key(long_)
    assert peerslice.node_label_key(long_ + "b") != hashed  # a shared prefix is no shared key
    assert peerslice.node_label_key("node.example.com") == "span.ferry.io/node.example.com"
    # no literal name can be a hash form, nor a key the API server refuses
    for node in ("h-7", "-a", "a-", "a b", "", "ünï", "a/b"):
        assert HASH_FORM.match(peerslice.node_label_key(node)), node
    for node in (long_, "h-7", "node.example.com", "n1", LONG):
        name = peerslice.node_label_key(node).split("/", 1)[1]
        assert len(name) <= 63 and LABEL_NAME.match(name), node


def test_selectors_read_as_the_api_server_reads_them() -> None:
    labels = {"span.ferry.io/n1": "", "ferry.io/span-all": "true", "app": "web"}
    assert peerslice.matches("span.ferry.io/n1", labels)
    assert not peerslice.matches("span.ferry.io/n2", labels)
    assert peerslice.matches("ferry.io/span-all=true", labels) and peerslice.matches("ferry.io/span-all==true", labels)
    assert not peerslice.matches("ferry.io/span-all=false", labels)
    assert peerslice.matches("!span.ferry.io/n2,app in (web, db)", labels)
    assert not peerslice.matches("app notin (web),span.ferry.io/n1", labels)
    assert peerslice.matches("app!=db", labels) and peerslice.matches("", labels)
    with pytest.raises(ValueError, match="not a label key"):
        peerslice.matches("a b", labels)


def test_plan_slices_shards_each_group_and_names_deterministically() -> None:
    pods = {f"a/p{i}": pod(f"a/p{i}") for i in range(7)}
    keys = frozenset(pods)
    groups = {"gb": GroupView(keys | {"a/gone"}, GroupReach(everywhere=True)),  # a/gone: no record, not published
              "ga": GroupView(frozenset({"a/p0"}), GroupReach(frozenset({"n2"}))),
              "gc": GroupView(keys, GroupReach())}  # reaches nobody
    plan = slices.plan_slices(pods, groups, max_pods=3)
    assert sorted(plan) == ["ga-0", "gb-0", "gb-1", "gb-2"]
    assert [p.key for p in plan["gb-0"].pods] == ["a/p0", "a/p1", "a/p2"]
    assert [p.key for p in plan["gb-2"].pods] == ["a/p6"]
    assert plan["ga-0"].labels == {"ferry.io/group": "ga", "span.ferry.io/n2": ""}
    assert plan["gb-1"].labels == {"ferry.io/group": "gb", "ferry.io/span-all": "true"}
    assert slices.plan_slices(pods, groups, max_pods=3) == plan
    with pytest.raises(ValueError, match="max_pods"):
        slices.plan_slices(pods, groups, max_pods=peerslice.MAX_PODS_LIMIT + 1)


def test_a_group_name_is_its_canonical_form() -> None:
    from routesync.policy import selector as sel
    from routesync.policy.spanindex import Group
    a = sel.Selector((sel.Requirement("app", "In", frozenset({"x", "y"})), sel.Requirement("tier", "Exists")))
    b = sel.Selector((sel.Requirement("tier", "Exists"), sel.Requirement("app", "In", frozenset({"y", "x"}))))
    assert peerslice.group_name(Group("ns", None, a)) == peerslice.group_name(Group("ns", None, b))
    names = {peerslice.group_name(g) for g in (Group("ns", None, a), Group("other", None, a), Group(None, a, a),
                                               Group(ports=frozenset({("http", "TCP")})), Group("ns"))}
    assert len(names) == 5 and all(re.fullmatch(r"g[0-9a-f]{16}", n) for n in names)


names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
pods_strategy = st.builds(
    Pod, names, names, st.text(max_size=12),
    st.dictionaries(names, st.text(max_size=8), max_size=4).map(lambda d: tuple(sorted(d.items()))),
    st.lists(st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).map(str), max_size=3).map(tuple),
    st.lists(st.builds(NamedPort, names, st.sampled_from(("TCP", "UDP", "SCTP")), st.integers(1, 65535)),
             max_size=3).map(tuple))


@settings(max_examples=300, deadline=None)
@given(pods_strategy)
def test_a_pods_entry_round_trips_exactly(p: Pod) -> None:
    entry = json.loads(json.dumps(peerslice.pod_to_entry(p)))
    assert peerslice.pod_from_entry(entry) == p
    assert set(entry) == {"namespace", "name", "node", "labels", "ips", "ports"}


def good_object() -> dict[str, Any]:
    spec = peerslice.SliceSpec("gabc", Audience(frozenset({"n2"})), (pod("a/web", "n1", app="web"),))
    return peerslice.to_object("abc-0", spec)


def test_an_object_round_trips() -> None:
    obj = good_object()
    rs = peerslice.from_object(json.loads(json.dumps(obj)))
    assert (rs.name, rs.labels) == ("abc-0", obj["metadata"]["labels"])
    assert peerslice.to_object(rs.name, rs.spec) == obj
    assert (obj["apiVersion"], obj["kind"]) == ("ferry.io/v1alpha1", "PeerSlice")


def test_a_slice_for_its_subscribers_names_its_group_alone() -> None:
    """Delivered by subscription, a slice carries no Node: the label the Nodes' group selectors
    match, and an audience that reads back as itself."""
    spec = peerslice.SliceSpec("gabc", peerslice.SUBSCRIBERS, (pod("a/web", "n1", app="web"),))
    obj = json.loads(json.dumps(peerslice.to_object("gabc-0", spec)))
    assert obj["metadata"]["labels"] == {peerslice.GROUP_LABEL: "gabc", "ferry.io/delivery": "subscription"}
    assert obj["audience"] == {"everyone": False, "nodes": [], "subscribers": True}
    assert peerslice.from_object(obj).spec == spec
    sels = peerslice.group_selectors(["gx", "gabc", "gy", "gabc"], per_selector=2)
    assert sels == ["ferry.io/delivery=subscription,ferry.io/group in (gabc,gx)",
                    "ferry.io/delivery=subscription,ferry.io/group in (gy)"]
    assert [peerslice.matches(s, obj["metadata"]["labels"]) for s in sels] == [True, False]
    labelled = peerslice.to_object("gabc-0", peerslice.SliceSpec("gabc", Audience(frozenset({"n1"})), spec.pods))
    assert not peerslice.matches(sels[0], labelled["metadata"]["labels"])  # the other delivery's: not twice
    assert not any(peerslice.matches(s, obj["metadata"]["labels"]) for s in peerslice.node_selectors("n1"))
    assert peerslice.group_selectors([]) == []
    groupless = dict(obj, group="")
    with pytest.raises(SliceError, match="audience.subscribers: a slice without a group"):
        peerslice.from_object(groupless)


@pytest.mark.parametrize(("path", "value", "message"), [
    (("metadata",), None, "PeerSlice: metadata: not an object"),
    (("metadata", "name"), "", "PeerSlice: metadata.name: missing"),
    (("kind",), "EndpointSlice", "PeerSlice abc-0: apiVersion/kind"),
    (("metadata", "labels"), {"a": 1}, "PeerSlice abc-0: metadata.labels: not a map of strings"),
    (("group",), 7, "PeerSlice abc-0: group: not a string"),
    (("audience",), None, "PeerSlice abc-0: audience: not an object"),
    (("audience", "everyone"), "yes", "PeerSlice abc-0: audience.everyone: not a boolean"),
    (("audience", "everyone"), True, "PeerSlice abc-0: audience: one of everyone, subscribers or nodes"),
    (("audience", "nodes"), [3], "PeerSlice abc-0: audience.nodes[0]: not a Node name"),
    (("audience", "subscribers"), "yes", "PeerSlice abc-0: audience.subscribers: not a boolean"),
    (("audience", "subscribers"), True, "PeerSlice abc-0: audience: one of everyone, subscribers or nodes"),
    (("pods",), {}, "PeerSlice abc-0: pods: not a list"),
    (("pods", 0), "x", "PeerSlice abc-0: pods[0]: not an object"),
    (("pods", 0, "name"), 5, "PeerSlice abc-0: pods[0].name: not a string"),
    (("pods", 0, "node"), None, "PeerSlice abc-0: pods[0].node: not a string"),
    (("pods", 0, "labels"), [], "PeerSlice abc-0: pods[0].labels: not an object"),
    (("pods", 0, "labels", "app"), 1, "PeerSlice abc-0: pods[0].labels['app']: not a string"),
    (("pods", 0, "ips", 0), "10.0.0.300", "PeerSlice abc-0: pods[0].ips[0]: '10.0.0.300' is not an address"),
    (("pods", 0, "ports"), [{"name": "http", "protocol": "TCP", "number": "80"}],
     "PeerSlice abc-0: pods[0].ports[0].number: not an integer"),
    (("pods", 0, "ports"), [{"name": "http", "number": 80}],
     "PeerSlice abc-0: pods[0].ports[0].protocol: not a string"),
])
def test_a_malformed_object_names_its_field(path: tuple[Any, ...], value: Any, message: str) -> None:
    obj = good_object()
    target: Any = obj
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    with pytest.raises(SliceError) as e:
        peerslice.from_object(obj)
    assert str(e.value).startswith(message), str(e.value)


def test_the_same_pod_twice_in_one_object_is_refused() -> None:
    obj = good_object()
    obj["pods"].append(dict(obj["pods"][0]))
    with pytest.raises(SliceError, match=r"pods\[1\]: a/web twice"):
        peerslice.from_object(obj)


def test_a_new_leader_repairs_what_it_finds() -> None:
    """Objects a crash (a Pod added to its new slice, not yet removed from its old one), an older
    controller (other labels, larger slices, no group) or a hand left: the rebuilt book, told
    every Pod and group, writes them back to the contract."""
    _book, store, pods, groups = seeded_book()
    objs = {k: json.loads(json.dumps(v)) for k, v in store.objects.items()}
    first, second = sorted(n for n in objs if n.startswith("web-"))
    objs[second]["pods"].append(objs[first]["pods"][0])  # twice in one group
    objs[first]["metadata"]["labels"]["stale"] = "yes"
    third = min(n for n in objs if n.startswith("all-"))
    objs[third]["pods"].extend(peerslice.pod_to_entry(pod(f"a/x{i}", "n1")) for i in range(3))  # over max_pods
    for i in range(3):
        pods[f"a/x{i}"] = pod(f"a/x{i}", "n1")
    groups["all"] = GroupView(groups["all"].members | {f"a/x{i}" for i in range(3)}, groups["all"].reach)
    objs["junk"] = {"apiVersion": "ferry.io/v1alpha1", "kind": "PeerSlice", "metadata": {"name": "junk"}}
    older = json.loads(json.dumps(objs[third]))  # the audience-grouped version's: no group
    del older["group"]
    older["metadata"]["name"] = "0123456789abcdef-0"
    objs["0123456789abcdef-0"] = older
    rebuilt = SliceBook.from_objects(objs.values(), max_pods=3)
    assert len(rebuilt.errors) == 1 and rebuilt.errors[0].startswith("PeerSlice junk: audience")
    store.objects = objs
    w = rebuilt.apply(pods, groups)
    assert {"junk", "0123456789abcdef-0"} <= set(w.delete) and first in {o["metadata"]["name"] for o in w.update}
    store.write(w, "repair")
    for name, obj in store.objects.items():
        assert 1 <= len(obj["pods"]) <= 3
        assert obj["metadata"]["labels"] == peerslice.from_object(obj).spec.labels, name
    assert by_group({n: peerslice.from_object(o).spec for n, o in store.objects.items()}) == \
        by_group(slices.plan_slices(pods, groups, 3))
    assert rebuilt.apply(pods, groups).count == 0
