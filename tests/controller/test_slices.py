"""PeerSlices (controller/slices.py) held to the contract they carry, ``relevance.per_node``.

The randomized test plays ferry-controller and the API server together: random Pod records and
spans change (Pods added, changed, moved between Nodes, removed; spans among explicit Node sets,
everywhere, populated, reaching nobody, gone), one at a time or a few in one batch, some delivered
twice; the :class:`SliceBook`'s writes go into a store that refuses a create of an existing name,
an update or delete of a missing one and an update that changes nothing; and every Node reads the
store through its own label selectors, filtered as the API server's watch cache does.  After every
event, for every Node: what it receives is exactly ``per_node`` of the spans with ``populated``
taken as ``everywhere`` (the documented superset), contains ``per_node`` of the spans themselves,
equals it on every Node that has a Pod, and carries each Pod's current record; no Pod is in two
slices; no slice is empty or over ``max_pods``; each slice's labels are its audience's; the Pods of
each audience are those :func:`plan_slices` puts there; a Pod event writes at most one slice and a
span event at most two.  Every so often the book is thrown away and rebuilt from the store's
objects, as a new leader does: given every Pod and span it writes nothing, and carries on."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller import slices
from controller.slices import SliceBook, Writes
from routesync.policy import peerslice, relevance
from routesync.policy.model import NamedPort, Pod
from routesync.policy.peerslice import Audience, SliceError
from routesync.policy.relevance import Span

LONG = "node-" + "x" * 70 + ".example.com"  # longer than a label key's name may be
NODES = ("n1", "n2", "node.example.com", LONG, "h-7", "empty")  # "empty" never has a Pod
POD_NODES = NODES[:-1]
KEYS = tuple(f"ns{i % 3}/p{i}" for i in range(30))
# a label key's name part as the API server checks it (apimachinery's qualifiedNameFmt, 63 characters at most)
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
HASH_FORM = re.compile(r"^span\.ferry\.io/h-[0-9a-f]{32}$")
MAX = 3  # small, so audiences take several slices and Pods move between them


def make_pod(rng: random.Random, key: str) -> Pod:
    ns, name = key.split("/")
    labels = tuple(sorted({f"k{rng.randrange(3)}": f"v{rng.randrange(2)}" for _ in range(rng.randrange(3))}.items()))
    ips = (f"10.0.{rng.randrange(4)}.{rng.randrange(1, 250)}",) + (("fd00::7",) if rng.random() < 0.3 else ())
    ports = tuple(NamedPort(f"port{i}", rng.choice(("TCP", "UDP", "SCTP")), rng.randrange(1, 65536))
                  for i in range(rng.randrange(3)))
    return Pod(ns, name, rng.choice(POD_NODES), labels, ips, ports)


def make_span(rng: random.Random) -> Span | None:
    r = rng.random()
    if r < 0.1:
        return None
    if r < 0.15:
        return Span()  # reaches nobody: its Node's own alone, subtracted
    nodes = frozenset(rng.sample(POD_NODES, rng.choice((1, 1, 2, 3))))
    if r < 0.65:
        return Span(nodes)
    if r < 0.8:
        return Span(nodes if rng.random() < 0.3 else frozenset(), everywhere=True)
    return Span(nodes if rng.random() < 0.3 else frozenset(), populated=True)


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

    def received(self, node: str) -> dict[str, dict[str, Any]]:
        """What ``node``'s watches hold: Pod key -> entry, over the slices its selectors match."""
        out: dict[str, dict[str, Any]] = {}
        selectors = [peerslice.parse_selector(s) for s in peerslice.node_selectors(node)]  # matches(), parsed once
        for obj in self.objects.values():
            labels = obj["metadata"].get("labels") or {}
            if any(s.matches(labels) for s in selectors):
                for entry in obj["pods"]:
                    key = f"{entry['namespace']}/{entry['name']}"
                    assert key not in out, f"{node} receives {key} twice"
                    out[key] = entry
        return out


def widened(spans: Mapping[str, Span]) -> dict[str, Span]:
    return {k: Span(s.nodes, s.everywhere or s.populated) for k, s in spans.items()}


def check(store: Store, book: SliceBook, pods: Mapping[str, Pod], spans: Mapping[str, Span], where: str) -> int:
    """Every property of the module docstring; returns how many (Node, Pod) deliveries there are."""
    assert store.objects == {o["metadata"]["name"]: o for o in book.objects()}, f"{where}: book and store differ"
    placed: dict[str, str] = {}
    by_audience: dict[Audience, set[str]] = {}
    for name, obj in store.objects.items():
        rs = peerslice.from_object(obj)
        assert 1 <= len(rs.spec.pods) <= MAX, f"{where}: {name} holds {len(rs.spec.pods)} Pods"
        assert rs.labels == peerslice.audience_labels(rs.spec.audience), f"{where}: {name}'s labels"
        for p in rs.spec.pods:
            assert p.key not in placed, f"{where}: {p.key} in {placed.get(p.key)} and {name}"
            placed[p.key] = name
            by_audience.setdefault(rs.spec.audience, set()).add(p.key)
    reference: dict[Audience, set[str]] = {}
    for spec in slices.plan_slices(pods, spans, MAX).values():
        assert 1 <= len(spec.pods) <= MAX
        reference.setdefault(spec.audience, set()).update(p.key for p in spec.pods)
    assert by_audience == reference, f"{where}: audiences hold other Pods than plan_slices'"
    live = {k: s for k, s in spans.items() if k in pods}
    exact = relevance.per_node(live, pods.values(), NODES)
    superset = relevance.per_node(widened(live), pods.values(), NODES)
    populated = {p.node for p in pods.values()}
    deliveries = 0
    for node in NODES:
        got = store.received(node)
        own = {k for k, p in pods.items() if p.node == node}
        remote = set(got) - own
        assert remote == superset[node], f"{where}: {node} receives {sorted(remote ^ superset[node])} wrongly"
        assert exact[node] <= remote
        if node in populated:
            assert remote == exact[node], f"{where}: {node} has Pods and receives more than it reads"
        for key, entry in got.items():
            assert peerslice.pod_from_entry(entry) == pods[key], f"{where}: {node} holds a stale {key}"
        deliveries += len(remote)
    return deliveries


@pytest.mark.parametrize("seed", range(4))
def test_slices_deliver_to_each_node_exactly_what_it_reads(seed: int) -> None:
    rng = random.Random(seed)
    book, store = SliceBook(MAX), Store()
    pods: dict[str, Pod] = {}
    spans: dict[str, Span] = {}
    events = deliveries = rebuilds = moved = 0
    last: tuple[dict[str, Pod | None], dict[str, Span | None]] = ({}, {})
    for step in range(2600):
        r = rng.random()
        pod_changes: dict[str, Pod | None] = {}
        span_changes: dict[str, Span | None] = {}
        if r < 0.08 and (last[0] or last[1]):
            pod_changes, span_changes = last  # delivered again
        else:
            for _ in range(rng.choice((1, 1, 1, 1, 1, 2, 4))):
                key = rng.choice(KEYS)
                if rng.random() < 0.4:
                    old = pods.get(key)
                    if old is not None and rng.random() < 0.2:
                        pod_changes[key] = None
                    elif old is not None and rng.random() < 0.3:  # moves Node, nothing else
                        pod_changes[key] = Pod(old.namespace, old.name, rng.choice(POD_NODES), old.labels, old.ips,
                                               old.ports)
                    else:
                        pod_changes[key] = make_pod(rng, key)
                else:
                    span_changes[key] = make_span(rng)
        # a batch is one apply (what a watch coalesced), or its changes one by one in another order
        deliveries_in: list[tuple[dict[str, Pod | None], dict[str, Span | None]]] = [(pod_changes, span_changes)]
        if len(pod_changes) + len(span_changes) > 1 and rng.random() < 0.5:
            deliveries_in = [({k: v}, {}) for k, v in pod_changes.items()] + \
                [({}, {k: v}) for k, v in span_changes.items()]
            rng.shuffle(deliveries_in)
        for pc, sc in deliveries_in:
            for key, pod in pc.items():
                if pod is None:
                    pods.pop(key, None)
                else:
                    pods[key] = pod
            for key, span in sc.items():
                if span is None:
                    spans.pop(key, None)
                else:
                    spans[key] = span
            where = f"seed {seed} step {step}: pods {pc} spans {sc}"
            before = {k: book.slice_of(k) for k in KEYS}
            w = book.apply(pc, sc)
            store.write(w, where)
            events += len(pc) + len(sc)
            if (pc, sc) == last:
                assert w.count == 0, f"{where}: a change delivered again writes {w}"
            elif len(pc) + len(sc) == 1:
                assert w.count <= (1 if pc else 2), f"{where}: {w}"
            moved += sum(before[k] is not None and book.slice_of(k) not in (None, before[k]) for k in KEYS)
            deliveries += check(store, book, pods, spans, where)
        last = (pod_changes, span_changes)
        if step % 97 == 96:  # failover: a new leader rebuilds from the objects, then hears everything
            rebuilt = SliceBook.from_objects(list(store.objects.values()), MAX)
            assert rebuilt.errors == ()
            w = rebuilt.apply(dict(pods), dict(spans))
            assert w.count == 0, f"{where}: the rebuilt book writes {w}"
            assert rebuilt.specs() == book.specs()
            book, rebuilds = rebuilt, rebuilds + 1
            check(store, book, pods, spans, f"{where}, rebuilt")
    # not vacuous: events enough, Pods delivered, moved between slices, books rebuilt and carried on
    assert events >= 2500 and deliveries > 0 and moved > 100 and rebuilds >= 20, (events, deliveries, moved)
    print(f"seed {seed}: {events} events, {deliveries} deliveries, {moved} moves, {rebuilds} rebuilds, "
          f"{len(store.objects)} slices at the end")
    assert len(store.objects) > 3


def slice_pods(obj: Mapping[str, Any]) -> set[str]:
    return {f"{e['namespace']}/{e['name']}" for e in obj["pods"]}


def pod(key: str, node: str = "n1", **labels: str) -> Pod:
    ns, name = key.split("/")
    return Pod(ns, name, node, tuple(sorted(labels.items())), ("10.0.0.1",))


def seeded_book() -> tuple[SliceBook, Store, dict[str, Pod], dict[str, Span]]:
    pods = {f"a/p{i}": pod(f"a/p{i}", "n1", app=str(i)) for i in range(10)}
    spans = {k: Span(frozenset({"n2"}) if i < 5 else frozenset({"n3"})) for i, k in enumerate(sorted(pods))}
    book, store = SliceBook(max_pods=3), Store()
    store.write(book.apply(pods, spans), "seed")
    assert len(store.objects) == 4  # two audiences of five Pods, three to a slice
    return book, store, pods, spans


def test_a_pod_record_change_is_one_update_of_its_one_slice() -> None:
    book, store, _pods, _spans = seeded_book()
    before = {k: dict(v) for k, v in store.objects.items()}
    changed = pod("a/p3", "n1", app="3", tier="web")
    w = book.apply({"a/p3": changed})
    assert (len(w.create), len(w.update), len(w.delete)) == (0, 1, 0)
    name = w.update[0]["metadata"]["name"]
    assert name == book.slice_of("a/p3")
    entries = {f"{e['namespace']}/{e['name']}": e for e in w.update[0]["pods"]}
    assert entries["a/p3"] == peerslice.pod_to_entry(changed)
    assert {k: e for k, e in entries.items() if k != "a/p3"} == \
        {f"{e['namespace']}/{e['name']}": e for e in before[name]["pods"] if e["name"] != "p3"}
    store.write(w, "change")
    assert {k: v for k, v in store.objects.items() if k != name} == {k: v for k, v in before.items() if k != name}
    assert book.apply({"a/p3": changed}).count == 0  # the same record again: nothing


def test_a_span_change_touches_at_most_two_slices() -> None:
    book, store, _pods, _spans = seeded_book()
    old = book.slice_of("a/p1")
    w = book.apply(spans={"a/p1": Span(frozenset({"n3"}))})  # to the other audience, which has room
    assert w.count == 2 and not w.create and not w.delete
    assert {o["metadata"]["name"] for o in w.update} == {old, book.slice_of("a/p1")}
    store.write(w, "move")
    w = book.apply(spans={"a/p1": Span(frozenset({"n1", "n2", "n3"}))})  # a new audience: a new slice
    assert (len(w.create), len(w.update), len(w.delete)) == (1, 1, 0)
    assert slice_pods(w.create[0]) == {"a/p1"}
    store.write(w, "new audience")
    w = book.apply(spans={"a/p1": Span(frozenset({"n2"}))})  # back: its lone slice goes
    assert (len(w.create), len(w.update), len(w.delete)) == (0, 1, 1)
    store.write(w, "back")
    # everywhere and populated reach one audience, every Node: between them nothing moves
    assert book.apply(spans={"a/p1": Span(everywhere=True)}).count == 2
    assert book.apply(spans={"a/p1": Span(frozenset({"n2"}), populated=True)}).count == 0


def test_a_node_outside_a_span_is_never_in_the_labels() -> None:
    rng = random.Random(7)
    for _ in range(500):
        span = make_span(rng)
        aud = peerslice.audience(span) if span is not None else None
        if span is None or aud is None:
            continue
        labels = peerslice.audience_labels(aud)
        for node in NODES:
            inside = span.everywhere or span.populated or node in span.nodes
            assert (peerslice.node_label_key(node) in labels) == (node in span.nodes and aud.everyone is False)
            assert any(peerslice.matches(s, labels) for s in peerslice.node_selectors(node)) == inside, (span, node)
        assert all(k in (peerslice.SPAN_LABEL, peerslice.SPAN_ALL_LABEL) or k.startswith(peerslice.NODE_LABEL_PREFIX)
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


def test_plan_slices_groups_by_audience_and_names_deterministically() -> None:
    pods = {f"a/p{i}": pod(f"a/p{i}") for i in range(7)}
    spans = {k: Span(everywhere=True) if i % 2 else Span(populated=True) for i, k in enumerate(sorted(pods))}
    spans["a/p0"] = Span(frozenset({"n2"}))
    spans["a/gone"] = Span(frozenset({"n2"}))  # no record: not published
    spans["a/p6"] = Span()  # reaches nobody
    plan = slices.plan_slices(pods, spans, max_pods=2)
    everyone = peerslice.audience_hash(peerslice.EVERYONE)
    n2 = peerslice.audience_hash(Audience(frozenset({"n2"})))
    assert sorted(plan) == sorted([f"{everyone}-0", f"{everyone}-1", f"{everyone}-2", f"{n2}-0"])
    assert [p.key for p in plan[f"{everyone}-0"].pods] == ["a/p1", "a/p2"]
    assert [p.key for p in plan[f"{everyone}-2"].pods] == ["a/p5"]
    assert plan[f"{n2}-0"].labels == {"ferry.io/span": n2, "span.ferry.io/n2": ""}
    assert plan[f"{everyone}-1"].labels == {"ferry.io/span": everyone, "ferry.io/span-all": "true"}
    assert slices.plan_slices(pods, spans, max_pods=2) == plan
    with pytest.raises(ValueError, match="max_pods"):
        slices.plan_slices(pods, spans, max_pods=peerslice.MAX_PODS_LIMIT + 1)


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
    spec = peerslice.SliceSpec(Audience(frozenset({"n2"})), (pod("a/web", "n1", app="web"),))
    return peerslice.to_object("abc-0", spec)


def test_an_object_round_trips() -> None:
    obj = good_object()
    rs = peerslice.from_object(json.loads(json.dumps(obj)))
    assert (rs.name, rs.labels) == ("abc-0", obj["metadata"]["labels"])
    assert peerslice.to_object(rs.name, rs.spec) == obj
    assert (obj["apiVersion"], obj["kind"]) == ("ferry.io/v1alpha1", "PeerSlice")


@pytest.mark.parametrize(("path", "value", "message"), [
    (("metadata",), None, "PeerSlice: metadata: not an object"),
    (("metadata", "name"), "", "PeerSlice: metadata.name: missing"),
    (("kind",), "EndpointSlice", "PeerSlice abc-0: apiVersion/kind"),
    (("metadata", "labels"), {"a": 1}, "PeerSlice abc-0: metadata.labels: not a map of strings"),
    (("audience",), None, "PeerSlice abc-0: audience: not an object"),
    (("audience", "everyone"), "yes", "PeerSlice abc-0: audience.everyone: not a boolean"),
    (("audience", "everyone"), True, "PeerSlice abc-0: audience: either everyone or nodes"),
    (("audience", "nodes"), [3], "PeerSlice abc-0: audience.nodes[0]: not a Node name"),
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
    controller (other labels, larger slices) or a hand left: the rebuilt book, told every Pod and
    span, writes them back to the contract."""
    _book, store, pods, spans = seeded_book()
    objs = {k: json.loads(json.dumps(v)) for k, v in store.objects.items()}
    first, second, *_ = sorted(n for n in objs if objs[n]["metadata"]["labels"].get("span.ferry.io/n2") == "")
    objs[second]["pods"].append(objs[first]["pods"][0])  # in two slices
    objs[first]["metadata"]["labels"]["stale"] = "yes"
    third = min(n for n in objs if n not in (first, second))
    objs[third]["pods"].extend(peerslice.pod_to_entry(pod(f"a/x{i}", "n1")) for i in range(3))  # over max_pods
    for i in range(3):
        pods[f"a/x{i}"], spans[f"a/x{i}"] = pod(f"a/x{i}", "n1"), Span(frozenset(objs[third]["audience"]["nodes"]))
    objs["junk"] = {"apiVersion": "ferry.io/v1alpha1", "kind": "PeerSlice", "metadata": {"name": "junk"}}
    rebuilt = SliceBook.from_objects(objs.values(), max_pods=3)
    assert len(rebuilt.errors) == 1 and rebuilt.errors[0].startswith("PeerSlice junk: audience")
    store.objects = objs
    w = rebuilt.apply(pods, spans)
    assert "junk" in w.delete and first in {o["metadata"]["name"] for o in w.update}
    store.write(w, "repair")
    for name, obj in store.objects.items():
        assert 1 <= len(obj["pods"]) <= 3
        assert obj["metadata"]["labels"] == peerslice.from_object(obj).spec.labels, name
    keys = [k for o in store.objects.values() for k in slice_pods(o)]
    assert sorted(keys) == sorted(pods)
    assert rebuilt.apply(pods, spans).count == 0
