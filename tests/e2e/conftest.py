"""Fixtures for the end-to-end tests: one ferry-lab cluster with route-sync per traffic mode,
shared by a module's tests (module scope), torn down even when a test fails.

Lab names start with "te" (this area's prefix) plus the pid and a counter."""

from __future__ import annotations

import itertools
import os
import shutil
import sys
from collections.abc import Iterator

import pytest

# tests/ on sys.path must not shadow Open vSwitch's `ovs` package (ovsdbapp needs ovs.db).
_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not hasattr(sys.modules.get("ovs"), "__path__"):
    sys.modules.pop("ovs", None)
    _saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _TESTS]
    try:
        import ovs.db.idl  # noqa: F401
    finally:
        sys.path[:] = _saved

from lab import build
from lab.api import Lab, ensure_cni_bin

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


@pytest.fixture(scope="session")
def e2e_cni_bin(tmp_path_factory: pytest.TempPathFactory) -> str:
    env = os.environ.get("FERRY_CNI_BIN")
    if env and os.access(os.path.join(env, "ferry"), os.X_OK):
        return env
    return ensure_cni_bin(str(tmp_path_factory.mktemp("cni-bin")))


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


def start_lab(cni_bin: str, topo: dict) -> Lab:
    reason = can_run()
    if reason:
        pytest.skip(reason)
    lab = Lab.up(topo, name=lab_name(), cni_bin=cni_bin)
    try:
        for node, pod in PODS:
            lab.add_pod(node, pod)
    except BaseException:
        lab.down()
        raise
    return lab


@pytest.fixture(scope="module")
def lab_of(e2e_cni_bin: str) -> Iterator:
    """``lab_of(topology_dict)`` → a running lab with PODS, torn down at module end."""
    labs: list[Lab] = []

    def make(topo: dict) -> Lab:
        lab = start_lab(e2e_cni_bin, topo)
        labs.append(lab)
        return lab

    yield make
    for lab in labs:
        lab.down()
