"""Fixtures for the BGP tests: ferry-lab clusters whose router learns the Pod CIDRs over BGP
(``lab/topologies/bgp.yaml``: noEncap, FRR on the router, route-sync + ExaBGP on every Node),
one per configuration (module scope), names starting with "tg" (this area's prefix; bench_dataplane
has "tb"), torn down even when a test fails."""

from __future__ import annotations

import copy
import itertools
import os
import shutil
from collections.abc import Callable, Iterator

import pytest
import yaml

from lab import frr
from lab.api import Lab, ensure_cni_bin
from tests.e2e.conftest import can_run

_counter = itertools.count()
BGP_TOPOLOGY = os.path.join(os.path.dirname(frr.__file__), "topologies", "bgp.yaml")
PODS = (("node-1", "a"), ("node-1", "b"), ("node-2", "a"), ("node-3", "a"))


def lab_name() -> str:
    return f"tg{os.getpid() % 100000:x}{next(_counter)}"[:12]


def bgp_topology(router_bgp: dict | None = None, **route_sync: object) -> dict:
    """bgp.yaml with ``routeSync`` keys and ``router.bgp`` keys changed."""
    with open(BGP_TOPOLOGY) as f:
        doc = copy.deepcopy(yaml.safe_load(f))
    doc["routeSync"] = {**doc["routeSync"], "resyncSeconds": 600, **route_sync}
    doc["router"]["bgp"] = {**doc["router"]["bgp"], **(router_bgp or {})}
    return doc


def learned(lab: Lab) -> dict[str, dict]:
    """Destination -> the router's kernel route that zebra installed from BGP."""
    return {r["dst"]: r for r in frr.routes(lab.router.netns)}


def all_learned(lab: Lab) -> bool:
    have = learned(lab)
    return all(c in have for n in lab.nodes for c in n.spec.pod_cidrs)


@pytest.fixture(scope="session")
def bgp_cni_bin(tmp_path_factory: pytest.TempPathFactory) -> str:
    env = os.environ.get("FERRY_CNI_BIN")
    if env and os.access(os.path.join(env, "ferry"), os.X_OK):
        return env
    return ensure_cni_bin(str(tmp_path_factory.mktemp("cni-bin")))


@pytest.fixture(scope="module")
def bgp_lab_of(bgp_cni_bin: str) -> Iterator[Callable[[dict], Lab]]:
    labs: list[Lab] = []

    def make(topo: dict) -> Lab:
        reason = can_run() or (None if shutil.which(frr.DAEMONS[0], path=frr.FRR_DIR) else "frr not installed")
        if reason:
            pytest.skip(reason)
        lab = Lab.up(topo, name=lab_name(), cni_bin=bgp_cni_bin)
        labs.append(lab)
        for node, pod in PODS:
            lab.add_pod(node, pod)
        return lab

    yield make
    for lab in labs:
        lab.down()
