"""UplinkMover: move + restore keep the Node reachable and give back the exact original host;
a crash half-way is repaired; two moved Nodes carry Pod traffic over a VXLAN tunnel (netdev)."""

from __future__ import annotations

import tempfile
from contextlib import ExitStack

import pytest

from cni.pipeline import match as fm
from cni.pipeline.actions import SetField, output
from cni.pipeline.tables import UPLINK_COOKIE, Flow, Table, peer_cookie
from routesync.apply.uplink import UplinkMover
from routesync.model import TunnelSpec, UplinkSpec
from tests.routesync.apply.helpers import Node, Pinger, node, ns_sh, veth
from tests.support.ovs_instance import OvsInstance, netns

SPEC = UplinkSpec("eth0", "eth0~")


def setup_host(n: Node, peer: str, idx: int) -> None:
    """The Node's uplink eth0 (veth to ``peer``) with addresses and routes of several kinds."""
    veth(n.ns, "eth0", peer, f"eth0p{idx}")
    ns = n.ns
    ns_sh(ns, "ip", "link", "set", "eth0", "mtu", "1480")
    ns_sh(ns, "ip", "addr", "add", f"192.168.60.{idx}/24", "dev", "eth0")
    ns_sh(ns, "ip", "addr", "add", f"fd00:60::{idx}/64", "dev", "eth0", "nodad")
    ns_sh(ns, "ip", "route", "add", "default", "via", "192.168.60.254")
    ns_sh(ns, "ip", "route", "add", "10.60.0.0/16", "via", "192.168.60.253", "metric", "50",
          "proto", "static")
    ns_sh(ns, "ip", "-6", "route", "add", "fd00:61::/64", "via", "fd00:60::fe")


@pytest.mark.root
def test_move_and_restore_exact_and_reachable() -> None:
    with node("fb-um1") as n, netns("fb-um1p") as peer, tempfile.TemporaryDirectory() as state:
        setup_host(n, peer, 1)
        ns_sh(peer, "ip", "addr", "add", "192.168.60.100/24", "dev", "eth0p1")
        mover = UplinkMover(n.applier, SPEC, state, "netdev", netns=n.ns)
        try:
            before = mover.snapshot("eth0")
            assert {r["dst"] for r in before["routes"]} == {"0.0.0.0/0", "10.60.0.0/16",
                                                             "fd00:61::/64"}
            ping = Pinger(peer, "192.168.60.1", 0.01)
            ns_sh(peer, "ping", "-c", "3", "-i", "0.2", "-W", "1", "192.168.60.1")  # warm-up
            mover.move()
            moved = mover.snapshot("eth0")
            sent, lost = ping.stop()
            print(f"uplink move: {sent} pings at 10 ms, {lost} lost")
            assert lost == 0
            # the internal port took the name, MAC, MTU, addresses and routes
            assert (moved["mac"], moved["mtu"], moved["addresses"]) == \
                (before["mac"], before["mtu"], before["addresses"])
            assert moved["routes"] == before["routes"]
            assert "eth0~" in n.ovs.vsctl("list-ports", "br-int")
            assert n.ovs.vsctl("get", "interface", "eth0", "type").strip() == "internal"
            assert mover.snapshot("eth0~")["addresses"] == []
            assert "uplink_in" in ns_sh(n.ns, "nft", "list", "table", "netdev", "ferry_uplink")
            n.ovs.appctl("revalidator/wait")  # the datapath's counts are on the OpenFlow flows now
            flows = [f for f in n.applier.dump_flows() if f.cookie == UPLINK_COOKIE.value]
            assert len(flows) == 2 and all(f.n_packets > 0 for f in flows)  # host traffic via OVS
            assert mover.flows() and mover.move().phase == "moved"  # a second move is a no-op

            ping = Pinger(peer, "192.168.60.1", 0.01)
            ns_sh(peer, "ping", "-c", "3", "-i", "0.2", "-W", "1", "192.168.60.1")
            assert mover.restore() is True
            sent, lost = ping.stop()
            print(f"uplink restore: {sent} pings at 10 ms, {lost} lost")
            assert lost == 0
            after = mover.snapshot("eth0")
            assert after == before
            assert "eth0" not in n.ovs.vsctl("list-ports", "br-int")
            assert "ferry_uplink" not in ns_sh(n.ns, "nft", "list", "tables")
            assert mover.restore() is False
        finally:
            mover.close()


class Crash(Exception):
    pass


@pytest.mark.root
@pytest.mark.parametrize("crash_at", ["recorded", "renamed", "attached", "addressed"])
def test_repair_after_crash(crash_at: str) -> None:
    name = f"fb-uc{crash_at[:3]}"
    with node(name) as n, netns(name + "p") as peer, tempfile.TemporaryDirectory() as state:
        setup_host(n, peer, 2)
        mover = UplinkMover(n.applier, SPEC, state, "netdev", netns=n.ns)
        before = mover.snapshot("eth0")
        assert len(before["routes"]) == 3

        def crash(step: str) -> None:
            if step == crash_at:
                raise Crash(step)

        mover.after_step = crash
        with pytest.raises(Crash):
            mover.move()
        mover.close()
        again = UplinkMover(n.applier, SPEC, state, "netdev", netns=n.ns)  # "next start"
        try:
            assert again.repair() == "moved"
            moved = again.snapshot("eth0")
            assert moved["addresses"] == before["addresses"] and moved["routes"] == before["routes"]
            assert again.load().phase == "moved"
            # and a crash half-way through restore is finished by repair as well
            again.after_step = lambda step: (_ for _ in ()).throw(Crash(step)) \
                if step == "readdressed" else None
            with pytest.raises(Crash):
                again.restore()
            again.after_step = lambda step: None
            assert again.repair() == "restored"
            assert again.snapshot("eth0") == before
        finally:
            again.close()


def plug_pod(n: Node, pod: str, ip: str) -> int:
    veth(n.ns, "fb-pod", pod, "eth0")
    ns_sh(pod, "ip", "addr", "add", ip, "dev", "eth0")
    ns_sh(pod, "ethtool", "-K", "eth0", "tx", "off")
    return n.applier.attach_port("fb-pod")


@pytest.mark.root
def test_vxlan_between_two_moved_nodes() -> None:
    with ExitStack() as stack, tempfile.TemporaryDirectory() as state:
        a = stack.enter_context(node("fb-uva"))
        b = stack.enter_context(node("fb-uvb"))
        pa = stack.enter_context(netns("fb-uvpa"))
        pb = stack.enter_context(netns("fb-uvpb"))
        veth(a.ns, "eth0", b.ns, "eth0")
        ns_sh(a.ns, "ip", "addr", "add", "192.168.70.1/24", "dev", "eth0")
        ns_sh(b.ns, "ip", "addr", "add", "192.168.70.2/24", "dev", "eth0")
        movers = []
        for n, peer_ip, pod, pod_ip in ((a, "192.168.70.2", pa, "10.99.0.1/24"),
                                        (b, "192.168.70.1", pb, "10.99.0.2/24")):
            m = UplinkMover(n.applier, SPEC, f"{state}/{n.ns}", "netdev", netns=n.ns)
            stack.callback(m.close)
            m.move()
            movers.append(m)
            tun = n.applier.ensure_tunnel(TunnelSpec("vxlan", "ferry-tun0", 4789), None)
            pod_port = plug_pod(n, pod, pod_ip)
            c = peer_cookie("the-other-node")
            flows = m.flows() + [
                Flow(Table.CLASSIFIER, 100, (fm.IN_PORT(pod_port),),
                     (SetField(fm.TUN_DST, fm.IPV4_DST(peer_ip).value), output(tun)), c),
                Flow(Table.CLASSIFIER, 100, (fm.IN_PORT(tun),), (output(pod_port),), c)]
            assert n.applier.sync_flows(flows).added
        # the underlay works between the moved Nodes (and fills OVS's tunnel neighbour cache)
        ns_sh(a.ns, "ping", "-c", "2", "-W", "1", "192.168.70.2")
        out = ns_sh(pa, "ping", "-c", "5", "-i", "0.2", "-W", "2", "10.99.0.2")
        assert " 0% packet loss" in out
        a.ovs.appctl("revalidator/wait")  # the datapath's counts are on the OpenFlow flows now
        tun_flows = [f for f in a.applier.dump_flows()
                     if f.cookie == peer_cookie("the-other-node").value and "tun_dst" in f.actions]
        assert tun_flows[0].n_packets >= 5  # the path is the tunnel
        stats = a.ovs.vsctl("get", "interface", "ferry-tun0", "statistics")
        print("tunnel port statistics on node a:", stats)
        for m in movers:
            assert m.restore()


@pytest.mark.root
def test_tagged_move_repair_and_restore() -> None:
    """A transport VLAN (issue 29): the peer reaches the Node only through a trunk of VLAN 100 (an
    OVS switch in the peer's namespace, an access port of 100 holding the peer's address).  Before
    the move the Node's kernel sends untagged and nothing answers; moved with VLAN 100 (also after a
    crash half-way, repaired) it answers, its own frames tagged by the pass-through flows, the
    physical link's IPv6 off (its kernel's own chatter would leave untagged); restored, the link is
    as it was, IPv6 included."""
    spec = UplinkSpec("eth0", "eth0~", vlan=100)
    with node("fb-utg") as n, netns("fb-utgp") as peer, OvsInstance("fb-utgp", netns=peer) as sw, \
            tempfile.TemporaryDirectory() as state:
        setup_host(n, peer, 3)
        sw.vsctl("add-br", "sw", "--", "set", "bridge", "sw", "datapath_type=netdev")
        sw.vsctl("add-port", "sw", "eth0p3", "--", "set", "port", "eth0p3", "vlan_mode=trunk", "trunks=100")
        sw.vsctl("add-port", "sw", "in0", "--", "set", "interface", "in0", "type=internal", "--",
                 "set", "port", "in0", "tag=100")
        ns_sh(peer, "ip", "link", "set", "in0", "up")
        ns_sh(peer, "ip", "addr", "add", "192.168.60.100/24", "dev", "in0")
        ns_sh(peer, "ethtool", "-K", "eth0p3", "tx", "off")
        mover = UplinkMover(n.applier, spec, state, "netdev", netns=n.ns)
        try:
            before = mover.snapshot("eth0")
            ipv6_before = ns_sh(n.ns, "sysctl", "-n", "net.ipv6.conf.eth0.disable_ipv6").strip()
            assert " 0 received" in ns_sh(peer, "ping", "-c", "1", "-W", "1", "192.168.60.3", check=False)

            def crash(step: str) -> None:
                if step == "attached":
                    raise Crash(step)

            mover.after_step = crash
            with pytest.raises(Crash):
                mover.move()
            mover.close()
            mover = UplinkMover(n.applier, spec, state, "netdev", netns=n.ns)  # the next start
            assert mover.repair() == "moved" and mover.load().vlan == 100
            ns_sh(peer, "ping", "-c", "3", "-i", "0.2", "-W", "2", "192.168.60.3")
            flows = [f for f in n.applier.dump_flows() if f.cookie == UPLINK_COOKIE.value]
            assert sorted(f.actions for f in flows) == sorted(
                [f"push_vlan:0x8100,set_field:4196->vlan_vid,output:{mover.load().ports['eth0~']}",
                 f"pop_vlan,output:{mover.load().ports['eth0']}"]), flows
            assert all(f.n_packets > 0 for f in flows)
            assert ns_sh(n.ns, "sysctl", "-n", "net.ipv6.conf.eth0~.disable_ipv6").strip() == "1"
            assert mover.snapshot("eth0")["addresses"] == before["addresses"]  # IPv6 kept on the internal port
            assert mover.restore() is True
            assert mover.snapshot("eth0") == before
            assert ns_sh(n.ns, "sysctl", "-n", "net.ipv6.conf.eth0.disable_ipv6").strip() == ipv6_before
        finally:
            mover.close()
