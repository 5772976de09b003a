"""route-sync's plain data: what the Node sources give, and the desired state the planner computes.

The planner (pure functions) turns ``(Config, local NodeRecord, peer NodeRecords, local facts)``
into a :class:`DesiredState`; the appliers diff it against what is installed and apply only the
difference.  Nothing here touches the system."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cni.pipeline.modes import via
from cni.pipeline.tables import Flow

if TYPE_CHECKING:
    from cni.node import nodestate
    from cni.pipeline.modes import Path, TunnelType
    from routesync.nftbody import NftBody
    from routesync.wireguard.model import WgSpec

MAC_ANNOTATION = "ferry.io/mac-address"
TRANSPORT_ANNOTATION = "ferry.io/transport-addresses"
# This Node's transport VLAN, over route-sync's ``transportVLAN``: a VLAN ID (1..4094), or
# ``none`` for an untagged transport network on this Node.
VLAN_ANNOTATION = "ferry.io/transport-vlan"
VLAN_NONE = "none"

# Routes route-sync installs carry this protocol number (rtnetlink RTPROT_*), so a restart
# can list exactly its own routes ("adopt and clean") and never touch anyone else's.
FERRY_ROUTE_PROTO = 0x66  # 102, unassigned in /etc/iproute2/rt_protos


@dataclass(frozen=True)
class NodeRecord:
    """One Node as a source (Kubernetes or the embedded registry) describes it."""

    name: str
    transport_addresses: tuple[str, ...]  # "192.168.77.11", "fd00:77::11"
    pod_cidrs: tuple[str, ...]  # "10.244.1.0/24", "fd00:10:244:1::/64"
    annotations: tuple[tuple[str, str], ...] = ()
    # this Node's own record as route-sync publishes it: annotations it took out on purpose (a
    # finished key rotation's next key; the MAC with macSource neighbor), which a source that
    # patches the Node (Kubernetes) must delete there. Not part of what the record says.
    retracted: frozenset[str] = field(default=frozenset(), compare=False)

    def annotation(self, key: str) -> str | None:
        return dict(self.annotations).get(key)


@dataclass(frozen=True)
class PeerPlan:
    """The decision for one peer and one address family."""

    peer: str
    family: int  # 4 | 6
    path: Path
    transport_address: str | None  # the peer's underlay address of this family
    pod_cidrs: tuple[str, ...]  # the peer's Pod CIDRs of this family
    peer_gateway: str | None = None  # first address of the peer's Pod CIDR (tunnel host routes)
    next_hop_mac: str | None = None  # fast path only
    mac_source: str | None = None  # "annotation" | "neighbor" | None
    # fast path: the path this peer takes while its next-hop MAC is unknown (route | underlay)
    fallback: Path | None = None
    next_hop: str | None = None  # fast path: the next hop's address (the peer, or the router)

    @property
    def via(self) -> str:
        """Which port a Pod's packet to this peer leaves by: fast (the uplink, from OVS) |
        gateway (ferry-gw0 and the Node's routing) | tunnel | none."""
        return via(self.path)


@dataclass(frozen=True)
class HostRoute:
    """A route in the Node's main table, installed with proto FERRY_ROUTE_PROTO."""

    dst: str  # CIDR
    gw: str | None
    dev: str | None  # interface name; None = let the kernel pick from gw
    onlink: bool = False
    mtu: int = 0  # the route's MTU (tunnelled peers: the tunnel MTU); 0: the device's


@dataclass(frozen=True)
class Neighbor:
    """A permanent neighbour entry (IPv6 tunnel next hop on the gateway port)."""

    ip: str
    mac: str
    dev: str


@dataclass(frozen=True)
class NftPlan:
    """Ferry's own nftables table: masquerade Pod egress to non-Pod destinations, and
    conntrack bypass for the tunnel's UDP port."""

    table: str = "ferry"
    masquerade: bool = True
    local_pod_cidrs: tuple[str, ...] = ()
    cluster_pod_cidrs: tuple[str, ...] = ()  # every Node's Pod CIDRs (a set in the table)
    snat_exclude: tuple[str, ...] = ()  # further destinations not to masquerade (Node addresses)
    tunnel_udp_port: int | None = None
    uplink_ingress_drop: str | None = None  # netdev + uplink on the bridge: the renamed uplink
    # what ``cluster_pod_cidrs`` gained and lost since the tuple it was made from (the planner's
    # memo knows; the nft applier then changes its sets by them), not part of the plan's value
    cluster_changes: ClusterChanges | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ClusterChanges:
    since: tuple[str, ...]  # the ``cluster_pod_cidrs`` these changes are from (that very tuple)
    added: tuple[str, ...]
    removed: tuple[str, ...]


@dataclass(frozen=True)
class PeerChanges:
    since: list[PeerPlan]  # the ``DesiredState.peers`` these changes are from (that very list)
    added: tuple[PeerPlan, ...]  # plans in the new list that are no objects of ``since``
    removed: tuple[PeerPlan, ...]  # plans of ``since`` no longer in it


@dataclass(frozen=True)
class SetChanges:
    """What a set of the desired state (``routes``, ``neighbors``) gained and lost since the set
    it was made from (that very object: the planner's memo knows, and an applier that applied
    ``since`` takes the difference from here instead of comparing two sets of every peer)."""

    since: AbstractSet[Any]
    added: frozenset[Any]
    removed: frozenset[Any]


@dataclass(frozen=True)
class TunnelSpec:
    type: TunnelType
    port_name: str
    dst_port: int | None  # UDP port (vxlan/geneve/stt), None for gre


@dataclass(frozen=True)
class UplinkSpec:
    """Move the uplink onto the bridge: ``name`` becomes an internal port with the uplink's
    MAC/addresses/routes and the physical link is renamed to ``renamed``."""

    name: str  # "eth0"
    renamed: str  # "eth0~"
    vlan: int | None = None  # the transport VLAN: what OVS tags on the way out and takes in tagged


@dataclass
class DesiredState:
    mtu: int  # the tunnel MTU (= transport_mtu when nothing is tunnelled)
    gateway_addresses: tuple[str, ...]  # CIDRs on the gateway port
    tunnel: TunnelSpec | None
    uplink: UplinkSpec | None
    peers: list[PeerPlan] = field(default_factory=list)
    flows: list[Flow] = field(default_factory=list)  # owners BASE, NODE, PEER (never POD)
    routes: set[HostRoute] = field(default_factory=set)
    neighbors: set[Neighbor] = field(default_factory=set)
    nft: NftPlan = field(default_factory=NftPlan)
    # NetworkPolicy on: the body of the host's judge table (routesync.policy.hostjudge), what
    # kube-proxy's NAT takes past OVS, as sets and chains; None: policy off (no such table)
    policy_nft: NftBody | None = None
    forwarding: bool = True
    # macSource both: peers whose annotation and neighbour entry disagree (the annotation wins)
    mac_disagreements: list[MacDisagreement] = field(default_factory=list)
    # the full MTU: Pods' interfaces, the gateway port, unencapsulated paths (0: = mtu)
    transport_mtu: int = 0
    # namespaces with NetworkPolicies: an ovs-vswitchd restart's Pod flow replay gives their Pods
    # the pending block their ADD gave them (route-sync lifts it for the Pods it has planned)
    policy_namespaces: tuple[str, ...] = ()
    # Pod CIDRs two Nodes claim (routesync.planclaims): the set-aside ones are planned nowhere here
    cidr_conflicts: tuple[CidrConflict, ...] = ()
    # trafficEncryptionMode wireguard: the device and its peers (the daemon adds it: its keys and
    # the time decide it, routesync.wireguard.plan); None: no encryption
    wireguard: WgSpec | None = None
    # the state file's peer rows and their JSON, in ``peers``' order, when the planner kept them
    # (its memo: routesync.statefile writes an unchanged peer's text again); None: made from ``peers``
    peer_rows: list[nodestate.Peer] | None = None
    peer_texts: list[str] | None = None
    # the plans ``peers`` gained and lost since the list it was made from, when the planner's memo
    # knows (the appliers then probe only the new tunnel endpoints without comparing every plan)
    peer_changes: PeerChanges | None = field(default=None, compare=False, repr=False)
    # what ``routes`` and ``neighbors`` gained and lost since the sets they were made from, when
    # the planner's memo knows (the route applier then sends those without two set differences)
    route_changes: SetChanges | None = field(default=None, compare=False, repr=False)
    neighbor_changes: SetChanges | None = field(default=None, compare=False, repr=False)
    # True: the appliers compare with what the system holds (dumps; repairs drift).  False (a
    # Node change between re-assertions): they may apply only the difference from the desired
    # state they applied last, without reading the system back.
    full: bool = True


# --- what the appliers report to the planner (``routesync.daemon.Appliers.prepare``) and the kernel's
# --- next hops it plans the fast path with ------------------------------------------------------------

@dataclass(frozen=True)
class LocalFacts:
    """What the appliers report about this Node after preparing the bridge and its ports; the
    planner needs it to build flows (ofports, MACs) and to decide paths (transport networks)."""

    gateway_ofport: int
    gateway_mac: str
    tunnel_ofport: int | None  # None when there is no tunnel port
    uplink_name: str  # the transport interface as the host sees it now ("eth0")
    uplink_addresses: tuple[str, ...]  # CIDRs on it: "192.168.77.11/24", "fd00:77::11/64"
    transport_mtu: int
    uplink_mac: str | None = None
    uplink_ofport: int | None = None  # the physical uplink's OVS port while moved onto the bridge
    uplink_host_ofport: int | None = None  # the internal port that took the uplink's name (moved)
    # the denied log's meter (cni.pipeline.tables.DENIED_LOG_METER) is on the bridge: without it
    # no isolation flow sends packets up (a log must not open a flood's way to route-sync)
    denied_log_meter: bool = False
    # every global address of the Node's namespace (NetworkPolicy: the Node's own traffic)
    node_addresses: tuple[str, ...] = ()
    # this prepare moved the uplink onto the bridge: connections the Node opened before (the
    # API server's watches) may stall, and are opened again (``NodeSource.reconnect``)
    uplink_moved: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class NextHop:
    """What the kernel says about the way to one destination: the next hop's address (the
    destination itself on a shared segment, else the router) and its MAC when resolved."""

    ip: str
    mac: str | None


@dataclass(frozen=True)
class MacDisagreement:
    peer: str
    family: int
    annotation: str
    neighbor: str


@dataclass(frozen=True)
class CidrConflict:
    """A Pod CIDR two Nodes claim (any overlap, one inside the other included): ``node``'s
    ``cidr`` is set aside for ``owner``'s ``owner_cidr`` (``routesync.planclaims``)."""

    node: str
    cidr: str  # canonical
    owner: str
    owner_cidr: str  # canonical
