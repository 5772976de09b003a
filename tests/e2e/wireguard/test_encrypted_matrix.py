"""The encrypted matrix (issue 30): ``lab/topologies/wireguard.yaml`` with ``--encryption wireguard``
in every mode (encap VXLAN, Geneve, GRE; noEncap; hybrid; noEncap with the fast path; noEncap with
BGP), one lab per mode:

* every Node sends every peer's Pod CIDRs, both families, through its WireGuard device (the state
  files' paths), each Node runs the userspace device (this kernel has no WireGuard);
* ``ferry-lab check``'s whole matrix passes, ping and TCP, IPv4 and IPv6;
* the evidence, captured on every port of both segments while it runs: Pod-to-Pod traffic alone
  (first window) crosses between Nodes as UDP to the WireGuard port and nothing else (neighbour
  discovery aside), WireGuard transport data between every pair of Nodes both ways; no Pod address
  in any packet on the wire, outer or inner, in either window (the second: the rest of the matrix,
  Pods to Nodes and to the external host);
* a 1500-byte DF ping across every path never black-holes: refused by the sender or answered, and
  one at the MTU it was told crosses; Pods' routes to other Nodes' Pods carry the transport MTU
  minus 60 (WireGuard over the IPv4 underlay);
* ``ferry-lab down`` leaves no wireguard-go behind, also once route-sync is gone (it outlives it);
* on a single-family underlay (``--family 4``, ``--family 6``) the WireGuard MTU is exactly the
  transport MTU minus 60 over IPv4, minus 80 over IPv6, and the capture sees UDP to 51820 alone.

A probe that fails (or a lab that does not settle) says why, before the lab is torn down: its
message carries every Node's WireGuard peers, a second probe of the failing pair and the Nodes' and
the router's neighbours and routes (``tests/e2e/wireguard/diagnose.py``; also written to a file under
``$FERRY_TEST_FAILURES``, /tmp/ferry-test-failures by default).

``tests/e2e/wireguard/test_clear_evidence.py`` is the control: the same capture, unencrypted, sees
the Pods' addresses."""

from __future__ import annotations

import time

import pytest

from cni.pipeline.modes import ENCRYPTION_WIREGUARD
from lab import build, check, wireguard
from lab.sh import running
from lab.topology import CATEGORIES, node_netns
from lab.wirecapture import WireCapture
from routesync.config import DEFAULT_WG_PORT
from routesync.wireguard.plan import overhead
from tests.e2e.wireguard.diagnose import diagnose, explain
from tests.e2e.wireguard.helpers import (
    MODES,
    Mode,
    df_failure_pairs,
    df_failures,
    df_paths,
    mode,
    probe_paths,
    route_mtu,
    settle_encrypted,
    start,
    wireguard_to_every_peer,
)

pytestmark = pytest.mark.root

POD_TO_POD = ("same-subnet", "other-subnet")
DF_POD_TO_POD = ("pod-pod-remote",)


@pytest.fixture(scope="module", params=MODES, ids=[m.name for m in MODES])
def wg_lab(request: pytest.FixtureRequest, cni_bin: str):  # type: ignore[no-untyped-def]
    m: Mode = request.param
    t0 = time.monotonic()
    lab = start(cni_bin, m, ENCRYPTION_WIREGUARD)
    try:
        settle_encrypted(lab)
    except BaseException:
        lab.down()
        raise
    yield m, lab, time.monotonic() - t0
    lab.down()  # a no-op when the test tore it down


def test_encrypted_matrix_and_the_wire_carries_no_pod_address(wg_lab) -> None:  # type: ignore[no-untyped-def]
    m, lab, up_s = wg_lab
    t0 = time.monotonic()
    assert wireguard_to_every_peer(lab)
    procs = {n.name: wireguard.pids(n.netns) for n in lab.nodes}
    assert all(len(p) == 1 for p in procs.values()), f"wireguard-go per Node: {procs}"
    # window 1: Pod to Pod only, so every flow between Nodes is Pod traffic
    with WireCapture(lab) as cap:
        rows1 = check.run(lab, POD_TO_POD)
        df1 = probe_paths(df_paths(lab, DF_POD_TO_POD))
        ev1 = cap.evidence()
    # window 2: the rest of the matrix (same Node, Pods to Nodes and to the external host)
    with WireCapture(lab) as cap:
        rows2 = check.run(lab, tuple(c for c in CATEGORIES if c not in POD_TO_POD))
        df2 = probe_paths([p for p in df_paths(lab) if p.kind not in DF_POD_TO_POD])
        ev2 = cap.evidence()
    took = time.monotonic() - t0
    rows = rows1 + rows2
    failed = [r for r in rows if not r.ok]
    assert rows1 and rows2 and not failed, explain(lab, failed, m.name)
    for ev in (ev1, ev2):
        assert not any(ev.dropped.values()), ev.dropped
        assert not ev.sightings, f"{m.name}: Pod addresses on the wire, encrypted:\n{ev.report()}"
    assert ev1.not_wireguard(DEFAULT_WG_PORT) == set(), \
        f"{m.name}: between Nodes, Pod traffic not in UDP to {DEFAULT_WG_PORT}:\n{ev1.report()}"
    # WireGuard's transport data between every pair of Nodes, each way (over the IPv4 underlay)
    addr = {n.name: n.address(4) for n in lab.nodes}
    data = {(s, d) for (s, d, kind) in ev1.wireguard if kind == "transport-data"}
    missing = [(a, b) for a in addr for b in addr if a != b and (addr[a], addr[b]) not in data]
    assert not missing, f"{m.name}: no WireGuard data {missing}:\n{ev1.report()}\n{diagnose(lab, what='no data')}"
    # MTU: no black hole on any path; Pods' routes to other Nodes' Pods at the WireGuard MTU
    dfs = df1 + df2
    assert not df_failures(dfs), "\n".join(df_failures(dfs)) + "\n" + diagnose(lab, df_failure_pairs(dfs), "DF")
    # the Pods' routes to other Nodes' Pods carry what route-sync says (its state file's mtu),
    # which is WireGuard's over the IPv4 endpoints the wire showed (60 bytes)
    state = lab.node("node-1").state() or {}
    mtus = {(r.path.label, r.path.dst): route_mtu(r.path.netns, r.path.dst) for r in df1}
    assert set(mtus.values()) == {state.get("mtu")}, f"{m.name}: Pods' route MTUs to remote Pods {mtus}"
    assert state["mtu"] == state["transportMTU"] - overhead(ipv6_underlay=False), state  # IPv4 endpoints: 60
    print(f"\n{m.name} (wireguard): up + settled {up_s:.1f} s, matrix + evidence + DF {took:.1f} s; "
          f"{len(rows)} probes ok, {len(dfs)} DF paths ({sum(r.full.outcome == 'crossed' for r in dfs)} crossed "
          f"at 1500, the rest refused at {sorted({r.full.mtu for r in dfs if r.full.mtu})}); on the wire "
          f"{ev1.total + ev2.total} frames, no Pod address; between Nodes: "
          f"{sorted(str(f) for f in ev1.flows_between_nodes())[:3]}...")


def test_down_leaves_no_wireguard_go(wg_lab) -> None:  # type: ignore[no-untyped-def]
    """Even when route-sync, its parent, is gone: no manifest entry names it, its namespace does."""
    m, lab, _ = wg_lab
    pids = [p for n in lab.nodes for p in wireguard.pids(n.netns)]
    assert pids, f"{m.name}: no wireguard-go runs"
    lab.kill_route_sync("node-1")
    assert all(running(p) for p in pids), f"{m.name}: a wireguard-go died with route-sync"
    assert build.down(lab.name, lab.root)
    left = [p for p in pids if running(p)]
    assert not left, f"{m.name}: wireguard-go still running after down: {left}"
    assert not any(build.netns_exists(node_netns(lab.name, n.name)) for n in lab.nodes)


@pytest.mark.parametrize("family", ["4", "6"])
def test_wireguard_mtu_per_underlay_family(cni_bin: str, family: str) -> None:
    lab = start(cni_bin, mode("encap-vxlan"), ENCRYPTION_WIREGUARD, (("node-1", "a"), ("node-2", "a"), ("node-3", "a")),
                family=family)
    try:
        settle_encrypted(lab)
        with WireCapture(lab) as cap:  # Pod to Pod alone: every flow between Nodes is Pod traffic
            rows = check.run(lab, POD_TO_POD)
            dfs = probe_paths(df_paths(lab, DF_POD_TO_POD))
            ev = cap.evidence()
        dfs += probe_paths([p for p in df_paths(lab) if p.kind not in DF_POD_TO_POD])
        assert rows and all(r.ok for r in rows), explain(lab, rows, f"IPv{family} underlay")
        assert not ev.sightings and ev.not_wireguard(DEFAULT_WG_PORT) == set(), ev.report()
        assert not df_failures(dfs), "\n".join(df_failures(dfs)) + "\n" + diagnose(lab, df_failure_pairs(dfs), "DF")
        state = lab.node("node-1").state() or {}
        want = state["transportMTU"] - overhead(ipv6_underlay=family == "6")
        remote = [r for r in dfs if r.path.kind == "pod-pod-remote"]
        assert remote and {route_mtu(r.path.netns, r.path.dst) for r in remote} == {want} == {state["mtu"]}
        assert {(r.full.outcome, r.full.mtu) for r in remote} == {("refused", want)}
        assert all(r.at_mtu is not None and r.at_mtu.outcome == "crossed" for r in remote)
        print(f"\nIPv{family} underlay: WireGuard MTU {want}, {len(dfs)} DF paths, none lost; "
              f"{ev.total} frames, between Nodes {sorted(str(f) for f in ev.flows_between_nodes())[:2]}...")
    finally:
        lab.down()
