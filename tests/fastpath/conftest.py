"""Fixtures for the fast-path tests: one ferry-lab per configuration (module scope), names
starting with "tf" (this area's prefix), torn down even when a test fails."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from lab.api import Lab, Node
from tests.e2e.conftest import can_run, topology
from tests.waiting import until

_counter = itertools.count()
PODS = (("node-1", "a"), ("node-2", "a"), ("node-3", "a"))


def lab_name() -> str:
    return f"tf{os.getpid() % 100000:x}{next(_counter)}"[:12]


RESYNC = 600  # s: far beyond any wait's deadline (tests.waiting.HANG), so what a test sees follow
# an event followed it from the event, whatever the machine's speed, not from a periodic resync


def fast_topology(mode: str, mac_source: str, **extra: object) -> dict:
    """The default three Nodes, route-sync with the fast path; the router routes Pod CIDRs."""
    rs = {"trafficEncapMode": mode, "fastPath": True, "macSource": mac_source, "resyncSeconds": RESYNC, **extra}
    return topology(rs, route_pod_cidrs=True)


def settled(node: Node, peers: list[str]) -> bool:
    st = node.state() or {}
    paths = {(p["name"], ":" in p["podCIDRs"][0]): p.get("path") for p in st.get("peers", [])}
    return all(paths.get((peer, v6)) in ("fast", "tunnel") for peer in peers for v6 in (False, True))


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
