"""The words route-sync's config, the node state file, the plugin and the lab share, declared once:
traffic modes, the path to a peer, OVS datapaths, tunnel types.

At run time these are plain strings and tuples (no ``enum``: ~8 ms per ADD; no ``typing``: this
module is on the per-Pod path and imports only ``cni.lean.typecheck``).  For mypy each family of words is also a
``Literal`` alias (``Mode``, ``Path``, ``Datapath``, ``TunnelType``): a field typed with one takes
only its words, and a misspelt word in a comparison (``strict_equality``) or an assignment fails
the type check.  Import the aliases under ``if TYPE_CHECKING:``; compare with the constants.
``tests/test_declared_once.py`` checks each tuple against its alias and that no module
spells these words as literals instead."""

from __future__ import annotations

from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Final, Literal, TypeAlias

    from typing_extensions import TypeIs  # typing's own from 3.13

    Mode: TypeAlias = Literal["encap", "noEncap", "hybrid", "networkPolicyOnly"]
    Path: TypeAlias = Literal["tunnel", "route", "underlay", "fast", "wireguard", "none"]
    Encryption: TypeAlias = Literal["none", "wireguard"]
    Datapath: TypeAlias = Literal["netdev", "system"]
    TunnelType: TypeAlias = Literal["vxlan", "geneve", "gre", "stt"]

# Traffic modes (route-sync's trafficEncapMode, the state file's "mode").
ENCAP: Final = "encap"  # every peer through a tunnel
NO_ENCAP: Final = "noEncap"  # host routes to same-subnet peers, the underlay routes the rest
HYBRID: Final = "hybrid"  # routed inside the subnet, tunnelled across
NETWORK_POLICY_ONLY: Final = "networkPolicyOnly"  # chained after the primary CNI, which routes
MODES: tuple[Mode, ...] = (ENCAP, NO_ENCAP, HYBRID, NETWORK_POLICY_ONLY)
TUNNELLED_MODES: tuple[Mode, ...] = (ENCAP, HYBRID)  # the modes with a tunnel port
FAST_PATH_MODES: tuple[Mode, ...] = (NO_ENCAP, HYBRID)  # the modes fastPath is valid in

# The path to one peer, per family (the planner's decision, the state file's peers[].path).
PATH_TUNNEL: Final = "tunnel"
PATH_ROUTE: Final = "route"  # a host route via the peer (same subnet)
PATH_UNDERLAY: Final = "underlay"  # via the Node's default route: the underlay routes Pod CIDRs
PATH_FAST: Final = "fast"  # straight from OVS to the uplink, to the next hop's MAC
# trafficEncryptionMode wireguard: through the gateway to the Node's WireGuard device (encrypted;
# it replaces whatever path the mode gives the peer, the state file's peers[].path says this)
PATH_WIREGUARD: Final = "wireguard"
PATH_NONE: Final = "none"  # no Ferry path (networkPolicyOnly; a peer without a transport address)
PATHS: tuple[Path, ...] = (PATH_TUNNEL, PATH_ROUTE, PATH_UNDERLAY, PATH_FAST, PATH_WIREGUARD, PATH_NONE)
ROUTED_PATHS: tuple[Path, ...] = (PATH_ROUTE, PATH_FAST)  # never encapsulated (a Pod's full MTU)

# Traffic encryption between Nodes (route-sync's trafficEncryptionMode, the state file's "encryption").
# (the same words as PATH_NONE and PATH_WIREGUARD: one constant per word, these name them again)
ENCRYPTION_NONE: Final = PATH_NONE
ENCRYPTION_WIREGUARD: Final = PATH_WIREGUARD
ENCRYPTIONS: tuple[Encryption, ...] = (ENCRYPTION_NONE, ENCRYPTION_WIREGUARD)

# OVS datapaths (route-sync's datapathType, the state file's and the conf's "datapath").
NETDEV: Final = "netdev"  # userspace
SYSTEM: Final = "system"  # the kernel module
DATAPATHS: tuple[Datapath, ...] = (NETDEV, SYSTEM)

# Tunnel types (route-sync's tunnelType, the state file's tunnel.type).
VXLAN: Final = "vxlan"
GENEVE: Final = "geneve"
GRE: Final = "gre"
STT: Final = "stt"  # the system datapath only
TUNNEL_TYPES: tuple[TunnelType, ...] = (VXLAN, GENEVE, GRE, STT)
NETDEV_TUNNEL_TYPES: tuple[TunnelType, ...] = (VXLAN, GENEVE, GRE)  # what the userspace datapath tunnels with

# Which port a Pod's packet to a peer leaves the bridge by (``show``'s VIA column, PeerPlan.via).
VIA_GATEWAY: Final = "gateway"


def via(path: str) -> str:
    """fast (the uplink, straight from OVS) | tunnel | none | gateway (``ferry-gw0`` and the
    Node's routing: route and underlay peers)."""
    return path if path in (PATH_FAST, PATH_TUNNEL, PATH_NONE) else VIA_GATEWAY


def is_mode(value: object) -> TypeIs[Mode]:
    return value in MODES


def is_path(value: object) -> TypeIs[Path]:
    return value in PATHS


def is_encryption(value: object) -> TypeIs[Encryption]:
    return value in ENCRYPTIONS


def is_datapath(value: object) -> TypeIs[Datapath]:
    return value in DATAPATHS


