"""The Node's own connectivity across the tagged underlay's events (issue 29), seen from the external
host (ping every 10 ms to node-3, alone on segment b, behind the router): route-sync killed and
restarted, ovs-vswitchd killed and restarted, the VLAN changed at runtime, removed (the uplink
restored off the bridge), added again
(moved back onto it), route-sync killed in the middle of that move and restarted.  Every event is
the switch port changed first (the operator's side), then the Node's ``ferry.io/transport-vlan``
annotation; the test waits for replies after each, never for time.  What is asserted: the Node is
reachable again after each, loses nothing across a plain route-sync restart, and an untagged Node
on a trunk port reaches nothing.  The numbers (pings lost, and seconds from the annotation or the
restart to the first reply) are printed for the record, not asserted: they are the machine's."""

from __future__ import annotations

import os
import threading
import time

import pytest

from lab import ovs
from lab.segswitch import (
    SwitchPlan,
    access_settings,
    bootstrap_settings,
    paths,
    trunk_settings,
    trunk_when_tagged,
)
from lab.topology import segment_netns
from tests.e2e.vlan.helpers import set_vlan_annotation, start, switch_port, tagged, uplink_state
from tests.support.labs import topology
from tests.support.liveping import LivePing
from tests.support.waiting import HANG, until

pytestmark = pytest.mark.root

NEW_VLAN = 200
NODE, SEGMENT = "node-3", "b"


def test_node_reachability_across_vlan_events(cni_bin: str) -> None:
    lab = start(cni_bin, tagged(topology({"trafficEncapMode": "noEncap"}, route_pod_cidrs=True)), pods=())
    results: dict[str, tuple[int, float, float]] = {}
    try:
        node = lab.node(NODE)
        dst = node.address(4)
        assert dst is not None
        ping = LivePing(lab.external.netns, dst, interval=0.01)
        with ping:
            ping.more_replies(5, "before anything")

            def event(name: str, act, settled=None) -> None:  # type: ignore[no-untyped-def]
                """``act()`` (returns the wall time the Node's side started), then replies again."""
                last_before, seq_before = ping.stamps[-1], ping.seqs[-1]
                t0 = act()
                assert ping.reply_after(t0), f"{name}: no reply from {NODE} after it"
                if settled is not None:
                    until(settled, f"{name}: settled")
                ping.more_replies(3, f"after {name}")
                i = next(i for i, s in enumerate(ping.stamps) if s > t0)
                first, seq_first = ping.stamps[i], ping.seqs[i]
                lost = seq_first - seq_before - 1 - sum(1 for q in ping.seqs if seq_before < q < seq_first)
                results[name] = (lost, first - last_before, first - t0)

            # 1. route-sync SIGKILLed and started again: OVS keeps the tagged flows meanwhile
            def restart() -> float:
                t0 = time.time()
                lab.reconfigure_route_sync(NODE, sig=9)
                return t0
            event("route-sync killed + restarted", restart)

            # 1b. ovs-vswitchd SIGKILLed and started again: its flows are gone until route-sync's pass
            # for the new instance puts them back, the pass-through tagged as before
            def vswitchd() -> float:
                t0 = time.time()
                lab.restart_vswitchd(NODE)
                return t0
            event("ovs-vswitchd killed + restarted", vswitchd)

            # 2. VLAN 100 -> 200: the segment's switch moves (router port, node-3's trunk), then the Node
            def change() -> float:
                switch_port(lab, SEGMENT, "router", *access_settings(NEW_VLAN))
                switch_port(lab, SEGMENT, NODE, *trunk_settings(NEW_VLAN))
                t0 = time.time()
                set_vlan_annotation(lab, NODE, str(NEW_VLAN))
                return t0
            event("VLAN changed 100 -> 200", change, lambda: (uplink_state(lab, NODE) or {}).get("vlan") == NEW_VLAN)

            # 3. VLAN removed: node-3's port becomes an access port of 200, the Node untagged (restore)
            def remove() -> float:
                switch_port(lab, SEGMENT, NODE, *access_settings(NEW_VLAN))
                t0 = time.time()
                set_vlan_annotation(lab, NODE, "none")
                return t0
            event("VLAN removed (uplink restored)", remove, lambda: uplink_state(lab, NODE) is None)

            # 4. the port a trunk again while the Node sends untagged: misconfigured, it reaches nothing
            # (the gap of this event includes that check; its reaction time is the move's)
            def add() -> float:
                switch_port(lab, SEGMENT, NODE, *trunk_settings(NEW_VLAN))
                assert not lab.ping(node, lab.router.address(4), count=2, timeout=1), "an untagged Node crossed a trunk"
                t0 = time.time()
                set_vlan_annotation(lab, NODE, str(NEW_VLAN))
                return t0
            event("VLAN set (uplink moved onto the bridge)", add,
                  lambda: (uplink_state(lab, NODE) or {}).get("phase") == "moved")

            # 5. off again, then route-sync SIGKILLed in the middle of the move back onto the bridge
            event("VLAN removed again", remove, lambda: uplink_state(lab, NODE) is None)
            switch_port(lab, SEGMENT, NODE, *trunk_settings(NEW_VLAN))
            set_vlan_annotation(lab, NODE, str(NEW_VLAN))
            phase = until(lambda: (uplink_state(lab, NODE) or {}).get("phase"), "route-sync starts the move",
                          step=0.0005)
            lab.kill_route_sync(NODE, sig=9)

            def resume() -> float:
                t0 = time.time()
                lab.reconfigure_route_sync(NODE, sig=9)  # repair() finishes the move
                return t0
            event(f"route-sync killed mid-move (phase {phase}) + restarted", resume,
                  lambda: (uplink_state(lab, NODE) or {}).get("phase") == "moved")

            # 6. the Kubernetes lab's bootstrap: an untagged Node on a native-untagged port reaches the
            # VLAN; once its route-sync tags, the lab's watcher turns the port into a strict trunk
            def bootstrap_untagged() -> float:
                switch_port(lab, SEGMENT, NODE, *bootstrap_settings(NEW_VLAN))
                t0 = time.time()
                set_vlan_annotation(lab, NODE, "none")
                return t0
            event("bootstrap port, Node untagged", bootstrap_untagged, lambda: uplink_state(lab, NODE) is None)
            stop = threading.Event()
            plan = SwitchPlan(SEGMENT, segment_netns(lab.name, SEGMENT), NEW_VLAN, (NODE,), ("router",), bootstrap=True)
            watcher = threading.Thread(target=trunk_when_tagged, daemon=True, args=(
                lab.dir, [plan], {NODE: os.path.dirname(node.paths.state_file)}, stop))
            watcher.start()

            def tag() -> float:
                t0 = time.time()
                set_vlan_annotation(lab, NODE, str(NEW_VLAN))
                return t0
            try:
                event("bootstrap port, Node tags, the port becomes a trunk", tag, lambda: not watcher.is_alive())
            finally:
                stop.set()
                watcher.join(HANG)
            port = ovs.vsctl(paths(lab.dir, SEGMENT), "--columns=vlan_mode,tag,trunks", "list", "port", NODE)
            assert "trunk" in port and "native" not in port, port
            res = ping.stop()
        print(f"\nnode-3 seen from the external host, ping -i 0.01 ({res.transmitted} sent, {res.lost} lost):")
        for name, (lost, gap, reaction) in results.items():
            print(f"  {name}: {lost} lost, gap {gap:.3f} s (last reply before -> first after), "
                  f"first reply {reaction:.3f} s after the Node's side started")
        assert results["route-sync killed + restarted"][0] == 0
    finally:
        lab.down()

