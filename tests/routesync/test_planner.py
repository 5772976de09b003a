"""The planner: decision table, and the whole desired state per mode (pure, no root)."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni.pipeline.tables import BASE_COOKIE, GATEWAY_PORT, NODE_COOKIE, VIRTUAL_MAC, Owner, Table, peer_cookie
from routesync.config import from_dict
from routesync.model import HostRoute, LocalFacts, Neighbor, NodeRecord
from routesync.planner import decide, first_address, node_state, plan

NETS = ("192.168.77.0/24",)
FACTS = LocalFacts(gateway_ofport=2, gateway_mac="02:00:00:00:01:01", tunnel_ofport=3, uplink_name="eth0",
                   uplink_addresses=("192.168.77.11/24",), transport_mtu=1500, uplink_mac="02:00:00:00:00:11")
LOCAL = NodeRecord("node-a", ("192.168.77.11",), ("10.244.1.0/24",))
SAME = NodeRecord("node-b", ("192.168.77.12",), ("10.244.2.0/24",))
OTHER = NodeRecord("node-c", ("192.168.88.13",), ("10.244.3.0/24",))


def cfg(mode: str, **kw: object):  # type: ignore[no-untyped-def]
    return from_dict({"nodeName": "node-a", "trafficEncapMode": mode, "clusterCIDRs": ["10.244.0.0/16"], **kw})


# --- decide ----------------------------------------------------------------------------------

def test_decision_table() -> None:
    table = {
        "encap": ("tunnel", "tunnel"),
        "hybrid": ("route", "tunnel"),
        "noEncap": ("route", "underlay"),
        "networkPolicyOnly": ("none", "none"),
    }
    for mode, (same, other) in table.items():
        assert decide(mode, NETS, "192.168.77.12") == same, mode
        assert decide(mode, NETS, "192.168.88.13") == other, mode
    assert decide("hybrid", ("fd00:77::/64",), "fd00:77::12") == "route"
    assert decide("hybrid", ("192.168.77.0/24",), "fd00:77::12") == "tunnel"  # other family: not "inside"
    with pytest.raises(ValueError):
        decide("bogus", NETS, "192.168.77.12")


@given(st.sampled_from(["encap", "hybrid", "noEncap", "networkPolicyOnly"]),
       st.ip_addresses(v=4), st.integers(min_value=8, max_value=30), st.ip_addresses(v=4))
def test_decision_properties(mode: str, local: ipaddress.IPv4Address, plen: int,
                             peer: ipaddress.IPv4Address) -> None:
    net = ipaddress.ip_interface(f"{local}/{plen}").network
    path = decide(mode, (str(net),), str(peer))
    inside = peer in net
    assert path in {"tunnel", "route", "underlay", "none"}
    assert (path == "none") == (mode == "networkPolicyOnly")
    assert (path == "route") == (inside and mode in ("hybrid", "noEncap"))
    assert (path == "underlay") == (not inside and mode == "noEncap")
    assert (path == "tunnel") == (mode == "encap" or (mode == "hybrid" and not inside))


# --- plan ------------------------------------------------------------------------------------

def peer_flows_of(desired, name):  # type: ignore[no-untyped-def]
    return [f for f in desired.flows if f.cookie == peer_cookie(name)]


def test_encap_plan() -> None:
    d = plan(cfg("encap"), LOCAL, [SAME, OTHER], FACTS)
    assert d.mtu == 1450 and d.transport_mtu == 1500  # tunnel MTU; the gateway port's
    assert d.gateway_addresses == ("10.244.1.1/24",)
    assert d.tunnel is not None and (d.tunnel.type, d.tunnel.dst_port) == ("vxlan", 4789)
    assert d.uplink is not None and (d.uplink.name, d.uplink.renamed) == ("eth0", "eth0~")
    assert [(p.peer, p.path) for p in d.peers] == [("node-b", "tunnel"), ("node-c", "tunnel")]
    # the Node's own packets to tunnelled Pods are held to the tunnel MTU by the route
    assert d.routes == {HostRoute("10.244.2.0/24", "10.244.2.1", GATEWAY_PORT, True, mtu=1450),
                        HostRoute("10.244.3.0/24", "10.244.3.1", GATEWAY_PORT, True, mtu=1450)}
    fl = peer_flows_of(d, "node-c")
    l3 = [f for f in fl if f.table == Table.L3_FORWARDING]
    assert len(l3) == 1 and l3[0].match_text() == "ip,nw_dst=10.244.3.0/24"
    assert l3[0].actions_text() == ("mod_dl_src:02:00:00:00:01:01,mod_dl_dst:aa:bb:cc:dd:ee:ff,dec_ttl,"
                             "set_field:192.168.88.13->tun_dst,output:3")
    arp = [f for f in fl if f.table == Table.NEIGHBOR_RESPONDER]
    assert len(arp) == 1 and arp[0].match_text() == "arp,arp_op=1,arp_tpa=10.244.3.1" \
        and VIRTUAL_MAC.replace(":", "") in arp[0].actions_text()
    node = [f for f in d.flows if f.cookie == NODE_COOKIE]
    assert [(f.match_text(), f.actions_text()) for f in node] \
        == [("in_port=3", "mod_dl_dst:02:00:00:00:01:01,goto_table:25")]
    assert any(f.cookie == BASE_COOKIE and f.match_text() == "dl_dst=02:00:00:00:01:01" for f in d.flows)
    assert d.nft.masquerade and d.nft.tunnel_udp_port == 4789 and d.nft.uplink_ingress_drop == "eth0~"
    assert set(d.nft.cluster_pod_cidrs) == {"10.244.0.0/16", "10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24"}
    assert not {f.cookie.owner for f in d.flows} & {Owner.POD}


def test_hybrid_plan_routes_same_subnet_tunnels_the_other() -> None:
    d = plan(cfg("hybrid", tunnelType="geneve"), LOCAL, [SAME, OTHER], FACTS)
    assert [(p.peer, p.path) for p in d.peers] == [("node-b", "route"), ("node-c", "tunnel")]
    assert d.mtu == 1450
    assert HostRoute("10.244.2.0/24", "192.168.77.12", None) in d.routes  # routed: the device's MTU
    assert HostRoute("10.244.3.0/24", "10.244.3.1", GATEWAY_PORT, True, mtu=1450) in d.routes
    assert peer_flows_of(d, "node-b") == []
    assert len(peer_flows_of(d, "node-c")) == 2


def test_noencap_plan() -> None:
    d = plan(cfg("noEncap", noSNAT=True), LOCAL, [SAME, OTHER], FACTS)
    assert [(p.peer, p.path) for p in d.peers] == [("node-b", "route"), ("node-c", "underlay")]
    assert d.routes == {HostRoute("10.244.2.0/24", "192.168.77.12", None)}
    assert d.mtu == 1500 and d.tunnel is None and d.uplink is None
    assert not d.nft.masquerade and d.nft.tunnel_udp_port is None
    assert [f for f in d.flows if f.cookie.owner in (Owner.PEER, Owner.NODE)] == []


def test_network_policy_only_plan() -> None:
    d = plan(cfg("networkPolicyOnly"), LOCAL, [SAME, OTHER], FACTS)
    assert {p.path for p in d.peers} == {"none"}
    assert d.routes == set() and d.neighbors == set()
    assert not d.nft.masquerade and d.gateway_addresses == () and d.mtu == 1500



def test_network_policy_only_returns_service_replies_to_the_host() -> None:
    """networkPolicyOnly: a packet from the gateway with a source in the cluster CIDRs (a local
    Pod's connection the host DNATed to a local backend) is flagged, and its connection's replies
    go back to the gateway, where the host undoes the DNAT; encap flags only its own Pod CIDR."""
    def flagged(mode: str) -> list[str]:
        d = plan(cfg(mode, clusterCIDRs=["10.244.0.0/16", "fd00:10:244::/48"]), LOCAL, [SAME], FACTS)
        return sorted(f.text() for f in d.flows if f.table == Table.CONNTRACK and "load:0x1->" in f.text())

    npo = flagged("networkPolicyOnly")
    assert len(npo) == 2 and any("nw_src=10.244.0.0/16" in t for t in npo)
    assert any("ipv6_src=fd00:10:244::/48" in t for t in npo)
    assert all("in_port=2" in t for t in npo)
    d = plan(cfg("networkPolicyOnly"), LOCAL, [SAME], FACTS)
    assert [f for f in d.flows if f.table == Table.CONNTRACK_STATE and "ct_mark=0x1/0x3" in f.text()
            and "output:2" in f.text()]
    assert [t for t in flagged("encap") if "10.244.0.0/16" in t] == []


def test_ipv6_tunnel_plan_and_ipv6_underlay_mtu() -> None:
    local = NodeRecord("node-a", ("fd00:77::11",), ("fd00:10:244:1::/64",))
    peer = NodeRecord("node-b", ("fd00:88::12",), ("fd00:10:244:2::/64",))
    facts = LocalFacts(2, "02:00:00:00:01:01", 3, "eth0", ("fd00:77::11/64",), 1500)
    d = plan(cfg("encap"), local, [peer], facts)
    assert d.mtu == 1430  # 1500 - 50 - 20
    assert d.gateway_addresses == ("fd00:10:244:1::1/64",)
    gw = "fd00:10:244:2::1"
    assert d.routes == {HostRoute(f"{gw}/128", None, GATEWAY_PORT, mtu=1430),
                        HostRoute("fd00:10:244:2::/64", gw, GATEWAY_PORT, mtu=1430)}
    assert d.neighbors == {Neighbor(gw, VIRTUAL_MAC, GATEWAY_PORT)}
    (l3,) = peer_flows_of(d, "node-b")
    assert l3.match_text() == "ipv6,ipv6_dst=fd00:10:244:2::/64" \
        and "set_field:fd00:88::12->tun_ipv6_dst" in l3.actions_text()


def test_dual_stack_peer_gets_one_plan_per_family_and_state_file_mirrors_it() -> None:
    local = NodeRecord("node-a", ("192.168.77.11", "fd00:77::11"), ("10.244.1.0/24", "fd00:10:244:1::/64"))
    peer = NodeRecord("node-b", ("192.168.77.12", "fd00:77::12"), ("10.244.2.0/24", "fd00:10:244:2::/64"))
    facts = LocalFacts(2, "02:00:00:00:01:01", 3, "eth0", ("192.168.77.11/24", "fd00:77::11/64"), 1500)
    d = plan(cfg("encap"), local, [peer], facts)
    assert [(p.family, p.transport_address) for p in d.peers] == [(4, "192.168.77.12"), (6, "fd00:77::12")]
    assert d.mtu == 1430  # IPv6 Pod traffic rides the IPv6 underlay
    s = node_state(cfg("encap"), local, d, facts)
    assert s.podCIDRs == ["10.244.1.0/24", "fd00:10:244:1::/64"] and s.mtu == 1430
    assert s.tunnel is not None and s.tunnel.ofport == 3
    assert [(p.name, p.path, p.podCIDRs) for p in s.peers] == [
        ("node-b", "tunnel", ["10.244.2.0/24"]), ("node-b", "tunnel", ["fd00:10:244:2::/64"])]


def test_peer_change_only_touches_that_peers_cookie() -> None:
    before = plan(cfg("encap"), LOCAL, [SAME, OTHER], FACTS)
    moved = NodeRecord("node-c", ("192.168.88.99",), ("10.244.3.0/24",))
    after = plan(cfg("encap"), LOCAL, [SAME, moved], FACTS)
    changed = {f.cookie for f in set(before.flows) ^ set(after.flows)}
    assert changed == {peer_cookie("node-c")}
    gone = plan(cfg("encap"), LOCAL, [SAME], FACTS)
    assert peer_flows_of(gone, "node-c") == [] and all(r.dst != "10.244.3.0/24" for r in gone.routes)


def test_first_address() -> None:
    assert first_address("10.244.1.0/24") == "10.244.1.1/24"
    assert first_address("fd00:10:244:1::/64") == "fd00:10:244:1::1/64"


def test_flow_keys_unique_with_many_peers() -> None:
    peers = [NodeRecord(f"n{i}", (f"192.168.{i // 200}.{i % 200 + 2}",), (f"10.{i // 250}.{i % 250}.0/24",))
             for i in range(500)]
    d = plan(cfg("encap"), NodeRecord("node-a", ("192.168.77.11",), ("10.99.1.0/24",)), peers, FACTS)
    keys = [f.key() for f in d.flows]
    assert len(keys) == len(set(keys))
    assert len(d.routes) == 500


@pytest.mark.skipif(shutil.which("ovs-ofctl") is None, reason="ovs-ofctl not installed")
def test_ovs_ofctl_parses_every_planned_flow(tmp_path) -> None:  # type: ignore[no-untyped-def]
    local = NodeRecord("node-a", ("192.168.77.11", "fd00:77::11"), ("10.244.1.0/24", "fd00:10:244:1::/64"))
    peer = NodeRecord("node-b", ("192.168.88.12", "fd00:88::12"), ("10.244.2.0/24", "fd00:10:244:2::/64"))
    facts = LocalFacts(2, "02:00:00:00:01:01", 3, "eth0", ("192.168.77.11/24", "fd00:77::11/64"), 1500)
    d = plan(cfg("hybrid"), local, [peer], facts)
    path = tmp_path / "flows.txt"
    path.write_text("\n".join(f.text() for f in d.flows) + "\n")
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "parse-flows", str(path)],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("OFPT_FLOW_MOD") == len(d.flows)
