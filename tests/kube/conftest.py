"""Fixtures for the real-Kubernetes tests: ferry-lab clusters with etcd, kube-apiserver,
controller-manager, scheduler, containerd and a kubelet per Node, Ferry from its DaemonSet.

Lab names start with "tk" plus the pid and a counter. Every cluster is torn down by its finalizer,
also when a test fails. Skipped (with the reason) only where the machine lacks a part: not root,
the Kubernetes components not built (tools/build-go-tools.sh kubernetes), no containerd, no frozen
bundle to build the image from (make dist)."""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lab import tools
from lab.api import Lab

_counter = itertools.count()
REPO = tools.REPO


def lab_name() -> str:
    return f"tk{os.getpid() % 100000:x}{next(_counter)}"[:12]


def can_run() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for t in ("ovs-vswitchd", "containerd", "runc", "ctr", "podman", "mmdebstrap", "nsenter"):
        if shutil.which(t) is None:
            return f"{t} not installed (make install)"
    for t in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"):
        if not os.access(tools.tool(t), os.X_OK):
            return f"{t} not built (tools/build-go-tools.sh kubernetes)"
    if not os.access(os.path.join(REPO, "dist", "ferry", "ferry-route-sync"), os.X_OK):
        return "no frozen bundle (make dist)"
    return None


def topology(route_sync: dict[str, Any], route_pod_cidrs: bool = False, nodes: int = 3,
             join_later: tuple[str, ...] = ()) -> dict[str, Any]:
    """The default topology (node-1, node-2 on segment a; node-3, node-4 on b behind the router),
    as a Kubernetes cluster."""
    all_nodes = [{"name": "node-1", "segment": "a"}, {"name": "node-2", "segment": "a"},
                 {"name": "node-3", "segment": "b"}, {"name": "node-4", "segment": "b"}]
    return {"datapath": "netdev", "clusterCIDRs": ["10.244.0.0/16", "fd00:10:244::/48"],
            "segments": {"a": {"ipv4": "192.168.77.0/24", "ipv6": "fd00:77::/64"},
                         "b": {"ipv4": "192.168.88.0/24", "ipv6": "fd00:88::/64"}},
            "router": {"routePodCIDRs": route_pod_cidrs},
            "nodes": all_nodes[:nodes],
            "routeSync": {"resyncSeconds": 5, **route_sync},
            "kubernetes": {"joinLater": list(join_later)}}


def _factory(cni_bin: str) -> Iterator[Callable[[dict[str, Any]], Lab]]:
    labs: list[Lab] = []

    def make(topo: dict[str, Any]) -> Lab:
        reason = can_run()
        if reason:
            pytest.skip(reason)
        lab = Lab.up(topo, name=lab_name(), cni_bin=cni_bin)
        labs.append(lab)
        return lab

    yield make
    for lab in labs:
        lab.down()


@pytest.fixture
def kube_lab_of(cni_bin: str) -> Iterator[Callable[[dict[str, Any]], Lab]]:
    """``kube_lab_of(topology)`` -> a running Kubernetes lab, torn down after the test (a
    cluster is ~10 processes: one at a time on a 2-core machine)."""
    yield from _factory(cni_bin)


@pytest.fixture(scope="module")
def kube_module_lab_of(cni_bin: str) -> Iterator[Callable[[dict[str, Any]], Lab]]:
    """The same, shared by a module's tests and torn down at its end."""
    yield from _factory(cni_bin)
