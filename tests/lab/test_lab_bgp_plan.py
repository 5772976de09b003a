"""routePodCIDRs: bgp, pure: the topology key, what route-sync's config and FRR's get, and that
nothing static reaches the router."""

from __future__ import annotations

import os

import pytest

from lab import frr, layout, netplan, overrides, topology
from lab.topology import TopologyError

BGP_FILE = os.path.join(os.path.dirname(topology.__file__), "topologies", "bgp.yaml")


def test_shipped_bgp_topology() -> None:
    t = topology.load(BGP_FILE)
    assert t.router_bgp == topology.RouterBgp(asn=65000, node_asn=64512, hold_time=3, graceful_restart=0)
    assert t.route_pod_cidrs is False and topology.router_routes(t) == "bgp"
    assert t.route_sync is not None and t.route_sync.trafficEncapMode == "noEncap"
    router = topology.router_netns("x")
    plan = netplan.plan("x", t)
    assert not [c for c in plan.stages[1][router] if c.startswith("route ")], "a static route on the router"
    assert topology.parse(topology.to_doc(t)) == t  # the lab's stored topology.yaml reads back the same


def test_route_sync_config_per_node_is_valid() -> None:
    from routesync.config import from_dict  # here: tests/routesync is a package named routesync too

    t = topology.load(BGP_FILE)
    for n, peer in (("node-1", "192.168.77.1"), ("node-3", "192.168.88.1")):
        node = t.node(n)
        doc = layout.route_sync_config(t, node, layout.node_paths("/run/ferry-lab/x", n), "/run/ferry-lab/x")
        assert doc["bgp"] == {"localASN": 64512, "peers": [{"address": peer, "asn": 65000, "holdTime": 3}]}
        cfg = from_dict(doc)  # route-sync accepts it
        assert cfg.bgp is not None and cfg.bgp.peers[0].hold_time == 3
    # IPv6-only: the Nodes peer over IPv6 and get a router ID (an IPv4 address by definition)
    v6 = topology.parse(overrides.apply(topology.to_doc(t), overrides.Overrides(family="6")))
    n3 = v6.node("node-3")
    doc = frr.node_bgp_config(v6, n3)
    assert doc["peers"][0]["address"] == "fd00:88::1" and doc["routerID"] == "10.255.0.3"


def test_frr_config() -> None:
    t = topology.load(BGP_FILE)
    p = frr.plan(t, "x", "/run/ferry-lab/x/router/frr")
    conf = p.configs["bgpd"]
    for line in ("router bgp 65000", " bgp router-id 192.168.77.1", " no bgp ebgp-requires-policy",
                 " neighbor nodes remote-as 64512", " neighbor nodes timers 1 3",
                 " bgp listen range 192.168.77.0/24 peer-group nodes",
                 " bgp listen range 192.168.88.0/24 peer-group nodes",
                 " address-family ipv6 unicast", "  neighbor nodes activate"):
        assert line in conf.splitlines(), line
    assert "router bgp" not in p.configs["zebra"]
    assert list(p.argv) == ["zebra", "bgpd"]  # zebra first: bgpd installs routes through it
    for argv in p.argv.values():
        assert "--vty_socket" in argv and argv[argv.index("-P") + 1] == "0"
        assert argv[argv.index("-i") + 1].startswith("/run/ferry-lab/x/router/frr/")
    v6 = topology.parse(overrides.apply(topology.to_doc(t), overrides.Overrides(family="6")))
    conf6 = frr.plan(v6, "x", "/d").configs["bgpd"]
    assert " bgp listen range fd00:77::/64 peer-group nodes" in conf6.splitlines()
    assert " bgp router-id 10.255.255.254" in conf6.splitlines()
    gr = topology.parse({**topology.to_doc(t), "router": {"routePodCIDRs": "bgp", "bgp": {"gracefulRestart": 60}}})
    assert " bgp graceful-restart" in frr.plan(gr, "x", "/d").configs["bgpd"].splitlines()


@pytest.mark.parametrize("router,rs,msg", [
    ({"routePodCIDRs": "ospf"}, {"trafficEncapMode": "noEncap"}, "router.routePodCIDRs"),
    ({"routePodCIDRs": "bgp"}, None, "needs a routeSync block"),
    ({"routePodCIDRs": True, "bgp": {"asn": 1}}, {"trafficEncapMode": "noEncap"}, "router.bgp: only with"),
    ({"routePodCIDRs": "bgp", "bgp": {"asn": 0}}, {"trafficEncapMode": "noEncap"}, "router.bgp.asn"),
    ({"routePodCIDRs": "bgp", "bgp": {"holdTime": 1}}, {"trafficEncapMode": "noEncap"}, "router.bgp.holdTime"),
    ({"routePodCIDRs": "bgp", "bgp": {"asn": 64512}}, {"trafficEncapMode": "noEncap"}, "must differ"),
    ({"routePodCIDRs": "bgp", "bgp": {"med": 1}}, {"trafficEncapMode": "noEncap"}, "router.bgp: unknown"),
    ({"routePodCIDRs": "bgp", "static": 1}, {"trafficEncapMode": "noEncap"}, "router: unknown"),
])
def test_bad_router_keys(router: dict, rs: dict | None, msg: str) -> None:
    with pytest.raises(TopologyError, match=msg):
        topology.parse({"router": router, "routeSync": rs})


@pytest.mark.parametrize("kubernetes", [{}, {"kubeProxy": "nftables"}])
def test_bgp_on_a_kubernetes_lab_is_one_config_for_every_node(kubernetes: dict) -> None:
    """``--kubernetes`` writes ``kubernetes: {}``: a Kubernetes lab as much as one with keys.  The
    DaemonSet's one ConfigMap peers each Node with its IPv4 default gateway (its segment's router
    address, where FRR listens), and route-sync's parser takes it; an IPv6-only segment is refused
    (no per-Node router ID in one ConfigMap)."""
    from lab.kube import lab_cluster
    from routesync.config import from_dict

    t = topology.parse({"router": {"routePodCIDRs": "bgp", "bgp": {"holdTime": 3, "gracefulRestart": 30}},
                        "routeSync": {"trafficEncapMode": "noEncap"}, "kubernetes": kubernetes})
    keys = lab_cluster.route_sync_keys(t)
    assert keys["bgp"] == {"localASN": 64512, "gracefulRestart": 30, "peers": [
        {"address": "defaultGateway", "addressFamily": "ipv4", "asn": 65000, "holdTime": 3}]}
    assert "nodePodRoutes" not in keys
    bgp = from_dict({"nodeName": "node-1", **keys}).bgp
    assert bgp is not None and bgp.peers[0].default_gateway and bgp.peers[0].address_family == 4
    # each Node's default gateway is the router's address on its segment: FRR's listen ranges
    for n in t.nodes:
        assert frr.peering_address(t, n.segment) == netplan_default_gateway(t, n.name)
    with pytest.raises(TopologyError, match="bgp on a Kubernetes lab needs IPv4 on every segment"):
        topology.parse({"segments": {"a": {"ipv6": "fd00:77::/64"}}, "clusterCIDRs": ["fd00:10:244::/48"],
                        "nodes": [{"name": "node-1", "segment": "a"}], "router": {"routePodCIDRs": "bgp"},
                        "routeSync": {"trafficEncapMode": "noEncap"}, "kubernetes": kubernetes})


def netplan_default_gateway(t: topology.Topology, node: str) -> str:
    cmds = netplan.plan("tb", t).stages[1][topology.node_netns("tb", node)]
    (line,) = [c for c in cmds if c.startswith("route add default via ")]
    return line.split()[-1]


def test_mode_flag_keeps_bgp() -> None:
    import yaml

    with open(BGP_FILE) as f:
        doc = yaml.safe_load(f)
    out = overrides.apply(doc, overrides.Overrides(mode="noEncap", fast_path=True))
    t = topology.parse(out)
    assert t.router_bgp is not None and t.route_pod_cidrs is False and t.route_sync.fastPath  # type: ignore[union-attr]
