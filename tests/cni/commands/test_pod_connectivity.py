"""Pods on one Node, plugged by the real plugin through cnitool, reach each other and the gateway."""

from __future__ import annotations

import hashlib

import pytest

from cni.pipeline import tables as pl
from tests.support.netcheck import ping, tcp_echo

pytestmark = pytest.mark.root


def test_two_pods_ping_and_carry_tcp_over_both_families(node):
    a = node.add_pod("a")
    b = node.add_pod("b")
    for family in (4, 6):
        assert ping(a.netns, b.ip(family)), f"IPv{family} ping a -> b"
        assert ping(b.netns, a.ip(family)), f"IPv{family} ping b -> a"
    assert tcp_echo(b.netns, b.ip(4), a.netns), "TCP over IPv4"
    assert tcp_echo(a.netns, a.ip(6), b.netns, port=5202), "TCP over IPv6"


def test_pod_reaches_gateway_and_gateway_reaches_pod(node):
    a = node.add_pod("a")
    gw4 = next(i["gateway"] for i in a.result["ips"] if "." in i["address"])
    gw6 = next(i["gateway"] for i in a.result["ips"] if ":" in i["address"])
    assert ping(a.netns, gw4) and ping(a.netns, gw6)
    assert ping(node.name, a.ip(4)) and ping(node.name, a.ip(6))


def test_result_and_system_agree(node):
    a = node.add_pod("a")
    r = a.result
    assert r["cniVersion"] == "1.0.0"
    host, sandbox = r["interfaces"]
    assert sandbox["name"] == "eth0" and sandbox["sandbox"] == a.path
    assert host["name"].startswith(pl.HOST_VETH_PREFIX) and host["name"] in node.ports()
    assert [i["interface"] for i in r["ips"]] == [1, 1]
    assert {x["dst"] for x in r["routes"]} == {"0.0.0.0/0", "::/0"}
    mac = a.exec("cat", "/sys/class/net/eth0/address").stdout.strip()
    assert mac == sandbox["mac"]
    # netdev datapath: the plugin turned TX checksum offload off inside the Pod.
    feats = a.exec("ethtool", "-k", "eth0").stdout
    assert "tx-checksumming: off" in feats
    # IPv6 without DAD delay: no tentative address right after ADD.
    assert "tentative" not in a.exec("ip", "-6", "addr", "show", "dev", "eth0").stdout
    # Pod flows carry the Pod's cookie.
    cookie = pl.pod_cookie(_container_id(node, a), "eth0")
    assert len(node.flows(cookie.match())) > 5


def _container_id(node, pod) -> str:
    ext = node.ovs.vsctl("get", "port", pod.host_veth, "external_ids")
    for part in ext.strip("{}\n").split(", "):
        k, _, v = part.partition("=")
        if k.strip('"') == pl.EXT_CONTAINER_ID:
            return v.strip('"')
    raise AssertionError(ext)


def test_pod_port_gets_the_ofport_its_flows_were_installed_for(node):
    """ADD installs a Pod's flows for the ofport it requested while vswitchd is still opening the
    port: the port must end up with exactly that ofport, also when the first choice is taken
    (here requested by an interface vswitchd cannot open), and traffic must cross."""
    path_b = f"/run/netns/{node.name}-b"
    cid_b = "cnitool-" + hashlib.sha512(path_b.encode()).hexdigest()[:20]  # how cnitool names a sandbox
    taken = pl.pod_ofports(cid_b, "eth0")[0]
    a = node.add_pod("a")  # creates the bridge (lone Node)
    node.ovs.vsctl("add-port", node.bridge, "ghost0", "--", "set", "interface", "ghost0", f"ofport_request={taken}")
    try:
        b = node.add_pod("b")
        for pod in (a, b):
            host = pod.result["interfaces"][0]["name"]
            cid = node.ovs.vsctl("get", "port", host, "external_ids:ferry-container-id").strip().strip('"')
            ofport = int(node.ovs.vsctl("get", "interface", host, "ofport"))
            want = pl.pod_ofports(cid, "eth0")
            assert ofport == (want[1] if pod is b else want[0]), (pod.name, cid, ofport, want)
            assert any(f"in_port={ofport}" in f for f in node.flows()), f"no flow for in_port={ofport}"
        assert ping(a.netns, b.ip(4)) and ping(b.netns, a.ip(6))
    finally:
        node.ovs.vsctl("--if-exists", "del-port", node.bridge, "ghost0")
