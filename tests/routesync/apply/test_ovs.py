"""OvsApplier against a private OVS: bridge, ports, and the per-cookie flow sync."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from cni.ovs.openflow.ofctl import DumpedFlow, parse_dump
from cni.pipeline import match as m
from cni.pipeline.actions import DROP, SetField, goto, output
from cni.pipeline.tables import (
    BASE_COOKIE,
    EXT_GATEWAY_MAC,
    NODE_COOKIE,
    Flow,
    Table,
    peer_cookie,
    pod_cookie,
)
from routesync.apply.ovs import (
    OvsApplier,
    OvsError,
    group_installed,
    plan_flow_sync,
)
from routesync.model import TunnelSpec
from tests.routesync.apply.helpers import node, ns_sh
from tests.support.ovs_instance import OvsInstance, netns
from tests.support.waiting import until

DUMP = """OFPST_FLOW reply (OF1.3) (xid=0x2):
 cookie=0x400000000000000, duration=0.006s, table=0, n_packets=3, n_bytes=180, udp,tp_dst=4789 actions=drop
 cookie=0x300000000000001, duration=1.5s, table=30, n_packets=0, n_bytes=0, priority=200,ip,nw_dst=10.244.2.0/24 \
actions=set_field:192.168.1.2->tun_dst,output:3
 cookie=0x200000000000007, duration=0.006s, table=0, n_packets=0, n_bytes=0, priority=100,in_port=9 \
actions=goto_table:10
"""


def test_parse_dump_and_grouping_leave_pod_flows_out() -> None:
    flows = parse_dump(DUMP)
    assert [(f.cookie, f.table, f.priority) for f in flows] == [
        (0x400000000000000, 0, 32768), (0x300000000000001, 30, 200), (0x200000000000007, 0, 100)]
    assert flows[0].match == "udp,tp_dst=4789" and flows[0].n_packets == 3
    assert flows[1].actions == "set_field:192.168.1.2->tun_dst,output:3"
    assert set(group_installed(flows)) == {0x400000000000000, 0x300000000000001}  # no POD


def test_plan_flow_sync() -> None:
    a, b = frozenset({(0, 1, "x", "drop")}), frozenset({(0, 2, "y", "drop")})
    add, replace, delete, unchanged = plan_flow_sync({1: a, 2: b, 3: a}, {1: a, 2: a, 4: b})
    assert (add, replace, delete, unchanged) == ([3], [2], [4], 1)


def peer_flows(name: str, tun_dst: str, cidr: str) -> list[Flow]:
    c = peer_cookie(name)
    return [Flow(Table.L3_FORWARDING, 200, (m.IP, m.IPV4_DST(cidr)),
                 (SetField(m.ETH_DST, m.mac_value("aa:bb:cc:dd:ee:ff")),
                  SetField(m.TUN_DST, m.IPV4_DST(tun_dst).value), output(3)), c),
            # written in a non-canonical way on purpose: OVS prints it as "udp,..."
            Flow(Table.CLASSIFIER, 100, (m.Field(m.ETH_TYPE, 0x0800), m.Field(m.IP_PROTO, 17), m.IPV4_SRC(tun_dst)),
                 (goto(Table.L3_FORWARDING),), c)]


def base_flows() -> list[Flow]:
    return [Flow(Table.CLASSIFIER, 0, (), DROP, BASE_COOKIE),
            Flow(Table.L3_FORWARDING, 0, (), (goto(Table.L2_FORWARDING),), BASE_COOKIE),
            Flow(Table.CLASSIFIER, 50, (m.IN_PORT(3),),
                 (SetField(m.ETH_DST, m.mac_value("02:00:00:00:00:01")), goto(Table.L3_FORWARDING)), NODE_COOKIE)]


def installed(app: OvsApplier) -> dict[int, list]:
    return group_installed(app.dump_flows())


AGE = 0.2  # s: how much older the flows are than anything a sync would re-install
SLACK = 0.05  # s: durations print in ms and are taken flow by flow within one dump


def reinstalled(before: list[DumpedFlow], after: list[DumpedFlow], ref_cookie: int) -> set[int]:
    """Cookies with a flow (re)installed between two dumps.  A flow left alone ages exactly as
    much as the reference flows (``ref_cookie``: flows no sync touches) between the dumps; one
    re-installed is younger than that by its age at ``before`` (>= AGE: the test paused so).
    Only OVS's own durations are compared, so how fast the machine is does not matter."""
    def key(f: DumpedFlow) -> tuple[int, int, int, str, str]:
        return (f.cookie, *f.canon())

    was = {key(f): f.duration for f in before}
    ref = [f.duration - was[key(f)] for f in after if f.cookie == ref_cookie and key(f) in was]
    assert ref, f"no reference flow with cookie {ref_cookie:#x} in both dumps"
    elapsed = min(ref)
    return {f.cookie for f in after if key(f) not in was or f.duration - was[key(f)] < elapsed - SLACK}


@pytest.mark.root
def test_flow_sync_exact_idempotent_replace_stale_and_pod_survive() -> None:
    with node("fb-of1") as n:
        app = n.applier
        # What an "earlier run" and the plugin left: a stale peer group and a Pod's flows.
        pod = pod_cookie("c0ffee", "eth0")
        n.ovs.ofctl("add-flows", "br-int", "-", input=(
            f"table=0,priority=100,cookie=0x{pod.value:x},in_port=9,actions=goto_table:10\n"
            f"table={int(Table.L2_FORWARDING)},priority=200,cookie=0x{pod.value:x},dl_dst=02:00:00:00:00:09,"
            "actions=output:9\n"
            f"table={int(Table.L3_FORWARDING)},priority=200,cookie=0x{peer_cookie('gone').value:x},ip,nw_dst=10.9.0.0/24,"
            "actions=output:3\n"))
        desired = base_flows() + peer_flows("b", "192.168.7.2", "10.244.2.0/24") + \
            peer_flows("c", "192.168.7.3", "10.244.3.0/24")
        d1 = app.sync_flows(desired)
        assert sorted(d1.added) == sorted({f.cookie.value for f in desired})
        assert d1.deleted == [peer_cookie("gone").value]
        got = installed(app)
        assert {c: len(v) for c, v in got.items()} == {
            BASE_COOKIE.value: 2, NODE_COOKIE.value: 1, peer_cookie("b").value: 2,
            peer_cookie("c").value: 2}
        pod_flows = [f for f in app.dump_flows() if f.cookie == pod.value]
        assert len(pod_flows) == 2

        time.sleep(AGE)  # not a wait: it makes a re-installed flow tell from an untouched one
        before = app.dump_flows()
        d2 = app.sync_flows(desired)
        assert not d2.changed and d2.flows_sent == 0 and d2.unchanged == 4
        after = app.dump_flows()
        assert reinstalled(before, after, pod.value) == set()  # nothing was re-added

        # peer b's tunnel address changed: its group is replaced, c's flows stay as they were
        desired2 = base_flows() + peer_flows("b", "192.168.7.22", "10.244.2.0/24") + \
            peer_flows("c", "192.168.7.3", "10.244.3.0/24")
        d3 = app.sync_flows(desired2)
        assert d3.replaced == [peer_cookie("b").value] and not d3.added and not d3.deleted
        now = installed(app)
        assert all("192.168.7.22" in f.actions or "192.168.7.22" in f.match
                   for f in now[peer_cookie("b").value])
        assert reinstalled(after, app.dump_flows(), pod.value) == {peer_cookie("b").value}  # c left alone

        # peer c removed: exactly its group goes; Pod flows still untouched
        d4 = app.sync_flows(base_flows() + peer_flows("b", "192.168.7.22", "10.244.2.0/24"))
        assert d4.deleted == [peer_cookie("c").value]
        assert peer_cookie("c").value not in installed(app)
        assert len([f for f in app.dump_flows() if f.cookie == pod.value]) == 2

        # a flow deleted by hand (drift) is restored by the next sync
        n.ovs.ofctl("del-flows", "br-int", f"cookie={peer_cookie('b').match()},table={int(Table.L3_FORWARDING)}")
        d5 = app.sync_flows(base_flows() + peer_flows("b", "192.168.7.22", "10.244.2.0/24"))
        assert d5.replaced == [peer_cookie("b").value]
        assert len(installed(app)[peer_cookie("b").value]) == 2

        with pytest.raises(ValueError):
            app.sync_flows([Flow(Table.CLASSIFIER, 1, (), DROP, pod)])


@pytest.mark.root
def test_bridge_gateway_tunnel_ports() -> None:
    with node("fb-op1") as n:
        app = n.applier
        assert n.ovs.vsctl("get", "bridge", "br-int", "fail_mode").strip() == "secure"
        assert "OpenFlow13" in n.ovs.vsctl("get", "bridge", "br-int", "protocols")
        ofport, mac = app.ensure_gateway()
        assert ofport > 0 and mac.startswith("02:")
        # the kernel device carries that MAC, and a second call (a restart) keeps it
        assert mac in ns_sh(n.ns, "ip", "link", "show", "ferry-gw0")
        app.close()
        again = OvsApplier(n.ovs.db, "br-int", n.ovs.run_dir)
        try:
            assert again.ensure_gateway() == (ofport, mac)
            assert again._get("Interface", "ferry-gw0", "external_ids")[EXT_GATEWAY_MAC] == mac
            # tunnel: created flow-based, kept, replaced on type change, removed on None
            t1 = again.ensure_tunnel(TunnelSpec("vxlan", "ferry-tun0", 4789), None)
            assert again.ensure_tunnel(TunnelSpec("vxlan", "ferry-tun0", 4789), None) == t1
            opts = n.ovs.vsctl("get", "interface", "ferry-tun0", "options")
            assert 'remote_ip=flow' in opts and 'key=flow' in opts and 'dst_port="4789"' in opts
            again.ensure_tunnel(TunnelSpec("geneve", "ferry-tun0", 6081), None)
            assert n.ovs.vsctl("get", "interface", "ferry-tun0", "type").strip() == "geneve"
            again.ensure_tunnel(TunnelSpec("gre", "ferry-tun0", None), None)
            assert "dst_port" not in n.ovs.vsctl("get", "interface", "ferry-tun0", "options")
            assert again.ensure_tunnel(None, None) is None
            assert "ferry-tun0" not in n.ovs.vsctl("list-ports", "br-int")
            assert again.datapath_id()
        finally:
            again.close()


def _answers(app: OvsApplier) -> bool:
    try:
        app.dump_flows()
    except Exception:  # noqa: BLE001 - not yet
        return False
    return True


@pytest.mark.root
def test_the_denied_log_meter_and_flows_sync_like_any_other() -> None:
    """The meter is made, then changed in place; the policy flows that use it (controller with
    userdata and meter_id) read back as their canonical text, so a second sync sends nothing."""
    from cni.pipeline.tables import DENIED_LOG_METER
    from routesync.policy import plan as pp
    from routesync.policy.model import Pod, policy_from

    with node("fb-dl1") as n:
        app = n.applier
        app.ensure_meter(DENIED_LOG_METER, 100, 1000)
        app.ensure_meter(DENIED_LOG_METER, 20, 50)  # there already: modified
        meters = n.ovs.ofctl("dump-meters", "br-int")
        assert "meter=1 pktps burst stats" in meters and "rate=20 burst_size=50" in meters, meters
        connects = app.session.connects
        app.ensure_meter(DENIED_LOG_METER, 20, 50)  # made already for this ovs-vswitchd: nothing sent
        assert app.session.connects == connects
        deny = policy_from({"metadata": {"namespace": "ns", "name": "deny"},
                            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}})
        pod = Pod("ns", "p", "n1", (), ("10.244.1.5", "fd00:10:244:1::5"), ())
        flows = pp.plan(pp.Inputs((pod,), {"ns": ()}, (deny,)), pp.NodeFacts("n1", denied_log=True)).flows
        desired = base_flows() + flows
        first = app.sync_flows(desired)
        assert len(first.added) == 2 + len(flows)  # the base flows: 2 cookies; a policy flow: its own
        assert any("controller(" in f for f in n.ovs.ofctl("dump-flows", "br-int").splitlines())
        again = app.sync_flows(desired)
        assert not again.changed, again


@pytest.mark.root
def test_vswitchd_restart_detected_and_flows_reinstalled() -> None:
    with node("fb-or1") as n:
        app = n.applier
        desired = base_flows() + peer_flows("b", "192.168.7.2", "10.244.2.0/24")
        app.sync_flows(desired)
        before = app.vswitchd_instance()  # what the applier replays Pod flows once per
        assert before is not None and app.vswitchd_instance() == before
        d = n.ovs.dir
        old = n.ovs._pids[1]
        n.ovs.appctl("exit")
        until(lambda: not os.path.exists(f"/proc/{old}"), f"ovs-vswitchd {old} to exit")
        subprocess.run(["ip", "netns", "exec", n.ns, "ovs-vswitchd", n.ovs.db,
                        f"--pidfile={d}/ovs-vswitchd.pid", f"--log-file={d}/ovs-vswitchd.log",
                        f"--unixctl={d}/ovs-vswitchd.ctl", "--detach", "--no-chdir"],
                       env=n.ovs.env, check=True, capture_output=True)
        with open(f"{d}/ovs-vswitchd.pid") as f:
            new = int(f.read().strip())
        assert new and new != old
        n.ovs._pids[1] = new  # so the fixture stops the new daemon
        until(lambda: _answers(app), "the bridge to answer OpenFlow again")
        assert app.vswitchd_instance() != before
        assert installed(app) == {}  # OVS lost every flow
        t0 = time.perf_counter()
        res = app.sync_flows(desired)
        print(f"re-install after vswitchd restart: {1000 * (time.perf_counter() - t0):.1f} ms")
        assert len(res.added) == 3 and len(installed(app)) == 3


@pytest.mark.root
def test_sync_1000_peers_timing() -> None:
    with node("fb-ot1") as n:
        app = n.applier
        desired = base_flows()
        for i in range(1000):
            desired += peer_flows(f"n{i}", f"192.168.{i // 250}.{i % 250 + 1}",
                                  f"10.{i // 256}.{i % 256}.0/24")
        t0 = time.perf_counter()
        d1 = app.sync_flows(desired)
        t1 = time.perf_counter()
        d2 = app.sync_flows(desired)
        t2 = time.perf_counter()
        desired[-1] = Flow(desired[-1].table, desired[-1].priority, desired[-1].match,
                           (goto(Table.L2_FORWARDING),), desired[-1].cookie)
        d3 = app.sync_flows(desired)
        t3 = time.perf_counter()
        print(f"1000 peers ({len(desired)} flows): first sync {1000 * (t1 - t0):.0f} ms, "
              f"no-op re-sync {1000 * (t2 - t1):.0f} ms, one peer changed {1000 * (t3 - t2):.0f} ms")
        assert len(d1.added) == 1002 and not d2.changed and len(d3.replaced) == 1
        assert len(app.dump_flows()) == len(desired)


@pytest.mark.root
def test_planned_flows_go_natively_and_read_back_unchanged_after_the_bridge_is_recreated() -> None:
    """route-sync's own flows (masked CIDRs, tunnel destinations) travel over the persistent
    OpenFlow connection, no ovs-ofctl exec; a full sync compares them with OVS's dump as equal;
    after the bridge is re-created (flows gone, the connection dead) the next sync reconnects."""
    from cni.pipeline.flows import GatewayPort
    from cni.pipeline.flows import base_flows as planned_base
    from routesync.model import PeerPlan
    from routesync.peerflows import node_flows
    from routesync.peerflows import peer_flows as planned_peer

    gw = GatewayPort(ofport=2, mac="02:00:00:00:00:01", addresses=("10.244.1.1/24", "fd00:1::1/64"))
    desired = planned_base(gw) + node_flows(3, gw.mac)
    for i in range(20):
        desired += planned_peer(PeerPlan(f"p{i}", 4, "tunnel", f"192.168.7.{i + 2}", (f"10.244.{i + 2}.0/24",),
                                         f"10.244.{i + 2}.1"), gw.mac, 3)
        desired += planned_peer(PeerPlan(f"p{i}", 6, "tunnel", f"fd00:7::{i + 2:x}", (f"fd00:244:{i + 2:x}::/64",),
                                         f"fd00:244:{i + 2:x}::1"), gw.mac, 3)
    with node("fb-of9") as n:
        app = n.applier
        d1 = app.sync_flows(desired)
        assert d1.flows_sent == len(desired)
        assert (app.native_bundles, app.ofctl_bundles) == (1, 0)
        d2 = app.sync_flows(desired)
        assert not d2.changed and d2.unchanged == len({f.cookie.value for f in desired})
        moved = [f for f in desired if f.cookie != peer_cookie("p3")] + planned_peer(
            PeerPlan("p3", 4, "tunnel", "192.168.8.3", ("10.245.3.0/24",), "10.245.3.1"), gw.mac, 3)
        d3 = app.sync_flow_delta(desired, moved)
        assert d3.replaced == [peer_cookie("p3").value] and app.ofctl_bundles == 0
        assert not app.sync_flows(moved).changed
        n.ovs.vsctl("del-br", "br-int")  # every flow and the connection's bridge gone
        app.ensure_bridge("netdev")
        d4 = app.sync_flows(moved)
        assert len(d4.added) == len({f.cookie.value for f in moved}) and app.ofctl_bundles == 0
        assert app.session.connects == 2
        assert not app.sync_flows(moved).changed


def test_group_by_cookie_value_whatever_the_cookie_objects() -> None:
    from cni.pipeline.tables import Cookie, Owner
    from routesync.apply.ovs import _group

    a1, a2, b = Cookie(Owner.PEER, 1), Cookie(Owner.PEER, 1), Cookie(Owner.PEER, 2)
    f = [Flow(Table.L3_FORWARDING, 200, (m.IP, m.IPV4_DST(f"10.0.{i}.0/24")), DROP, c)
         for i, c in enumerate((a1, a1, b, a2, b))]
    assert _group(f) == {a1.value: (f[0], f[1], f[3]), b.value: (f[2], f[4])}
    assert _group([]) == {}


def test_node_state_rows_are_reused_for_the_same_plans() -> None:
    from cni.node import nodestate
    from routesync.model import PeerPlan
    from routesync.planner import _peer_rows

    p1 = PeerPlan("a", 4, "tunnel", "192.168.1.2", ("10.0.1.0/24",), "10.0.1.1")
    p2 = PeerPlan("b", 4, "tunnel", "192.168.1.3", ("10.0.2.0/24",), "10.0.2.1")
    rows: dict = {}
    first = _peer_rows([p1, p2], rows)
    p2b = PeerPlan("b", 4, "tunnel", "192.168.1.4", ("10.0.2.0/24",), "10.0.2.1")
    second = _peer_rows([p1, p2b], rows)
    assert second[0] is first[0] and second[1] is not first[1]
    assert second == _peer_rows([p1, p2b], None)
    assert second[1] == nodestate.Peer(name="b", addresses=["192.168.1.4"], podCIDRs=["10.0.2.0/24"], path="tunnel",
                                       mac=None, macSource=None)
    assert set(rows) == {id(p1), id(p2b)}


@pytest.mark.root
def test_a_large_first_bundle_goes_through_ovs_ofctl_and_changes_natively(monkeypatch) -> None:
    """Thousands of never-encoded flows (a first full pass) go through ovs-ofctl's C parser;
    a later change of one peer goes over the socket; both leave what a full sync reads back
    as equal."""
    import routesync.apply.ovs as ovs_mod
    from routesync.model import PeerPlan
    from routesync.peerflows import peer_flows as planned_peer

    monkeypatch.setattr(ovs_mod, "NATIVE_MAX_FRESH", 4)
    gmac = "02:00:00:00:00:01"
    desired = [f for i in range(10) for f in planned_peer(
        PeerPlan(f"p{i}", 4, "tunnel", f"192.168.7.{i + 2}", (f"10.244.{i + 2}.0/24",), f"10.244.{i + 2}.1"), gmac, 3)]
    with node("fb-of8") as n:
        app = n.applier
        app.sync_flows(desired)
        assert (app.native_bundles, app.ofctl_bundles) == (0, 1)
        moved = [f for f in desired if f.cookie != peer_cookie("p3")] + planned_peer(
            PeerPlan("p3", 4, "tunnel", "192.168.8.3", ("10.245.3.0/24",), "10.245.3.1"), gmac, 3)
        assert app.sync_flow_delta(desired, moved).replaced == [peer_cookie("p3").value]
        assert (app.native_bundles, app.ofctl_bundles) == (1, 1)
        assert not app.sync_flows(moved).changed


@pytest.mark.root
def test_policy_flows_sync_and_read_back_unchanged() -> None:
    """NetworkPolicy's flows (conjunction() clauses, conj_id, port ranges, registers) go through
    route-sync's sync: ovs-ofctl parse-flows of their texts (its canonical cache) equals OVS's dump,
    so a second sync changes nothing, and a changed clause replaces only its cookie group."""
    from cni.pipeline.actions import Conjunction
    from tests.cni.ovs.test_codec import POLICY_COOKIE, policy_flows

    desired = base_flows() + policy_flows()
    with node("fb-ofp") as n:
        app = n.applier
        d1 = app.sync_flows(desired)
        assert POLICY_COOKIE.value in d1.added and d1.flows_sent == len(desired)
        d2 = app.sync_flows(desired)
        assert not d2.changed and d2.flows_sent == 0
        assert len(installed(app)[POLICY_COOKIE.value]) == len(policy_flows())
        dns = [Flow(f.table, f.priority, (m.UDP, m.UDP_DST(5353)), (Conjunction(7, 3, 3),), f.cookie)
               if f.match_text() == "udp,tp_dst=53" else f for f in policy_flows()]
        moved = base_flows() + dns
        d3 = app.sync_flows(moved)
        assert d3.replaced == [POLICY_COOKIE.value] and not d3.added and not d3.deleted
        assert not app.sync_flows(moved).changed
        assert any("tp_dst=5353" in f.match for f in installed(app)[POLICY_COOKIE.value])


def test_a_new_vswitchd_with_the_old_pid_is_a_new_instance(tmp_path) -> None:
    """In a container's PID namespace a restarted ovs-vswitchd may get its predecessor's pid: the
    instance (pid + the pidfile's mtime) still changes, so route-sync replays the flows."""
    app = OvsApplier("unix:/nonexistent.sock", "br-int", str(tmp_path))
    pidfile = tmp_path / "ovs-vswitchd.pid"
    assert app.vswitchd_instance() is None
    pidfile.write_text("42\n")
    os.utime(pidfile, ns=(1_000_000_000, 1_000_000_000))
    first = app.vswitchd_instance()
    assert first is not None  # the first instance seen
    assert app.vswitchd_instance() == first  # the same one
    pidfile.write_text("42\n")  # the next container's ovs-vswitchd, same pid
    os.utime(pidfile, ns=(2_000_000_000, 2_000_000_000))
    second = app.vswitchd_instance()
    assert second is not None and second != first
    pidfile.write_text("43\n")  # another pid, same second
    os.utime(pidfile, ns=(2_000_000_000, 2_000_000_000))
    assert app.vswitchd_instance() not in (None, second)


def test_a_datapath_the_kernel_cannot_open_is_named_in_the_error() -> None:
    """``datapathType: system`` needs the kernel's openvswitch module: where it is there the bridge
    comes up; where it is not (this lab's kernel) the error names the key and the module, not a
    socket path."""
    if os.path.exists("/sys/module/openvswitch"):
        with node("fb-sysdp", datapath="system") as n:
            assert n.applier.ofport("br-int") > 0
        return
    with netns("fb-sysdp") as ns, OvsInstance("fb-sysdp", netns=ns) as ovs:
        app = OvsApplier(ovs.db, "br-int", ovs.run_dir, timeout=2.0)
        try:
            with pytest.raises(OvsError, match=r"bridge br-int: ovs-vswitchd did not open its datapath of type "
                                               r"system \(datapathType\) within 2 s: the kernel's openvswitch module"):
                app.ensure_bridge("system")
        finally:
            app.close()
