"""The transport VLAN's pure parts (issue 29): the config key and the Node annotation over it,
the uplink move it asks for, and the flows: everything output to the uplink is tagged first,
everything taken in from it matches the tag and pops it."""

from __future__ import annotations

import pytest

from cni.pipeline.actions import Output, PopVlan, PushVlan, SetField
from cni.pipeline.match import IN_PORT, VLAN_VID, Field
from cni.pipeline.tables import UPLINK_COOKIE, Flow, Table
from routesync.apply.uplink import uplink_flows
from routesync.config import ConfigError, from_dict
from routesync.model import VLAN_ANNOTATION, LocalFacts, NextHop, NodeRecord
from routesync.planner import PlanError, plan, transport_vlan, uplink_spec

UPLINK, HOST = 5, 6
FACTS = LocalFacts(2, "02:00:00:00:01:01", None, "eth0", ("192.168.77.11/24", "fd00:77::11/64"), 1500,
                   uplink_mac="02:00:00:00:77:11", uplink_ofport=UPLINK, uplink_host_ofport=HOST)
LOCAL = NodeRecord("n1", ("192.168.77.11", "fd00:77::11"), ("10.244.1.0/24", "fd00:10:244:1::/64"))
PEER = NodeRecord("n2", ("192.168.77.12", "fd00:77::12"), ("10.244.2.0/24", "fd00:10:244:2::/64"),
                  (("ferry.io/mac-address", "02:00:00:00:77:12"),))
OTHER = NodeRecord("n3", ("192.168.88.13", "fd00:88::13"), ("10.244.3.0/24", "fd00:10:244:3::/64"))
HOPS = {"192.168.88.13": NextHop("192.168.77.1", "02:00:00:00:77:01"),
        "fd00:88::13": NextHop("fd00:77::1", "02:00:00:00:77:01")}


def cfg(**kw: object):  # type: ignore[no-untyped-def]
    return from_dict({"nodeName": "n1", "trafficEncapMode": "noEncap", **kw})


@pytest.mark.parametrize("value", [0, 4095, -1, 5000, "100", "vlan100", True, 100.0, [100]])
def test_bad_transport_vlan_is_refused_naming_the_key(value: object) -> None:
    with pytest.raises(ConfigError) as e:
        cfg(transportVLAN=value)
    assert e.value.key == "transportVLAN" and "'transportVLAN'" in str(e.value)


def test_transport_vlan_from_config_and_the_node_annotation_over_it() -> None:
    c = cfg(transportVLAN=100)
    assert c.transport_vlan == 100 and cfg().transport_vlan is None
    assert cfg(transportVLAN=1).transport_vlan == 1 and cfg(transportVLAN=4094).transport_vlan == 4094
    assert transport_vlan(c, LOCAL) == 100
    assert transport_vlan(c, NodeRecord("n1", (), (), ((VLAN_ANNOTATION, "200"),))) == 200
    assert transport_vlan(cfg(), NodeRecord("n1", (), (), ((VLAN_ANNOTATION, " 300 "),))) == 300
    assert transport_vlan(c, NodeRecord("n1", (), (), ((VLAN_ANNOTATION, "none"),))) is None
    for bad in ("0", "4095", "x", "", "1.5"):
        with pytest.raises(PlanError, match=VLAN_ANNOTATION):
            transport_vlan(c, NodeRecord("n1", (), (), ((VLAN_ANNOTATION, bad),)))


def test_a_vlan_moves_the_uplink_in_every_mode() -> None:
    """The kernel need not tag: the Node's address goes onto the internal port OVS tags for."""
    assert uplink_spec(cfg()) is None  # noEncap, no fast path: the uplink stays where it is
    spec = uplink_spec(cfg(transportVLAN=100))
    assert spec is not None and (spec.name, spec.renamed, spec.vlan) == ("eth0", "eth0~", 100)
    off = NodeRecord("n1", (), (), ((VLAN_ANNOTATION, "none"),))
    assert uplink_spec(cfg(transportVLAN=100), off) is None
    spec = uplink_spec(from_dict({"nodeName": "n1", "trafficEncapMode": "encap", "transportVLAN": 7}))
    assert spec is not None and spec.vlan == 7


def _outputs_to(flow: Flow, port: int) -> bool:
    return any(isinstance(a, Output) and a.port == port for a in flow.actions)


def _tagged_before_output(flow: Flow, vid: int) -> bool:
    acts = list(flow.actions)
    out = next(i for i, a in enumerate(acts) if isinstance(a, Output) and a.port == UPLINK)
    return (out >= 2 and isinstance(acts[out - 2], PushVlan)
            and acts[out - 1] == SetField(VLAN_VID, 0x1000 | vid))


@pytest.mark.parametrize("mode", ["noEncap", "hybrid"])
def test_fast_path_flows_tag_what_leaves_and_take_in_only_tagged(mode: str) -> None:
    d = plan(cfg(trafficEncapMode=mode, fastPath=True, transportVLAN=100), LOCAL, [PEER, OTHER], FACTS, HOPS)
    assert d.uplink is not None and d.uplink.vlan == 100
    flows = list(d.flows) + uplink_flows(UPLINK, HOST, 100)
    out = [f for f in flows if _outputs_to(f, UPLINK)]
    # L3 per fast peer and family (n2 and n3 in noEncap), ConntrackCommit's uplink commits, the host's pass-through
    assert len(out) >= 6 and {f.table for f in out} >= {Table.L3_FORWARDING, Table.CONNTRACK_COMMIT, Table.CLASSIFIER}
    for f in out:
        assert _tagged_before_output(f, 100), f.text()
    taken_in = [f for f in flows if f.table == Table.CLASSIFIER and IN_PORT(UPLINK) in f.match]
    assert len(taken_in) >= 3  # the fast-in flows (per peer and family) and the host's pass-through
    for f in taken_in:
        assert Field(VLAN_VID, 0x1000 | 100) in f.match, f.text()
        assert isinstance(f.actions[0], PopVlan), f.text()


def test_untagged_plan_has_no_vlan_actions() -> None:
    d = plan(cfg(fastPath=True), LOCAL, [PEER, OTHER], FACTS, HOPS)
    flows = list(d.flows) + uplink_flows(UPLINK, HOST)
    assert not any(isinstance(a, (PushVlan, PopVlan)) for f in flows for a in f.actions)
    assert not any(isinstance(i, Field) and i.spec is VLAN_VID for f in flows for i in f.match)
    c = f"{UPLINK_COOKIE.value:#x}"
    assert [f.text() for f in uplink_flows(UPLINK, HOST, 100)] == [
        f"table=0,priority=10,cookie={c},in_port=5,vlan_vid=4196,actions=pop_vlan,output:6",
        f"table=0,priority=10,cookie={c},in_port=6,actions=push_vlan:0x8100,set_field:4196->vlan_vid,output:5",
    ]


def test_both_sources_carry_the_annotation() -> None:
    """The Kubernetes source keeps ``ferry.io/*`` annotations of a Node object, the registry its
    record's: the planner reads the VLAN from either."""
    from routesync.sources.kube import record_from_node
    from routesync.sources.registry import parse_record, render_record

    node = {"metadata": {"name": "n1", "annotations": {VLAN_ANNOTATION: "42", "other.io/x": "y"}},
            "spec": {"podCIDRs": ["10.244.1.0/24"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.77.11"}]}}
    rec = record_from_node(node)
    assert transport_vlan(cfg(transportVLAN=100), rec) == 42
    again = parse_record(render_record(rec), "n1")
    assert again == rec and transport_vlan(cfg(), again) == 42
