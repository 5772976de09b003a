"""RouteApplier in a namespace: only proto-Ferry routes are ours; drift is repaired."""

from __future__ import annotations

import time

import pytest

from routesync.apply.routes import RouteApplier, plan_routes
from routesync.model import FERRY_ROUTE_PROTO, HostRoute, Neighbor
from tests.routesync.apply.helpers import ns_sh, veth
from tests.support.ovs_instance import netns


def test_plan_routes_dev_none_matches_any_device() -> None:
    installed = {HostRoute("10.1.0.0/24", "192.168.1.2", "eth0"),
                 HostRoute("10.2.0.0/24", "192.168.1.3", "eth0")}
    add, delete = plan_routes({HostRoute("10.1.0.0/24", "192.168.1.2", None),
                               HostRoute("10.3.0.0/24", "10.3.0.1", "gw", True)}, installed)
    assert add == [HostRoute("10.3.0.0/24", "10.3.0.1", "gw", True)]
    assert delete == [HostRoute("10.2.0.0/24", "192.168.1.3", "eth0")]


DESIRED = {
    HostRoute("10.244.2.0/24", "10.244.2.1", "ferry-gw0", True),  # tunnelled peer
    HostRoute("10.244.3.0/24", "192.168.9.3", None),  # direct route via the peer Node
    HostRoute("fd00:10:244:2::1/128", None, "ferry-gw0"),  # IPv6 tunnel: /128 + neighbour
    HostRoute("fd00:10:244:2::/64", "fd00:10:244:2::1", "ferry-gw0"),
}
NEIGH = {Neighbor("fd00:10:244:2::1", "aa:bb:cc:dd:ee:ff", "ferry-gw0")}


def routes_text(ns: str) -> str:
    return ns_sh(ns, "ip", "route") + ns_sh(ns, "ip", "-6", "route")


@pytest.mark.root
def test_route_sync_only_ours_and_drift_repaired() -> None:
    with netns("fb-rt1") as ns, netns("fb-rt1p") as peer:
        veth(ns, "ferry-gw0", peer, "gwpeer")
        veth(ns, "eth0", peer, "eth0p")
        ns_sh(ns, "ip", "addr", "add", "192.168.9.1/24", "dev", "eth0")
        # someone else's route, of another protocol, in the same destination space
        ns_sh(ns, "ip", "route", "add", "10.50.0.0/24", "via", "192.168.9.50", "proto", "static")
        with RouteApplier(netns=ns) as r:
            assert r.set_gateway_addresses("ferry-gw0", ["10.244.1.1/24", "fd00:10:244:1::1/64"])[0]
            assert r.set_gateway_addresses("ferry-gw0", ["10.244.1.1/24", "fd00:10:244:1::1/64"]) \
                == ([], [])
            d = r.sync(DESIRED, NEIGH)
            assert len(d.added) == 4 and len(d.neigh_added) == 1
            text = routes_text(ns)
            assert "10.244.2.0/24 via 10.244.2.1 dev ferry-gw0 proto 102 onlink" in text
            assert "10.244.3.0/24 via 192.168.9.3 dev eth0 proto 102" in text
            assert "fd00:10:244:2::/64 via fd00:10:244:2::1 dev ferry-gw0 proto 102" in text
            assert "aa:bb:cc:dd:ee:ff PERMANENT" in ns_sh(ns, "ip", "-6", "neigh", "show",
                                                          "dev", "ferry-gw0")
            assert not r.sync(DESIRED, NEIGH).changed  # second sync: nothing to do

            ns_sh(ns, "ip", "route", "del", "10.244.2.0/24")  # drift: deleted by hand
            d = r.sync(DESIRED, NEIGH)
            assert d.added == [HostRoute("10.244.2.0/24", "10.244.2.1", "ferry-gw0", True)]
            assert "10.244.2.0/24 via 10.244.2.1" in routes_text(ns)

            # a new run with fewer peers removes exactly ours, never the static route
            d = r.sync({HostRoute("10.244.3.0/24", "192.168.9.3", None)}, set())
            assert len(d.deleted) == 3 and len(d.neigh_deleted) == 1
            text = routes_text(ns)
            assert "10.244.2.0/24" not in text and "fd00:10:244:2::" not in text
            assert "10.50.0.0/24 via 192.168.9.50 dev eth0 proto static" in text
            assert len(r.sync(set(), set()).deleted) == 1  # what teardown does
            assert "proto 102" not in routes_text(ns)
            assert "10.50.0.0/24" in routes_text(ns)

            r.set_forwarding(True, True)
            assert ns_sh(ns, "sysctl", "-n", "net.ipv4.ip_forward").strip() == "1"
            assert ns_sh(ns, "sysctl", "-n", "net.ipv6.conf.all.forwarding").strip() == "1"
            assert r.set_mtu("ferry-gw0", 1450) is True and r.set_mtu("ferry-gw0", 1450) is False
            assert "mtu 1450" in ns_sh(ns, "ip", "link", "show", "ferry-gw0")


@pytest.mark.root
def test_route_sync_1000_peers_timing() -> None:
    with netns("fb-rt2") as ns, netns("fb-rt2p") as peer:
        veth(ns, "ferry-gw0", peer, "gwpeer")
        with RouteApplier(netns=ns) as r:
            r.set_gateway_addresses("ferry-gw0", ["10.244.1.1/24"])
            want = {HostRoute(f"10.{100 + i // 256}.{i % 256}.0/24", f"10.{100 + i // 256}.{i % 256}.1",
                              "ferry-gw0", True) for i in range(1000)}
            t0 = time.perf_counter()
            assert len(r.sync(want, set()).added) == 1000
            t1 = time.perf_counter()
            assert not r.sync(want, set()).changed
            t2 = time.perf_counter()
            print(f"1000 routes: install {1000 * (t1 - t0):.0f} ms, no-op re-sync {1000 * (t2 - t1):.0f} ms")
            count = ns_sh(ns, "ip", "route", "show", "proto", str(FERRY_ROUTE_PROTO)).count("\n")
            assert count == 1000
