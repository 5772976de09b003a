"""The OpenFlow codec and session (cni.ovs.openflow) install exactly what ovs-ofctl installs for every
kind of flow Ferry plans (plugin, chained next hops with their IPv6 set_field/resubmit responder,
route-sync's bundles), delete by cookie exactly, and report the switch's refusals."""

from __future__ import annotations

import pytest

from cni.ovs.openflow.bridge import OpenFlow
from cni.ovs.openflow.codec import OpenFlowError
from cni.pipeline import match as m
from cni.pipeline import tables as pl
from cni.pipeline.actions import SetField, goto, output
from cni.pipeline.chained import next_hop_flows
from cni.pipeline.flows import GatewayPort, PodPort, base_flows, pod_flows
from cni.pipeline.match import IN_PORT
from tests.cni.ovs.test_codec import every_planned_flow, policy_flows
from tests.support.ovs_instance import OvsInstance, netns

pytestmark = pytest.mark.root

GW = GatewayPort(ofport=2, mac="02:00:00:00:00:01", addresses=("10.244.1.1/24", "fd00:10:244:1::1/64"))
POD_A = PodPort(cookie=pl.pod_cookie("fs-a", "eth0"), ofport=7, mac="02:11:22:33:44:55",
                addresses=("10.244.1.5/24", "fd00:10:244:1::5/64"))
BACKWARDS = pl.Flow(pl.Table.CLASSIFIER, 10, (IN_PORT(1),), (goto(0),), pl.BASE_COOKIE)  # the switch refuses it
POD_B = PodPort(cookie=pl.pod_cookie("fs-b", "eth0"), ofport=8, mac="02:11:22:33:44:66",
                addresses=("10.244.1.6/24",))


@pytest.fixture
def ovs():
    with netns("fs-ofn") as ns, OvsInstance("fs-ofn", netns=ns) as o:
        for br in ("brn", "bro"):
            o.vsctl("add-br", br, "--", "set", "bridge", br, "datapath_type=netdev", "fail_mode=secure")
        yield o


def _dump(o, br: str) -> list[str]:
    out = o.ofctl("dump-flows", br, "--no-stats")
    return sorted(line.strip() for line in out.splitlines() if "actions=" in line)


def test_native_and_ofctl_install_the_same_flows(ovs):
    flows = base_flows(GW) + pod_flows(POD_A, GW.mac, GW.ofport) + pod_flows(POD_B, GW.mac, GW.ofport)
    flows += next_hop_flows(POD_A.cookie, POD_A.ofport, ("10.244.1.1", "fd00:10:244:1::1/64"), GW.mac)
    assert any("resubmit" in f.text() and "nd_reserved" in f.text() for f in flows)  # chained IPv6: native too
    OpenFlow("brn", ovs.run_dir).add_flows(flows)
    ovs.ofctl("add-flows", "bro", "-", input="".join(f.text() + "\n" for f in flows))
    native, reference = _dump(ovs, "brn"), _dump(ovs, "bro")
    assert len(native) == len(flows)
    assert native == reference


def test_delete_by_cookie_removes_exactly_that_pod(ovs):
    nat = OpenFlow("brn", ovs.run_dir)
    nat.add_flows(base_flows(GW) + pod_flows(POD_A, GW.mac) + pod_flows(POD_B, GW.mac))
    nat.del_flows(POD_A.cookie)
    left = _dump(ovs, "brn")
    assert not any(f"cookie={POD_A.cookie.value:#x}" in x for x in left)
    assert any(f"cookie={POD_B.cookie.value:#x}" in x for x in left)
    assert sum(f"cookie={pl.BASE_COOKIE.value:#x}" in x for x in left) == len(base_flows(GW))


def test_switch_refusal_is_reported(ovs):
    with pytest.raises(OpenFlowError, match="refused"):
        OpenFlow("brn", ovs.run_dir).add_flows([BACKWARDS])


def test_missing_bridge_is_reported(ovs):
    with pytest.raises(OpenFlowError, match="cannot connect"):
        OpenFlow("nope", ovs.run_dir).del_flows(POD_A.cookie)


def test_a_flow_the_codec_cannot_express_raises_and_nothing_is_sent(ovs):
    """No exec fallback: the whole add fails before connecting, and the bridge is untouched."""
    bad = pl.Flow(pl.Table.CLASSIFIER, 10, (IN_PORT(1),), ("output:1",), POD_A.cookie)
    with pytest.raises(OpenFlowError, match="not expressed"):
        OpenFlow("brn", ovs.run_dir).add_flows([*pod_flows(POD_A, GW.mac), bad])
    assert _dump(ovs, "brn") == []


def test_replace_flows_in_one_bundle(ovs):
    of = OpenFlow("brn", ovs.run_dir)
    of.add_flows(base_flows(GW) + pod_flows(POD_A, GW.mac) + pod_flows(POD_B, GW.mac))
    of.replace_flows(POD_A.cookie, pod_flows(POD_A, GW.mac)[:2])
    left = _dump(ovs, "brn")
    assert sum(f"cookie={POD_A.cookie.value:#x}" in x for x in left) == 2
    assert sum(f"cookie={POD_B.cookie.value:#x}" in x for x in left) == len(pod_flows(POD_B, GW.mac))
    with pytest.raises(OpenFlowError, match="refused"):
        of.replace_flows(POD_B.cookie, [pl.Flow(BACKWARDS.table, 10, BACKWARDS.match, BACKWARDS.actions, POD_B.cookie)])
    assert _dump(ovs, "brn") == left  # the refused bundle deleted nothing either


# ------------------------------------------------------------------ route-sync's flows (bundles)

def _routesync_flows() -> list[pl.Flow]:
    """Every kind of flow Ferry plans (base, per-Pod, chained, NODE, uplink, PEER tunnel and fast
    path): what route-sync installs, and the Pod flows it replays."""
    return every_planned_flow()


@pytest.fixture
def rs_ovs():
    """Bridges as route-sync makes them: OpenFlow 1.0 and 1.3 only (bundles by the ONF extension)."""
    with netns("fs-ofb") as ns, OvsInstance("fs-ofb", netns=ns) as o:
        for br in ("brn", "bro"):
            o.vsctl("add-br", br, "--", "set", "bridge", br, "datapath_type=netdev", "fail_mode=secure",
                    "protocols=OpenFlow10,OpenFlow13")
        yield o


def _ofctl13(o, command: str, br: str, *args: str, input: str | None = None) -> str:
    import subprocess

    return subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", command, f"unix:{o.dir}/{br}.mgmt", *args],
                          input=input, capture_output=True, text=True, check=True).stdout


def _dump13(o, br: str) -> list[str]:
    out = _ofctl13(o, "dump-flows", br, "--no-stats")
    return sorted(line.strip() for line in out.splitlines() if "actions=" in line)


def test_routesync_flows_bundle_installs_what_ofctl_bundle_installs(rs_ovs):
    from routesync.apply.ofsession import OpenFlowSession

    flows = _routesync_flows()
    session = OpenFlowSession("brn", rs_ovs.run_dir)
    session.bundle(session.encode([], flows))
    _ofctl13(rs_ovs, "add-flows", "bro", "--bundle", "-", input="".join(f"add {f.text()}\n" for f in flows))
    native, reference = _dump13(rs_ovs, "brn"), _dump13(rs_ovs, "bro")
    assert len(native) == len(flows)
    assert native == reference
    session.close()


def test_bundle_replaces_a_cookie_group_atomically_and_survives_a_lost_connection(rs_ovs):
    from routesync.apply.ofsession import OpenFlowSession

    flows = _routesync_flows()
    p1 = pl.peer_cookie("p1")
    session = OpenFlowSession("brn", rs_ovs.run_dir)
    session.bundle(session.encode([], flows))
    new = [pl.Flow(pl.Table.L3_FORWARDING, 200, (m.IP, m.IPV4_DST("10.250.0.0/16")),
                   (SetField(m.TUN_DST, 0xAC100008), output(3)), p1)]
    session._sock.close()  # the connection is gone (as after an ovs-vswitchd restart)
    session.bundle(session.encode([p1], new))
    assert session.connects == 2
    left = _dump13(rs_ovs, "brn")
    mine = [x for x in left if f"cookie={p1.value:#x}" in x]
    assert len(mine) == 1 and "nw_dst=10.250.0.0/16" in mine[0] and "tun_dst" in mine[0]
    assert len(left) == len(flows) - sum(f.cookie == p1 for f in flows) + 1
    session.close()


def test_bundle_refused_by_the_switch_changes_nothing(rs_ovs):
    from routesync.apply.ofsession import OpenFlowSession

    flows = _routesync_flows()
    session = OpenFlowSession("brn", rs_ovs.run_dir)
    session.bundle(session.encode([], flows))
    before = _dump13(rs_ovs, "brn")
    with pytest.raises(OpenFlowError, match="refused"):
        session.bundle(session.encode([pl.peer_cookie("p1")], [BACKWARDS]))
    assert _dump13(rs_ovs, "brn") == before  # the delete in the same bundle did not happen
    session.bundle(session.encode([], flows[:1]))  # and the session works again
    session.close()


# ------------------------------------------------------------------ NetworkPolicy's conjunctive flows

def _canonical(flows: list[pl.Flow]) -> list[tuple[int, int, int, str, str]]:
    """(table, priority, match, actions, cookie) of ``ovs-ofctl parse-flows`` of the flows' texts."""
    import subprocess

    from routesync.apply.ovs import parse_flow_mods

    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "parse-flows", "-"], capture_output=True, text=True,
                         check=True, input="".join(f.text() + "\n" for f in flows)).stdout
    return sorted((t, p, match, actions, c) for c, t, p, match, actions in parse_flow_mods(out))


def test_policy_flows_install_as_ofctl_installs_them_and_dump_back_as_their_text(rs_ovs):
    """Conjunction clause flows, conj_id flows, port ranges, registers: the codec (one-shot, and
    route-sync's bundle) installs what ovs-ofctl installs from the text, and the dump reads back
    as the text's canonical form (what route-sync compares)."""
    from cni.ovs.openflow.ofctl import parse_dump
    from routesync.apply.ofsession import OpenFlowSession

    flows = policy_flows()
    OpenFlow("brn", rs_ovs.run_dir).add_flows(flows)
    _ofctl13(rs_ovs, "add-flows", "bro", "-", input="".join(f.text() + "\n" for f in flows))
    native, reference = _dump13(rs_ovs, "brn"), _dump13(rs_ovs, "bro")
    assert len(native) == len(flows)
    assert native == reference
    dumped = parse_dump(_ofctl13(rs_ovs, "dump-flows", "brn", "--no-names"))
    assert sorted((*f.canon(), f.cookie) for f in dumped) == _canonical(flows)

    _ofctl13(rs_ovs, "del-flows", "brn")
    session = OpenFlowSession("brn", rs_ovs.run_dir)
    session.bundle(session.encode([], flows))
    assert _dump13(rs_ovs, "brn") == reference
    session.close()


def test_conjunctive_match_on_the_switch(ovs):
    """The switch runs the codec's conjunction: a packet from the source range to a port in the
    range reaches the conj_id flow (which sets a register bit the next table matches); one that
    satisfies a single clause falls to the table's miss."""
    c = pl.peer_cookie("fs-conj")
    t, nxt = pl.Table.CLASSIFIER, pl.Table.L3_FORWARDING
    from cni.pipeline.actions import Conjunction, Load

    flows = [
        pl.Flow(t, 100, (m.IP, m.IPV4_SRC("10.9.0.0/16")), (Conjunction(5, 1, 2), Conjunction(6, 1, 2)), c),
        pl.Flow(t, 100, (m.TCP, m.masked(m.TCP_DST, 0x1000, 0xF000)), (Conjunction(5, 2, 2),), c),
        pl.Flow(t, 100, (m.UDP, m.UDP_DST(53)), (Conjunction(6, 2, 2),), c),
        pl.Flow(t, 100, (m.CONJ_ID(5), m.IP), (Load(1, m.REG0, 3, 1), goto(nxt)), c),
        pl.Flow(t, 100, (m.CONJ_ID(6), m.IP), (Load(1, m.REG0, 4, 1), goto(nxt)), c),
        pl.Flow(t, 0, (), (), c),
        pl.Flow(nxt, 10, (m.masked(m.REG0, 0x8, 0x8),), (output(1),), c),
        pl.Flow(nxt, 10, (m.masked(m.REG0, 0x10, 0x10),), (output(2),), c),
    ]
    OpenFlow("brn", ovs.run_dir).add_flows(flows)

    def trace(packet: str) -> str:
        # (a packet is named by ovs-fields names: tp_dst there is tcp_dst only; in flows it is any port)
        return ovs.appctl("ofproto/trace", "brn", f"in_port=LOCAL,{packet}")

    ovs.vsctl("add-port", "brn", "p1", "--", "set", "interface", "p1", "type=internal", "ofport_request=1",
              "--", "add-port", "brn", "p2", "--", "set", "interface", "p2", "type=internal", "ofport_request=2")
    tcp = trace("tcp,nw_src=10.9.1.2,nw_dst=10.1.1.1,tcp_dst=0x1234")
    assert "conj_id=5,ip" in tcp and "output:1" in tcp and "output:2" not in tcp
    udp = trace("udp,nw_src=10.9.1.2,nw_dst=10.1.1.1,udp_dst=53")
    assert "conj_id=6,ip" in udp and "output:2" in udp and "output:1" not in udp
    for miss in ("tcp,nw_src=10.9.1.2,nw_dst=10.1.1.1,tcp_dst=0x2234",  # port outside the range
                 "tcp,nw_src=10.8.1.2,nw_dst=10.1.1.1,tcp_dst=0x1234",  # source outside
                 "udp,nw_src=10.9.1.2,nw_dst=10.1.1.1,udp_dst=0x1234"):  # the other conjunction's port
        out = trace(miss)
        assert "conj_id" not in out and out.rstrip().endswith("Datapath actions: drop"), out
