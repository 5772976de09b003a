"""The lab's pure parts: topology parsing, addressing, the underlay plan, files, manifest."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from lab import layout, netplan, topology
from lab.manifest import Manifest
from lab.topology import TopologyError


def test_default_topology_three_nodes_two_segments() -> None:
    t = topology.load()
    assert [(n.name, n.segment) for n in t.nodes] == [("node-1", "a"), ("node-2", "a"), ("node-3", "b")]
    n1, n3 = t.node("node-1"), t.node("node-3")
    assert topology.node_addresses(t, n1) == ("192.168.77.11", "fd00:77::b")
    assert topology.node_addresses(t, n3) == ("192.168.88.13", "fd00:88::d")
    assert n1.pod_cidrs == ("10.244.1.0/24", "fd00:10:244:1::/64")
    assert n3.pod_cidrs == ("10.244.3.0/24", "fd00:10:244:3::/64")
    assert n1.datapath == "netdev"
    # the default cluster runs route-sync: VXLAN between every pair of Nodes
    assert t.route_sync is not None
    assert (t.route_sync.trafficEncapMode, t.route_sync.tunnelType) == ("encap", "vxlan")
    assert t.route_sync.fastPath is False
    # lone.yaml is the same cluster without route-sync
    lone = topology.load(os.path.join(os.path.dirname(topology.__file__), "topologies", "lone.yaml"))
    assert lone.route_sync is None and lone.nodes == t.nodes and lone.segments == t.segments


def test_pod_cidrs_are_disjoint_and_inside_cluster() -> None:
    import ipaddress
    cidrs = [topology.default_pod_cidrs(("10.244.0.0/16", "fd00:10:244::/48"), i) for i in range(1, 40)]
    v4 = [ipaddress.ip_network(c[0]) for c in cidrs]
    assert all(not a.overlaps(b) for i, a in enumerate(v4) for b in v4[i + 1:])
    assert all(n.subnet_of(ipaddress.ip_network("10.244.0.0/16")) for n in v4)
    with pytest.raises(TopologyError):
        topology.default_pod_cidrs(("10.244.0.0/16",), 256)


@pytest.mark.parametrize("doc, message", [
    ({"nodes": [{"name": "n1", "segment": "z"}]}, "unknown segment"),
    ({"nodes": [{"name": "Node_1"}]}, "node name"),
    ({"nodes": [{"name": "n1"}, {"name": "n1"}]}, "duplicate"),
    ({"datapath": "dpdk"}, "datapath"),
    ({"segments": {"a": {"ipv4": "192.168.77.1/24"}}}, "host bits"),
    ({"segments": {"a": {"ipv4": "fd00::/64"}}}, "not IPv4"),
    ({"routeSync": {"trafficEncapMode": "tunnel"}}, "trafficEncapMode"),
    ({"bogus": 1}, "unknown keys"),
])
def test_bad_topologies_are_refused(doc: dict, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        topology.parse(doc)


def test_to_doc_round_trips() -> None:
    t = topology.parse({"router": {"routePodCIDRs": True}, "routeSync": {"tunnelType": "geneve"},
                        "nodes": [{"name": "x", "segment": "b", "datapath": "system"}]})
    assert topology.parse(yaml.safe_load(yaml.safe_dump(topology.to_doc(t)))) == t


def test_underlay_plan_never_touches_the_root_namespace() -> None:
    t = topology.load()
    plan = netplan.plan("tlp", t)
    assert set(plan.namespaces) == {"tlp-seg-a", "tlp-seg-b", "tlp-router", "tlp-ext",
                                    "tlp-node-1", "tlp-node-2", "tlp-node-3"}
    for stage in plan.stages:
        assert set(stage) <= set(plan.namespaces)  # every batch runs inside a lab namespace
        for lines in stage.values():
            for line in lines:
                if " type veth " in line:  # the peer is created directly in a lab namespace
                    assert line.split(" netns ")[1] in plan.namespaces
    creates = [line for lines in plan.stages[0].values() for line in lines if line.startswith("link add")]
    assert any("peer name eth0 mtu 1500 netns tlp-node-3" in c for c in creates)
    assert "route add ::/0 via fd00:88::1" in plan.stages[1]["tlp-node-3"]
    assert "net.ipv6.conf.all.forwarding=1" in plan.sysctls["tlp-router"]
    # the Nodes' kernels hand out none of the policy conformance suite's fixed hostNetwork ports
    assert "net.ipv4.ip_local_reserved_ports=34345-34352" in plan.sysctls["tlp-node-3"]
    assert not any("reserved_ports" in s for s in plan.sysctls["tlp-router"])
    assert not any(line.startswith("route add 10.244") for line in plan.stages[1]["tlp-router"])


def test_router_routes_pod_cidrs_when_asked() -> None:
    t = topology.parse({"router": {"routePodCIDRs": True}})
    r = netplan.plan("tlp", t).stages[1]["tlp-router"]
    assert "route add 10.244.3.0/24 via 192.168.88.13" in r
    assert "route add fd00:10:244:1::/64 via fd00:77::b" in r


def test_files_conflist_registry_route_sync() -> None:
    t = topology.parse({"routeSync": {"trafficEncapMode": "noEncap"}, "segments": {"a": {"mtu": 1400}, "b": {}}})
    n = t.node("node-1")
    p = layout.node_paths("/run/ferry-lab/tlp", "node-1")
    lone = layout.conflist(t, n, p, lone=True)["plugins"][0]
    assert lone["type"] == "ferry" and lone["mtu"] == 1400 and lone["datapath"] == "netdev"
    assert lone["ipam"]["ranges"] == [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:244:1::/64"}]]
    assert lone["ovsdb"] == "unix:/run/ferry-lab/tlp/nodes/node-1/ovs/db.sock"
    assert layout.conflist(t, n, p, lone=False)["plugins"][0]["mtu"] == 0
    assert layout.registry_record(t, n) == {"name": "node-1", "transportAddresses": ["192.168.77.11", "fd00:77::b"],
                                            "podCIDRs": ["10.244.1.0/24", "fd00:10:244:1::/64"], "annotations": {}}
    rs = layout.route_sync_config(t, n, p, "/run/ferry-lab/tlp")
    # no defaultMTU: route-sync derives the Pod MTU from the uplink's (the segment's 1400)
    assert rs["trafficEncapMode"] == "noEncap" and "defaultMTU" not in rs
    creates = [line for lines in netplan.plan("tlp", t).stages[0].values() for line in lines]
    assert any("peer name eth0 mtu 1400 netns tlp-node-1" in c for c in creates)
    assert rs["nodeSource"] == {"type": "registry", "registryDir": "/run/ferry-lab/tlp/registry"}
    assert rs["transportInterface"] == "eth0" and rs["stateFile"] == p.state_file


def test_expectation_without_route_sync_only_promises_local_paths() -> None:
    t = topology.load()
    assert topology.expectation(t, False).configured == {"same-node", "pod-to-node"}
    assert topology.expectation(t, True).configured == set(topology.CATEGORIES)
    routed = topology.parse({"router": {"routePodCIDRs": True}})
    assert topology.expectation(routed, False).configured == set(topology.CATEGORIES)


def test_manifest_is_on_disk_before_record_returns_and_refuses_a_second_lab(tmp_path) -> None:
    m = Manifest.create(str(tmp_path), "tlm")
    m.record("netns", name="tlm-a")
    with open(os.path.join(tmp_path, "manifest.json")) as f:
        assert {"kind": "netns", "name": "tlm-a"} in json.load(f)["entries"]
    assert Manifest.load(str(tmp_path)).of_kind("netns") == [{"kind": "netns", "name": "tlm-a"}]
    with pytest.raises(FileExistsError):
        Manifest.create(str(tmp_path), "tlm")
    m.forget("netns", name="tlm-a")
    assert Manifest.load(str(tmp_path)).entries == []



def test_manifest_keeps_what_another_process_wrote(tmp_path) -> None:
    """Two writers of one manifest (``up`` and a later ``join``, each with its own copy): each
    write re-reads the file, so neither drops the other's entries or info."""
    a = Manifest.create(str(tmp_path), "tlm")
    b = Manifest.load(str(tmp_path))
    a.record("netns", name="tlm-a")
    b.record("pid", pid=1234, what="kubelet node-3")
    b.set(kubeconfig="/k")
    a.set(state="up", upSeconds=1.0)
    a.forget("netns", name="tlm-a")
    m = Manifest.load(str(tmp_path))
    assert m.entries == [{"kind": "pid", "pid": 1234, "what": "kubelet node-3"}]
    assert (m.state, m.info) == ("up", {"kubeconfig": "/k", "upSeconds": 1.0})
