"""``routesync.recordlist``: the places where two record lists differ, found by halves, equal a
pass over every place; the daemon's split of its own record, across calls, equals
``own_and_peers`` (the reference) on random sequences of source lists."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routesync.model import NodeRecord
from routesync.recordlist import SMALL, SPAN, NodeList, OwnSplit, changed_places, own_and_peers


def record(i: int, addr: int = 1) -> NodeRecord:
    return NodeRecord(f"node-{i}", (f"192.168.0.{addr}",), (f"10.244.{i}.0/24",))


def reference(now: list[NodeRecord], was: list[NodeRecord]) -> list[int]:
    return [i for i in range(len(now)) if not (now[i] is was[i] or now[i] == was[i])]


# each place: kept (the very object), an equal copy, or another record
@given(st.lists(st.sampled_from(("same", "equal", "other")), max_size=5 * SMALL))
def test_changed_places_equals_a_pass_over_every_place(kinds: list[str]) -> None:
    was = [record(i) for i in range(len(kinds))]
    now = [w if k == "same" else replace(w) if k == "equal" else replace(w, transport_addresses=("192.168.0.9",))
           for w, k in zip(was, kinds)]
    got = changed_places(now, was)
    assert got == reference(now, was)
    assert got == [i for i, k in enumerate(kinds) if k == "other"]


# lists longer than a span (several spans and a short last one): a few places changed or
# copied equal anywhere, across the spans' edges too
LONG = 2 * SPAN + 7


@given(st.dictionaries(st.integers(0, LONG - 1), st.sampled_from(("equal", "other")), max_size=12))
def test_changed_places_across_spans_equals_a_pass_over_every_place(places: dict[int, str]) -> None:
    was = [record(i) for i in range(LONG)]
    now = list(was)
    for i, k in places.items():
        now[i] = replace(was[i]) if k == "equal" else replace(was[i], transport_addresses=("192.168.0.9",))
    got = changed_places(now, was)
    assert got == reference(now, was)
    assert got == sorted(i for i, k in places.items() if k == "other")


def test_changed_places_refuses_lists_of_two_lengths() -> None:
    with pytest.raises(ValueError, match="3 and 2"):
        changed_places([record(0)] * 3, [record(0)] * 2)


def test_changed_places_finds_one_change_among_5000_by_halves() -> None:
    was = [record(i) for i in range(5000)]
    now = list(was)
    now[4321] = replace(was[4321], pod_cidrs=("10.99.0.0/24",))
    assert changed_places(now, was) == [4321]
    assert changed_places(was, was) == []


# one step of what a source hands the daemon: a record changed, a Node added or gone, this Node's
# record changed, added or gone (or another Node's in its place), a second record of this Node's
# name, the list reordered
STEP = st.tuples(st.sampled_from(("change", "add", "remove", "own", "own-gone", "own-back", "own-replaced", "twin",
                                  "untwin", "shuffle", "none")), st.integers(0, 10 ** 6))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 40), st.lists(STEP, max_size=30))
def test_own_split_across_calls_equals_own_and_peers(n: int, steps: list[tuple[str, int]]) -> None:
    me = "node-me"
    nodes = [record(i) for i in range(n)] + [NodeRecord(me, ("192.168.0.200",), ("10.244.200.0/24",))]
    split = OwnSplit()
    serial = 1000
    for kind, r in [("none", 0), *steps]:
        nodes = list(nodes)
        at = r % len(nodes) if nodes else 0
        serial += 1
        if kind == "change" and nodes:
            nodes[at] = replace(nodes[at], transport_addresses=(f"192.168.1.{serial % 250}",))
        elif kind == "add":
            nodes.insert(at, record(serial))
        elif kind == "remove" and nodes:
            del nodes[at]
        elif kind == "own":
            nodes = [replace(x, pod_cidrs=(f"10.245.{serial % 250}.0/24",)) if x.name == me else x for x in nodes]
        elif kind == "own-gone":
            nodes = [x for x in nodes if x.name != me]
        elif kind == "own-back" and all(x.name != me for x in nodes):
            nodes.insert(at, NodeRecord(me, ("192.168.0.201",), ()))
        elif kind == "own-replaced":  # one length, this Node's place now another Node's
            nodes = [record(serial) if x.name == me else x for x in nodes]
        elif kind == "twin" and nodes:  # a record of another Node renamed to this one (a registry file)
            nodes[at] = replace(nodes[at], name=me)
        elif kind == "untwin":
            seen = [i for i, x in enumerate(nodes) if x.name == me]
            if len(seen) > 1:
                nodes[seen[-1]] = replace(nodes[seen[-1]], name=f"node-{serial}")
        elif kind == "shuffle":
            nodes = nodes[at:] + nodes[:at]
        got = split.split(nodes, me)
        want = own_and_peers(nodes, me)
        assert got == want
        assert got[0] is want[0]



@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.lists(STEP, max_size=30), st.lists(st.booleans(), max_size=30))
def test_own_split_of_lists_that_say_what_changed_equals_own_and_peers(n: int, steps: list[tuple[str, int]],
                                                                      skips: list[bool]) -> None:
    """Lists from ``SortedRecords`` (the Kubernetes source's), now and then one the split does not
    see: the split equals the reference, and its peers say what changed since the peers before."""
    from routesync.sources.sortedrecords import SortedRecords

    me = "node-me"
    held = {x.name: x for x in [record(i) for i in range(n)]}
    held[me] = NodeRecord(me, ("192.168.0.200",), ("10.244.200.0/24",))
    source = SortedRecords(held.values())
    split = OwnSplit()
    serial, last_peers = 1000, None
    for k, (kind, r) in enumerate([("none", 0), *steps]):
        serial += 1
        others = sorted(x for x in held if x != me)
        change: dict[str, NodeRecord | None] = {}
        if kind == "change" and others:
            name = others[r % len(others)]
            change[name] = replace(held[name], transport_addresses=(f"192.168.1.{serial % 250}",))
        elif kind == "add":
            change[f"node-{serial}"] = record(serial)
        elif kind == "remove" and others:
            change[others[r % len(others)]] = None
        elif kind == "own" and me in held:
            change[me] = replace(held[me], pod_cidrs=(f"10.245.{serial % 250}.0/24",))
        elif kind in ("own-gone", "own-replaced"):
            change[me] = None
        elif kind == "own-back" and me not in held:
            change[me] = NodeRecord(me, ("192.168.0.201",), ())
        source.change(change)
        for name, rec in change.items():
            if rec is None:
                held.pop(name, None)
            else:
                held[name] = rec
        if k < len(skips) and skips[k]:
            source.list()  # a list the split did not see
        nodes = source.list()
        got = split.split(nodes, me)
        want = own_and_peers(nodes, me)
        assert got == want
        assert got[0] is want[0]
        peers = got[1]
        assert isinstance(peers, NodeList)
        if last_peers is not None and peers.changes_since(last_peers.key) is not None:
            was, now = {x.name: x for x in last_peers}, {x.name: x for x in peers}
            assert dict(peers.changes) == {m: (was.get(m), now.get(m)) for m in was.keys() | now.keys()
                                           if was.get(m) is not now.get(m)}
        last_peers = peers
