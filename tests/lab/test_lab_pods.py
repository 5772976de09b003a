"""Pods plugged by the real ferry plugin through cnitool, and the connectivity check."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from lab import layout
from lab.api import CNI_CACHE, Lab, cnitool_container_id

pytestmark = pytest.mark.root
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ferry_lab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lab.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)


def test_two_pods_on_one_node_ping_and_carry_tcp(lab: Lab) -> None:
    a = lab.add_pod("node-1", "a")
    b = lab.add_pod("node-1", "b")
    assert a.ipv4 and a.ipv6 and b.ipv4 and b.ipv6 and a.mac and a.mac != b.mac
    assert a.ipv4.startswith("10.244.1.") and b.ipv6.startswith("fd00:10:244:1:")
    for dst in (b.ipv4, b.ipv6):
        assert lab.ping(a, dst), dst
        probe = lab.tcp(a, dst, size=256 * 1024)  # many full-size segments: checksums must be right
        assert probe, probe.detail
        assert probe.peer in (a.ipv4, a.ipv6)  # same Node: no NAT
    # the Pod's traffic went through its Node's OVS: the gateway/pod ports counted packets
    gw = lab.node("node-1").ovs_port_stats("ferry-gw0")
    assert lab.ping(a, lab.node("node-1").ipv4)
    assert lab.node("node-1").ovs_port_stats("ferry-gw0").rx_packets > gw.rx_packets
    # a probe can fail: an address nobody holds
    assert not lab.ping(a, "10.244.1.250", timeout=1)
    assert [p.name for p in lab.node("node-1").pods()] == ["a", "b"]


def test_del_pod_removes_netns_port_and_cache(lab: Lab) -> None:
    a = lab.add_pod("node-2", "a")
    node = lab.node("node-2")
    assert any(p.startswith("fry") for p in node.vsctl("list-ports", "br-int").split())
    cache = os.path.join(CNI_CACHE, f"ferry-{cnitool_container_id('/run/netns/' + a.netns)}-eth0")
    assert os.path.exists(cache)
    lab.del_pod("node-2", "a")
    assert not os.path.exists(f"/run/netns/{a.netns}")
    assert not any(p.startswith("fry") for p in node.vsctl("list-ports", "br-int").split())
    assert not os.path.exists(cache) and lab.node("node-2").pods() == []
    b = lab.add_pod("node-2", "b")  # the Node still plugs Pods after a delete
    assert lab.ping(b, node.ipv6)


def test_check_same_node_passes_and_fails_when_broken(lab_factory: Callable[..., Lab]) -> None:
    lab = lab_factory(os.path.join(os.path.dirname(layout.__file__), "topologies", "lone.yaml"))
    assert not lab.route_sync
    lab.add_pod("node-1", "p1")
    b = lab.add_pod("node-1", "p2")
    cp = ferry_lab("check", "--only", "same-node", "--name", lab.name)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "2/2 probes passed" in cp.stdout
    full = ferry_lab("check", "--name", lab.name)  # lone Nodes: cross-Node is "not configured", not failed
    assert full.returncode == 0, full.stdout
    assert "not configured" in full.stdout and "pod-to-remote-node" in full.stdout
    b.exec(["ip", "link", "set", "eth0", "down"], check=True)
    broken = ferry_lab("check", "--only", "same-node", "--name", lab.name)
    assert broken.returncode == 1 and "FAIL" in broken.stdout and "FAILED" in broken.stdout


def test_cross_node_matrix_with_router_routes(lab_factory: Callable[..., Lab]) -> None:
    """Lone Nodes + the router routing every Pod CIDR (noEncap with cloud routes): all categories."""
    lab = lab_factory(os.path.join(os.path.dirname(layout.__file__), "topologies", "routed.yaml"))
    for n in lab.nodes:
        lab.add_pod(n.name, "p1")
        lab.add_pod(n.name, "p2")
    cp = ferry_lab("check", "--name", lab.name)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "not configured" not in cp.stdout
    assert "30/30 probes passed" in cp.stdout
    show = ferry_lab("show", "--name", lab.name)
    assert show.returncode == 0 and "pod p2" in show.stdout and "ovs ok" in show.stdout
