"""routesync.sources.sortedrecords: the records kept in name order equal sorting them all, after
every step of random changes (pure; no root)."""

from __future__ import annotations

import random

import pytest

from routesync.model import NodeRecord
from routesync.sources.sortedrecords import SortedRecords


def record(name: str, n: int) -> NodeRecord:
    return NodeRecord(name, (f"192.168.{n % 250}.{n % 200 + 1}",), (f"10.{n % 250}.{n % 256}.0/24",))


@pytest.mark.parametrize("seed", range(4))
def test_kept_order_equals_sorting_everything(seed: int) -> None:
    rng = random.Random(seed)
    held = {f"node-{i:03d}": record(f"node-{i:03d}", i) for i in rng.sample(range(400), 40)}
    kept = SortedRecords(held.values())
    for step in range(2000):
        changes: dict[str, NodeRecord | None] = {}
        for _ in range(rng.choice([1, 1, 2, 5])):
            name = f"node-{rng.randrange(400):03d}"
            changes[name] = None if rng.random() < 0.35 else record(name, rng.randrange(10_000))
        kept.change(changes)
        for name, rec in changes.items():
            if rec is None:
                held.pop(name, None)
            else:
                held[name] = rec
        got = kept.list()
        assert got == sorted(held.values(), key=lambda r: r.name), f"step {step}"
        assert all(a is b for a, b in zip(got, sorted(held.values(), key=lambda r: r.name)))


def diff(was: list[NodeRecord], now: list[NodeRecord]) -> dict[str, tuple[NodeRecord | None, NodeRecord | None]]:
    """The reference: every name whose record is another object in ``now`` than in ``was``."""
    a, b = {r.name: r for r in was}, {r.name: r for r in now}
    return {n: (a.get(n), b.get(n)) for n in a.keys() | b.keys() if a.get(n) is not b.get(n)}


@pytest.mark.parametrize("seed", range(4))
def test_each_list_says_what_changed_since_the_list_before(seed: int) -> None:
    """Several changes between two lists (a Node added then gone again is no change; one changed
    back to its record of the last list is none either), and the key each list follows."""
    rng = random.Random(seed)
    pool = {f"node-{i:03d}": [record(f"node-{i:03d}", i + k) for k in range(3)] for i in range(60)}
    kept = SortedRecords(rng.choice(v) for v in rng.sample(list(pool.values()), 20))
    last = kept.list()
    assert last.follows is None
    for step in range(1500):
        for _ in range(rng.choice([0, 1, 1, 2, 6])):
            name = rng.choice(list(pool))
            kept.change({name: None if rng.random() < 0.35 else rng.choice(pool[name])})
        now = kept.list()
        assert now.follows == last.key and now.key != last.key, f"step {step}"
        assert dict(now.changes) == diff(last, now), f"step {step}"
        assert now.changes_since(last.key) is now.changes and now.changes_since(now.key) is None
        last = now


def test_a_record_under_another_name_is_refused() -> None:
    with pytest.raises(ValueError, match="node-2"):
        SortedRecords().change({"node-2": record("node-1", 1)})
