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
            assert facts.denied_log_meter  # NetworkPolicy's denied log: its meter is on the bridge
            assert "type=drop rate=100 burst_size=1000" in n.ovs.ofctl("dump-meters", "br-int")
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


@pytest.mark.root
def test_host_path_comes_back_with_the_vlan_last_applied() -> None:
    """The Node's own way out after an ovs-vswitchd restart while the source cannot be read
    (``restore_host_path``): the pass-through flows go back tagged with the VLAN the uplink was
    last moved with (a Node annotation may have set 200 over the config's 100), not the config's."""
    with node("fb-na3") as n, netns("fb-na3p") as peer, tempfile.TemporaryDirectory() as d:
        veth(n.ns, "eth0", peer, "eth0p")
        ns_sh(n.ns, "ip", "addr", "add", "192.168.81.1/24", "dev", "eth0")
        cfg = Config(node_name="a", mode="noEncap", ovsdb=n.ovs.db, ovs_run_dir=n.ovs.run_dir,
                     state_file=f"{d}/node-state.json", transport_vlan=100)
        ap = make_appliers(cfg, netns=n.ns)
        try:
            ap.prepare(cfg, None, UplinkSpec("eth0", "eth0~", vlan=200), ())  # the annotation's VLAN
            ap.ovs.sync_flows([])  # the flows gone, as after an ovs-vswitchd restart
            assert ap.restore_host_path(UplinkSpec("eth0", "eth0~", vlan=100)) is True  # the config's
            flows = sorted(f.match + " " + f.actions for f in ap.ovs.dump_flows() if f.cookie == UPLINK_COOKIE.value)
            assert len(flows) == 2 and "dl_vlan=200" in flows[0] + flows[1] and "4296->vlan_vid" in flows[0] + flows[1]
            assert "dl_vlan=100" not in " ".join(flows)
        finally:
            ap.teardown(cfg)
            ap.close()
