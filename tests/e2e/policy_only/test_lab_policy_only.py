"""The networkPolicyOnly lab: 3 Nodes (two on segment a, one behind the router), conflist
[ptp + host-local, ferry], route-sync in networkPolicyOnly, the underlay routing Pod CIDRs
(``lab/topologies/policy-only.yaml``).  ``ferry-lab check``'s matrix passes, Pod traffic crosses
each Node's OVS and is routed by the hosts (no tunnel, no masquerade)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from lab import build, check
from lab.api import Lab
from lab.topology import load
from tests.support.paths import REPO

pytestmark = pytest.mark.root
TOPOLOGY = str(REPO / "lab" / "topologies" / "policy-only.yaml")


@pytest.fixture
def lab(cni_bin: str) -> Iterator[Lab]:
    name = f"tc{secrets.token_hex(3)}"
    try:
        yield Lab.up(load(TOPOLOGY), name=name, cni_bin=cni_bin)
    finally:
        build.down(name)


def test_policy_only_lab_passes_same_and_cross_node_checks(lab: Lab) -> None:
    for n in ("node-1", "node-2", "node-3"):
        assert lab.node(n).state()["mode"] == "networkPolicyOnly"
        for p in ("a", "b"):
            pod = lab.add_pod(n, p)
            # ptp's attachment: host end "veth...", next hop = first address of the Node's Pod CIDR
            assert pod.result["interfaces"][0]["name"].startswith("veth")
    rows = check.run(lab)
    assert {r.spec.category for r in rows if r.configured} >= {
        "same-node", "same-subnet", "other-subnet", "pod-to-node", "pod-to-remote-node", "pod-to-external"}
    failed = [r for r in rows if r.configured and not r.ok]
    assert not failed, check.table(lab, rows)
    # No masquerade in networkPolicyOnly: the external host sees the Pods' own addresses.
    for r in rows:
        if r.spec.category == "pod-to-external":
            assert r.tcp.peer == lab.pod(*r.spec.src.split("/")).address(r.spec.family), r


def test_cross_node_pod_traffic_crosses_ovs_and_the_host_routes_it(lab: Lab) -> None:
    a, c = lab.add_pod("node-1", "a"), lab.add_pod("node-2", "c")
    n1, n2 = lab.node("node-1"), lab.node("node-2")
    assert "ferry-tun0" not in n1.vsctl("list-ports", "br-int")  # routed by the underlay, not tunnelled
    # node-1 routes node-2's Pod CIDR via node-2 (the lab's primary-CNI routing), the Pod via ferry-gw0
    assert "via 192.168.77.12 dev eth0" in n1.exec(["ip", "route", "get", c.ipv4]).stdout
    assert "dev ferry-gw0" in n1.exec(["ip", "route", "get", a.ipv4]).stdout
    g1, g2 = n1.ovs_port_stats("ferry-gw0"), n2.ovs_port_stats("ferry-gw0")
    for fam in (4, 6):
        assert lab.ping(a, c.address(fam), count=5, interval=0.05)
    h1, h2 = n1.ovs_port_stats("ferry-gw0"), n2.ovs_port_stats("ferry-gw0")
    # node-1: a's echo requests leave OVS by the gateway port; node-2: they enter OVS by it.
    assert h1.tx_packets - g1.tx_packets >= 10 and h2.rx_packets - g2.rx_packets >= 10
    # DEL through the chain: Ferry's port goes, ptp removes the veth and the route.
    host = a.result["interfaces"][0]["name"]
    lab.del_pod("node-1", "a")
    assert host not in n1.vsctl("list-ports", "br-int")
    assert host not in n1.exec(["ip", "-o", "link"]).stdout
    assert a.ipv4 not in n1.exec(["ip", "route"]).stdout
