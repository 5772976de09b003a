"""Chaos, CI size: 3 Nodes with route-sync, 150 ADD/DEL from 8 workers, 15 SIGKILLs of plugin
processes at random instants, route-sync SIGKILLed and restarted twice, ovs-vswitchd restarted
once mid-run, each disruption at its operation mark whatever the machine's speed.  Afterwards
every live Pod reaches every other, no address is held twice, nothing is left of a Pod that is
gone, and the restarted Node's flows came back without an ADD.

``make chaos`` runs the same driver (tests/e2e/chaos/run_chaos.py) at full size."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from tests.e2e.chaos.run_chaos import Settings, run_chaos, schedule

pytestmark = [pytest.mark.root, pytest.mark.slow]

NODES = ["node-1", "node-2", "node-3"]


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("ovs-vswitchd", "ovsdb-server", "ip", "nft", "ping"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    from lab import build

    if build.route_sync_command() is None:
        return "ferry-route-sync not installed"
    return None


def test_chaos_ci_size(tmp_path) -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    s = Settings(ops=150, workers=8, kills=15, route_sync_restarts=2, vswitchd_restart=True, pods_per_node=5,
                 seed=int.from_bytes(os.urandom(2), "big"), cni_bin=str(tmp_path / "cni-bin"))
    r = run_chaos(s, log=lambda m: print(m, file=sys.stderr))
    print(f"\nchaos (seed {s.seed}): {r}")
    # Every scheduled event happened, at its mark (the op stream waits for it): a fast machine
    # does not finish the ops before the ovs-vswitchd restart.
    assert r.missing_events == [], "scheduled events did not happen:\n" + "\n".join(r.missing_events)
    assert [(e.what, e.node, e.mark) for e in r.events] == [(e.what, e.node, e.mark) for e in schedule(s, NODES)]
    assert [e.at_op for e in r.events] == [e.mark for e in r.events]
    assert r.route_sync_kills == 2 and r.route_sync_restarts == 2 and r.vswitchd_restarts == 1
    assert r.errors == []
    assert r.ops == s.ops and r.kills == s.kills, f"{r.kills} SIGKILLs landed, {s.kills} wanted"
    # Leaks other than per-Pod flows alone (veth, port, IPAM record) fail here at once.
    assert [x for x in r.leaks if "flows only" not in x] == [], "state left for Pods that are gone"
    assert r.duplicate_addresses == []
    assert r.pairs_pinged > 0 and r.unreachable == []
    # Traffic between the anchors crossed the restart (its gap is measured, not bounded: a
    # duration here would depend on the machine's speed).
    assert r.flows_back_s is not None and r.traffic_back is True and r.traffic_gap_s is not None
    # After the restart every Pod has exactly its planned flows again (route-sync's replay), and no
    # Pod that is gone has any (the replay takes the plugin's attachment lock and re-checks the port).
    assert r.pod_flows_differing_after_restart == [], r.pod_flows_differing_after_restart
    assert r.flow_mismatches == [], r.flow_mismatches
    assert r.leaks == [], r.leaks
    assert r.ok
