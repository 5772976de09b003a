"""The tagged lab's pure parts (issue 29): the ``vlan`` key and a Node's ``vlan: none``, the
underlay plan without Linux bridges, the segment switches' ports, route-sync's transportVLAN
(the embedded lab's per Node, the Kubernetes lab's ConfigMap), ``--vlan``."""

from __future__ import annotations

import os

import pytest

from lab import layout, netplan, overrides, segswitch, topology
from lab.kube.lab_cluster import route_sync_keys
from lab.topology import TopologyError

VLAN_YAML = os.path.join(os.path.dirname(topology.__file__), "topologies", "vlan.yaml")


def test_vlan_yaml_tags_every_segment_and_node() -> None:
    t = topology.load(VLAN_YAML)
    assert t.vlan == 100 and [n.vlan for n in t.nodes] == [100, 100, 100]
    assert topology.parse(topology.to_doc(t)) == t
    assert topology.load().vlan is None and all(n.vlan is None for n in topology.load().nodes)


@pytest.mark.parametrize("doc, message", [
    ({"vlan": 0}, "vlan 0"), ({"vlan": 4095}, "vlan 4095"), ({"vlan": "100"}, "vlan '100'"), ({"vlan": True}, "vlan"),
    ({"routeSync": None, "vlan": 100}, "needs a routeSync"),
    ({"nodes": [{"name": "node-1", "vlan": "none"}]}, "only with a top-level vlan"),
    ({"vlan": 100, "nodes": [{"name": "node-1", "vlan": 5000}]}, "node node-1: vlan 5000"),
])
def test_bad_vlans_are_refused(doc: dict, message: str) -> None:
    base = {"routeSync": {"trafficEncapMode": "noEncap"}}
    with pytest.raises(TopologyError, match=message):
        topology.parse({**base, **doc})


def test_a_node_left_untagged_and_its_route_sync_config(tmp_path) -> None:  # type: ignore[no-untyped-def]
    t = topology.parse({"vlan": 100, "routeSync": {"trafficEncapMode": "noEncap"},
                        "nodes": [{"name": "node-1"}, {"name": "node-2", "vlan": "none"},
                                  {"name": "node-3", "vlan": 7}]})
    assert [n.vlan for n in t.nodes] == [100, None, 7]
    assert topology.parse(topology.to_doc(t)) == t

    def cfg(name: str) -> dict:
        return layout.route_sync_config(t, t.node(name), layout.node_paths(str(tmp_path), name), str(tmp_path))
    assert cfg("node-1")["transportVLAN"] == 100 and "transportVLAN" not in cfg("node-2")
    assert cfg("node-3")["transportVLAN"] == 7


def test_tagged_underlay_plan_has_switches_not_bridges() -> None:
    t = topology.load(VLAN_YAML)
    p = netplan.plan("x", t)
    create = p.stages[0]
    assert not any("type bridge" in c or "master" in c for cmds in create.values() for c in cmds)
    assert "link set node-1 up" in create["x-seg-a"] and "link set router up" in create["x-seg-a"]
    assert set(netplan.NO_IPV6) <= set(p.sysctls["x-seg-a"])  # the switch's kernel says nothing itself
    assert p.tx_csum_off["x-router"] == ("eth-a", "eth-b")
    sa, sb = segswitch.plan("x", t)
    assert (sa.netns, sa.trunks, sa.access, sa.vlan, sa.bootstrap) == ("x-seg-a", ("node-1", "node-2"), ("router",),
                                                                      100, False)
    assert sb.trunks == ("node-3",)
    args = segswitch.vsctl_args(sa)
    text = " ".join(args)
    assert "datapath_type=netdev" in text
    assert "add-port br0 node-1 -- set port node-1 vlan_mode=trunk trunks=100" in text
    assert "add-port br0 router -- set port router vlan_mode=access tag=100" in text
    assert segswitch.plan("x", topology.load()) == []  # untagged labs keep their Linux bridges
    assert any("type bridge" in c for c in netplan.plan("x", topology.load()).stages[0]["x-seg-a"])


def test_kubernetes_lab_bootstraps_untagged_and_configures_the_vlan() -> None:
    t = topology.parse({"vlan": 100, "routeSync": {"trafficEncapMode": "noEncap"}, "kubernetes": {}})
    assert route_sync_keys(t)["transportVLAN"] == 100
    sp = segswitch.plan("x", t)[0]
    assert sp.bootstrap and "vlan_mode=native-untagged tag=100 trunks=100" in " ".join(segswitch.vsctl_args(sp))


def test_uplink_tagged_reads_route_syncs_record(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert not segswitch.uplink_tagged(str(tmp_path), 100)
    (tmp_path / "uplink.json").write_text('{"phase": "moving", "vlan": 100}')
    assert not segswitch.uplink_tagged(str(tmp_path), 100)
    (tmp_path / "uplink.json").write_text('{"phase": "moved", "vlan": 100}')
    assert segswitch.uplink_tagged(str(tmp_path), 100) and not segswitch.uplink_tagged(str(tmp_path), 200)


def test_vlan_flag_overrides_the_topology() -> None:
    doc = overrides.load(None, overrides.Overrides(mode="hybrid", vlan=300))
    t = topology.parse(doc)
    assert t.vlan == 300 and all(n.vlan == 300 for n in t.nodes)
    assert "vlan" not in overrides.load(None, overrides.Overrides(mode="hybrid"))
