"""cni.ovs.ofnative installs exactly what ovs-ofctl installs for every flow the plugin plans,
deletes by cookie exactly, and reports the switch's refusals."""

from __future__ import annotations

import pytest

from cni.ovs.ofnative import NativeOpenFlow, OpenFlowError, encode_instructions, encode_match
from cni.pipeline import tables as pl
from cni.pipeline.flows import GatewayPort, PodPort, base_flows, pod_flows
from tests.support.ovs_instance import OvsInstance, netns

pytestmark = pytest.mark.root

GW = GatewayPort(ofport=2, mac="02:00:00:00:00:01", addresses=("10.244.1.1/24", "fd00:10:244:1::1/64"))
POD_A = PodPort(cookie=pl.pod_cookie("fs-a", "eth0"), ofport=7, mac="02:11:22:33:44:55",
                addresses=("10.244.1.5/24", "fd00:10:244:1::5/64"))
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
    NativeOpenFlow("brn", ovs.run_dir).add_flows(flows)
    ovs.ofctl("add-flows", "bro", "-", input="".join(f.text() + "\n" for f in flows))
    native, reference = _dump(ovs, "brn"), _dump(ovs, "bro")
    assert len(native) == len(flows)
    assert native == reference


def test_delete_by_cookie_removes_exactly_that_pod(ovs):
    nat = NativeOpenFlow("brn", ovs.run_dir)
    nat.add_flows(base_flows(GW) + pod_flows(POD_A, GW.mac) + pod_flows(POD_B, GW.mac))
    nat.del_flows(POD_A.cookie)
    left = _dump(ovs, "brn")
    assert not any(f"cookie={POD_A.cookie.value:#x}" in x for x in left)
    assert any(f"cookie={POD_B.cookie.value:#x}" in x for x in left)
    assert sum(f"cookie={pl.BASE_COOKIE.value:#x}" in x for x in left) == len(base_flows(GW))


def test_switch_refusal_is_reported(ovs):
    bad = pl.Flow(pl.Table.CLASSIFIER, 10, "in_port=1", "goto_table:0", pl.BASE_COOKIE)  # goto backwards
    with pytest.raises(OpenFlowError, match="refused"):
        NativeOpenFlow("brn", ovs.run_dir).add_flows([bad])


def test_missing_bridge_is_reported(ovs):
    with pytest.raises(OpenFlowError, match="cannot connect"):
        NativeOpenFlow("nope", ovs.run_dir).del_flows(POD_A.cookie)


@pytest.mark.parametrize("match", ["tcp", "nw_ttl=3", "in_port=LOCAL", "dl_src=02:00:00:00:00:01,actions=drop"])
def test_unknown_match_syntax_is_refused_not_guessed(match):
    with pytest.raises((OpenFlowError, ValueError)):
        encode_match(match)


@pytest.mark.parametrize("actions", ["resubmit(,30)", "controller", "output:1,goto_table:30,output:2",
                                     "load:0x1->NXM_NX_REG0[]"])
def test_unknown_action_syntax_is_refused_not_guessed(actions):
    with pytest.raises((OpenFlowError, ValueError)):
        encode_instructions(actions)


# ------------------------------------------------------------------ route-sync's flows (bundles)

def _routesync_flows() -> list[pl.Flow]:
    """Every kind of flow route-sync installs: base, NODE (tunnel classifier, uplink pass-through),
    PEER tunnel flows (IPv4/IPv6 Pod CIDRs over IPv4/IPv6 underlays, the peer gateway's ARP
    responder) and fast-path flows (masked source and destination, both families)."""
    from routesync.apply.uplink import uplink_flows
    from routesync.model import PeerPlan
    from routesync.peerflows import FastPort, node_flows, peer_flows

    flows = base_flows(GW) + node_flows(3, GW.mac) + uplink_flows(4, 5)
    flows += peer_flows(PeerPlan("p1", 4, "tunnel", "172.16.0.7", ("10.244.2.0/24",), "10.244.2.1"), GW.mac, 3)
    flows += peer_flows(PeerPlan("p2", 6, "tunnel", "fd00:172::9", ("fd00:10:244:2::/64",), "fd00:10:244:2::1"),
                        GW.mac, 3)
    flows += peer_flows(PeerPlan("p3", 4, "tunnel", "fd00:172::a", ("10.244.3.0/25", "10.244.4.7/32"),
                                 "10.244.3.1"), GW.mac, 3)
    port = FastPort(4, "02:aa:bb:cc:dd:ee", ("10.244.1.0/24", "fd00:10:244:1::/64"))
    flows += peer_flows(PeerPlan("p4", 4, "fast", "192.168.1.4", ("10.244.5.0/24",), next_hop_mac="02:00:00:00:00:44"),
                        GW.mac, 3, port)
    flows += peer_flows(PeerPlan("p5", 6, "fast", "fd00:192::5", ("fd00:10:244:5::/64",),
                                 next_hop_mac="02:00:00:00:00:55"), GW.mac, 3, port)
    return flows


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
    kinds = {f.match.split(",")[0] for f in flows} | {a.split(":")[0] for f in flows for a in f.actions.split(",")}
    assert {"ip", "ipv6", "set_field", "mod_dl_dst", "goto_table", "output"} <= kinds
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
    new = [pl.Flow(pl.Table.L3_FORWARDING, 200, "ip,nw_dst=10.250.0.0/16",
                   "set_field:172.16.0.8->tun_dst,output:3", p1)]
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
    bad = pl.Flow(pl.Table.CLASSIFIER, 10, "in_port=1", "goto_table:0", pl.BASE_COOKIE)  # goto backwards
    with pytest.raises(OpenFlowError, match="refused"):
        session.bundle(session.encode([pl.peer_cookie("p1")], [bad]))
    assert _dump13(rs_ovs, "brn") == before  # the delete in the same bundle did not happen
    session.bundle(session.encode([], flows[:1]))  # and the session works again
    session.close()


@pytest.mark.parametrize(("match", "actions"), [
    ("tcp,nw_dst=10.0.0.0/8", "drop"), ("ip,dl_dst=02:00:00:00:00:01/ff:ff:00:00:00:00", "drop"),
    ("ip,nw_dst=10.0.0.0/33", "drop"), ("ip", "set_field:10.0.0.1->nw_dst"),
    ("ip", "set_field:fd00::1->tun_dst"),
])
def test_route_sync_encoder_refuses_what_it_does_not_speak(match, actions):
    from routesync.apply.ofwire import encode_instructions_ext, encode_match_masked

    with pytest.raises((OpenFlowError, ValueError)):
        encode_match_masked(match)
        encode_instructions_ext(actions)
