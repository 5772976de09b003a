"""Fixtures for the real-Kubernetes tests: ferry-lab clusters with etcd, kube-apiserver,
controller-manager, scheduler, containerd and a kubelet per Node, Ferry from its DaemonSet.

Every cluster is torn down by its finalizer, also when a test fails. Skipped (with the reason)
only where the machine lacks a part: not root, the Kubernetes components not built
(tools/build-go-tools.sh kubernetes), no containerd, no frozen bundle to build the image from
(make dist)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lab.api import Lab
from tests.e2e.kube.helpers import lab_factory


@pytest.fixture
def kube_lab_of(cni_bin: str) -> Iterator[Callable[[dict[str, Any]], Lab]]:
    """``kube_lab_of(topology)`` -> a running Kubernetes lab, torn down after the test (a
    cluster is ~10 processes: one at a time on a 2-core machine)."""
    yield from lab_factory(cni_bin)


@pytest.fixture(scope="module")
def kube_module_lab_of(cni_bin: str) -> Iterator[Callable[[dict[str, Any]], Lab]]:
    """The same, shared by a module's tests and torn down at its end."""
    yield from lab_factory(cni_bin)
