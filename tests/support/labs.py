"""The default lab the end-to-end suites share: its topology, its Pods, whether this machine can run
it, and starting it (tests/e2e/conftest.py's ``lab_of`` fixture; the fast-path and BGP suites
build on the topology).

Lab names start with "te" (this area's prefix) plus the pid and a counter."""

from __future__ import annotations

import itertools
import os
import shutil

import pytest

from lab import build
from lab.api import Lab

_counter = itertools.count()


def lab_name() -> str:
    return f"te{os.getpid() % 100000:x}{next(_counter)}"[:12]


def can_run() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("ovs-vswitchd", "ovsdb-server", "ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    if build.route_sync_command() is None:
        return "ferry-route-sync not installed"
    return None


def topology(route_sync: dict, route_pod_cidrs: bool = False) -> dict:
    """The default three-Node topology (node-1, node-2 on segment a; node-3 behind the router)."""
    return {"datapath": "netdev", "clusterCIDRs": ["10.244.0.0/16", "fd00:10:244::/48"],
            "segments": {"a": {"ipv4": "192.168.77.0/24", "ipv6": "fd00:77::/64"},
                         "b": {"ipv4": "192.168.88.0/24", "ipv6": "fd00:88::/64"}},
            "router": {"routePodCIDRs": route_pod_cidrs},
            "nodes": [{"name": "node-1", "segment": "a"}, {"name": "node-2", "segment": "a"},
                      {"name": "node-3", "segment": "b"}],
            "routeSync": route_sync}


PODS = (("node-1", "a"), ("node-1", "b"), ("node-2", "a"), ("node-3", "a"))


def start_lab(cni_bin: str, topo: dict, pods: tuple[tuple[str, str], ...] = PODS, name: str | None = None) -> Lab:
    """A lab of ``topo`` with ``pods`` plugged (skipped where the machine cannot run one)."""
    reason = can_run()
    if reason:
        pytest.skip(reason)
    lab = Lab.up(topo, name=name or lab_name(), cni_bin=cni_bin)
    try:
        for node, pod in pods:
            lab.add_pod(node, pod)
    except BaseException:
        lab.down()
        raise
    return lab
