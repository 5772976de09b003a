"""Fixtures for tests that need a real multi-Node cluster (ferry-lab).  Copy the pattern:

    def test_something(lab_factory):
        lab = lab_factory()                      # default topology, torn down after the test
        a = lab.add_pod("node-1", "a")

Lab names start with "tl" (this area's prefix) plus the pid and a counter, so parallel test
runs never share a namespace; every lab is torn down by its finalizer even when the test fails."""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Callable, Iterator

import pytest

from lab import build
from lab.api import Lab

_counter = itertools.count()


def lab_name(prefix: str = "tl") -> str:
    return f"{prefix}{os.getpid() % 100000:x}{next(_counter)}"[:12]


def _can_run() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("ovs-vswitchd", "ovsdb-server", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    return None


@pytest.fixture
def new_lab_name() -> Callable[[], str]:
    """A fresh lab name of this test area ("tl..."), for tests that drive the CLI themselves."""
    return lab_name


@pytest.fixture
def lab_factory(cni_bin: str) -> Iterator[Callable[..., Lab]]:
    reason = _can_run()
    if reason:
        pytest.skip(reason)
    names: list[str] = []

    def make(topology: object = None, name: str | None = None) -> Lab:
        n = name or lab_name()
        names.append(n)
        return Lab.up(topology, name=n, cni_bin=cni_bin)  # type: ignore[arg-type]

    yield make
    for n in names:
        build.down(n)


@pytest.fixture
def lab(lab_factory: Callable[..., Lab]) -> Lab:
    """The default topology: node-1, node-2 on segment a; node-3 on b; router; external host."""
    return lab_factory()
