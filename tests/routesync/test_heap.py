"""``routesync.heap``: after a full pass the daemon's heap is settled (cycles collected once, the
rest frozen out of the collector's scans), and only after full passes."""

from __future__ import annotations

import gc
import threading
import weakref

from routesync.config import from_dict
from routesync.daemon import Daemon
from routesync.heap import HeapSettler
from routesync.model import NodeRecord
from routesync.sources.registry import RegistrySource
from tests.routesync.standins import RecordingAppliers
from tests.support.waiting import until


class Node:
    """An object in a reference cycle (only the cyclic collector frees it)."""

    def __init__(self) -> None:
        self.me = self


def test_a_settle_collects_the_cycles_dropped_before_it_and_freezes_the_rest() -> None:
    kept = [Node() for _ in range(10)]
    dropped = Node()
    gone = weakref.ref(dropped)
    del dropped
    heap = HeapSettler(young=700 + 12_345)
    threshold = gc.get_threshold()
    try:
        heap.settle()
        assert gone() is None  # the cycle was collected
        assert heap.settles == 1 and heap.frozen == gc.get_freeze_count() >= len(kept)
        assert gc.get_threshold() == (700 + 12_345, *threshold[1:])  # the young generation waits longer
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_the_daemon_settles_after_full_passes_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = from_dict({"nodeName": "node-a", "podCIDRs": ["10.244.1.0/24"], "stateFile": str(tmp_path / "state.json"),
                     "resyncSeconds": 3600,
                     "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg"), "pollInterval": 0.05}})
    apl = RecordingAppliers()
    threshold = gc.get_threshold()
    d = Daemon(cfg, RegistrySource(str(tmp_path / "reg"), "node-a", poll_interval=0.05), apl, settle_heap=True)
    other = RegistrySource(str(tmp_path / "reg"), "node-b")
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    try:
        assert d.heap is not None
        until(lambda: d.heap is not None and d.heap.settles == 1, "the first full pass's settle")
        n = len(apl.applied)
        other.publish_self(NodeRecord("node-b", ("192.168.77.50",), ("10.244.2.0/24",)))
        until(lambda: len(apl.applied) > n and bool(apl.applied[-1].peers), "node-b's change applied")
        assert not apl.applied[-1].full and d.heap.settles == 1  # an incremental pass: no settle
        apl.generation = 2  # ovs-vswitchd restarted: a full pass
        until(lambda: d.heap is not None and d.heap.settles == 2, "the full pass's settle")
    finally:
        d.stop.set()
        t.join(30)
        gc.unfreeze()
        gc.set_threshold(*threshold)
    assert Daemon(cfg, RegistrySource(str(tmp_path / "reg"), "node-a"), apl).heap is None  # off unless asked
