"""Fixtures for the fast-path tests: one ferry-lab per configuration (module scope), names
starting with "tf" (this area's prefix), torn down even when a test fails."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab.api import Lab
from tests.e2e.fastpath.helpers import PODS, lab_name, settled
from tests.support.labs import can_run
from tests.support.waiting import until


@pytest.fixture(scope="module")
def fast_lab_of(cni_bin: str) -> Iterator:
    labs: list[Lab] = []

    def make(topo: dict) -> Lab:
        reason = can_run()
        if reason:
            pytest.skip(reason)
        lab = Lab.up(topo, name=lab_name(), cni_bin=cni_bin)
        labs.append(lab)
        for node, pod in PODS:
            lab.add_pod(node, pod)
        # Settled: every Node has a path to every peer in both families that is not the gateway
        # fallback.  A peer's MAC comes from its annotation (published by its route-sync's first
        # pass) or the neighbour table, so right after up a Node may still be on the fallback.
        until(lambda: all(settled(n, [m.name for m in lab.nodes if m.name != n.name]) for n in lab.nodes),
              "every Node off the gateway fallback to every peer")
        return lab

    yield make
    for lab in labs:
        lab.down()
