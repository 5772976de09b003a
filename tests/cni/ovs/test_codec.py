"""cni.ovs.openflow.codec encodes every flow the planners produce (plugin, chained, route-sync), and
its bytes mean what the flow's text means: ``ovs-ofctl ofp-print`` of the encoded FLOW_MOD reads
the same as ``ovs-ofctl parse-flows`` of the text.  What it cannot express raises.  No root: only
ovs-ofctl's own parser and printer."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from cni.ovs.openflow import codec
from cni.ovs.openflow.codec import OpenFlowError
from cni.pipeline import match as m
from cni.pipeline import tables as pl
from cni.pipeline.actions import DEC_TTL, Conjunction, Goto, Load, Move, Output, SetField, goto, output
from cni.pipeline.chained import next_hop_flows
from cni.pipeline.flows import GatewayPort, PodPort, base_flows, pod_flows

GW = GatewayPort(ofport=2, mac="02:00:00:00:00:01", addresses=("10.244.1.1/24", "fd00:10:244:1::1/64"))
POD = PodPort(cookie=pl.pod_cookie("fs-a", "eth0"), ofport=7, mac="02:11:22:33:44:55",
              addresses=("10.244.1.5/24", "fd00:10:244:1::5/64"))


def every_planned_flow() -> list[pl.Flow]:
    """One of each kind of flow Ferry plans: base, per-Pod (both families, gratuitous ARP), chained
    next hops (ARP and the IPv6 NA responder: set_field, resubmit), route-sync's NODE, uplink and
    PEER flows (tunnel over IPv4 and IPv6 underlays, fast path with masked source and destination)."""
    from routesync.apply.uplink import uplink_flows
    from routesync.model import PeerPlan
    from routesync.peerflows import FastPort, node_flows, peer_flows

    flows = base_flows(GW) + pod_flows(POD, GW.mac, GW.ofport)
    flows += next_hop_flows(POD.cookie, POD.ofport, ("10.244.1.1", "fd00:10:244:1::1/64"), GW.mac)
    flows += node_flows(3, GW.mac) + uplink_flows(4, 5) + uplink_flows(6, 7, vlan=100)
    flows += peer_flows(PeerPlan("p1", 4, "tunnel", "172.16.0.7", ("10.244.2.0/24",), "10.244.2.1"), GW.mac, 3)
    flows += peer_flows(PeerPlan("p2", 6, "tunnel", "fd00:172::9", ("fd00:10:244:2::/64",), "fd00:10:244:2::1"),
                        GW.mac, 3)
    flows += peer_flows(PeerPlan("p3", 4, "tunnel", "fd00:172::a", ("10.244.3.0/25", "10.244.4.7/32"),
                                 "10.244.3.1"), GW.mac, 3)
    port = FastPort(4, "02:aa:bb:cc:dd:ee", ("10.244.1.0/24", "fd00:10:244:1::/64"), host_ofport=5)
    flows += node_flows(None, GW.mac, port)
    flows += peer_flows(PeerPlan("p4", 4, "fast", "192.168.1.4", ("10.244.5.0/24", "10.244.6.9/32"),
                                 next_hop_mac="02:00:00:00:00:44"), GW.mac, 3, port)
    flows += peer_flows(PeerPlan("p5", 6, "fast", "fd00:192::5", ("fd00:10:244:5::/64",),
                                 next_hop_mac="02:00:00:00:00:55"), GW.mac, 3, port)
    # a tagged uplink (ports 6, 7: its flows would replace the untagged ones' of the same match)
    tagged = FastPort(6, "02:aa:bb:cc:dd:ef", ("10.244.1.0/24", "fd00:10:244:1::/64"), host_ofport=7, vlan=4094)
    flows += peer_flows(PeerPlan("p6", 4, "fast", "192.168.1.6", ("10.244.7.0/24",),
                                 next_hop_mac="02:00:00:00:00:66"), GW.mac, 3, tagged)
    # NetworkPolicy isolation with the denied log: ct_state, controller(max_len, userdata, meter_id)
    from routesync.policy import plan as pp
    from routesync.policy.model import Pod, policy_from

    deny = policy_from({"metadata": {"namespace": "ns", "name": "deny"},
                        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}})
    pod = Pod("ns", "p", "n1", (), ("10.244.1.5", "fd00:10:244:1::5"), ())
    flows += pp.plan(pp.Inputs((pod,), {"ns": ()}, (deny,)), pp.NodeFacts("n1", denied_log=True)).flows
    return flows


def test_the_sample_covers_every_kind_of_match_and_action() -> None:
    flows = every_planned_flow()
    items = {type(i).__name__ if not isinstance(i, m.Field) else i.spec.name for f in flows for i in f.match}
    actions = {type(a).__name__ if not isinstance(a, SetField) else f"set_field:{a.spec.name}"
               for f in flows for a in f.actions}
    assert {"Proto", "in_port", "eth_src", "eth_dst", "ipv4_src", "ipv4_dst", "ipv6_src", "ipv6_dst", "arp_op",
            "arp_spa", "arp_tpa", "arp_sha", "icmpv6_type", "nd_target", "icmpv4_type", "ct_state", "ct_mark",
            "vlan_vid"} <= items
    assert {"Output", "Goto", "Move", "Load", "DecTtl", "Resubmit", "Ct", "set_field:eth_src", "set_field:eth_dst",
            "set_field:tun_dst", "set_field:tun_ipv6_dst", "set_field:nd_tll", "set_field:nd_reserved",
            "set_field:nd_options_type", "set_field:nw_ttl", "set_field:ipv6_src", "set_field:icmpv6_type",
            "set_field:icmpv6_code", "PushVlan", "PopVlan", "set_field:vlan_vid", "Controller"} <= actions
    assert any(not f.actions for f in flows) and any(not f.match for f in flows)
    assert any(isinstance(i, m.Field) and i.prefix is not None for f in flows for i in f.match)


def test_every_planned_flow_encodes() -> None:
    for f in every_planned_flow():
        msg = codec.flow_mod_add(f, 1)
        assert len(msg) % 8 == 0 and codec.HEADER.unpack_from(msg)[2] == len(msg), f.text()


@pytest.mark.skipif(shutil.which("ovs-ofctl") is None, reason="needs ovs-ofctl")
def test_encoded_bytes_mean_what_the_text_says() -> None:
    """ovs-ofctl decodes our bytes to exactly what it makes of the flow's text."""
    flows = every_planned_flow()
    ref = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "parse-flows", "-"], check=True, capture_output=True,
                         text=True, input="".join(f.text() + "\n" for f in flows)).stdout
    expected = [line.split("): ", 1)[1] for line in ref.splitlines() if "OFPT_FLOW_MOD" in line]
    hexes = [codec.flow_mod_add(f, 0).hex() for f in flows]
    ours = []
    for h in hexes:
        out = subprocess.run(["ovs-ofctl", "ofp-print", h], check=True, capture_output=True, text=True).stdout
        ours.append(out.strip().split("): ", 1)[1])
    assert len(expected) == len(flows)
    assert ours == expected


@pytest.mark.parametrize(("match", "actions"), [
    ((m.Field(m.IPV4_DST, 0x0A000000, 8),), ()),  # no eth_type: OVS would refuse it
    ((m.IP, m.Field(m.ARP_TPA, 0x0A000000, 8)), ()),  # arp_tpa without ARP
    ((m.ARP, m.Field(m.ARP_TPA, 0x0A000000, 8)), ()),  # arp_tpa is not matched by prefix here
    ((m.IP, m.IPV4_DST("10.0.0.1"), m.ICMPV6_TYPE(135)), ()),  # ICMPv6 type without icmp6
    ((), (goto(30), output(1))),  # an action after goto_table
    (("ip",), ()),  # text is not a match item
    ((), ("output:1",)),  # nor an action
])
def test_what_the_codec_cannot_express_raises(match: tuple, actions: tuple) -> None:
    flow = pl.Flow(pl.Table.CLASSIFIER, 1, match, actions)
    with pytest.raises(OpenFlowError):
        codec.flow_mod_add(flow, 1)


def test_values_are_validated_when_built() -> None:
    for bad in (lambda: m.ETH_DST("02:00:00:00:00"), lambda: m.IPV4_DST("fd00::1"), lambda: m.ARP_TPA("10.0.0.0/8"),
                lambda: m.IPV4_DST("10.0.0.0/33"), lambda: m.ND_TARGET("10.0.0.1"),
                lambda: Move(m.ETH_SRC, m.ARP_SPA), lambda: Move(m.ICMPV6_TYPE, m.ICMPV6_CODE),
                lambda: Load(1, m.ICMPV6_TYPE), lambda: Load(1 << 16, m.ARP_OP)):
        with pytest.raises(ValueError):
            bad()


def test_text_renders_ovs_ofctl_syntax() -> None:
    f = pl.Flow(pl.Table.L3_FORWARDING, 200, (m.IP, m.IPV4_DST("10.1.2.3/24")),
                (SetField(m.ETH_DST, m.mac_value("02:00:00:00:00:09")), DEC_TTL, SetField(m.TUN_DST, 0xAC100007),
                 Output(3)), pl.peer_cookie("x"))
    assert f.match_text() == "ip,nw_dst=10.1.2.0/24"
    assert f.actions_text() == "mod_dl_dst:02:00:00:00:00:09,dec_ttl,set_field:172.16.0.7->tun_dst,output:3"
    assert pl.Flow(pl.Table.CLASSIFIER, 0, (), ()).text() == "table=0,priority=0,cookie=0x100000000000000,actions=drop"
    assert Goto(40).text() == "goto_table:40"


# ------------------------------------------------------------------ NetworkPolicy's conjunctive flows

POLICY_COOKIE = pl.peer_cookie("fs-policy")


def policy_flows() -> list[pl.Flow]:
    """One of each thing NetworkPolicy's flows use: conjunction() clause flows (one clause shared by
    three conjunctions), masked port ranges for TCP/UDP/SCTP in both families, exact ports,
    conj_id flows, register matches (exact and masked) and register loads (one bit, a range, the
    whole register)."""
    t, c = pl.Table.SPOOF_GUARD, POLICY_COOKIE
    return [
        pl.Flow(t, 200, (m.IP, m.IPV4_SRC("10.244.1.0/24")),
                (Conjunction(7, 1, 3), Conjunction(8, 1, 2), Conjunction(0xFFFFFFFF, 1, 64)), c),
        pl.Flow(t, 200, (m.TCP, m.masked(m.TCP_DST, 0x1000, 0xF000)), (Conjunction(7, 2, 3),), c),
        pl.Flow(t, 200, (m.UDP, m.UDP_DST(53)), (Conjunction(7, 3, 3), Conjunction(8, 2, 2)), c),
        pl.Flow(t, 200, (m.SCTP, m.masked(m.SCTP_DST, 0x20, 0xFFF0)), (Conjunction(0xFFFFFFFF, 64, 64),), c),
        pl.Flow(t, 200, (m.TCP6, m.masked(m.TCP_DST, 0x8000, 0x8000)), (Conjunction(9, 1, 2),), c),
        pl.Flow(t, 200, (m.UDP6, m.masked(m.UDP_DST, 0x100, 0xFF00)), (Conjunction(9, 2, 2),), c),
        pl.Flow(t, 200, (m.SCTP6, m.SCTP_DST(9899)), (Conjunction(10, 2, 2),), c),
        pl.Flow(t, 200, (m.TCP, m.TCP_DST(80)), (Conjunction(10, 1, 2),), c),
        pl.Flow(t, 200, (m.CONJ_ID(7), m.IP), (Load(1, m.REG0, 0, 1), goto(pl.Table.CONNTRACK)), c),
        pl.Flow(t, 200, (m.CONJ_ID(8),), (Load(0xAB, m.REG1, 8, 8), Load(5, m.REG2), Load(3, m.REG3, 30, 2),
                                          goto(pl.Table.CONNTRACK)), c),
        pl.Flow(t, 200, (m.CONJ_ID(0xFFFFFFFF),), (), c),
        pl.Flow(pl.Table.CONNTRACK, 100, (m.masked(m.REG0, 1, 1), m.REG3(0xC0000000)),
                (Move(m.REG1, m.REG2), goto(pl.Table.L3_FORWARDING)), c),
        pl.Flow(pl.Table.CONNTRACK, 90, (m.IPV6, m.masked(m.REG1, 0xAB00, 0xFF00), m.REG2(5)), (output(3),), c),
    ]


def _print(flows: list[pl.Flow]) -> tuple[list[str], list[str]]:
    """(ovs-ofctl parse-flows of the texts, ovs-ofctl ofp-print of the codec's bytes), one line each."""
    ref = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "parse-flows", "-"], check=True, capture_output=True,
                         text=True, input="".join(f.text() + "\n" for f in flows)).stdout
    expected = [line.split("): ", 1)[1] for line in ref.splitlines() if "OFPT_FLOW_MOD" in line]
    ours = [subprocess.run(["ovs-ofctl", "ofp-print", codec.flow_mod_add(f, 0).hex()], check=True,
                           capture_output=True, text=True).stdout.strip().split("): ", 1)[1] for f in flows]
    return expected, ours


def test_policy_sample_covers_every_new_field_and_action() -> None:
    flows = policy_flows()
    fields = {i.spec for f in flows for i in f.match if isinstance(i, m.Field)}
    protos = {i for f in flows for i in f.match if isinstance(i, m.Proto)}
    assert {m.CONJ_ID, m.TCP_DST, m.UDP_DST, m.SCTP_DST, m.REG0, m.REG1, m.REG2, m.REG3} <= fields
    assert {m.TCP, m.UDP, m.SCTP, m.TCP6, m.UDP6, m.SCTP6} <= protos
    assert any(sum(isinstance(a, Conjunction) for a in f.actions) == 3 for f in flows)
    assert {a.dst for f in flows for a in f.actions if isinstance(a, Load)} == {m.REG0, m.REG1, m.REG2, m.REG3}


@pytest.mark.skipif(shutil.which("ovs-ofctl") is None, reason="needs ovs-ofctl")
def test_policy_flows_encoded_bytes_mean_what_the_text_says() -> None:
    """ovs-ofctl accepts every policy flow's text, and decodes the codec's bytes to the same flow."""
    flows = policy_flows()
    expected, ours = _print(flows)
    assert len(expected) == len(flows)
    assert ours == expected


@pytest.mark.skipif(shutil.which("ovs-ofctl") is None, reason="needs ovs-ofctl")
def test_policy_texts_are_what_ovs_prints() -> None:
    """Each new match field and action is written as ovs-ofctl's canonical text writes it (what
    dump-flows prints; only the order of match fields differs), and route-sync's reader of
    parse-flows (``parse_flow_mods``, behind its canonical cache) takes every one."""
    from routesync.apply.ovs import parse_flow_mods

    flows = policy_flows()
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "parse-flows", "-"], check=True, capture_output=True,
                         text=True, input="".join(f.text() + "\n" for f in flows)).stdout
    parsed = parse_flow_mods(out)
    assert len(parsed) == len(flows)
    for f, (cookie, table, priority, match, actions) in zip(flows, parsed, strict=True):
        assert (cookie, table, priority) == (f.cookie.value, int(f.table), f.priority), f.text()
        assert actions == f.actions_text(), f.text()
        assert sorted(match.split(",")) == sorted(f.match_text().split(",")), f.text()
    assert parsed[8][3] == "conj_id=7,ip" and parsed[1][3] == "tcp,tp_dst=0x1000/0xf000"


def test_policy_texts_and_wire_layout() -> None:
    flows = policy_flows()
    assert flows[0].text() == (f"table=10,priority=200,cookie={POLICY_COOKIE.value:#x},ip,nw_src=10.244.1.0/24,"
                               "actions=conjunction(7,1/3),conjunction(8,1/2),conjunction(4294967295,1/64)")
    assert flows[1].match_text() == "tcp,tp_dst=0x1000/0xf000"
    assert flows[6].match_text() == "sctp6,tp_dst=9899"
    assert flows[11].match_text() == "reg0=0x1/0x1,reg3=0xc0000000"
    assert Load(1, m.REG0, 0, 1).text() == "load:0x1->NXM_NX_REG0[0]"
    assert Load(1, m.REG0, 0, 32).text() == Load(1, m.REG0).text() == "load:0x1->NXM_NX_REG0[]"
    # NXAST_CONJUNCTION: experimenter action, 16 bytes, Nicira, subtype 34, clause 0-based, n, id
    assert codec.encode_instructions((Conjunction(0x01020304, 2, 3),))[8:] == bytes.fromhex(
        "ffff0010" "00002320" "0022" "01" "03" "01020304")
    # NXAST_REG_LOAD of reg1[8..15]: ofs_nbits = 8 << 6 | 7, NXM_NX_REG1, the value
    assert codec.encode_instructions((Load(0xAB, m.REG1, 8, 8),))[8:] == bytes.fromhex(
        "ffff0018" "00002320" "0007" "0207" "00010204" "00000000000000ab")
    # tp_dst=0x1000/0xf000: OXM_OF_TCP_DST with the mask bit, value then mask
    match = codec.encode_match((m.TCP, m.masked(m.TCP_DST, 0x1000, 0xF000)))
    assert bytes.fromhex("80001d04" "1000" "f000") in match
    assert bytes.fromhex("00014a04" "00000007") in codec.encode_match((m.CONJ_ID(7),))  # NXM_NX_CONJ_ID (37)


@pytest.mark.parametrize(("match", "actions"), [
    ((m.IP, m.TCP_DST(80)), ()),  # tcp_dst without ip_proto 6
    ((m.masked(m.UDP_DST, 0x100, 0xFF00),), ()),  # udp_dst without udp
    ((m.TCP, m.UDP_DST(53)), ()),  # udp_dst on tcp
    ((m.UDP6, m.SCTP_DST(1)), ()),  # sctp_dst on udp6
    ((m.IP,), (Conjunction(1, 1, 2), output(1))),  # conjunction() with another action
    ((m.IP,), (Conjunction(1, 1, 2), goto(30))),  # or with goto_table
    ((m.IP,), (output(1), Conjunction(1, 2, 2))),
    ((m.Field(m.CONJ_ID, 7, None, 0xFF),), ()),  # conj_id is matched exactly
])
def test_what_the_codec_cannot_express_in_policy_flows_raises(match: tuple, actions: tuple) -> None:
    with pytest.raises(OpenFlowError):
        codec.flow_mod_add(pl.Flow(pl.Table.CLASSIFIER, 1, match, actions), 1)


@pytest.mark.parametrize("bad", [
    lambda: Conjunction(1, 0, 2), lambda: Conjunction(1, 3, 2), lambda: Conjunction(1, 1, 1),
    lambda: Conjunction(1, 1, 65), lambda: Conjunction(1 << 32, 1, 2), lambda: Conjunction(-1, 1, 2),
    lambda: Load(2, m.REG0, 0, 1), lambda: Load(1, m.REG0, 31, 2), lambda: Load(1, m.REG0, -1, 1),
    lambda: Load(1, m.REG0, 0, 0), lambda: Load(1, m.REG0, 4), lambda: Load(1 << 32, m.REG0),
    lambda: Load(1, m.CONJ_ID), lambda: m.TCP_DST(65536), lambda: m.CONJ_ID(1 << 32), lambda: m.REG0(-1),
    lambda: m.masked(m.TCP_DST, 0x1001, 0xF000), lambda: m.masked(m.UDP_DST, 0, 0x10000),
    lambda: m.masked(m.CONJ_ID, 1, 1),
])
def test_policy_values_are_validated_when_built(bad) -> None:
    with pytest.raises(ValueError):
        bad()
