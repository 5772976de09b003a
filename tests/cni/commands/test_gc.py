"""GC in-process: an attachment not in the runtime's valid list goes entirely, under its attachment lock
(so route-sync's flow replay never races it into a half-removed Pod); listed ones stay."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest

from cni.commands.add import add
from cni.commands.check import check
from cni.commands.gc import gc
from cni.node.locks import attachment_lock
from cni.pipeline import tables as pl
from routesync.apply.ovs import OvsApplier
from tests.cni.commands.inprocess import LoneNode, MakePod
from tests.support.waiting import HANG, flock_waiters, until

pytestmark = pytest.mark.root


def test_gc_removes_what_the_runtime_no_longer_lists(lone_node: LoneNode, make_pod: MakePod) -> None:
    keep, stale = make_pod("keep"), make_pod("stale")
    kept = lone_node.call(add, lone_node.request("ADD", keep))
    gone = lone_node.call(add, lone_node.request("ADD", stale))
    assert len(lone_node.pod_ports()) == 2 and len(lone_node.ipam_files()) == 6

    assert lone_node.call(gc, lone_node.request("GC", valid=[keep])) is None

    assert lone_node.pod_ports() == [kept.interfaces[0].name]
    assert lone_node.host_veths() == [kept.interfaces[0].name]
    assert lone_node.flows(pl.pod_cookie(stale.container_id, "eth0")) == []
    assert set(stale.links()) == {"lo"}  # its veth went, Pod end included
    claims = {f.split("/", 1)[1] for f in lone_node.ipam_files() if f.startswith("ips/")}
    assert claims == {i.address.split("/")[0] for i in kept.ips}
    assert not claims & {i.address.split("/")[0] for i in gone.ips}
    # The listed Pod is untouched: CHECK still passes, its flows are all there.
    assert lone_node.call(check, lone_node.request("CHECK", keep, prev_result=kept)) is None


def test_gc_with_every_attachment_listed_changes_nothing(lone_node: LoneNode, make_pod: MakePod) -> None:
    a, b = make_pod("a"), make_pod("b")
    lone_node.call(add, lone_node.request("ADD", a))
    lone_node.call(add, lone_node.request("ADD", b))
    ports, files, flows = sorted(lone_node.pod_ports()), lone_node.ipam_files(), len(lone_node.flows())
    lone_node.call(gc, lone_node.request("GC", valid=[a, b]))
    assert (sorted(lone_node.pod_ports()), lone_node.ipam_files(), len(lone_node.flows())) == (ports, files, flows)


def _in_thread(results: dict[str, object], name: str, call: Callable[[], object]) -> threading.Thread:
    """``call()`` on a thread of its own; its return value, or what it raised, lands in ``results``."""
    def run() -> None:
        try:
            results[name] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the test, which asserts on it
            results[name] = e

    t = threading.Thread(target=run, name=name)
    t.start()
    return t


def test_gc_takes_the_attachment_lock_so_a_racing_replay_leaves_the_pod_whole_or_gone(
        lone_node: LoneNode, make_pod: MakePod) -> None:
    """ovs-vswitchd restarted (the Pod's port is there, its flows are not) and GC is told the Pod is
    gone while route-sync replays the Pods' flows.  Without GC taking the attachment lock, GC could
    delete the flows, the replay (which sees the port) put them back, then GC delete the port: flows
    left for a port that no longer exists.  Here both wait on the lock (held by the test, as an ADD
    or DEL would), and whichever goes first, the Pod ends entirely gone: no port, no veth, no flows."""
    stale = make_pod("stale")
    host = lone_node.call(add, lone_node.request("ADD", stale)).interfaces[0].name
    cookie = pl.pod_cookie(stale.container_id, "eth0")
    assert lone_node.flows(cookie)
    lone_node.ovs.ofctl("del-flows", lone_node.bridge, f"cookie={cookie.match()}")  # what a restart leaves
    lock_dir = str(lone_node.dir / "state" / "locks")
    gw_mac = json.loads(lone_node.ovs.vsctl("get", "Interface", pl.GATEWAY_PORT, "mac_in_use"))
    gw_ofport = int(lone_node.ovs.vsctl("get", "Interface", pl.GATEWAY_PORT, "ofport"))
    ovs = OvsApplier(lone_node.ovs.db, lone_node.bridge, lone_node.ovs.run_dir)
    results: dict[str, object] = {}
    try:
        with attachment_lock(lock_dir, stale.container_id, "eth0") as lock:
            gc_thread = _in_thread(results, "gc", lambda: lone_node.call(gc, lone_node.request("GC", valid=[])))
            until(lambda: flock_waiters(lock.path) == 1, "GC waiting on the Pod's attachment lock")
            # GC has removed nothing before it holds the lock
            assert lone_node.pod_ports() == [host] and lone_node.host_veths() == [host]
            replay = _in_thread(results, "replay", lambda: ovs.replay_pod_flows(gw_mac, gw_ofport, lock_dir=lock_dir))
            until(lambda: flock_waiters(lock.path) == 2, "the replay waiting on the same lock")
        gc_thread.join(HANG)
        replay.join(HANG)
    finally:
        ovs.close()
    assert results["gc"] is None, results
    assert results["replay"] in (0, 1), results  # 1: it went first, and GC removed what it put back
    assert (lone_node.pod_ports(), lone_node.host_veths(), lone_node.flows(cookie)) == ([], [], [])
    assert set(stale.links()) == {"lo"}
