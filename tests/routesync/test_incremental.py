"""The incremental path's pure parts: the planner's per-peer memo gives the same desired state
as planning from scratch; the nft set collapse equals ``ipaddress.collapse_addresses``; the
daemon runs full passes first / after an ovs-vswitchd restart and incremental ones for Node
changes (without re-preparing)."""

from __future__ import annotations

import ipaddress
import threading

from hypothesis import given
from hypothesis import strategies as st

from routesync.apply import delta_applicable
from routesync.apply.nft import _collapse
from routesync.config import from_dict
from routesync.daemon import Daemon
from routesync.model import DesiredState, LocalFacts, NodeRecord
from routesync.planner import PeerMemo, plan
from routesync.sources.registry import RegistrySource
from tests.routesync.standins import RecordingAppliers
from tests.support.waiting import HANG, until

FACTS = LocalFacts(gateway_ofport=2, gateway_mac="02:00:00:00:01:01", tunnel_ofport=3, uplink_name="eth0",
                   uplink_addresses=("192.168.77.11/24", "fd00:77::11/64"), transport_mtu=1500,
                   uplink_mac="02:00:00:00:00:11")
LOCAL = NodeRecord("node-a", ("192.168.77.11",), ("10.244.1.0/24",))


def peer(i: int, addr: str | None = None, cidr: str | None = None) -> NodeRecord:
    return NodeRecord(f"node-{i:03d}", (addr or f"192.168.{77 + i % 2}.{20 + i}",),
                      (cidr or f"10.244.{10 + i}.0/24", f"fd00:10:244:{10 + i:x}::/64"))


def same(a: DesiredState, b: DesiredState) -> bool:
    return (a.peers, [f.text() for f in a.flows], a.routes, a.neighbors, a.nft) == \
        (b.peers, [f.text() for f in b.flows], b.routes, b.neighbors, b.nft)


def test_memo_plans_exactly_what_a_fresh_plan_does_across_changes() -> None:
    for mode in ("encap", "hybrid", "noEncap"):
        cfg = from_dict({"nodeName": "node-a", "trafficEncapMode": mode, "clusterCIDRs": ["10.244.0.0/16"]})
        memo = PeerMemo()
        peers = [peer(i) for i in range(20)]
        steps = [
            peers,
            peers[:5] + [peer(5, addr="192.168.78.99")] + peers[6:],  # address: other subnet now
            peers[:7] + [peer(7, cidr="10.99.0.0/24")] + peers[8:],  # Pod CIDR changed
            peers[:-3],  # removed
            peers + [peer(40)],  # added
        ]
        for nodes in steps:
            fresh = plan(cfg, LOCAL, nodes, FACTS)
            memoized = plan(cfg, LOCAL, nodes, FACTS, memo=memo)
            assert same(fresh, memoized), mode
        assert set(memo.results) == set(steps[-1])  # peers gone are forgotten
        # another context (the tunnel port's ofport changed): nothing stale is reused
        moved = LocalFacts(**{**FACTS.__dict__, "tunnel_ofport": 9})
        assert same(plan(cfg, LOCAL, steps[-1], moved), plan(cfg, LOCAL, steps[-1], moved, memo=memo))
        if mode == "encap":
            assert any("output:9" in f.actions_text() for f in plan(cfg, LOCAL, steps[-1], moved, memo=memo).flows)


v4 = st.builds(lambda a, p: f"{ipaddress.IPv4Address(a)}/{p}", st.integers(0, 2**32 - 1), st.integers(0, 32))
v6 = st.builds(lambda a, p: f"{ipaddress.IPv6Address(a)}/{p}", st.integers(0, 2**128 - 1), st.integers(0, 128))
near4 = st.builds(lambda a, p: f"10.0.{a >> 8 & 3}.{a & 255}/{p}", st.integers(0, 1023), st.integers(20, 32))


@given(st.lists(st.one_of(v4, v6, near4), max_size=25))
def test_collapse_equals_ipaddress(cidrs: list[str]) -> None:
    for v in (4, 6):
        nets = [n for n in (ipaddress.ip_network(c, strict=False) for c in cidrs) if n.version == v]
        assert _collapse(cidrs, v) == [str(n) for n in ipaddress.collapse_addresses(nets)]  # type: ignore[type-var]


def test_delta_only_for_per_peer_differences() -> None:
    cfg = from_dict({"nodeName": "node-a", "clusterCIDRs": ["10.244.0.0/16"]})
    a = plan(cfg, LOCAL, [peer(1)], FACTS)
    b = plan(cfg, LOCAL, [peer(1), peer(2)], FACTS)
    assert delta_applicable(a, b)
    b.mtu = a.mtu - 10
    assert not delta_applicable(a, b)
    c = plan(cfg, NodeRecord("node-a", ("192.168.77.11",), ("10.244.2.0/24",)), [peer(1)], FACTS)
    assert not delta_applicable(a, c)  # gateway addresses moved


def test_daemon_full_first_incremental_for_changes_full_after_ovs_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = from_dict({"nodeName": "node-a", "podCIDRs": ["10.244.1.0/24"], "stateFile": str(tmp_path / "s.json"),
                     "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg"), "pollInterval": 0.02}})
    apl = RecordingAppliers()
    d = Daemon(cfg, RegistrySource(str(tmp_path / "reg"), "node-a", poll_interval=0.02), apl)
    other = RegistrySource(str(tmp_path / "reg"), "node-b")
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    try:
        until(lambda: apl.applied)
        until(lambda: apl.prepared >= 1 and len(apl.applied) >= 1)
        assert apl.applied[0].full
        # a first change: this Node's own record (published by the first pass) is seen once
        other.publish_self(NodeRecord("node-b", ("192.168.77.59",), ("10.244.2.0/24",)))
        until(lambda: apl.applied[-1].peers and apl.applied[-1].peers[0].transport_address == "192.168.77.59")
        # the pass that saw our own record prepared again (its local facts changed); from here on
        # nothing local changes (was a 0.1 s sleep, short on a slow machine)
        until(lambda: apl.prepared >= 2, "the pass that sees this Node's own record")
        n, prepared = len(apl.applied), apl.prepared
        for i in range(3):
            other.publish_self(NodeRecord("node-b", (f"192.168.77.{60 + i}",), ("10.244.2.0/24",)))
            until(lambda i=i: apl.applied[-1].peers
                  and apl.applied[-1].peers[0].transport_address == f"192.168.77.{60 + i}")
        changes = apl.applied[n:]
        assert changes and not any(x.full for x in changes)
        assert apl.prepared == prepared  # the local facts were reused
        apl.generation += 1  # ovs-vswitchd restarted: the next pass is full and prepares
        until(lambda: apl.applied[-1].full and apl.prepared > prepared, "the full pass after the restart")
    finally:
        d.stop.set()
        t.join(HANG)
