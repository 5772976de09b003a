"""What the BGP suites share: ``lab/topologies/bgp.yaml`` (noEncap, FRR on the router, route-sync +
ExaBGP on every Node) with keys changed, what the router learned, lab names starting with "tg"
(this area's prefix; bench_dataplane has "tb")."""

from __future__ import annotations

import copy
import itertools
import os

import yaml

from lab import frr
from lab.api import Lab

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
