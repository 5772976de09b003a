"""cni.ovs.openflow.bridge (native adds/deletes/bundles, ovs-ofctl dumps) against a private
vswitchd: flows seen by ovs-ofctl, deleted exactly by cookie, and a ping forwarded by a netdev
bridge through flows installed with it."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator

import pytest

from cni.kernel.ethtool import set_tx_checksum
from cni.kernel.netlink import Netlink
from cni.kernel.netns import entered, open_netns
from cni.ovs.openflow.bridge import OpenFlow
from cni.ovs.openflow.codec import OpenFlowError
from cni.ovs.openflow.ofctl import OfctlError, parse_flow_line
from cni.ovs.ovsdb import Ovsdb
from cni.pipeline import match as m
from cni.pipeline.actions import DEC_TTL, DROP, SetField, goto, output
from cni.pipeline.tables import BASE_COOKIE, Cookie, Flow, Owner, Table, pod_cookie
from tests.support.names import uniq
from tests.support.ovs_instance import OvsInstance
from tests.support.waiting import until

BR = "fs-br"


@pytest.fixture
def of(ovs: OvsInstance) -> Iterator[OpenFlow]:
    with Ovsdb(ovs.db) as db:
        db.ensure_bridge(BR, "netdev")
    yield OpenFlow(BR, ovs.run_dir)


def pod_flows(cookie: Cookie, port: int) -> list[Flow]:
    return [
        Flow(Table.CLASSIFIER, 100, (m.IN_PORT(port),), (goto(Table.SPOOF_GUARD),), cookie),
        Flow(Table.SPOOF_GUARD, 200, (m.IP, m.IN_PORT(port), m.ETH_SRC(f"02:00:00:00:00:{port:02x}"),
                                      m.IPV4_SRC(f"10.9.0.{port}")), (goto(Table.L3_FORWARDING),), cookie),
        Flow(Table.L3_FORWARDING, 200, (m.IP, m.IPV4_DST(f"10.9.0.{port}")),
             (SetField(m.ETH_DST, m.mac_value(f"02:00:00:00:00:{port:02x}")), DEC_TTL, goto(Table.L2_FORWARDING)),
             cookie),
    ]


def test_parse_flow_line() -> None:
    line = (" cookie=0x2000000000000ab, duration=1.5s, table=30, n_packets=7, n_bytes=686, "
            "idle_age=3, priority=200,ip,nw_dst=10.9.0.1 actions=dec_ttl,goto_table:40")
    f = parse_flow_line(line)
    assert f is not None
    assert (f.table, f.priority, f.cookie, f.match, f.actions, f.n_packets, f.n_bytes) == (
        30, 200, 0x2000000000000AB, "ip,nw_dst=10.9.0.1", "dec_ttl,goto_table:40", 7, 686)
    assert parse_flow_line("OFPST_FLOW reply (OF1.4) (xid=0x2):") is None
    miss = parse_flow_line(" cookie=0x0, duration=1s, table=0, n_packets=0, n_bytes=0, priority=0 actions=drop")
    assert miss is not None and (miss.priority, miss.match, miss.actions) == (0, "", "drop")
    assert (f.duration, miss.duration) == (1.5, 1.0)


@pytest.mark.root
def test_add_dump_delete_by_cookie(ovs: OvsInstance, of: OpenFlow) -> None:
    a, b = pod_cookie("ctr-a", "eth0"), pod_cookie("ctr-b", "eth0")
    base = [Flow(Table.L2_FORWARDING, 0, (), DROP, BASE_COOKIE)]
    of.add_flows(pod_flows(a, 3) + pod_flows(b, 4) + base)
    text = ovs.ofctl("dump-flows", BR)  # ovs-ofctl's own view
    assert text.count(f"cookie={a.value:#x}") == 3 and text.count(f"cookie={b.value:#x}") == 3
    # Added over OpenFlow 1.0+NXM, where goto_table travels as resubmit(,T) (the same walk, as the
    # last action of a flow).
    assert re.search(rf"set_field:02:00:00:00:00:03->eth_dst,dec_ttl,goto_table:{int(Table.L2_FORWARDING)}", text)
    dumped = of.dump_flows()
    assert len(dumped) == 7
    assert {(f.table, f.priority, f.match) for f in of.dump_flows(a)} == {
        (0, 100, "in_port=3"), (10, 200, "ip,in_port=3,dl_src=02:00:00:00:00:03,nw_src=10.9.0.3"),
        (int(Table.L3_FORWARDING), 200, "ip,nw_dst=10.9.0.3")}
    l3 = int(Table.L3_FORWARDING)
    assert [f.match for f in of.dump_flows(table=l3)] and all(f.table == l3 for f in of.dump_flows(table=l3))
    assert [f.cookie for f in of.dump_flows(b, table=0)] == [b.value]
    of.del_flows(a)
    after = of.dump_flows()
    assert {f.cookie for f in after} == {b.value, BASE_COOKIE.value} and len(after) == 4
    assert f"cookie={a.value:#x}" not in ovs.ofctl("dump-flows", BR)
    of.del_flows(Cookie.owner_match(Owner.POD))  # every per-Pod flow, base flows stay
    assert [f.cookie for f in of.dump_flows()] == [BASE_COOKIE.value]


@pytest.mark.root
def test_replace_flows_atomically(of: OpenFlow) -> None:
    a, b = pod_cookie("ctr-a", "eth0"), pod_cookie("ctr-b", "eth0")
    of.add_flows(pod_flows(a, 3) + pod_flows(b, 4))
    new = pod_flows(a, 5)[:2]
    of.replace_flows(a, new)
    assert {(f.table, f.match) for f in of.dump_flows(a)} == {(int(f.table), f.match_text()) for f in new}
    assert len(of.dump_flows(b)) == 3
    of.replace_flows(a, [], atomic=False)
    assert of.dump_flows(a) == []


@pytest.mark.root
def test_refused_flow_raises(of: OpenFlow) -> None:
    backwards = (goto(Table.CLASSIFIER),)  # goto_table must go forwards: the switch refuses it
    with pytest.raises(OpenFlowError, match="refused"):
        of.add_flows([Flow(Table.SPOOF_GUARD, 1, (), backwards)])
    # Nothing of a failing batch in a bundle stays.
    c = pod_cookie("x", "eth0")
    with pytest.raises(OpenFlowError):
        of.replace_flows(c, [Flow(Table.CLASSIFIER, 5, (m.IN_PORT(1),), DROP, c),
                             Flow(Table.SPOOF_GUARD, 6, (m.IN_PORT(1),), backwards, c)])
    assert of.dump_flows(c) == []


@pytest.mark.root
def test_missing_bridge_raises(ovs: OvsInstance) -> None:
    with pytest.raises(OfctlError, match="fs-nobr"):
        OpenFlow("fs-nobr", ovs.run_dir).dump_flows()


@pytest.mark.root
def test_netdev_bridge_forwards_ping_and_tcp_with_our_flows(ovs: OvsInstance, of: OpenFlow,
                                                            make_netns) -> None:  # type: ignore[no-untyped-def]
    node = f"/run/netns/{ovs.netns}"
    pods = []
    with Ovsdb(ovs.db) as db, Netlink.in_netns(node) as nl:
        for i in (1, 2):
            pod = make_netns(f"p{i}")
            host, mac, ip = uniq("h"), f"02:00:00:00:01:{i:02x}", f"10.9.0.{i}"
            fd = open_netns(f"/run/netns/{pod}")
            try:
                nl.create_veth(host, "eth0", fd, mtu=1500, peer_mac=mac)
            finally:
                os.close(fd)
            nl.link_set(host, up=True)
            with Netlink.in_netns(f"/run/netns/{pod}") as pnl:
                idx = pnl.link_index("eth0")
                assert idx is not None
                pnl.addr_add(idx, f"{ip}/24")
                pnl.link_set(idx, up=True)
            with entered(f"/run/netns/{pod}"):
                set_tx_checksum("eth0", False)  # netdev datapath: no partial checksums
            ofport = db.add_port(BR, host, {"ferry-owner": "pod"})
            pods.append((pod, mac, ip, ofport))
    flows = [Flow(Table.CLASSIFIER, 0, (), DROP, BASE_COOKIE),
             Flow(Table.L2_FORWARDING, 0, (), DROP, BASE_COOKIE)]
    for _pod, mac, ip, port in pods:
        c = pod_cookie(ip, "eth0")
        flows += [Flow(Table.CLASSIFIER, 100, (m.IN_PORT(port),), (goto(Table.L2_FORWARDING),), c),
                  Flow(Table.L2_FORWARDING, 100, (m.ETH_DST(mac),), (output(port),), c),
                  Flow(Table.L2_FORWARDING, 50, (m.ARP, m.ARP_TPA(ip)), (output(port),), c)]
    of.add_flows(flows)
    (pa, _, _, _), (_, _, ipb, portb) = pods
    ping = subprocess.run(["ip", "netns", "exec", pa, "ping", "-c", "2", "-i", "0.2", "-W", "2", ipb],
                          check=False, capture_output=True, text=True, timeout=20)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    def to_b() -> int:
        return sum(f.n_packets for f in of.dump_flows(table=int(Table.L2_FORWARDING))
                   if f.actions == f"output:{portb}")

    # datapath stats reach the OpenFlow table when the revalidators have run a pass
    until(lambda: ovs.appctl("revalidator/wait") is not None and to_b() >= 3,
          "ARP + 2 echo requests counted on our flows")
    # TCP too (needs TX checksum offload off in the Pods on a netdev datapath).
    server = subprocess.Popen(["ip", "netns", "exec", pods[1][0], "python3", "-c",
                               ("import socket;s=socket.create_server(('0.0.0.0',5201));print('ready',flush=True);"
                                "c,_=s.accept();c.sendall(c.recv(100)[::-1]);c.close()")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"  # listening
        client = subprocess.run(["ip", "netns", "exec", pa, "python3", "-c",
                                 (f"import socket\ns=socket.create_connection(('{ipb}',5201),timeout=30)\n"
                                  "s.sendall(b'ferry');print(s.recv(100).decode())")],
                                check=False, capture_output=True, text=True, timeout=90)
        assert client.stdout.strip() == "yrref", client.stderr
    finally:
        server.kill()
        server.wait()
    # Removing one Pod's flows by cookie cuts exactly that Pod off.
    of.del_flows(pod_cookie(ipb, "eth0"))
    ping = subprocess.run(["ip", "netns", "exec", pa, "ping", "-c", "1", "-W", "1", ipb],
                          check=False, capture_output=True, text=True, timeout=20)
    assert ping.returncode != 0
