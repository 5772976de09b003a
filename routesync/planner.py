"""The planner: Nodes + config + local facts in, :class:`model.DesiredState` out.  Pure.

Decision per peer and address family (:func:`decide`):

    mode               peer in a local transport subnet   peer elsewhere
    encap              tunnel                             tunnel
    hybrid             route                              tunnel
    noEncap            route                              underlay (the underlay routes Pod CIDRs)
    networkPolicyOnly  none                               none

With ``fastPath`` (noEncap, hybrid) a routed or underlay peer whose next-hop MAC is known takes
the *fast* path (:func:`choose_mac`): Pods' packets leave OVS straight by the uplink.  Same
subnet, the next hop is the peer itself (its ``ferry.io/mac-address`` annotation and/or the
kernel's neighbour entry, per ``macSource``); another subnet, it is this Node's router towards
the peer, whose MAC only the neighbour table can give (no annotation names a router), whatever
``macSource`` says.  A peer without a known MAC keeps its ``route``/``underlay`` path (the
gateway port).  The kernel's answers come in as ``next_hops`` (destination → :class:`NextHop`);
:func:`fast_candidates` says which destinations to ask about.

Two Nodes claiming one Pod CIDR (any overlap): one claim stands, the other is planned nowhere
(:mod:`.planclaims`: this Node's own first, then the Node whose name sorts first).

Without a memo everything is computed from scratch (the reference: a full pass's meaning); with
one (:class:`PeerMemo`, the daemon's) an unchanged peer's result is reused and the peers' flows
say which cookie groups moved since the last plan (``routesync.flowdelta``); the appliers diff
what is left.  ``tests/routesync/test_node_delta.py`` replays random Node events through both
and holds them equal."""

from __future__ import annotations

import bisect
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain, compress
from operator import attrgetter, is_not
from typing import TYPE_CHECKING, Any

from cni.lean import addr
from cni.node import nodestate
from cni.pipeline.flows import GatewayPort, base_flows
from cni.pipeline.flows import mac as mac_of
from cni.pipeline.match import VLAN_MAX, VLAN_MIN
from cni.pipeline.modes import (
    ENCAP,
    FAST_PATH_MODES,
    HYBRID,
    NETDEV,
    NETWORK_POLICY_ONLY,
    NO_ENCAP,
    PATH_FAST,
    PATH_NONE,
    PATH_ROUTE,
    PATH_TUNNEL,
    PATH_UNDERLAY,
    PATH_WIREGUARD,
)
from cni.pipeline.tables import GATEWAY_PORT, TUNNEL_PORT, VIRTUAL_MAC, Flow

from . import mtu as mtu_mod
from . import planclaims
from .config import Config, ConfigError, vlan_id
from .flowdelta import KeyedFlowTracker, join
from .model import (
    MAC_ANNOTATION,
    VLAN_ANNOTATION,
    VLAN_NONE,
    CidrConflict,
    ClusterChanges,
    DesiredState,
    HostRoute,
    LocalFacts,
    MacDisagreement,
    Neighbor,
    NextHop,
    NftPlan,
    NodeRecord,
    PeerChanges,
    PeerPlan,
    SetChanges,
    TunnelSpec,
    UplinkSpec,
)
from .peerflows import FastPort, node_flows, peer_flows
from .recordlist import NodeList, changed_places, common_ends

if TYPE_CHECKING:
    from cni.pipeline.modes import Mode, Path

IPNet = ipaddress.IPv4Network | ipaddress.IPv6Network


class PlanError(Exception):
    """The local Node cannot be planned yet (e.g. it has no Pod CIDR)."""


def decide(mode: Mode, local_transport_networks: Iterable[str | IPNet], peer_address: str | None) -> Path:
    """The path to one peer for one family: tunnel | route | underlay | none.

    ``peer_address`` is the peer's transport address of that family (None: it has none; then a
    direct route is impossible and hybrid tunnels over the other family, noEncap leaves it to the
    underlay)."""
    if mode == NETWORK_POLICY_ONLY:
        return PATH_NONE
    if mode == ENCAP:
        return PATH_TUNNEL
    same_subnet = False
    if peer_address is not None:
        ip = ipaddress.ip_address(peer_address)
        same_subnet = any(ip in ipaddress.ip_network(n, strict=False) for n in local_transport_networks
                          if ipaddress.ip_network(n, strict=False).version == ip.version)
    if mode == HYBRID:
        return PATH_ROUTE if same_subnet else PATH_TUNNEL
    if mode == NO_ENCAP:
        return PATH_ROUTE if same_subnet else PATH_UNDERLAY
    raise ValueError(f"unknown mode {mode!r}")


def first_address(cidr: str) -> str:
    """The gateway address of a Pod CIDR: its first host, with the CIDR's prefix length."""
    return addr.first_host_cidr(cidr)


# cni.lean.addr (integer arithmetic, checked against ipaddress in tests/cni/lean/test_addr.py) instead of
# ipaddress objects: planning 5,000 peers spent most of its ~1.3 s constructing them.
def _family(address: str) -> int:
    return addr.family(address)


def _by_family(addrs: Sequence[str], family: int) -> list[str]:
    return [a for a in addrs if _family(a) == family]


def _host(address: str) -> str:
    return addr.host(address)


def uplink_renamed(name: str) -> str:
    """The physical uplink's name once moved onto the bridge: ``eth0`` → ``eth0~``."""
    return name[:14] + "~"


def local_pod_cidrs(config: Config, local: NodeRecord) -> tuple[str, ...]:
    cidrs = local.pod_cidrs or config.pod_cidrs
    if not cidrs:
        raise PlanError(f"Node {local.name} has no Pod CIDR (neither in its record nor in podCIDRs)")
    return tuple(str(ipaddress.ip_network(c, strict=False)) for c in cidrs)


def transport_networks(config: Config, facts: LocalFacts) -> tuple[str, ...]:
    addrs = config.transport_interface_cidrs or facts.uplink_addresses
    return tuple(str(ipaddress.ip_interface(a).network) for a in addrs)


def local_transport_addresses(config: Config, local: NodeRecord, facts: LocalFacts) -> tuple[str, ...]:
    if local.transport_addresses:
        return tuple(_host(a) for a in local.transport_addresses)
    return tuple(_host(a) for a in (config.transport_interface_cidrs or facts.uplink_addresses))


def _underlay_for(family: int, addresses: Sequence[str]) -> str | None:
    """The transport address a tunnel for Pod ``family`` uses: same family first, else the other."""
    same = _by_family(addresses, family)
    if same:
        return same[0]
    other = _by_family(addresses, 10 - family)  # 4 <-> 6
    return other[0] if other else None


def choose_mac(mac_source: str, same_subnet: bool, annotation: str | None, neighbor: str | None
               ) -> tuple[str | None, str | None, bool]:
    """(next-hop MAC, its source, disagreement) for one fast-path candidate.

    Another subnet: the router's MAC, from the neighbour table only.  Same subnet: ``annotation``
    or ``neighbor`` alone, or ``both``: the annotation first, the neighbour entry verifies (a
    different MAC there is a disagreement; the annotation is used), the neighbour entry alone
    when there is no annotation."""
    if not same_subnet:
        return (neighbor, "neighbor", False) if neighbor else (None, None, False)
    if mac_source == "annotation":
        return (annotation, "annotation", False) if annotation else (None, None, False)
    if mac_source == "neighbor":
        return (neighbor, "neighbor", False) if neighbor else (None, None, False)
    if annotation:
        return annotation, "annotation", bool(neighbor and neighbor != annotation)
    return (neighbor, "neighbor", False) if neighbor else (None, None, False)


def _valid_mac(value: str | None) -> str | None:
    if not value:
        return None
    try:
        return mac_of(value)
    except ValueError:
        return None


def fast_path_ready(config: Config, facts: LocalFacts) -> bool:
    """The fast path outputs Pods' packets to the uplink in clear: never with encryption (every
    peer takes the WireGuard path instead; ``show`` says what it replaced)."""
    return bool(config.fast_path and config.mode in FAST_PATH_MODES and facts.uplink_ofport
                and facts.uplink_mac and not config.encrypted)


def fast_candidates(config: Config, peers: Sequence[NodeRecord], facts: LocalFacts) -> tuple[str, ...]:
    """The transport addresses whose next hop the kernel must resolve for the fast path: every
    routed/underlay peer with ``macSource`` neighbor/both, only other-subnet ones with annotation."""
    if not config.fast_path or config.encrypted:
        return ()
    networks = transport_networks(config, facts)
    out: set[str] = set()
    for peer in peers:
        if peer.name == config.node_name:
            continue
        for p in peer_plans(config, networks, peer):
            wanted = p.path == PATH_UNDERLAY or (p.path == PATH_ROUTE and config.mac_source != "annotation")
            if wanted and p.transport_address:
                out.add(p.transport_address)
    return tuple(sorted(out))


def peer_plans(config: Config, networks: Sequence[str], peer: NodeRecord,
               next_hops: Mapping[str, NextHop] | None = None, fast: bool = False,
               disagreements: list[MacDisagreement] | None = None) -> list[PeerPlan]:
    plans: list[PeerPlan] = []
    peer_addrs = [_host(a) for a in peer.transport_addresses]
    annotation = _valid_mac(peer.annotation(MAC_ANNOTATION))
    by_family: dict[int, list[str]] = {4: [], 6: []}
    for c in peer.pod_cidrs:  # each parsed once (a full pass plans every peer)
        by_family[addr.family(c)].append(c)
    for family in (4, 6):
        cidrs = tuple(addr.canonical_network(c) for c in by_family[family])
        if not cidrs:
            continue
        same = _by_family(peer_addrs, family)
        path = decide(config.mode, networks, same[0] if same else None)
        transport = same[0] if same else None
        if path == PATH_TUNNEL:
            transport = _underlay_for(family, peer_addrs)
            if transport is None:  # a peer with no transport address cannot be tunnelled to
                path = PATH_NONE
        if config.encrypted and path != PATH_NONE:
            # WireGuard carries this peer whatever the mode gives it (the mode's path kept as
            # the fallback, for show); its endpoint is the peer's transport address
            endpoint = transport or _underlay_for(family, peer_addrs)
            plans.append(PeerPlan(peer=peer.name, family=family, path=PATH_WIREGUARD if endpoint else PATH_NONE,
                                  transport_address=endpoint, pod_cidrs=cidrs, fallback=path))
            continue
        plan = PeerPlan(
            peer=peer.name, family=family, path=path, transport_address=transport, pod_cidrs=cidrs,
            peer_gateway=_host(first_address(cidrs[0])) if path == PATH_TUNNEL else None,
        )
        if fast and path in (PATH_ROUTE, PATH_UNDERLAY) and transport is not None:
            hop = (next_hops or {}).get(transport)
            mac, source, differs = choose_mac(config.mac_source, path == PATH_ROUTE, annotation,
                                              _valid_mac(hop.mac) if hop else None)
            if differs and disagreements is not None and annotation and hop and hop.mac:
                disagreements.append(MacDisagreement(peer.name, family, annotation, mac_of(hop.mac)))
            if mac is not None:
                plan = replace(plan, path=PATH_FAST, next_hop_mac=mac, mac_source=source, fallback=path,
                               next_hop=hop.ip if hop else transport)
        plans.append(plan)
    return plans


def host_routes(plan: PeerPlan, tunnel_mtu: int = 0, wireguard: str | None = None
                ) -> tuple[set[HostRoute], set[Neighbor]]:
    """The Node's routes to one peer's Pod CIDRs; a tunnelled peer's carry ``tunnel_mtu`` (the
    gateway port has the full MTU: the Node's own packets must fit the tunnel).  A WireGuard
    peer's go to the device ``wireguard`` (at the same MTU: the WireGuard overhead's)."""
    routes: set[HostRoute] = set()
    neighbors: set[Neighbor] = set()
    if plan.path == PATH_WIREGUARD and wireguard is not None:
        for c in plan.pod_cidrs:
            routes.add(HostRoute(dst=c, gw=None, dev=wireguard, mtu=tunnel_mtu))
    elif ((plan.path == PATH_ROUTE or (plan.path == PATH_FAST and plan.fallback == PATH_ROUTE))
          and plan.transport_address):
        for c in plan.pod_cidrs:
            routes.add(HostRoute(dst=c, gw=plan.transport_address, dev=None))
    elif plan.path == PATH_TUNNEL and plan.peer_gateway:
        gw = plan.peer_gateway
        if plan.family == 4:
            for c in plan.pod_cidrs:
                routes.add(HostRoute(dst=c, gw=gw, dev=GATEWAY_PORT, onlink=True, mtu=tunnel_mtu))
        else:
            routes.add(HostRoute(dst=f"{gw}/128", gw=None, dev=GATEWAY_PORT, mtu=tunnel_mtu))
            neighbors.add(Neighbor(ip=gw, mac=VIRTUAL_MAC, dev=GATEWAY_PORT))
            for c in plan.pod_cidrs:
                routes.add(HostRoute(dst=c, gw=gw, dev=GATEWAY_PORT, mtu=tunnel_mtu))
    return routes, neighbors


@dataclass(frozen=True)
class PeerResult:
    """What :func:`plan` derives from one peer record (a pure function of it and the context)."""

    plans: tuple[PeerPlan, ...]
    flows: tuple[Flow, ...]
    routes: frozenset[HostRoute]
    neighbors: frozenset[Neighbor]
    disagreements: tuple[MacDisagreement, ...]
    pod_cidrs: frozenset[str]  # the peer's Pod CIDRs, normalized (the cluster set)
    rows: tuple[nodestate.Peer, ...] = ()  # its rows of the state file (one per plan)
    texts: tuple[str, ...] = ()  # their JSON, as NodeState.to_json writes them


@dataclass
class PeerMemo:
    """What :func:`plan` keeps between calls to plan a Node change as a delta: each peer's
    result (reused while its record, and the planning context: config, transport networks,
    ports, MACs, this Node's Pod CIDRs, is the same) and the sums over the peers (flows, routes,
    neighbours, the cluster's Pod CIDRs, the state file's rows), each changed by what the peers
    that moved take out and put in.  A call finds the peers that moved by identity (the sources
    hand an unchanged Node's record over again), so a change of one Node costs that Node, not
    5,000 (the per-peer loop over every result was ~11 % of a change's CPU there).  Another
    context plans every peer again.  The caller (the daemon) owns it; ``plan`` without one
    computes everything (the reference: ``tests/routesync/test_node_delta.py``)."""

    context: Any = None
    results: dict[Any, PeerResult] = field(default_factory=dict)  # key -> result, the peers now
    claims: planclaims.ClaimIndex = field(default_factory=planclaims.ClaimIndex)  # every Node's Pod CIDRs
    by_name: dict[str, PeerResult] = field(default_factory=dict)  # the last plan's, per peer
    # the peers' flows as routesync.flowdelta tracks them: the cookie groups of the peers re-planned
    flows: KeyedFlowTracker = field(default_factory=KeyedFlowTracker)
    records: dict[str, NodeRecord] = field(default_factory=dict)  # the last plan's peer records
    keys: dict[str, Any] = field(default_factory=dict)  # peer -> its key in ``results``
    aside: dict[str, frozenset[str]] = field(default_factory=dict)  # the last plan's set-aside CIDRs
    order: list[str] = field(default_factory=list)  # the peers planned, sorted
    routes: set[HostRoute] = field(default_factory=set)
    neighbors: set[Neighbor] = field(default_factory=set)
    counts: dict[Any, int] = field(default_factory=dict)  # route/neighbour -> peers wanting it
    cluster: dict[str, int] = field(default_factory=dict)  # peers' Pod CIDR -> peers claiming it
    cluster_sorted: list[str] = field(default_factory=list)  # the cluster set, sorted
    fixed: frozenset[str] = frozenset()  # the cluster set's part that is no peer's (this context's)
    peer_list: list[NodeRecord] | None = None  # the last call's peers, as given
    disagreeing: int = 0  # results with MAC disagreements
    # the last plan's plans, flows, state-file rows and their texts, and how long each peer's
    # part is in them (plans/rows/texts, flows), in ``order``
    lists: tuple[list[PeerPlan], list[Flow], list[nodestate.Peer], list[str]] | None = None
    lengths: tuple[list[int], list[int]] | None = None
    cluster_tuple: tuple[str, ...] | None = None  # the cluster set the last plan handed out
    head: tuple[Any, list[Flow]] | None = None  # the base and Node flows, and what they were made of
    local_in: NodeRecord | None = None  # this Node's record among them, if it was

    def use(self, context: Any) -> dict[Any, PeerResult]:
        if context != self.context:
            self.context, self.results = context, {}
            self.records, self.keys, self.by_name, self.order = {}, {}, {}, []
            self.routes, self.neighbors, self.counts, self.cluster = set(), set(), {}, {}
            self.cluster_sorted, self.fixed, self.peer_list, self.disagreeing = [], frozenset(), None, 0
            self.lists, self.lengths, self.cluster_tuple = None, None, None
        return self.results


def peer_result(config: Config, networks: Sequence[str], peer: NodeRecord, facts: LocalFacts,
                tunnel_ofport: int | None, next_hops: Mapping[str, NextHop] | None, fast: bool,
                fast_port: FastPort | None, tunnel_mtu: int = 0) -> PeerResult:
    disagreements: list[MacDisagreement] = []
    plans = peer_plans(config, networks, peer, next_hops, fast, disagreements)
    flows: list[Flow] = []
    routes: set[HostRoute] = set()
    neighbors: set[Neighbor] = set()
    for p in plans:
        flows += peer_flows(p, facts.gateway_mac, tunnel_ofport, fast_port)
        r, n = host_routes(p, tunnel_mtu, config.wireguard.interface if config.encrypted else None)
        routes |= r
        neighbors |= n
    # every Pod CIDR is in exactly one family's plan, already canonical there
    rows = tuple(_peer_row(p) for p in plans)
    return PeerResult(tuple(plans), tuple(flows), frozenset(routes), frozenset(neighbors), tuple(disagreements),
                      frozenset(c for p in plans for c in p.pod_cidrs), rows, tuple(map(nodestate.json_text, rows)))


def wg_overhead(ipv6_underlay: bool) -> int:
    """What WireGuard adds to a packet (outer IP + UDP + its data header and tag)."""
    from .wireguard.plan import overhead

    return overhead(ipv6_underlay)


def tunnel_spec(config: Config) -> TunnelSpec | None:
    if not config.tunnelled:
        return None
    return TunnelSpec(type=config.tunnel_type, port_name=TUNNEL_PORT, dst_port=config.tunnel_port)


def transport_vlan(config: Config, local: NodeRecord | None = None) -> int | None:
    """This Node's transport VLAN: its ``ferry.io/transport-vlan`` annotation (a VLAN ID, or
    ``none``: untagged here), else ``transportVLAN``.  A bad annotation fails the pass, naming it
    (the Node keeps what it has: a guess could put it on the wrong network)."""
    raw = local.annotation(VLAN_ANNOTATION) if local is not None else None
    if raw is None:
        return config.transport_vlan
    text = raw.strip().lower()
    if text == VLAN_NONE:
        return None
    try:
        return vlan_id(VLAN_ANNOTATION, int(text) if text.isdigit() else raw)
    except ConfigError:
        raise PlanError(f"Node {local.name if local else '?'}: annotation {VLAN_ANNOTATION}={raw!r}: expected a "
                        f"VLAN ID in [{VLAN_MIN}, {VLAN_MAX}] or {VLAN_NONE!r}") from None


def uplink_spec(config: Config, local: NodeRecord | None = None) -> UplinkSpec | None:
    """OVS userspace tunnels need the uplink on the bridge (netdev only); the fast path needs it
    on either datapath (Pods' packets are output to it from OVS); so does a transport VLAN (the
    kernel here need not tag: OVS tags what the internal port that took the uplink's name sends)."""
    vlan = transport_vlan(config, local)
    if not ((config.datapath_type == NETDEV and config.tunnelled) or config.fast_path or vlan is not None):
        return None
    return UplinkSpec(name=config.transport_interface, renamed=uplink_renamed(config.transport_interface),
                      vlan=vlan)


def gateway_addresses(config: Config, local: NodeRecord) -> tuple[str, ...]:
    """The gateway's CIDRs.  networkPolicyOnly: none (the primary CNI owns addressing)."""
    if config.mode == NETWORK_POLICY_ONLY:
        return ()
    return tuple(first_address(c) for c in local_pod_cidrs(config, local))


def plan(config: Config, local: NodeRecord, peers: Sequence[NodeRecord], facts: LocalFacts,
         next_hops: Mapping[str, NextHop] | None = None, memo: PeerMemo | None = None) -> DesiredState:
    """The complete desired state of this Node.  ``next_hops``: the kernel's view of the
    :func:`fast_candidates` (fast path only).  ``memo``: per-peer results of earlier calls
    (the result is the same with or without it)."""
    pod_cidrs = local_pod_cidrs(config, local)
    gw_addrs = gateway_addresses(config, local)
    networks = transport_networks(config, facts)
    tunnel = tunnel_spec(config)
    uplink = uplink_spec(config, local)
    local_addrs = local_transport_addresses(config, local, facts)

    ipv6_underlay = False
    if config.encrypted:  # WireGuard's endpoints are IPv4 where the Node has an IPv4 transport address
        ipv6_underlay = bool(local_addrs) and not any(_family(a) == 4 for a in local_addrs)
    elif tunnel is not None:
        used = {_underlay_for(_family(c), local_addrs) for c in pod_cidrs}
        ipv6_underlay = any(a is not None and _family(a) == 6 for a in used)
    mtu = mtu_mod.pod_mtu(facts.transport_mtu, config.mode, config.tunnel_type, ipv6_underlay,
                          config.default_mtu, wg_overhead(ipv6_underlay) if config.encrypted else 0)
    full_mtu = mtu_mod.transport_mtu(facts.transport_mtu, config.default_mtu)
    route_mtu = mtu if mtu < full_mtu else 0  # host routes to tunnelled peers

    tunnel_ofport = facts.tunnel_ofport if tunnel is not None else None
    # networkPolicyOnly: the host un-DNATs a Service's reply only if it sees it; Pod sources that
    # come in through the gateway are flagged so their replies go back to it (docs/design/services.md)
    returned = config.cluster_cidrs if config.mode == NETWORK_POLICY_ONLY else ()
    fast = fast_path_ready(config, facts)
    fast_port = None
    if fast:
        assert facts.uplink_ofport is not None and facts.uplink_mac is not None
        fast_port = FastPort(facts.uplink_ofport, facts.uplink_mac, pod_cidrs, facts.uplink_host_ofport,
                             uplink.vlan if uplink is not None else None)
    gateway = GatewayPort(facts.gateway_ofport, facts.gateway_mac, gw_addrs)
    head_key = (gateway, returned, tunnel_ofport, fast_port)
    if memo is not None and memo.head is not None and memo.head[0] == head_key:
        flows = memo.head[1]  # the base and Node flows of the last plan (a list nobody changes)
    else:
        flows = base_flows(gateway, returned)
        flows += node_flows(tunnel_ofport, facts.gateway_mac, fast_port)
        if memo is not None:
            memo.head = (head_key, flows)
    args = (config, networks, facts, tunnel_ofport, next_hops, fast, fast_port, route_mtu)
    if memo is None:
        part = _peers_full(local, peers, pod_cidrs, *args)
        flows = flows + part.flows
    else:
        part = _peers_delta(memo, local, peers, pod_cidrs, *args)
        flows = join(flows, part.flows)
    nft = NftPlan(
        masquerade=not (config.no_snat or config.mode == NETWORK_POLICY_ONLY),
        local_pod_cidrs=pod_cidrs,
        cluster_pod_cidrs=part.cluster,
        cluster_changes=part.cluster_changes,
        tunnel_udp_port=tunnel.dst_port if tunnel is not None else None,
        uplink_ingress_drop=uplink.renamed if uplink is not None and config.datapath_type == NETDEV else None,
    )
    return DesiredState(mtu=mtu, gateway_addresses=gw_addrs, tunnel=tunnel, uplink=uplink, peers=part.plans,
                        flows=flows, routes=part.routes, neighbors=part.neighbors, nft=nft,
                        forwarding=True, mac_disagreements=part.disagreements, transport_mtu=full_mtu,
                        cidr_conflicts=part.conflicts, peer_rows=part.rows, peer_texts=part.texts,
                        peer_changes=part.peer_changes, route_changes=part.route_changes,
                        neighbor_changes=part.neighbor_changes)


@dataclass
class _Peers:
    """The peers' part of a plan."""

    plans: list[PeerPlan]
    flows: list[Flow]
    routes: set[HostRoute]
    neighbors: set[Neighbor]
    disagreements: list[MacDisagreement]
    cluster: tuple[str, ...]  # every Node's Pod CIDRs, sorted
    conflicts: tuple[CidrConflict, ...]
    rows: list[nodestate.Peer] | None = None  # the state file's rows, when kept
    texts: list[str] | None = None  # and their JSON
    cluster_changes: ClusterChanges | None = None  # what ``cluster`` gained and lost, when known
    peer_changes: PeerChanges | None = None  # what ``plans`` gained and lost, when known
    route_changes: SetChanges | None = None  # what ``routes`` gained and lost, when known
    neighbor_changes: SetChanges | None = None  # and ``neighbors``


def _hop_key(peer: NodeRecord, fast: bool, next_hops: Mapping[str, NextHop] | None) -> Any:
    """A peer's key among the memo's results: its record, and with the fast path the kernel's
    next hops for its addresses (part of its input)."""
    if not fast:
        return peer
    return (peer, tuple((a, (next_hops or {}).get(_host(a))) for a in peer.transport_addresses))


def _peers_full(local: NodeRecord, peers: Sequence[NodeRecord], pod_cidrs: tuple[str, ...], config: Config,
                networks: Sequence[str], facts: LocalFacts, tunnel_ofport: int | None,
                next_hops: Mapping[str, NextHop] | None, fast: bool, fast_port: FastPort | None,
                route_mtu: int) -> _Peers:
    """Every peer planned afresh: the reference the memo's deltas are held to."""
    claims = planclaims.ClaimIndex()
    records = {p.name: p.pod_cidrs for p in peers if p.name != local.name}
    records[local.name] = pod_cidrs
    claims.sync(records)
    conflicts = claims.conflicts(local.name)
    # two Nodes claiming one Pod CIDR: the set-aside claims are planned nowhere below (planclaims)
    aside = planclaims.set_aside(conflicts, local.name)
    out = _Peers([], [], set(), set(), [], (), conflicts)
    cluster = set(pod_cidrs) | set(config.cluster_cidrs)
    for peer in sorted(peers, key=lambda p: p.name):
        if peer.name == local.name:
            cluster |= {str(ipaddress.ip_network(c, strict=False)) for c in peer.pod_cidrs}
            continue
        if peer.name in aside:
            peer = replace(peer, pod_cidrs=tuple(c for c in peer.pod_cidrs
                                                 if addr.canonical_network(c) not in aside[peer.name]))
        res = peer_result(config, networks, peer, facts, tunnel_ofport, next_hops, fast, fast_port, route_mtu)
        out.plans += res.plans
        out.flows += res.flows
        out.routes |= res.routes
        out.neighbors |= res.neighbors
        out.disagreements += res.disagreements
        cluster |= res.pod_cidrs
    out.cluster = tuple(sorted(cluster))
    return out


_PLANS, _FLOWS, _DISAGREEMENTS = attrgetter("plans"), attrgetter("flows"), attrgetter("disagreements")
_ROWS, _TEXTS, _NAME = attrgetter("rows"), attrgetter("texts"), attrgetter("name")


# the most records in the two middles that :func:`_records` compares by name (past that, the whole
# list is)
MIDDLE_MOST = 64


def _same(a: NodeRecord, b: NodeRecord) -> bool:
    return a is b or a == b


def _records(memo: PeerMemo, local: NodeRecord, peers: Sequence[NodeRecord]
             ) -> tuple[dict[str, NodeRecord], NodeRecord | None, list[str], set[str]]:
    """The peers' records by name (this Node's own, when among them, apart), the peers whose
    record differs from the memo's and those gone.  A ``recordlist.NodeList`` that follows the
    last call's list says what changed (the Kubernetes source's, through the daemon's
    ``OwnSplit``).  Else the source's list in the last call's order (the same records, one or two
    replaced in place) is compared with that one by halves (``recordlist.changed_places``), a list
    with Nodes added or gone by the middle the two do not share (``recordlist.common_ends``);
    anything else by name."""
    prev = memo.peer_list
    changes = (peers.changes_since(getattr(prev, "key", None))
               if isinstance(peers, NodeList) and memo.records else None)
    if changes is not None and local.name not in changes:  # the list says what changed since the last
        current = memo.records  # the memo's own: updated in place
        changed: list[str] = []
        gone: set[str] = set()
        for n, (_was, record) in changes.items():
            if record is None:
                if current.pop(n, None) is not None:
                    gone.add(n)
            else:
                current[n] = record
                changed.append(n)
        return current, memo.local_in, changed, gone
    if prev is not None and memo.records and len(prev) == len(peers):
        at = changed_places(peers, prev)
        if all(peers[i].name == prev[i].name != local.name for i in at):
            current = memo.records  # the memo's own: updated in place
            for i in at:
                current[peers[i].name] = peers[i]
            return current, memo.local_in, [peers[i].name for i in at], set()
    elif prev is not None and memo.records and len(memo.records) + (memo.local_in is not None) == len(prev):
        # Nodes came or went, and the last list had no name twice: what differs is the middle
        # between the ends the lists share (a Node added or gone: itself)
        front, back = common_ends(peers, prev)
        now, was = peers[front:len(peers) - back], prev[front:len(prev) - back]
        if len(now) + len(was) <= MIDDLE_MOST:
            now_names = {r.name: r for r in now}
            was_names = {r.name for r in was}
            current = memo.records
            if (len(now_names) == len(now) and local.name not in now_names and local.name not in was_names
                    and all(n in was_names or n not in current for n in now_names)):
                gone = was_names - now_names.keys()
                changed = [n for n, r in now_names.items() if n not in current or not _same(r, current[n])]
                for n in gone:
                    del current[n]
                for n in changed:
                    current[n] = now_names[n]
                return current, memo.local_in, changed, gone
    current = dict(zip(map(_NAME, peers), peers))
    local_in = current.pop(local.name, None)
    last = memo.records
    names = list(current)
    changed = list(compress(names, map(is_not, map(last.get, names), current.values())))
    return current, local_in, changed, set(last.keys() - current.keys())


def _peers_delta(memo: PeerMemo, local: NodeRecord, peers: Sequence[NodeRecord], pod_cidrs: tuple[str, ...],
                 config: Config, networks: Sequence[str], facts: LocalFacts, tunnel_ofport: int | None,
                 next_hops: Mapping[str, NextHop] | None, fast: bool, fast_port: FastPort | None,
                 route_mtu: int) -> _Peers:
    """:func:`_peers_full`'s result from the memo's last one and the peers that moved since
    (their record another object, their next hops or set-aside CIDRs other; all of them in
    another context): what they took out of the sums is taken out, what they give now put in.
    The rest is C-level copies and joins of the kept results."""
    current, local_in, changed, gone = _records(memo, local, peers)
    fixed = set(pod_cidrs) | set(config.cluster_cidrs)
    if local_in is not None:
        fixed |= {str(ipaddress.ip_network(c, strict=False)) for c in local_in.pod_cidrs}
    memo.use((config, tuple(networks), tunnel_ofport, facts.gateway_mac, fast, fast_port, route_mtu, local.name,
              pod_cidrs, frozenset(fixed)))
    if not memo.order:  # a fresh context (or none planned before): every peer is planned
        memo.fixed, memo.cluster_sorted = frozenset(fixed), sorted(fixed)
        changed, gone = list(current), set()
    last = memo.records
    claims = memo.claims
    for n in gone:
        claims.set(n, ())
    for n in changed:
        claims.set(n, current[n].pod_cidrs)
    claims.set(local.name, pod_cidrs)
    conflicts = claims.conflicts(local.name)
    aside = planclaims.set_aside(conflicts, local.name)
    moved = set(changed) | gone
    moved.update(n for n in aside.keys() | memo.aside.keys() if aside.get(n) != memo.aside.get(n))
    if fast:  # the kernel's next hops are part of a peer's input
        moved.update(n for n in list(current) if n not in moved
                     and memo.keys.get(n) != _hop_key(last[n], True, next_hops))
    routes_since, neighbors_since = memo.routes, memo.neighbors
    routes, neighbors = set(routes_since), set(neighbors_since)  # the last plan's stay as they were (copies
    # of sets keep their elements' hashes: C work, no HostRoute.__hash__)
    touched_routes: set[HostRoute] = set()  # the routes and neighbours of the peers moved, before and now
    touched_neighbors: set[Neighbor] = set()
    counts, cluster, in_order, order = memo.counts, memo.cluster, memo.cluster_sorted, memo.order
    came: list[str] = []  # CIDRs into the cluster set, and out of it
    left: list[str] = []
    plans_in: list[PeerPlan] = []  # the moved peers' plans now, and before
    plans_out: list[PeerPlan] = []
    plans_since = memo.lists[0] if memo.lists is not None else None
    # a few peers moved: their parts are spliced into copies of the last lists where they are
    # (C copies and slices); many, or a fresh context: the lists are joined again from every result
    splice = _Splice(memo) if moved and len(moved) <= SPLICE_MOST and memo.lists is not None else None
    for n in sorted(moved):
        old = memo.by_name.pop(n, None)
        if old is not None:
            plans_out += old.plans
            memo.results.pop(memo.keys.pop(n), None)
            memo.disagreeing -= bool(old.disagreements)
            touched_routes |= old.routes
            touched_neighbors |= old.neighbors
            for x in (*old.routes, *old.neighbors):
                counts[x] -= 1
                if not counts[x]:
                    del counts[x]
                    (routes if isinstance(x, HostRoute) else neighbors).discard(x)
            for c in old.pod_cidrs:
                cluster[c] -= 1
                if not cluster[c]:
                    del cluster[c]
                    if c not in memo.fixed:
                        del in_order[bisect.bisect_left(in_order, c)]
                        left.append(c)
        peer = current.get(n)
        if peer is None:
            if old is not None:
                at = bisect.bisect_left(order, n)
                del order[at]
                if splice is not None:
                    splice.put(at, old, None)
            continue
        if n in aside:
            peer = replace(peer, pod_cidrs=tuple(c for c in peer.pod_cidrs
                                                 if addr.canonical_network(c) not in aside[n]))
        key = _hop_key(peer, fast, next_hops)
        res = peer_result(config, networks, peer, facts, tunnel_ofport, next_hops, fast, fast_port, route_mtu)
        memo.results[key], memo.keys[n], memo.by_name[n] = res, key, res
        memo.disagreeing += bool(res.disagreements)
        touched_routes |= res.routes
        touched_neighbors |= res.neighbors
        for x in (*res.routes, *res.neighbors):
            counts[x] = counts.get(x, 0) + 1
        routes |= res.routes
        neighbors |= res.neighbors
        for c in res.pod_cidrs:
            cluster[c] = cluster.get(c, 0) + 1
            if cluster[c] == 1 and c not in memo.fixed:
                bisect.insort(in_order, c)
                came.append(c)
        at = bisect.bisect_left(order, n)
        if old is None:
            order.insert(at, n)
        if splice is not None:
            splice.put(at, old, res)
        plans_in += res.plans
    memo.records, memo.aside, memo.routes, memo.neighbors = current, aside, routes, neighbors
    # a NodeList is never edited: kept as it is (a copy of 5,000 references touches 5,000 objects)
    memo.peer_list, memo.local_in = (peers if isinstance(peers, NodeList) else list(peers)), local_in
    if splice is not None:
        lists = splice.lists
    else:
        lists = _joined(memo) if moved or memo.lists is None else memo.lists
    memo.lists = lists
    plans, flows, rows, texts = lists
    owned = {n: memo.by_name[n].flows for n in moved if n in memo.by_name}
    disagreements = (list(chain.from_iterable(map(_DISAGREEMENTS, map(memo.by_name.__getitem__, order))))
                     if memo.disagreeing else [])
    since = memo.cluster_tuple
    both = set(came) & set(left)  # a CIDR one peer gave up and another took (or one peer re-planned)
    added, removed = tuple(c for c in came if c not in both), tuple(c for c in left if c not in both)
    # the same tuple while its content is: a peer re-planned for another change (its address) takes
    # its CIDRs out and back, and a new tuple of equal content would cost the nft applier and the
    # Pod inputs, which trust the planner's changes only against the very tuple they last had, a
    # comparison of every CIDR of the cluster on the next change (5,000 peers: ~1.3 ms)
    cluster_now = tuple(in_order) if added or removed or since is None else since
    memo.cluster_tuple = cluster_now
    changes = None if since is None else ClusterChanges(since, added, removed)
    peer_changes = None
    if plans_since is not None:
        peer_changes = PeerChanges(plans_since, (), ()) if plans is plans_since else \
            PeerChanges(plans_since, tuple(plans_in), tuple(plans_out))
    # what the routes and neighbours gained and lost: among those the moved peers had or have
    route_changes = _set_changes(routes_since, routes, touched_routes)
    neighbor_changes = _set_changes(neighbors_since, neighbors, touched_neighbors)
    return _Peers(plans, memo.flows.step(flows, owned, moved), routes, neighbors, disagreements,
                  cluster_now, conflicts, rows, texts, changes, peer_changes, route_changes, neighbor_changes)


def _set_changes(since: set[Any], now: set[Any], candidates: Iterable[Any]) -> SetChanges:
    """``now``'s difference from ``since``, when it can only be among ``candidates``."""
    added: set[Any] = set()
    removed: set[Any] = set()
    for x in candidates:
        if x in now:
            if x not in since:
                added.add(x)
        elif x in since:
            removed.add(x)
    return SetChanges(since, frozenset(added), frozenset(removed))


_Lists = tuple[list[PeerPlan], list[Flow], list[nodestate.Peer], list[str]]


def _joined(memo: PeerMemo) -> _Lists:
    """The peers' plans, flows, state-file rows and their texts, in peer order, joined from the
    results (C work over every peer), and each peer's part's lengths."""
    results = list(map(memo.by_name.__getitem__, memo.order))
    memo.lengths = (list(map(len, map(_PLANS, results))), list(map(len, map(_FLOWS, results))))
    return (list(chain.from_iterable(map(_PLANS, results))), list(chain.from_iterable(map(_FLOWS, results))),
            list(chain.from_iterable(map(_ROWS, results))), list(chain.from_iterable(map(_TEXTS, results))))


# most peers moved in one call whose parts are spliced (each splice sums the lengths before it:
# past this many, joining the lists again from every result costs less)
SPLICE_MOST = 64


class _Splice:
    """Copies of the last plan's lists (a list copy is a memory copy, not a pass over its items)
    into which the moved peers' parts are put, in ``memo.order``'s places, as the caller edits
    that order: a peer's part replaced (its address, Pod CIDR or MAC changed), taken out (gone)
    or put in (came).  The memo's lengths follow."""

    def __init__(self, memo: PeerMemo) -> None:
        assert memo.lists is not None and memo.lengths is not None
        self.lists: _Lists = (list(memo.lists[0]), list(memo.lists[1]), list(memo.lists[2]), list(memo.lists[3]))
        self.plan_lengths, self.flow_lengths = memo.lengths

    def put(self, at: int, was: PeerResult | None, now: PeerResult | None) -> None:
        """The part of the peer at ``at`` in the order (as the caller has it now: with a peer that
        came already in it, with one gone already out of it) from ``was`` to ``now``."""
        p, f = sum(self.plan_lengths[:at]), sum(self.flow_lengths[:at])
        plans, flows, rows, texts = self.lists
        np_, nf = (len(was.plans), len(was.flows)) if was is not None else (0, 0)
        plans[p:p + np_] = now.plans if now is not None else ()
        rows[p:p + np_] = now.rows if now is not None else ()
        texts[p:p + np_] = now.texts if now is not None else ()
        flows[f:f + nf] = now.flows if now is not None else ()
        if was is None:
            assert now is not None
            self.plan_lengths.insert(at, len(now.plans))
            self.flow_lengths.insert(at, len(now.flows))
        elif now is None:
            del self.plan_lengths[at], self.flow_lengths[at]
        else:
            self.plan_lengths[at], self.flow_lengths[at] = len(now.plans), len(now.flows)


def node_state(config: Config, local: NodeRecord, desired: DesiredState, facts: LocalFacts,
               rows: dict[int, tuple[PeerPlan, nodestate.Peer]] | None = None) -> nodestate.NodeState:
    """What the plugin reads: written by the daemon when it differs from the last one written
    (``policyNamespaces``: where a new Pod starts pending, ``desired.policy_namespaces``).
    The rows are the planner's (``desired.peer_rows``: its memo keeps each peer's) or else made
    here; ``rows`` (the caller's, kept across calls): each PeerPlan object's row, reused while the
    plan is the same object, so an unchanged peer costs no new record and comparing two states
    skips it by identity."""
    tunnel = None
    if desired.tunnel is not None and facts.tunnel_ofport is not None:
        tunnel = nodestate.Tunnel(type=desired.tunnel.type, port=desired.tunnel.port_name,
                                  ofport=facts.tunnel_ofport)
    return nodestate.NodeState(
        node=config.node_name,
        mode=config.mode,
        bridge=config.bridge,
        datapath=config.datapath_type,
        ovsdb=config.ovsdb,
        ovsRunDir=config.ovs_run_dir,
        mtu=desired.mtu,
        podCIDRs=list(local_pod_cidrs(config, local)),
        clusterCIDRs=list(desired.nft.cluster_pod_cidrs),
        gateway=nodestate.Gateway(name=GATEWAY_PORT, mac=facts.gateway_mac, ofport=facts.gateway_ofport,
                                  addresses=list(desired.gateway_addresses)),
        tunnel=tunnel,
        peers=desired.peer_rows if desired.peer_rows is not None else _peer_rows(desired.peers, rows),
        transportMTU=desired.transport_mtu or desired.mtu,
        policyNamespaces=list(desired.policy_namespaces),
        encryption=config.encryption,
    )


def _peer_row(p: PeerPlan) -> nodestate.Peer:
    return nodestate.Peer(name=p.peer, addresses=[p.transport_address] if p.transport_address else [],
                          podCIDRs=list(p.pod_cidrs), path=p.path, mac=p.next_hop_mac, macSource=p.mac_source)


def _peer_rows(plans: Sequence[PeerPlan], rows: dict[int, tuple[PeerPlan, nodestate.Peer]] | None
               ) -> list[nodestate.Peer]:
    if rows is None:
        return [_peer_row(p) for p in plans]
    out = []
    seen: dict[int, tuple[PeerPlan, nodestate.Peer]] = {}
    for p in plans:
        hit = rows.get(id(p))
        if hit is None or hit[0] is not p:
            hit = (p, _peer_row(p))
        seen[id(p)] = hit
        out.append(hit[1])
    rows.clear()
    rows.update(seen)  # the plans are kept alive here, so their ids stay theirs
    return out


def self_record(config: Config, local: NodeRecord | None, facts: LocalFacts) -> NodeRecord:
    """This Node's record as route-sync publishes it: its transport addresses, Pod CIDRs and the
    ``ferry.io/mac-address`` annotation (the uplink MAC, for peers' fast path)."""
    annotations = dict(local.annotations) if local is not None else {}
    retracted: frozenset[str] = frozenset()
    if config.mac_source == "neighbor":  # a neighbour-only cluster reads no annotation: publish none
        annotations.pop(MAC_ANNOTATION, None)
        retracted = frozenset((MAC_ANNOTATION,))
    elif facts.uplink_mac:
        annotations[MAC_ANNOTATION] = facts.uplink_mac
    addrs = (local.transport_addresses if local is not None and local.transport_addresses
             else tuple(_host(a) for a in (config.transport_interface_cidrs or facts.uplink_addresses)))
    cidrs = (local.pod_cidrs if local is not None and local.pod_cidrs else config.pod_cidrs)
    return NodeRecord(name=config.node_name, transport_addresses=tuple(addrs), pod_cidrs=tuple(cidrs),
                      annotations=tuple(sorted(annotations.items())), retracted=retracted)
