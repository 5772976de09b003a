"""bench_cni's encryption phase (issue 30: "ADD unchanged", <= 1.05x), its pure parts: the two
node state files, the order of the interleaved calls, what each Pod must hold afterwards, and
the ratios.

The plugin's only WireGuard-dependent work in an ADD is the Pod's routes' MTU
(``cni.pipeline.podnet``): with ``encryption: wireguard`` every other Node's Pods are behind
WireGuard's MTU, as behind encap's tunnel.  So the two Nodes are the same Node in **noEncap**, the
mode where encryption changes the most: in clear its Pods hold one default route at the full
MTU; encrypted, the default route plus the cluster prefix at the WireGuard MTU (1500 - 60).  Both
state files are what route-sync would write for this Node (``cni.node.nodestate.NodeState``, the
MTU from ``routesync.mtu.pod_mtu`` with WireGuard's overhead), one peer each, its path ``route``
in clear and ``wireguard`` encrypted; they differ in nothing else."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bench.util import ab_by_side, ab_order, ab_ratios
from cni.node import nodestate
from cni.pipeline import podnet
from cni.pipeline.modes import ENCRYPTION_NONE, ENCRYPTION_WIREGUARD, NO_ENCAP, PATH_ROUTE, PATH_WIREGUARD, VXLAN
from cni.pipeline.tables import GATEWAY_PORT

if TYPE_CHECKING:
    from cni.pipeline.modes import Encryption

SIDES: tuple[Encryption, ...] = (ENCRYPTION_NONE, ENCRYPTION_WIREGUARD)
# The Node of the phase: its own Pod CIDR (room for 999 Pods a side, sharing one IPAM store), the
# cluster's, one peer on the same segment.
POD_CIDR = "10.245.0.0/21"
GATEWAY = "10.245.0.1/21"
CLUSTER_CIDR = "10.245.0.0/16"
PEER_CIDR = "10.245.8.0/21"
PEER_ADDRESS = "192.168.77.12"
TRANSPORT_MTU = 1500
TARGET = 1.05  # issue 30: ADD p50 encrypted / clear


def node_state(encryption: Encryption, gateway_mac: str, gateway_ofport: int, ovsdb: str,
               ovs_run_dir: str, policy_namespaces: Sequence[str] = ()) -> nodestate.NodeState:
    """The state file route-sync would write for the phase's Node, in clear or encrypted;
    ``policy_namespaces``: the namespaces that have NetworkPolicies (none here; the policy phase's
    Node, ``bench.cni_policy``, is this one in clear with its Pods' namespace listed)."""
    from routesync.mtu import pod_mtu
    from routesync.wireguard.plan import overhead

    encrypted = encryption != ENCRYPTION_NONE
    return nodestate.NodeState(
        node="fbn-node", mode=NO_ENCAP, bridge="br-int", datapath="netdev", ovsdb=ovsdb, ovsRunDir=ovs_run_dir,
        mtu=pod_mtu(TRANSPORT_MTU, NO_ENCAP, VXLAN, encryption_overhead=overhead(False) if encrypted else 0),
        transportMTU=TRANSPORT_MTU, podCIDRs=[POD_CIDR], clusterCIDRs=[CLUSTER_CIDR],
        gateway=nodestate.Gateway(name=GATEWAY_PORT, mac=gateway_mac, ofport=gateway_ofport, addresses=[GATEWAY]),
        peers=[nodestate.Peer(name="fbn-peer", addresses=[PEER_ADDRESS], podCIDRs=[PEER_CIDR],
                              path=PATH_WIREGUARD if encrypted else PATH_ROUTE)],
        encryption=encryption, policyNamespaces=list(policy_namespaces))


def expected_routes(state: nodestate.NodeState) -> set[tuple[str, str, int]]:
    """The routes through the gateway ``(dst, gw, mtu)`` an IPv4 Pod of ``state``'s Node holds
    after ADD: the plugin's own plan (``cni.pipeline.podnet``)."""
    gw = GATEWAY.split("/")[0]
    return {(r.dst, r.gw, r.mtu) for r in podnet.for_state(state, {4: gw}).routes}


def kernel_routes(ip_json: Sequence[dict[str, Any]]) -> set[tuple[str, str, int]]:
    """``ip -j -4 route show`` in a Pod: its routes through a gateway as ``(dst, gw, mtu)`` (the
    kernel's connected route has none and is left out; mtu 0: none on the route)."""
    out = set()
    for r in ip_json:
        if "gateway" not in r:
            continue
        mtu = next((int(m["mtu"]) for m in r.get("metrics") or [] if "mtu" in m), 0)
        dst = "0.0.0.0/0" if r["dst"] == "default" else r["dst"] if "/" in r["dst"] else f"{r['dst']}/32"
        out.add((dst, r["gateway"], mtu))
    return out


def order(pairs: int) -> list[tuple[Encryption, int]]:
    """The interleaved calls (:func:`bench.util.ab_order`), the clear side first in even pairs."""
    return ab_order(SIDES, pairs)


def by_side(samples: Sequence[float], calls: Sequence[tuple[Encryption, int]]) -> dict[Encryption, list[float]]:
    return ab_by_side(samples, calls, SIDES)


def ratios(ms: Mapping[str, Mapping[Encryption, list[float]]]) -> dict[str, Any]:
    """encrypted / clear (:func:`bench.util.ab_ratios`)."""
    return ab_ratios(ms, ENCRYPTION_WIREGUARD, ENCRYPTION_NONE, TARGET)
