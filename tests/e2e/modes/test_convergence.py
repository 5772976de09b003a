"""Convergence and restarts, in one encap/vxlan lab with a short re-assertion period.

* a peer's appearance, Pod CIDR change, address change and removal reach another Node's flows
  and routes (registry write → installed, measured and printed, not bounded: a bound would
  depend on the machine's speed; bench/ tracks the figures);
* a route deleted by hand is back after the next re-assertion;
* SIGKILL of route-sync and a restart lose no ping of a running ``ping -i 0.1`` across Nodes
  and re-install nothing (same flows, same routes, flows keep their age);
* an ovs-vswitchd restart (every flow lost, the plugin's per-Pod flows too): route-sync puts its
  flows back and replays the per-Pod flows from the Pod ports' external_ids; traffic comes back
  and its gap is measured.

Every wait is on the observable condition (replies of a running ping, a log line, the flows);
the deadlines only bound a hang."""

from __future__ import annotations

import os
import re
import time

import pytest
import yaml

from cni.pipeline.tables import Cookie, Owner, peer_cookie
from lab import layout
from lab.api import Lab
from tests.e2e.modes.helpers import (
    cookie_dump,
    dump_flows,
    ferry_routes,
    flow_lines,
    owner_flow_count,
    tunnel_neighbours,
    wait_for,
)
from tests.support.labs import start_lab, topology
from tests.support.liveping import LivePing
from tests.support.waiting import HANG

pytestmark = [pytest.mark.root, pytest.mark.slow]

RESYNC = 1.5
FIGURES: dict[str, float] = {}


@pytest.fixture(scope="module")
def lab(cni_bin: str):  # type: ignore[no-untyped-def]
    lab = start_lab(cni_bin, topology({"trafficEncapMode": "encap", "tunnelType": "vxlan",
                                           "resyncSeconds": RESYNC}))
    yield lab
    lab.down()
    if FIGURES:
        print("\nconvergence figures:", {k: round(v, 3) for k, v in FIGURES.items()})


def _write_record(lab: Lab, name: str, addrs: list[str], cidrs: list[str]) -> None:
    path = os.path.join(layout.registry_dir(lab.dir), f"{name}.yaml")
    layout.write_atomic(path, yaml.safe_dump({"name": name, "transportAddresses": addrs, "podCIDRs": cidrs,
                                              "annotations": {}}))


def _remove_record(lab: Lab, name: str) -> None:
    os.unlink(os.path.join(layout.registry_dir(lab.dir), f"{name}.yaml"))


def _installed(lab: Lab, node: str, peer: str) -> tuple[str, list[str]]:
    n = lab.node(node)
    return cookie_dump(n, peer_cookie(peer)), ferry_routes(n)


def test_peer_change_converges(lab: Lab) -> None:
    """A synthetic peer node-9 (192.168.77.19): appear, change Pod CIDR, change address, vanish;
    node-1's flows and routes follow each change (how fast is printed)."""
    def has(cidr: str, tun: str) -> bool:
        flows, routes = _installed(lab, "node-1", "node-9")
        return (f"nw_dst={cidr}" in flows and f"{tun}->tun_dst" in flows
                and any(r.startswith(f"{cidr} ") for r in routes))

    _write_record(lab, "node-9", ["192.168.77.19"], ["10.244.9.0/24"])
    FIGURES["peer added"] = wait_for(lambda: has("10.244.9.0/24", "192.168.77.19"), HANG)

    _write_record(lab, "node-9", ["192.168.77.19"], ["10.244.19.0/24"])
    FIGURES["Pod CIDR changed"] = wait_for(
        lambda: has("10.244.19.0/24", "192.168.77.19") and "10.244.9.0" not in _installed(lab, "node-1", "node-9")[0]
        and not any(r.startswith("10.244.9.0/24") for r in ferry_routes(lab.node("node-1"))), HANG)

    _write_record(lab, "node-9", ["192.168.77.29"], ["10.244.19.0/24"])
    FIGURES["address changed"] = wait_for(
        lambda: has("10.244.19.0/24", "192.168.77.29")
        and "192.168.77.19" not in _installed(lab, "node-1", "node-9")[0],
        HANG)

    _remove_record(lab, "node-9")

    def gone() -> bool:
        flows, routes = _installed(lab, "node-1", "node-9")
        return not flow_lines(flows) and not any(r.startswith("10.244.19.0/24") for r in routes)
    FIGURES["peer removed"] = wait_for(gone, HANG)
    # the other Nodes converged too, and the real peers were never touched
    wait_for(lambda: not flow_lines(_installed(lab, "node-3", "node-9")[0]), HANG)
    assert lab.ping(lab.pod("node-1", "a"), lab.pod("node-3", "a").ipv4 or "")


def test_route_deleted_by_hand_is_restored(lab: Lab) -> None:
    n = lab.node("node-1")
    before = ferry_routes(n)
    victim = next(r for r in before if r.startswith("10.244.3.0/24 "))
    n.exec(["ip", "route", "del", "10.244.3.0/24"], check=True)
    assert not any(r.startswith("10.244.3.0/24 ") for r in ferry_routes(n))
    FIGURES["route restored after"] = wait_for(lambda: victim in ferry_routes(n), HANG, step=0.02)
    assert ferry_routes(n) == before


def _snapshot(lab: Lab, node: str) -> tuple[dict[str, list[str]], list[str]]:
    """route-sync's flows per owner (without counters and ages) and its routes."""
    strip = re.compile(r"(duration|n_packets|n_bytes|idle_age|hard_age)=[^,]*, ?")
    flows = {}
    for owner in (Owner.BASE, Owner.NODE, Owner.PEER, Owner.POD):
        dump = dump_flows(lab.node(node), f"cookie={Cookie.owner_match(owner)}")
        flows[f"{int(owner):#x}"] = sorted(strip.sub("", line).strip() for line in flow_lines(dump))
    return flows, ferry_routes(lab.node(node))


def _diff(a: tuple[dict[str, list[str]], list[str]], b: tuple[dict[str, list[str]], list[str]]) -> str:
    out = []
    for k in sorted(set(a[0]) | set(b[0])):
        x, y = set(a[0].get(k, [])), set(b[0].get(k, []))
        out += [f"- {f}" for f in sorted(x - y)] + [f"+ {f}" for f in sorted(y - x)]
    x, y = set(a[1]), set(b[1])
    out += [f"- route {r}" for r in sorted(x - y)] + [f"+ route {r}" for r in sorted(y - x)]
    return "\n".join(out)


def _min_age(lab: Lab, node: str) -> float:
    dump = dump_flows(lab.node(node))
    return min(float(m) for m in re.findall(r"duration=([\d.]+)s", dump))


def _log_count(lab: Lab, node: str, text: str) -> int:
    try:
        with open(lab.node(node).paths.route_sync_log, errors="replace") as f:
            return f.read().count(text)
    except FileNotFoundError:
        return 0


def test_route_sync_sigkill_and_restart_changes_nothing(lab: Lab) -> None:
    dst = lab.pod("node-3", "a").ipv4 or ""
    assert lab.ping(lab.pod("node-1", "a"), dst)
    before = _snapshot(lab, "node-1")
    ready = _log_count(lab, "node-1", "first reconcile done")
    with LivePing(lab.pod("node-1", "a").netns, dst, interval=0.1) as ping:
        ping.more_replies(5, "before the kill")
        t_kill = time.monotonic()
        lab.kill_route_sync("node-1")
        ping.more_replies(5, "while route-sync is down")
        lab.start_route_sync("node-1")
        wait_for(lambda: _log_count(lab, "node-1", "first reconcile done") > ready, HANG, step=0.02)
        ping.more_replies(5, "after route-sync's first reconcile")
        res = ping.stop()
    FIGURES["route-sync restart: pings lost"] = len(res.lost_seqs)
    assert res.lost_seqs == [], f"pings {res.lost_seqs} of {res.transmitted} lost during the restart"
    after = _snapshot(lab, "node-1")
    assert after == before, _diff(before, after)
    # nothing was re-installed: every flow is older than the kill (OVS prints ages in ms)
    t_check = time.monotonic()  # before the dump: a flow older than the kill is older than this
    assert _min_age(lab, "node-1") >= t_check - t_kill - 0.002


def test_ovs_vswitchd_restart_restores_flows_and_pod_flows(lab: Lab) -> None:
    dst = lab.pod("node-3", "a").ipv4 or ""
    before = _snapshot(lab, "node-1")
    neigh = tunnel_neighbours(lab, "node-1")
    pod_flows = owner_flow_count(lab.node("node-1"), Owner.POD)
    assert pod_flows > 0
    with LivePing(lab.pod("node-1", "a").netns, dst, interval=0.02) as ping:
        ping.more_replies(5, "before the restart")
        t_restart = time.time()
        lab.restart_vswitchd("node-1")
        # restored: route-sync's flows and routes, the Pods' flows, and the tunnel neighbours OVS
        # lost (route-sync refills them after the flows; until then IPv6 underlay packets drop)
        wait_for(lambda: _snapshot(lab, "node-1") == before and tunnel_neighbours(lab, "node-1") >= neigh, HANG,
                 step=0.05)
        assert ping.reply_after(t_restart), "no ping reply across the Nodes after the restart"
        ping.more_replies(5, "after the flows are back")
        res = ping.stop()
    FIGURES["vswitchd restart: traffic gap s"] = res.gap
    FIGURES["vswitchd restart: pings lost (at 20 ms)"] = res.lost
    assert owner_flow_count(lab.node("node-1"), Owner.POD) == pod_flows
    for fam in (4, 6):
        for other in ("node-1/b", "node-2/a", "node-3/a"):
            node, name = other.split("/")
            addr = lab.pod(node, name).address(fam) or ""
            assert lab.ping(lab.pod("node-1", "a"), addr), f"node-1/a -> {other} v{fam} after the restart"
