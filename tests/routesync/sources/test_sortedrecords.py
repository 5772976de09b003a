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


def test_a_record_under_another_name_is_refused() -> None:
    with pytest.raises(ValueError, match="node-2"):
        SortedRecords().change({"node-2": record("node-1", 1)})
