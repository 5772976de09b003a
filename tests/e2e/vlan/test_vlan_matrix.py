"""The connectivity matrix on a tagged underlay (issue 29), in noEncap, hybrid (routed and
tunnelled peers), the fast path, BGP and encap (Geneve), IPv4 and IPv6: every probe of ``ferry-lab check``
passes while tcpdump on the segment switches' trunk ports (every Node's port: what Node-to-Node
and Node-to-router frames cross) sees only frames tagged with VLAN 100, ARP and ND included, and
none untagged.  1500-byte packets with DF set cross the tagged path (the tag is outside the IP
MTU: the frames on the trunk are 1518 bytes).  A Node left untagged reaches nothing."""

from __future__ import annotations

import subprocess

import pytest

from lab import check
from lab.api import Lab
from tests.e2e.vlan.helpers import (
    VLAN,
    Capture,
    flush_neighbours,
    mode_topology,
    start,
    tagged,
    trunk_ports,
    tunnel_next_hops_known,
)
from tests.support.labs import topology
from tests.support.waiting import elapsed_until

pytestmark = pytest.mark.root

MODES = ("noEncap", "hybrid", "fast", "bgp", "encap")
# node-1's path to node-2 (same segment) and node-3 (behind the router), as its state file says
PATHS = {"noEncap": ("route", "underlay"), "hybrid": ("route", "tunnel"), "fast": ("fast", "fast"),
         "bgp": ("route", "underlay"), "encap": ("tunnel", "tunnel")}
DF_PAYLOAD = {4: 1500 - 28, 6: 1500 - 48}  # ICMP echo data that makes a 1500-byte IP packet


@pytest.fixture(scope="module", params=MODES)
def mode_lab(request: pytest.FixtureRequest, cni_bin: str):  # type: ignore[no-untyped-def]
    lab = start(cni_bin, mode_topology(request.param))
    yield request.param, lab
    lab.down()


def _df_ping(lab: Lab, src_ns: str, dst: str, family: int, mtu: int = 1500) -> subprocess.CompletedProcess:
    payload = DF_PAYLOAD[family] - (1500 - mtu)
    return subprocess.run(["ip", "netns", "exec", src_ns, "ping", f"-{family}", "-n", "-c", "2", "-i", "0.05",
                           "-W", "2", "-M", "do", "-s", str(payload), dst], capture_output=True, text=True, check=False)


def test_matrix_and_every_frame_on_the_trunks_is_tagged(mode_lab) -> None:  # type: ignore[no-untyped-def]
    mode, lab = mode_lab
    # the Nodes started together: a tunnel next hop asked before its Node tagged is asked again
    took = elapsed_until(lambda: tunnel_next_hops_known(lab), "every tunnel next hop in OVS's neighbour cache")
    with Capture(lab, trunk_ports(lab)) as cap:
        flush_neighbours(lab)
        rows = check.run(lab)
        n1, n2, n3 = lab.node("node-1"), lab.node("node-2"), lab.node("node-3")
        # Pod to Pod on the segment: routed at the full MTU; encap's tunnel at the tunnel MTU (its
        # overhead, not the tag's)
        pod_mtu = (n1.state() or {}).get("mtu" if mode == "encap" else "transportMTU", 1500)
        df = []
        for family in (4, 6):
            # Node to Node on the segment, and across the router, at 1500
            df.append(_df_ping(lab, n1.netns, n2.address(family), family))
            df.append(_df_ping(lab, n1.netns, n3.address(family), family))
            df.append(_df_ping(lab, lab.pod("node-1", "a").netns, lab.pod("node-2", "a").address(family), family,
                               pod_mtu))
        cap.settle(lab)
        frames = cap.stop()
    failed = [r for r in rows if not r.ok]
    assert rows and not failed, check.table(lab, failed)
    state = n1.state() or {}
    paths = {p["name"]: p["path"] for p in state.get("peers", [])}
    assert (paths.get("node-2"), paths.get("node-3")) == PATHS[mode], paths
    if mode == "bgp":  # the router learnt every Pod CIDR over sessions that crossed the tagged segment
        learnt = lab.router.exec(["ip", "route", "show", "proto", "bgp"], check=True).stdout
        assert all(c.split("/")[0] in learnt for n in lab.nodes for c in n.spec.pod_cidrs if ":" not in c), learnt
    for p in df:
        assert p.returncode == 0, f"{mode}: {p.args}: {p.stdout}{p.stderr}"
    summary = {}
    for (seg, port), f in frames.items():
        summary[port] = (f.total, dict(f.tagged), f.largest)
        assert f.total > 0, f"{mode}: nothing crossed {seg}/{port}"
        assert not f.untagged, f"{mode}: untagged frames on {seg}/{port}: {f.untagged} {f.untagged_sample}"
        assert f.vids == {VLAN}, f"{mode}: {seg}/{port} saw VLANs {f.vids}"
        assert {"IPv4", "IPv6"} <= f.inner_types(), f"{mode}: {seg}/{port}: {f.tagged}"
        assert f.largest == 1518, f"{mode}: {seg}/{port}: largest frame {f.largest} (1500 + 14 + the 4-byte tag)"
    assert any(t == "ARP" for f in frames.values() for _v, t in f.tagged), f"{mode}: no ARP seen: {summary}"
    print(f"\n{mode}: tunnel next hops known {took:.2f} s into the test; {len(rows)} probes ok; "
          f"per trunk port (frames, by (VID, type), largest): {summary}")


def test_an_untagged_node_reaches_nothing(cni_bin: str) -> None:
    """node-3 alone on segment b with no transportVLAN (``vlan: none``): its frames leave untagged,
    its switch port (a trunk of VLAN 100) drops them, so it reaches neither the router nor its
    peers, while node-1 (tagged) reaches the router.  The tagged path is what carries the rest."""
    doc = tagged(topology({"trafficEncapMode": "noEncap"}, route_pod_cidrs=True))
    doc["nodes"] = [*doc["nodes"][:2], {**doc["nodes"][2], "vlan": "none"}]
    lab = start(cni_bin, doc, pods=())
    try:
        n1, n3 = lab.node("node-1"), lab.node("node-3")
        assert n3.spec.vlan is None and n1.spec.vlan == VLAN
        # what node-3 sends, alone: the switch also floods the VLAN's own multicast (the router's
        # ND and MLD) to node-3's trunk port, tagged, whenever the router speaks
        with Capture(lab, [("b", "node-3")], direction="in") as cap:
            for family in (4, 6):
                assert lab.ping(n1, lab.router.address(family), count=2, timeout=2), \
                    "the tagged Node reaches the router"
                assert not lab.ping(n3, lab.router.address(family), count=2, timeout=1), \
                    "an untagged Node reached the router of a tagged segment"
                assert not lab.ping(n3, n1.address(family), count=1, timeout=1)
            frames = cap.stop()[("b", "node-3")]
        assert frames.untagged and not frames.tagged, frames  # it speaks (ARP/ND), untagged, and nobody answers
        assert {"ARP", "IPv6"} <= set(frames.untagged), frames.untagged
    finally:
        lab.down()
