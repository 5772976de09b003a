"""NodeAppliers (the daemon's Appliers): prepare + apply converge, re-apply is a no-op, and
teardown leaves the host as it was."""

from __future__ import annotations

import tempfile

import pytest

from cni.pipeline import match as fm
from cni.pipeline.actions import DROP, SetField, goto, output
from cni.pipeline.tables import (
    BASE_COOKIE,
    GATEWAY_PORT,
    NODE_COOKIE,
    UPLINK_COOKIE,
    Flow,
    Table,
    peer_cookie,
)
from routesync.apply import make_appliers
from routesync.apply.ovs import group_installed
from routesync.config import Config
from routesync.model import DesiredState, HostRoute, NftPlan, TunnelSpec, UplinkSpec
from tests.routesync.apply.helpers import node, ns_sh, veth
from tests.support.ovs_instance import netns


@pytest.mark.root
def test_prepare_apply_teardown() -> None:
    with node("fb-na1") as n, netns("fb-na1p") as peer, tempfile.TemporaryDirectory() as d:
        veth(n.ns, "eth0", peer, "eth0p")
        ns_sh(n.ns, "ip", "addr", "add", "192.168.80.1/24", "dev", "eth0")
        ns_sh(n.ns, "ip", "route", "add", "default", "via", "192.168.80.254")
        cfg = Config(node_name="a", ovsdb=n.ovs.db, ovs_run_dir=n.ovs.run_dir,
                     state_file=f"{d}/node-state.json")
        ap = make_appliers(cfg, netns=n.ns)
        try:
            before_routes = ns_sh(n.ns, "ip", "route")
            tunnel = TunnelSpec("vxlan", "ferry-tun0", 4789)
            facts = ap.prepare(cfg, tunnel, UplinkSpec("eth0", "eth0~"), ("10.244.1.1/24",))
            assert facts.uplink_addresses == ("192.168.80.1/24",) and facts.tunnel_ofport
            assert facts.gateway_mac and facts.transport_mtu == 1500
            desired = DesiredState(
                mtu=1450, gateway_addresses=("10.244.1.1/24",), tunnel=tunnel,
                uplink=UplinkSpec("eth0", "eth0~"),
                flows=[Flow(Table.CLASSIFIER, 0, (), DROP, BASE_COOKIE),
                       Flow(Table.CLASSIFIER, 200, (fm.IN_PORT(facts.tunnel_ofport),),
                            (SetField(fm.ETH_DST, fm.mac_value(facts.gateway_mac)), goto(Table.L3_FORWARDING)),
                            NODE_COOKIE),
                       Flow(Table.L3_FORWARDING, 200, (fm.IP, fm.IPV4_DST("10.244.2.0/24")),
                            (SetField(fm.TUN_DST, 0xC0A85002), output(facts.tunnel_ofport)),  # 192.168.80.2
                            peer_cookie("b"))],
                routes={HostRoute("10.244.2.0/24", "10.244.2.1", GATEWAY_PORT, True)},
                nft=NftPlan(local_pod_cidrs=("10.244.1.0/24",),
                            cluster_pod_cidrs=("10.244.1.0/24", "10.244.2.0/24"),
                            tunnel_udp_port=4789, uplink_ingress_drop="eth0~"))
            ap.apply(desired)
            groups = group_installed(ap.ovs.dump_flows())
            assert set(groups) == {BASE_COOKIE.value, NODE_COOKIE.value, peer_cookie("b").value,
                                   UPLINK_COOKIE.value}
            assert "10.244.2.0/24 via 10.244.2.1 dev ferry-gw0 proto 102 onlink" in \
                ns_sh(n.ns, "ip", "route")
            assert "mtu 1450" in ns_sh(n.ns, "ip", "link", "show", GATEWAY_PORT)
            # a second reconcile changes nothing
            assert ap.prepare(cfg, tunnel, UplinkSpec("eth0", "eth0~"), ("10.244.1.1/24",)) == facts
            assert not ap.ovs.sync_flows(desired.flows + ap._mover.flows()).changed
            assert not ap.routes.sync(desired.routes, desired.neighbors).changed
            assert not ap.nft.sync(desired.nft).inet_written
            assert ap.ovs_generation() == n.applier.vswitchd_instance()

            ap.teardown(cfg)
            assert group_installed(ap.ovs.dump_flows()) == {}
            assert ns_sh(n.ns, "ip", "route") == before_routes  # default route back on eth0
            assert "ferry" not in ns_sh(n.ns, "nft", "list", "tables")
            ports = n.ovs.vsctl("list-ports", "br-int").split()
            assert ports == []
            assert "192.168.80.1/24" in ns_sh(n.ns, "ip", "addr", "show", "eth0")
        finally:
            ap.close()
