"""The noEncap fast path end to end (issue 7), one lab per configuration, IPv4 and IPv6.

Path evidence: a Pod↔Pod exchange moves the physical uplink's OVS counters (``eth0~``) and
leaves ``ferry-gw0``'s OVS counters flat on both Nodes, and the Node's own stack sees none of
it (kernel counters of the internal port ``eth0`` that holds the Node's address stay flat).
On the gateway path (the fallback) the same exchange crosses ferry-gw0 and eth0 on both ends."""

from __future__ import annotations

import time

import pytest

from lab.api import Lab
from tests.e2e.fastpath.helpers import (
    fast_macs,
    fast_topology,
    read_record,
    state_peers,
    traffic,
    write_record_without_mac,
)
from tests.support.liveping import LivePing, LiveTcp
from tests.support.waiting import elapsed_until

pytestmark = [pytest.mark.root, pytest.mark.slow]
FAMILIES = (4, 6)
NOISE = 10  # background packets a port may carry during a probe (ARP/ND refreshes)
PROBE_PACKETS = 40  # 20 echo requests + 20 replies, at least, on each uplink
STREAM_STEP = 1 << 20  # bytes a TCP stream must carry in each phase of a switch


def assert_fast(lab: Lab, src_node: str, dst_node: str, family: int) -> None:
    a, b = lab.pod(src_node, "a"), lab.pod(dst_node, "a")
    nodes = (lab.node(src_node), lab.node(dst_node))
    for s, d in ((a, b), (b, a)):  # both directions
        c = traffic(lab, s, d, family, nodes)
        for n in nodes:
            assert c[n.name].gw_ovs <= NOISE, f"{s.node}->{d.node} IPv{family}: {n.name} ferry-gw0 moved {c}"
            assert c[n.name].host_uplink <= NOISE, f"{s.node}->{d.node} IPv{family}: {n.name} stack saw {c}"
            assert c[n.name].uplink_ovs >= PROBE_PACKETS, f"{s.node}->{d.node} IPv{family}: uplink {c}"


def assert_gateway(lab: Lab, src_node: str, dst_node: str, family: int) -> None:
    a, b = lab.pod(src_node, "a"), lab.pod(dst_node, "a")
    c = traffic(lab, a, b, family, (lab.node(src_node),))[src_node]
    assert c.gw_ovs >= PROBE_PACKETS and c.host_uplink >= PROBE_PACKETS, c


def wait(cond, what: str) -> float:  # type: ignore[no-untyped-def]
    """Seconds until ``cond()`` held (printed, never bounded: that would depend on the machine)."""
    return elapsed_until(cond, what)


# ------------------------------------------------------------------ noEncap, macSource annotation
@pytest.fixture(scope="module")
def ann_lab(fast_lab_of) -> Lab:  # type: ignore[no-untyped-def]
    return fast_lab_of(fast_topology("noEncap", "annotation"))


def test_annotation_lab_paths_and_sources(ann_lab: Lab) -> None:
    lab = ann_lab
    peers = state_peers(lab.node("node-1"))
    mac2 = dict(read_record(lab, "node-2").annotations)["ferry.io/mac-address"]
    for fam in FAMILIES:
        assert peers[("node-2", fam)]["path"] == "fast" and peers[("node-2", fam)]["macSource"] == "annotation"
        assert peers[("node-2", fam)]["mac"] == mac2
        # another subnet: the router's MAC, which only the neighbour table can give
        assert peers[("node-3", fam)]["path"] == "fast" and peers[("node-3", fam)]["macSource"] == "neighbor"
    from lab.build import route_sync_command

    cp = lab.node("node-1").exec([str(route_sync_command()), "show", "--state-file",
                                  lab.node("node-1").paths.state_file])
    rows = [line.split() for line in cp.stdout.splitlines() if line.startswith("node-")]
    assert rows and all(r[-1] == "fast" for r in rows), cp.stdout


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("peer", ["node-2", "node-3"], ids=["same-subnet", "other-subnet"])
def test_pod_traffic_never_crosses_the_gateway(ann_lab: Lab, peer: str, family: int) -> None:
    assert_fast(ann_lab, "node-1", peer, family)


def test_annotation_removed_and_restored_tcp_survives(ann_lab: Lab) -> None:
    """A TCP stream from node-1 to node-2 keeps flowing, on one connection, while node-2's MAC
    annotation goes (node-1 falls back to the gateway path) and comes back (fast again)."""
    lab = ann_lab
    n1 = lab.node("node-1")
    a, b = lab.pod("node-1", "a"), lab.pod("node-2", "a")
    with LiveTcp(b.netns, b.ipv4, a.netns, 5301) as tcp:
        tcp.more_bytes(STREAM_STEP, "on the fast path")
        lab.kill_route_sync("node-2")  # its flows stay; nobody re-publishes its annotation
        t0 = time.monotonic()
        write_record_without_mac(lab, "node-2")
        off = wait(lambda: not fast_macs(n1, "node-2"), "node-1 off the fast path to node-2")
        wait(lambda: state_peers(n1)[("node-2", 4)]["path"] == "route", "the state file to say so")
        off_total = time.monotonic() - t0
        tcp.more_bytes(STREAM_STEP, "on the gateway path")
        lab.start_route_sync("node-2")  # publishes the annotation again
        published = wait(lambda: "ferry.io/mac-address" in dict(read_record(lab, "node-2").annotations),
                         "node-2's route-sync to publish its MAC again")
        on = wait(lambda: bool(fast_macs(n1, "node-2")), "node-1 back on the fast path to node-2")
        tcp.more_bytes(STREAM_STEP, "back on the fast path")
        total = tcp.stop()
    print(f"annotation removed -> gateway path in {off * 1e3:.0f} ms ({off_total * 1e3:.0f} ms from the write); "
          f"restored -> fast in {on * 1e3:.0f} ms after the record (published {published:.2f}s after the restart); "
          f"{total} bytes on one connection")
    assert_fast(lab, "node-1", "node-2", 4)


def test_peer_without_mac_uses_the_gateway_path(ann_lab: Lab) -> None:
    lab = ann_lab
    n1 = lab.node("node-1")
    lab.kill_route_sync("node-2")
    try:
        write_record_without_mac(lab, "node-2")
        wait(lambda: not fast_macs(n1, "node-2"), "node-1 off the fast path to node-2")
        assert_gateway(lab, "node-1", "node-2", 4)
        assert_gateway(lab, "node-1", "node-2", 6)
    finally:
        lab.start_route_sync("node-2")
    wait(lambda: bool(fast_macs(n1, "node-2")), "node-2 re-published, node-1 fast again")


def test_router_mac_change_is_followed(ann_lab: Lab) -> None:
    """Followed from the router's gratuitous ARP / unsolicited NA, not by a periodic resync (the
    lab's resync period is far beyond the wait's deadline)."""
    lab = ann_lab
    n1 = lab.node("node-1")
    new = "02:00:00:aa:bb:01"
    r = lab.router
    r.exec(["sysctl", "-qw", "net.ipv4.conf.eth-a.arp_notify=1", "net.ipv6.conf.eth-a.ndisc_notify=1"], check=True)
    old = r.exec(["cat", "/sys/class/net/eth-a/address"], check=True).stdout.strip()
    assert fast_macs(n1, "node-3") == {old}
    # the kernel sends a gratuitous ARP and an unsolicited NA for the new MAC (arp/ndisc_notify)
    r.exec(["ip", "link", "set", "eth-a", "address", new], check=True)
    took = wait(lambda: fast_macs(n1, "node-3") == {new}, "node-1's flows to node-3 to use the new MAC")
    both = wait(lambda: all(state_peers(n1)[("node-3", f)]["mac"] == new for f in FAMILIES),
                "the state file to have it for both families")
    print(f"router MAC change followed in {took * 1e3:.0f} ms (state file both families {(both + took) * 1e3:.0f} ms)")
    for fam in FAMILIES:
        assert_fast(lab, "node-1", "node-3", fam)


def test_node_reachable_while_fast_path_switches(ann_lab: Lab) -> None:
    """node-2 pings node-1 (both families) while node-1's uplink leaves the bridge and comes back:
    replies keep coming in each phase; how many were lost is printed (the outage's length
    depends on the machine's speed, so it is not bounded here)."""
    lab = ann_lab
    n1, n2 = lab.node("node-1"), lab.node("node-2")
    pings = {fam: LivePing(n2.netns, n1.address(fam), interval=0.01) for fam in FAMILIES}
    try:
        for p in pings.values():
            p.more_replies(20, "before the switch")
        lab.reconfigure_route_sync("node-1", fastPath=False)  # uplink back off the bridge
        assert "eth0~" not in n1.exec(["ip", "-br", "link"], check=True).stdout
        assert all(p["path"] != "fast" for p in (n1.state() or {})["peers"])
        for p in pings.values():
            p.more_replies(20, "with the fast path off")
        lab.reconfigure_route_sync("node-1", fastPath=True)
        assert all(p["path"] == "fast" for p in (n1.state() or {})["peers"])
        for p in pings.values():
            p.more_replies(20, "with the fast path back")
        results = {fam: p.stop() for fam, p in pings.items()}
    finally:
        for p in pings.values():
            p.__exit__(None, None, None)
    for fam, res in results.items():
        print(f"IPv{fam}: node-2 -> node-1 {res.transmitted} pings while fastPath off/on, {res.lost} lost, "
              f"longest gap {res.gap:.2f}s")
    assert_fast(lab, "node-1", "node-2", 4)


# ------------------------------------------------------------------ noEncap, macSource neighbor
@pytest.fixture(scope="module")
def neigh_lab(fast_lab_of) -> Lab:  # type: ignore[no-untyped-def]
    return fast_lab_of(fast_topology("noEncap", "neighbor"))


def test_neighbor_only_no_annotations_every_peer_fast(neigh_lab: Lab) -> None:
    lab = neigh_lab
    for n in lab.nodes:
        assert "ferry.io/mac-address" not in dict(read_record(lab, n.name).annotations), n.name
    for n in lab.nodes:
        peers = state_peers(n)
        assert len(peers) == 4
        assert all(p["path"] == "fast" and p["macSource"] == "neighbor" for p in peers.values()), peers
    for fam in FAMILIES:
        assert_fast(lab, "node-1", "node-2", fam)
        assert_fast(lab, "node-1", "node-3", fam)


# ------------------------------------------------------------------ hybrid, macSource both
@pytest.fixture(scope="module")
def hybrid_lab(fast_lab_of) -> Lab:  # type: ignore[no-untyped-def]
    return fast_lab_of(fast_topology("hybrid", "both", tunnelType="vxlan"))


@pytest.mark.parametrize("family", FAMILIES)
def test_hybrid_routed_peer_fast_tunnelled_peer_unchanged(hybrid_lab: Lab, family: int) -> None:
    from tests.e2e.modes.helpers import measure

    lab = hybrid_lab
    peers = state_peers(lab.node("node-1"))
    assert peers[("node-2", family)]["path"] == "fast" and peers[("node-2", family)]["macSource"] == "annotation"
    assert peers[("node-3", family)]["path"] == "tunnel"
    assert_fast(lab, "node-1", "node-2", family)
    a, c = lab.pod("node-1", "a"), lab.pod("node-3", "a")
    addr = c.address(family)
    assert addr
    sample = measure(lab, a, "node-3", lambda: lab.ping(a, addr, count=5, interval=0.02))
    assert sample.out_delta >= 5 and sample.in_delta >= 5, sample
