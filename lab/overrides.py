"""``ferry-lab up``/``demo``'s ``--mode``, ``--tunnel``, ``--fast-path`` and ``--family``: a
topology document in, the same document with those keys overridden out.  Pure.

    --mode M        routeSync.trafficEncapMode (routeSync created when the topology has none),
                    and the underlay the mode relies on: noEncap and networkPolicyOnly get
                    router.routePodCIDRs (the underlay routes Pod CIDRs between segments),
                    networkPolicyOnly also nodePodRoutes (the primary CNI's routing on a segment),
                    any other mode loses nodePodRoutes (route-sync owns those routes then).
                    File keys the new mode cannot take (fastPath, noSNAT) are dropped.
    --tunnel T      routeSync.tunnelType (encap and hybrid only); the file's tunnelPort goes.
    --fast-path     routeSync.fastPath (noEncap and hybrid only).
    --family F      4, 6 or dual: clusterCIDRs, every segment, the external link and explicit
                    Node podCIDRs keep exactly these families; a family added gets the defaults.
    --vlan N        vlan: every segment a tagged switch (lab.segswitch), route-sync's transportVLAN.
    --encryption E  encryption: none or wireguard (route-sync's trafficEncryptionMode); wireguard
                    needs route-sync (a topology without one takes it with --mode) and refuses
                    networkPolicyOnly.

A combination that cannot work is refused with :class:`TopologyError` naming the flag and the
reason; the result is then parsed like any topology (``lab.topology.parse``)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cni.pipeline.modes import (
    ENCAP,
    ENCRYPTION_NONE,
    ENCRYPTIONS,
    FAST_PATH_MODES,
    MODES,
    NETDEV_TUNNEL_TYPES,
    NETWORK_POLICY_ONLY,
    NO_ENCAP,
    TUNNELLED_MODES,
)
from lab.topology import (
    DEFAULT_CLUSTER_CIDRS,
    DEFAULT_EXTERNAL,
    DEFAULT_TOPOLOGY,
    FAMILIES,
    TopologyError,
    default_pod_cidrs,
    default_segment_cidr,
    families_of,
)

FAMILY_CHOICES = {"4": (4,), "6": (6,), "dual": (4, 6)}
UNDERLAY_ROUTED_MODES = (NO_ENCAP, NETWORK_POLICY_ONLY)  # the router routes Pod CIDRs


@dataclass(frozen=True)
class Overrides:
    mode: str | None = None  # trafficEncapMode
    tunnel: str | None = None  # tunnelType
    fast_path: bool = False  # True: fastPath on
    family: str | None = None  # "4" | "6" | "dual"
    vlan: int | None = None  # the segments' 802.1Q VLAN and the Nodes' transportVLAN (lab.segswitch)
    encryption: str | None = None  # "none" | "wireguard": the topology's encryption key


def apply(doc: dict[str, Any] | None, o: Overrides) -> dict[str, Any]:
    """``doc`` with ``o`` applied (a new document; ``doc`` is not modified)."""
    out = copy.deepcopy(doc or {})
    if o.mode or o.tunnel or o.fast_path:
        _route_sync(out, o)
    if o.encryption is not None:
        _encryption(out, o.encryption)
    if o.family:
        _family(out, o.family)
    if o.vlan is not None:
        out["vlan"] = o.vlan
    return out


def load(path: str | None, o: Overrides) -> dict[str, Any]:
    """The topology file (default: ``lab/topologies/default.yaml``) with ``o`` applied."""
    import yaml

    with open(path or DEFAULT_TOPOLOGY) as f:
        doc = yaml.safe_load(f) or {}
    if not isinstance(doc, dict):
        raise TopologyError(f"{path or DEFAULT_TOPOLOGY}: expected a mapping")
    return apply(doc, o)


def _route_sync(doc: dict[str, Any], o: Overrides) -> None:
    rs_in = doc.get("routeSync")
    if rs_in is not None and not isinstance(rs_in, dict):
        raise TopologyError("routeSync: expected a mapping")
    rs = dict(rs_in or {})
    if o.mode is not None and o.mode not in MODES:
        raise TopologyError(f"--mode {o.mode}: one of {', '.join(MODES)}")
    if o.tunnel is not None and o.tunnel not in NETDEV_TUNNEL_TYPES:
        raise TopologyError(f"--tunnel {o.tunnel}: one of {', '.join(NETDEV_TUNNEL_TYPES)}")
    mode = o.mode or str(rs.get("trafficEncapMode", ENCAP))
    whence = "" if o.mode else (" (from the topology)" if rs_in else " (the default: the topology runs no "
                                                                        "route-sync)")
    if o.tunnel and mode not in TUNNELLED_MODES:
        raise TopologyError(f"--tunnel {o.tunnel}: only with --mode {' or '.join(TUNNELLED_MODES)} "
                            f"(mode is {mode}{whence}: no peer is tunnelled)")
    if o.fast_path and mode not in FAST_PATH_MODES:
        why = "every peer is tunnelled" if mode == ENCAP else "the primary CNI routes Pods"
        raise TopologyError(f"--fast-path: only with --mode {' or '.join(FAST_PATH_MODES)} "
                            f"(mode is {mode}{whence}: {why}, no routed peer to take a fast path)")
    if o.mode:
        rs["trafficEncapMode"] = o.mode
        if o.mode not in FAST_PATH_MODES:
            rs.pop("fastPath", None)
        if o.mode != NO_ENCAP:
            rs.pop("noSNAT", None)
        router = dict(doc.get("router") or {})
        if o.mode in UNDERLAY_ROUTED_MODES and router.get("routePodCIDRs") != "bgp":  # bgp routes them too
            router["routePodCIDRs"] = True
        doc["router"] = router
        doc["nodePodRoutes"] = o.mode == NETWORK_POLICY_ONLY
    if o.tunnel:
        rs["tunnelType"] = o.tunnel
        rs.pop("tunnelPort", None)  # the file's port was its tunnel type's
    if o.fast_path:
        rs["fastPath"] = True
    doc["routeSync"] = rs


def _encryption(doc: dict[str, Any], encryption: str) -> None:
    if encryption not in ENCRYPTIONS:
        raise TopologyError(f"--encryption {encryption}: one of {', '.join(ENCRYPTIONS)}")
    if encryption != ENCRYPTION_NONE:
        rs = doc.get("routeSync")
        if not rs:
            raise TopologyError(f"--encryption {encryption}: the topology runs no route-sync (routeSync), which is "
                                "what encrypts; add --mode")
        if isinstance(rs, dict) and rs.get("trafficEncapMode", ENCAP) == NETWORK_POLICY_ONLY:
            raise TopologyError(f"--encryption {encryption}: not with --mode {NETWORK_POLICY_ONLY} (the primary CNI "
                                "carries Pod traffic between Nodes; encrypt there)")
    doc["encryption"] = encryption


def _family(doc: dict[str, Any], family: str) -> None:
    wanted = FAMILY_CHOICES.get(str(family))
    if wanted is None:
        raise TopologyError(f"--family {family}: one of {', '.join(FAMILY_CHOICES)}")
    dropped = [f for f in FAMILIES if f not in wanted]
    cluster = [str(c) for c in doc.get("clusterCIDRs") or DEFAULT_CLUSTER_CIDRS.values()]
    kept = {f: next((c for c in cluster if families_of([c]) == (f,)), DEFAULT_CLUSTER_CIDRS[f]) for f in wanted}
    doc["clusterCIDRs"] = [kept[f] for f in wanted]
    segments = doc.get("segments") or {"a": {}, "b": {}}
    if not isinstance(segments, dict):
        raise TopologyError("segments: expected a mapping")
    doc["segments"] = {name: _only(dict(s or {}), wanted, dropped,
                                   lambda f, name=name, i=i: default_segment_cidr(str(name), i, f))
                       for i, (name, s) in enumerate(segments.items())}
    router = dict(doc.get("router") or {})
    router["external"] = _only(dict(router.get("external") or {}), wanted, dropped, DEFAULT_EXTERNAL.__getitem__)
    doc["router"] = router
    nodes = doc.get("nodes")
    if isinstance(nodes, list):
        out = []
        for i, n in enumerate(nodes, start=1):
            n = dict(n or {})
            if "podCIDRs" in n:
                have = {families_of([str(c)])[0]: str(c) for c in n["podCIDRs"]}
                derived = default_pod_cidrs(tuple(kept[f] for f in wanted), int(n.get("index", i)))
                n["podCIDRs"] = [have.get(f, derived[j]) for j, f in enumerate(wanted)]
            out.append(n)
        doc["nodes"] = out


def _only(block: dict[str, Any], wanted: tuple[int, ...], dropped: list[int], default: Callable[[int], str]
          ) -> dict[str, Any]:
    """A segment / external block with exactly the ``wanted`` families: others removed; when it
    named any, the missing wanted ones added with ``default(family)`` (naming none, the parser
    gives it the cluster's families)."""
    for f in dropped:
        block.pop(f"ipv{f}", None)
    if any(f"ipv{f}" in block for f in FAMILIES):
        for f in wanted:
            block.setdefault(f"ipv{f}", default(f))
    return block
