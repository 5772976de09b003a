"""NftApplier: the table's content, and real masquerading seen from an external host."""

from __future__ import annotations

import subprocess

import pytest

from routesync.apply.nft import NftApplier, render_inet
from routesync.model import NftPlan
from tests.ovs_instance import netns
from tests.routesync_apply.helpers import ns_sh, veth

PLAN = NftPlan(local_pod_cidrs=("10.244.1.0/24", "fd00:10:244:1::/64"),
               cluster_pod_cidrs=("10.244.1.0/24", "10.244.2.0/24", "fd00:10:244:2::/64"),
               snat_exclude=("192.168.50.1",), tunnel_udp_port=4789)

RECEIVE = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 9999)); s.settimeout(5)
print(s.recvfrom(100)[1][0])
"""
SEND = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(40):
    s.sendto(b"x", (sys.argv[1], 9999)); time.sleep(0.05)
"""


def test_render_masquerade_off_and_gre() -> None:
    body = render_inet(PLAN)
    assert "ip saddr @local4 ip daddr != @cluster4 ip daddr != @nosnat4 masquerade" in body
    assert "udp dport 4789 notrack" in body
    off = render_inet(NftPlan(masquerade=False, local_pod_cidrs=("10.244.1.0/24",)))
    assert "masquerade" not in off and "notrack" not in off


def source_seen(ext: str, pod: str, dst: str) -> str:
    rx = subprocess.Popen(["ip", "netns", "exec", ext, "python3", "-c", RECEIVE],
                          stdout=subprocess.PIPE, text=True)
    ns_sh(pod, "python3", "-c", SEND, dst)
    out, _ = rx.communicate(timeout=10)
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
