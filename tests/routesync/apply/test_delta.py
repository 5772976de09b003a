"""The incremental appliers against real OVS and a real routing table: what a delta installs
equals what a full sync would (the full sync afterwards finds nothing to do), untouched peers'
flows are not re-installed, and a netlink batch reports a failing route without losing the rest."""

from __future__ import annotations

import time

import pytest

from cni.kernel.netlink import NetlinkError
from cni.pipeline.tables import BASE_COOKIE, peer_cookie
from routesync.apply.routes import RouteApplier
from routesync.model import HostRoute
from tests.routesync.apply.helpers import node, ns_sh, veth
from tests.routesync.apply.test_ovs import AGE, base_flows, installed, peer_flows, reinstalled
from tests.support.ovs_instance import netns


@pytest.mark.root
def test_flow_delta_equals_full_sync_and_leaves_other_peers_alone() -> None:
    with node("fp2-d1") as n:
        app = n.applier
        before = base_flows() + peer_flows("b", "192.168.7.2", "10.244.2.0/24") + \
            peer_flows("c", "192.168.7.3", "10.244.3.0/24")
        app.sync_flows(before)
        time.sleep(AGE)  # not a wait: it makes a re-installed flow tell from an untouched one
        dumped = app.dump_flows()
        after = base_flows() + peer_flows("b", "192.168.7.22", "10.244.2.0/24") + \
            peer_flows("d", "192.168.7.4", "10.244.4.0/24")  # b changed, c gone, d new
        d = app.sync_flow_delta(before, after)
        assert (d.replaced, d.deleted, d.added) == ([peer_cookie("b").value], [peer_cookie("c").value],
                                                    [peer_cookie("d").value])
        assert not app.sync_flows(after).changed  # the dump agrees with a full sync's view
        got = installed(app)
        assert peer_cookie("c").value not in got
        # only b and d were installed: the base flows (the reference) and the rest aged alike
        assert reinstalled(dumped, app.dump_flows(), BASE_COOKIE.value) == {peer_cookie("b").value,
                                                                            peer_cookie("d").value}
        assert not app.sync_flow_delta(after, after).changed


@pytest.mark.root
def test_route_batch_applies_all_it_can_and_reports_the_failure() -> None:
    with netns("fp2-d2") as ns, netns("fp2-d2p") as peer:
        veth(ns, "ferry-gw0", peer, "gwpeer")
        with RouteApplier(netns=ns) as r:
            r.set_gateway_addresses("ferry-gw0", ["10.244.1.1/24"])
            good = [HostRoute(f"10.{100 + i // 256}.{i % 256}.0/24", f"10.{100 + i // 256}.{i % 256}.1", "ferry-gw0",
                              True)
                    for i in range(300)]
            bad = HostRoute("10.250.0.0/24", "192.0.2.1", None)  # no route to that next hop
            with pytest.raises(NetlinkError) as e:
                r.apply_routes([*good, bad], [])
            assert "1 of 301" in str(e.value)
            assert len(ns_sh(ns, "ip", "route", "show", "proto", "102").splitlines()) == 300
            # deleting what is already gone is no error
            r.apply_routes([], [good[0], good[0]])
            assert not r.sync(set(good[1:]), set()).changed
