"""What crossed a lab's underlay, as evidence of encryption (issue 30): pure, from decoded frames
(``lab.pcap``) to :class:`Evidence`.

Where to look (:func:`points`): every port of every segment's switch, the Nodes' and the router's
(a frame between two Nodes of a segment crosses both their ports; one across the router crosses a
Node's port on each segment and the router's on both).  What is reported:

* the flows between Node transport addresses: (source, destination, protocol, destination port)
  of every outer packet whose source and destination are both a Node's, with their counts, and
  the WireGuard messages among them;
* every sighting of a Pod address (any address inside the cluster's Pod CIDRs or a Node's) as an
  IP source or destination at any layer (outer; inside VXLAN, Geneve or GRE; in the packet an ICMP
  error quotes), or named by ARP or neighbour discovery: with encryption on there must be none.

A flow is a Pod flow when Pod addresses are its own or its inner packets'; a WireGuard datagram
hides them, which is the point."""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cni.pipeline.modes import GENEVE, VXLAN
from lab.pcap import IP_ICMPV6, IP_UDP, PROTO_NAMES, IpLayer, Packet, Ports
from lab.segswitch import ROUTER_PORT
from lab.topology import Topology, node_addresses, segment_netns
from routesync.config import DEFAULT_TUNNEL_PORTS, DEFAULT_WG_PORT

if TYPE_CHECKING:
    from cni.pipeline.modes import TunnelType

UDP, ICMPV6 = PROTO_NAMES[IP_UDP], PROTO_NAMES[IP_ICMPV6]
ND_TYPES = range(133, 138)  # ICMPv6 router/neighbour solicitation/advertisement, redirect


@dataclass(frozen=True)
class Point:
    """One capture point: a port of a segment's switch, in the segment's namespace."""

    segment: str
    port: str  # a Node's name, or the router's port
    netns: str
    nodes: tuple[str, ...]  # the Nodes whose frames to the router cross it

    @property
    def name(self) -> str:
        return f"{self.segment}/{self.port}"


def points(topo: Topology, lab: str) -> list[Point]:
    """Every port of every segment: the router's (crossed by its Nodes' frames to it) and each
    Node's."""
    out = []
    for s in topo.segments:
        ns = segment_netns(lab, s.name)
        members = tuple(n.name for n in topo.nodes if n.segment == s.name)
        out.append(Point(s.name, ROUTER_PORT, ns, members))
        out += [Point(s.name, n, ns, (n,)) for n in members]
    return out


def ports_of(topo: Topology) -> Ports:
    """The UDP ports ``topo``'s Nodes tunnel and encrypt with: each tunnel type's default, the
    configured ``tunnelPort``, route-sync's WireGuard port."""
    rs = topo.route_sync

    def of(kind: TunnelType) -> frozenset[int]:
        configured = rs.tunnelPort if rs is not None and rs.tunnelType == kind else None
        return frozenset(p for p in (DEFAULT_TUNNEL_PORTS[kind], configured) if p is not None)

    return Ports(vxlan=of(VXLAN), geneve=of(GENEVE), wireguard=frozenset({DEFAULT_WG_PORT}))


@dataclass(frozen=True)
class Flow:
    src: str
    dst: str
    proto: str
    dport: int | None = None  # TCP and UDP
    icmp_type: int | None = None  # ICMP and ICMPv6

    @property
    def nd(self) -> bool:
        """IPv6 neighbour discovery (or a router's): a Node's own, carrying nothing."""
        return self.proto == ICMPV6 and self.icmp_type in ND_TYPES

    def __str__(self) -> str:
        tail = f"/{self.dport}" if self.dport is not None else (
            f" type {self.icmp_type}" if self.icmp_type is not None else "")
        return f"{self.src} > {self.dst} {self.proto}{tail}"


@dataclass(frozen=True)
class Sighting:
    """A Pod address on the wire."""

    address: str
    role: str  # src | dst | arp | nd
    depth: int  # 0: the outer packet; 1 and more: inside a tunnel or an ICMP error's quote
    inside: str | None  # vxlan | geneve | gre | icmp-quote (None: outer)
    point: str  # the capture point's name
    outer: Flow | None  # the frame's outer flow (None: not IP, e.g. ARP)

    def __str__(self) -> str:
        where = "outer" if self.inside is None else f"inside {self.inside}"
        return f"{self.address} as {self.role} ({where}) at {self.point}" + (f" in {self.outer}" if self.outer else "")


@dataclass
class Evidence:
    packets: Counter[str] = field(default_factory=Counter)  # frames per capture point
    node_flows: Counter[Flow] = field(default_factory=Counter)  # outer packets between two Nodes
    wireguard: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (src, dst, message type)
    sightings: Counter[Sighting] = field(default_factory=Counter)
    truncated: int = 0  # frames cut before a header (the snap length): their inside is unknown
    dropped: dict[str, int] = field(default_factory=dict)  # per point, what the kernel dropped (tcpdump says)

    @property
    def total(self) -> int:
        return sum(self.packets.values())

    @property
    def pod_addresses(self) -> set[str]:
        return {s.address for s in self.sightings}

    def inside(self) -> set[str | None]:
        """Where Pod addresses were seen: None (outer), vxlan, geneve, gre, icmp-quote."""
        return {s.inside for s in self.sightings}

    def flows_between_nodes(self) -> set[Flow]:
        """The distinct flows between Node addresses but neighbour discovery."""
        return {f for f in self.node_flows if not f.nd}

    def not_wireguard(self, port: int) -> set[Flow]:
        """The flows between Nodes that are neither UDP to the WireGuard ``port`` nor neighbour
        discovery: with encryption on and only Pod-to-Pod traffic running, none."""
        return {f for f in self.flows_between_nodes() if not (f.proto == UDP and f.dport == port)}

    def report(self, limit: int = 8) -> str:
        out = [f"{self.total} frames on {len(self.packets)} capture points "
               f"({', '.join(f'{p} {n}' for p, n in sorted(self.packets.items()))})"
               + (f"; {self.truncated} cut short" if self.truncated else "")
               + (f"; dropped by the kernel: {self.dropped}" if any(self.dropped.values()) else "")]
        out.append("between Nodes (outer source > destination, protocol/port: frames):")
        for f, n in sorted(self.node_flows.items(), key=lambda kv: (str(kv[0]))):
            out.append(f"  {f}: {n}")
        if self.wireguard:
            out.append("WireGuard messages: " + ", ".join(f"{s} > {d} {t} {n}"
                                                           for (s, d, t), n in sorted(self.wireguard.items())))
        if not self.sightings:
            out.append("Pod addresses on the wire: none")
        else:
            addrs = sorted(self.pod_addresses, key=lambda a: (":" in a, ipaddress.ip_address(a).packed))
            out.append(f"Pod addresses on the wire: {len(addrs)} ({', '.join(addrs[:limit])}"
                       f"{', ...' if len(addrs) > limit else ''}) in {sum(self.sightings.values())} sightings, e.g.")
            for s, n in self.sightings.most_common(limit):
                out.append(f"  {s}: {n}")
        return "\n".join(out)


def pod_networks(topo: Topology) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The cluster's Pod CIDRs and every Node's (which may lie outside them)."""
    cidrs = [*topo.cluster_cidrs, *(c for n in topo.nodes for c in n.pod_cidrs)]
    v4 = [ipaddress.IPv4Network(c) for c in cidrs if ":" not in c]
    v6 = [ipaddress.IPv6Network(c) for c in cidrs if ":" in c]
    return [*ipaddress.collapse_addresses(v4), *ipaddress.collapse_addresses(v6)]


def node_transport_addresses(topo: Topology) -> set[str]:
    return {a for n in topo.nodes for a in node_addresses(topo, n) if a}


class _PodTest:
    """Address -> inside a Pod CIDR, memoised (a capture repeats a few addresses many times)."""

    def __init__(self, nets: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> None:
        self.nets = list(nets)
        self.seen: dict[str, bool] = {}

    def __call__(self, addr: str) -> bool:
        hit = self.seen.get(addr)
        if hit is None:
            a = ipaddress.ip_address(addr)
            hit = self.seen[addr] = any(a.version == n.version and a in n for n in self.nets)
        return hit


def evidence(captured: Mapping[str, Iterable[Packet]], nodes: Iterable[str],
             pods: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network],
             dropped: Mapping[str, int] | None = None) -> Evidence:
    """The evidence in ``captured`` (capture point name -> its frames), given the Nodes' transport
    addresses and the Pod CIDRs."""
    node_set = set(nodes)
    is_pod = _PodTest(pods)
    ev = Evidence(dropped=dict(dropped or {}))
    for point, pkts in captured.items():
        ev.packets[point] += 0
        for p in pkts:
            ev.packets[point] += 1
            ev.truncated += p.truncated
            outer = p.outer
            outer_flow = _flow(outer) if outer else None
            if outer and outer_flow and outer.src in node_set and outer.dst in node_set:
                ev.node_flows[outer_flow] += 1
                if outer.wireguard:
                    ev.wireguard[(outer.src, outer.dst, outer.wireguard)] += 1
            for layer in p.layers:
                for role, addr in (("src", layer.src), ("dst", layer.dst)):
                    if is_pod(addr):
                        ev.sightings[Sighting(addr, role, layer.depth, layer.inside, point, outer_flow)] += 1
            for named in p.named:
                if is_pod(named.address):
                    inside = next((layer.inside for layer in p.layers if layer.depth == named.depth), None)
                    ev.sightings[Sighting(named.address, named.kind, named.depth, inside, point, outer_flow)] += 1
    return ev


def _flow(layer: IpLayer) -> Flow:
    return Flow(layer.src, layer.dst, layer.proto, layer.dport, layer.icmp_type)


def of_topology(topo: Topology, captured: Mapping[str, Iterable[Packet]],
                dropped: Mapping[str, int] | None = None) -> Evidence:
    """:func:`evidence` with the Node addresses and Pod CIDRs of ``topo``."""
    return evidence(captured, node_transport_addresses(topo), pod_networks(topo), dropped)

