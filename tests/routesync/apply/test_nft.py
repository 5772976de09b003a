"""NftApplier: the table's content, and real masquerading seen from an external host."""

from __future__ import annotations

import subprocess

import pytest

from routesync.apply.nft import NftApplier, render_inet
from routesync.model import NftPlan
from tests.routesync.apply.helpers import ns_sh, veth
from tests.support.ovs_instance import netns

PLAN = NftPlan(local_pod_cidrs=("10.244.1.0/24", "fd00:10:244:1::/64"),
               cluster_pod_cidrs=("10.244.1.0/24", "10.244.2.0/24", "fd00:10:244:2::/64"),
               snat_exclude=("192.168.50.1",), tunnel_udp_port=4789)

RECEIVE = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 9999)); s.settimeout(60)
print("ready", flush=True)
print(s.recvfrom(100)[1][0])
"""
SEND = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
while True:  # until the receiver has one and the test ends this
    s.sendto(b"x", (sys.argv[1], 9999)); time.sleep(0.05)
"""


def test_render_masquerade_off_and_gre() -> None:
    body = render_inet(PLAN)
    assert "ip saddr @local4 ip daddr != @cluster4 ip daddr != @nosnat4 masquerade" in body
    assert "udp dport 4789 notrack" in body
    off = render_inet(NftPlan(masquerade=False, local_pod_cidrs=("10.244.1.0/24",)))
    assert "masquerade" not in off and "notrack" not in off


def source_seen(ext: str, pod: str, dst: str) -> str:
    """The source address ``ext`` sees on a datagram from ``pod`` to ``dst``: the sender starts
    once the receiver is bound, and sends until it has one."""
    rx = subprocess.Popen(["ip", "netns", "exec", ext, "python3", "-c", RECEIVE],
                          stdout=subprocess.PIPE, text=True)
    assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
    tx = subprocess.Popen(["ip", "netns", "exec", pod, "python3", "-c", SEND, dst])
    try:
        out, _ = rx.communicate(timeout=90)
    finally:
        tx.kill()
        tx.wait()
    return out.strip()


@pytest.mark.root
def test_masquerade_pod_egress_real_traffic() -> None:
    with netns("fb-nf1") as node, netns("fb-nf1p") as pod, netns("fb-nf1e") as ext:
        veth(node, "gw", pod, "eth0")
        veth(node, "eth0", ext, "eth0")
        ns_sh(node, "ip", "addr", "add", "10.244.1.1/24", "dev", "gw")
        ns_sh(node, "ip", "addr", "add", "192.168.50.1/24", "dev", "eth0")
        ns_sh(node, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        ns_sh(node, "ip", "route", "add", "10.244.2.0/24", "via", "192.168.50.2")  # "other Node"
        ns_sh(pod, "ip", "addr", "add", "10.244.1.2/24", "dev", "eth0")
        ns_sh(pod, "ip", "route", "add", "default", "via", "10.244.1.1")
        ns_sh(ext, "ip", "addr", "add", "192.168.50.2/24", "dev", "eth0")
        ns_sh(ext, "ip", "addr", "add", "10.244.2.5/32", "dev", "eth0")

        assert source_seen(ext, pod, "192.168.50.2") == "10.244.1.2"  # no table yet
        nft = NftApplier(netns=node)
        assert nft.sync(PLAN).inet_written
        assert not nft.sync(PLAN).inet_written  # same plan: nothing written
        listing = ns_sh(node, "nft", "list", "table", "inet", "ferry")
        assert "masquerade" in listing and "10.244.2.0/24" in listing
        assert source_seen(ext, pod, "192.168.50.2") == "192.168.50.1"  # masqueraded
        assert source_seen(ext, pod, "10.244.2.5") == "10.244.1.2"  # cluster Pod CIDR: not

        # noSNAT: the Pod's own address reaches the external host
        nft.sync(NftPlan(masquerade=False, local_pod_cidrs=PLAN.local_pod_cidrs,
                         cluster_pod_cidrs=PLAN.cluster_pod_cidrs))
        ns_sh(node, "conntrack", "-F", check=False)
        assert "masquerade" not in ns_sh(node, "nft", "list", "table", "inet", "ferry")
        assert source_seen(ext, pod, "192.168.50.2") == "10.244.1.2"

        # a table deleted by hand comes back; another table is never touched
        ns_sh(node, "nft", "add", "table", "ip", "other")
        ns_sh(node, "nft", "delete", "table", "inet", "ferry")
        assert nft.sync(PLAN).inet_written
        nft.delete()
        tables = ns_sh(node, "nft", "list", "tables")
        assert "ferry" not in tables and "table ip other" in tables


@pytest.mark.root
def test_libnftables_writes_what_nft_writes_in_its_netns_only() -> None:
    """The in-process applier (libnftables, no exec) and the exec one produce the same tables,
    inside the given namespace only; its thread is back in its own namespace between calls
    (nothing holds the Node's netns); nft's errors come back as NftError."""
    import os
    import threading

    from routesync.apply.nft import NftError

    root_before = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout
    plan = NftPlan(local_pod_cidrs=PLAN.local_pod_cidrs, tunnel_udp_port=4789, uplink_ingress_drop="eth0~",
                   cluster_pod_cidrs=tuple(f"10.{i // 250}.{i % 250}.0/24" for i in range(1000)))
    with netns("fb-nf4") as a, netns("fb-nf4b") as b:
        for ns in (a, b):
            ns_sh(ns, "ip", "link", "add", "eth0~", "type", "veth", "peer", "name", "eth0p")
        native, execd = NftApplier(netns=a), NftApplier(netns=b, native=False)
        try:
            assert native.native and not execd.native
            assert native.sync(plan).inet_written and execd.sync(plan).inet_written
            for family, table in (("inet", "ferry"), ("netdev", "ferry_uplink")):
                assert (ns_sh(a, "nft", "list", "table", family, table)
                        == ns_sh(b, "nft", "list", "table", family, table))
            assert native.fingerprint("inet", "ferry") == execd.fingerprint("inet", "ferry") is not None
            assert not native.sync(plan).inet_written  # read back through the library: equal
            lib = native._lib
            assert lib is not None
            tid = lib.call(threading.get_native_id)
            assert os.readlink(f"/proc/self/task/{tid}/ns/net") == os.readlink("/proc/self/ns/net")
            with pytest.raises(NftError, match="nft"):
                native._nft("-f", "-", stdin="table inet ferry { chain c { bogus; } }\n")
            native.delete()
            assert "ferry" not in ns_sh(a, "nft", "list", "tables")
        finally:
            native.close()
            execd.close()
    assert subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout == root_before


def _handle(ns: str) -> str:
    """The kernel's handle of table inet ferry (a re-created table gets a new one)."""
    first = ns_sh(ns, "nft", "-a", "list", "table", "inet", "ferry").splitlines()[0]
    return first.split("# handle")[1].strip()


def _elements(ns: str, name: str) -> str:
    return ns_sh(ns, "nft", "list", "set", "inet", "ferry", name)


@pytest.mark.root
def test_a_node_change_updates_set_elements_in_place() -> None:
    """Between full passes, a change of the Pod CIDR set changes elements only (no table
    re-creation: its kernel handle stays); removals may trail the additions but land before
    the next command; an overlapping change is one transaction; a full pass afterwards finds
    nothing to write; a removal that fails makes the next change write the table whole; a
    change of shape (masquerade off) writes it whole."""
    base = ("10.244.1.0/24", "10.244.2.0/24")
    a = NftPlan(local_pod_cidrs=("10.244.1.0/24",), cluster_pod_cidrs=(*base, "11.0.0.0/24", "12.0.0.0/24"),
                tunnel_udp_port=4789)
    b = NftPlan(local_pod_cidrs=a.local_pod_cidrs, cluster_pod_cidrs=(*base, "11.0.0.0/24", "13.0.0.0/24"),
                tunnel_udp_port=4789)
    c = NftPlan(local_pod_cidrs=a.local_pod_cidrs, cluster_pod_cidrs=(*base, "11.0.0.0/23", "13.0.0.0/24"),
                tunnel_udp_port=4789)
    with netns("fb-nf5") as ns:
        nft = NftApplier(netns=ns)
        try:
            assert nft.sync(a).inet_written
            handle = _handle(ns)
            assert nft.sync(b, verify=False, defer_removals=True).inet_written
            nft._settle()
            got = _elements(ns, "cluster4")
            assert "13.0.0.0/24" in got and "12.0.0.0/24" not in got and _handle(ns) == handle
            assert not nft.sync(b).inet_written  # a full pass: the comment is a's, the content b's
            assert nft.sync(c, verify=False, defer_removals=True).inet_written  # 11.0.0.0/24 -> /23
            got = _elements(ns, "cluster4")
            assert "11.0.0.0/23" in got and "11.0.0.0/24" not in got and _handle(ns) == handle
            assert not nft.sync(c).inet_written and not nft.sync(c, verify=False).inet_written
            # a removal nft refuses (the element went by hand): the next change writes the table
            ns_sh(ns, "nft", "delete", "element", "inet", "ferry", "cluster4", "{ 13.0.0.0/24 }")
            assert nft.sync(a, verify=False, defer_removals=True).inet_written
            nft.sync(a, verify=False)
            assert _handle(ns) != handle and "12.0.0.0/24" in _elements(ns, "cluster4")
            handle = _handle(ns)
            assert not nft.sync(a).inet_written
            off = NftPlan(masquerade=False, local_pod_cidrs=a.local_pod_cidrs, cluster_pod_cidrs=b.cluster_pod_cidrs,
                          tunnel_udp_port=4789)
            assert nft.sync(off, verify=False).inet_written and _handle(ns) != handle
            assert "masquerade" not in ns_sh(ns, "nft", "list", "table", "inet", "ferry")
        finally:
            nft.close()


def test_element_delta_is_what_collapse_gives() -> None:
    from routesync.apply.nft import element_delta

    a = NftPlan(local_pod_cidrs=("10.0.0.0/24",), cluster_pod_cidrs=("10.0.1.0/24", "fd00:1::/64"))
    b = NftPlan(local_pod_cidrs=("10.0.0.0/24",), cluster_pod_cidrs=("10.0.2.0/24", "fd00:1::/64", "fd00:2::/64"))
    # cluster4: 10.0.0.0/23 (local + 10.0.1.0/24 collapsed) -> 10.0.0.0/24 + 10.0.2.0/24
    assert element_delta(a, b) == (("add element inet ferry cluster4 { 10.0.0.0/24, 10.0.2.0/24 }\n"
                                   "add element inet ferry cluster6 { fd00:2::/64 }\n"),
                                   "delete element inet ferry cluster4 { 10.0.0.0/23 }\n", True)
    c = NftPlan(local_pod_cidrs=("10.0.0.0/24",), cluster_pod_cidrs=("10.0.4.0/24", "fd00:1::/64"))
    assert element_delta(b, c) == ("add element inet ferry cluster4 { 10.0.4.0/24 }\n",
                                   ("delete element inet ferry cluster4 { 10.0.2.0/24 }\n"
                                   "delete element inet ferry cluster6 { fd00:2::/64 }\n"), False)
