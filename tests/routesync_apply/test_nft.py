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
