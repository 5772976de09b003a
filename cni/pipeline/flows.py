"""Planners for the base flows (one set per bridge) and the per-Pod flows, as plain data.

Pure functions: addresses, MACs and ofports in, :class:`cni.pipeline.tables.Flow` lists out.  The
plugin installs the per-Pod flows and deletes them by the same cookie; route-sync (or the plugin
on a lone Node) installs the base flows.  Values are validated here (``cni.lean.addr``, MAC syntax)
when the flow values are built, so nothing a user controls can change a flow's meaning."""

from __future__ import annotations

from cni.lean import addr
from cni.lean.record import record
from cni.lean.typecheck import TYPE_CHECKING
from cni.pipeline import match as m
from cni.pipeline.actions import DEC_TTL, DROP, TO_IN_PORT, Load, Move, SetField, goto, output
from cni.pipeline.match import ARP, ICMP, ICMP6, IN_PORT, IP, IPV6, mac
from cni.pipeline.tables import (
    BASE_COOKIE,
    PIPELINE,
    Classifier,
    ConntrackState,
    Cookie,
    Flow,
    L2Forwarding,
    L3Forwarding,
    NeighborResponder,
    SpoofGuard,
    Table,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from cni.pipeline.actions import Action

__all__ = ["GatewayPort", "PodPort", "arp_responder_actions", "base_flows", "link_local", "mac", "miss_flows",
           "pending_flows", "pod_flows"]

ICMP6_NS, ICMP6_NA, ICMP6_RA, ICMP6_REDIRECT = 135, 136, 134, 137
ICMP_REDIRECT = 5


def miss_flows(cookie: Cookie = BASE_COOKIE) -> Iterator[Flow]:
    """Every table's miss flow, in packet order, as :data:`cni.pipeline.tables.PIPELINE` declares
    it (its lowest rung, on to ``MISS_GOTO``, or dropped when it names none): the only place a
    miss flow is written."""
    for decl in PIPELINE:
        yield Flow(decl.TABLE, decl.MISS, (), DROP if decl.MISS_GOTO is None else (goto(decl.MISS_GOTO),), cookie)


def link_local(mac_address: str) -> str:
    """The EUI-64 IPv6 link-local address the kernel derives from ``mac_address``."""
    b = bytearray(bytes.fromhex(mac(mac_address).replace(":", "")))
    b[0] ^= 0x02
    eui = bytes(b[:3]) + b"\xff\xfe" + bytes(b[3:])
    return addr.format_ip(int.from_bytes(b"\xfe\x80" + b"\x00" * 6 + eui, "big"), 128)


def arp_responder_actions(answer_mac: str, answer_ip: str) -> tuple[Action, ...]:
    """Turn an ARP request into the reply "``answer_ip`` is at ``answer_mac``", sent back out
    of the port it came in on."""
    value = m.mac_value(answer_mac)
    ip, bits = addr.parse_ip(answer_ip)
    if bits != 32:
        raise ValueError(f"not an IPv4 address: {answer_ip!r}")
    return (_SWAP_ETH, SetField(m.ETH_SRC, value), _ARP_REPLY, _SHA_TO_THA, Load(value, m.ARP_SHA), _SPA_TO_TPA,
            Load(ip, m.ARP_SPA), TO_IN_PORT)


_SWAP_ETH = Move(m.ETH_SRC, m.ETH_DST)  # the requester's MAC becomes the destination
_ARP_REPLY = Load(2, m.ARP_OP)
_SHA_TO_THA = Move(m.ARP_SHA, m.ARP_THA)
_SPA_TO_TPA = Move(m.ARP_SPA, m.ARP_TPA)


def routed_to(src_mac: str, dst_mac: str, then: Action) -> tuple[Action, ...]:
    """Rewrite a routed packet's MACs, decrement its TTL, then ``then``."""
    return (SetField(m.ETH_SRC, m.mac_value(src_mac)), SetField(m.ETH_DST, m.mac_value(dst_mac)), DEC_TTL, then)


def pending_flows(cookie: Cookie, addresses: Sequence[str]) -> list[Flow]:
    """A Pod whose policy is not in force yet (its namespace has NetworkPolicies and route-sync
    has not seen the Pod): no new connection from or to it.  ConntrackState, under the Pod's
    cookie; route-sync deletes them (that cookie, that table) once the Pod's policy is in force,
    the Pod's DEL with its other flows."""
    v4, v6 = _split(addresses)
    new = m.ct_state(m.CT_NEW | m.CT_TRK)
    flows = []
    for ip in v4:
        flows += [Flow(Table.CONNTRACK_STATE, ConntrackState.PENDING, (new, IP, m.IPV4_SRC(ip)), DROP, cookie),
                  Flow(Table.CONNTRACK_STATE, ConntrackState.PENDING, (new, IP, m.IPV4_DST(ip)), DROP, cookie)]
    for ip in v6:
        flows += [Flow(Table.CONNTRACK_STATE, ConntrackState.PENDING, (new, IPV6, m.IPV6_SRC(ip)), DROP, cookie),
                  Flow(Table.CONNTRACK_STATE, ConntrackState.PENDING, (new, IPV6, m.IPV6_DST(ip)), DROP, cookie)]
    return flows


def _split(addresses: Sequence[str]) -> tuple[list[str], list[str]]:
    """Host addresses (no prefix) by family, from CIDRs or plain addresses."""
    v4: list[str] = []
    v6: list[str] = []
    for a in addresses:
        value, _, bits = addr.parse_interface(a)
        (v4 if bits == 32 else v6).append(addr.format_ip(value, bits))
    return v4, v6


@record(frozen=True)
class GatewayPort:
    ofport: int
    mac: str
    addresses: tuple[str, ...]  # CIDRs or plain addresses of the gateway


def base_flows(gw: GatewayPort, via_gateway_cidrs: Sequence[str] = ()) -> list[Flow]:
    """Flows every bridge needs once: the gateway's own traffic and neighbours, every table's miss
    (:func:`miss_flows`) and the Services' conntrack flows (:func:`cni.pipeline.services.conntrack_flows`).

    ``via_gateway_cidrs``: the sources whose packets from the gateway are flagged (and their
    connections' replies sent back to the host), besides the gateway's own Pod CIDRs.
    networkPolicyOnly names the cluster CIDRs: its gateway has no Pod CIDR, and a Service's
    DNATed packet to a backend on the same Node comes back in through the gateway."""
    gmac = mac(gw.mac)
    port = int(gw.ofport)
    v4, v6 = _split(gw.addresses)
    c = BASE_COOKIE
    to_gw = (output(port),)
    flows = [
        Flow(Table.CLASSIFIER, Classifier.GATEWAY_NEIGHBOR, (IN_PORT(port), ARP), (goto(Table.NEIGHBOR_RESPONDER),), c),
        Flow(Table.CLASSIFIER, Classifier.GATEWAY_NEIGHBOR, (IN_PORT(port), ICMP6, m.ICMPV6_TYPE(ICMP6_NS)),
             (goto(Table.NEIGHBOR_RESPONDER),), c),
        Flow(Table.CLASSIFIER, Classifier.GATEWAY, (IN_PORT(port),), (goto(Table.CONNTRACK),), c),
        # The host's ICMP redirects never reach a Pod: forwarding a Service's DNATed packet back
        # out of the port it came in on (a local backend) is where Linux may send one, and it
        # would name the backend as the Pod's next hop for the Service address.
        Flow(Table.CLASSIFIER, Classifier.GATEWAY_REDIRECT, (IN_PORT(port), ICMP, m.ICMPV4_TYPE(ICMP_REDIRECT)),
             DROP, c),
        Flow(Table.CLASSIFIER, Classifier.GATEWAY_REDIRECT, (IN_PORT(port), ICMP6, m.ICMPV6_TYPE(ICMP6_REDIRECT)),
             DROP, c),
        Flow(Table.L2_FORWARDING, L2Forwarding.GATEWAY, (m.ETH_DST(gmac),), to_gw, c),
        # Unsolicited NAs (only a Pod's own, SpoofGuard saw to that) reach the Node's stack.
        Flow(Table.L2_FORWARDING, L2Forwarding.GATEWAY,
             (ICMP6, m.ETH_DST("33:33:00:00:00:01"), m.ICMPV6_TYPE(ICMP6_NA)), to_gw, c),
    ]
    for ip in v4:
        flows.append(Flow(Table.NEIGHBOR_RESPONDER, NeighborResponder.ANSWER, (ARP, m.ARP_OP(1), m.ARP_TPA(ip)),
                          arp_responder_actions(gmac, ip), c))
    for ip in v6 + [link_local(gmac)]:
        flows.append(Flow(Table.NEIGHBOR_RESPONDER, NeighborResponder.ANSWER,
                          (ICMP6, m.ICMPV6_TYPE(ICMP6_NS), m.ND_TARGET(ip)), to_gw, c))
    # imported here, not with this module: the plugin needs the base flows only in the ADD that
    # creates a lone Node's gateway, so every other ADD and DEL leaves the Services' module unloaded
    from cni.pipeline.services import conntrack_flows

    return [*flows, *miss_flows(c), *conntrack_flows(gw, (*gw.addresses, *via_gateway_cidrs))]


@record(frozen=True)
class PodPort:
    cookie: Cookie
    ofport: int
    mac: str
    addresses: tuple[str, ...]  # the Pod's CIDRs ("10.244.1.5/24") or plain addresses


def pod_flows(pod: PodPort, gateway_mac: str, gateway_ofport: int | None = None) -> list[Flow]:
    """The flows that make one Pod reachable and keep it from spoofing anyone.

    With ``gateway_ofport``, the Pod's gratuitous ARP (sender = target = its own address) goes to
    the gateway port, where the Node's stack updates a cached entry, instead of being answered
    by the responder."""
    pmac, gmac = mac(pod.mac), mac(gateway_mac)
    port = int(pod.ofport)
    c = pod.cookie
    v4, v6 = _split(pod.addresses)
    src = (IN_PORT(port), m.ETH_SRC(pmac))
    to_l3, to_responder = (goto(Table.L3_FORWARDING),), (goto(Table.NEIGHBOR_RESPONDER),)
    to_ct = (goto(Table.CONNTRACK),)
    to_pod = routed_to(gmac, pmac, goto(Table.L2_FORWARDING))
    flows = [
        Flow(Table.CLASSIFIER, Classifier.POD, (IN_PORT(port),), (goto(Table.SPOOF_GUARD),), c),
        Flow(Table.L2_FORWARDING, L2Forwarding.POD, (m.ETH_DST(pmac),), (output(port),), c),
    ]
    for ip in v4:
        flows += [
            Flow(Table.SPOOF_GUARD, SpoofGuard.POD, (*src, ARP, m.ARP_SPA(ip), m.ARP_SHA(pmac)), to_responder, c),
            Flow(Table.SPOOF_GUARD, SpoofGuard.POD, (*src, IP, m.IPV4_SRC(ip)), to_ct, c),
            Flow(Table.NEIGHBOR_RESPONDER, NeighborResponder.ANSWER, (ARP, m.ARP_OP(1), m.ARP_TPA(ip)),
                 arp_responder_actions(pmac, ip), c),
            *([Flow(Table.NEIGHBOR_RESPONDER, NeighborResponder.GRATUITOUS,
                    (ARP, IN_PORT(port), m.ARP_OP(1), m.ARP_SPA(ip), m.ARP_TPA(ip)), (output(gateway_ofport),), c)]
              if gateway_ofport is not None else []),
            Flow(Table.L3_FORWARDING, L3Forwarding.POD, (IP, m.ETH_DST(gmac), m.IPV4_DST(ip)), to_pod, c),
        ]
    if v6:
        ll = link_local(pmac)
        flows += [
            Flow(Table.SPOOF_GUARD, SpoofGuard.DROP_RA, (IN_PORT(port), ICMP6, m.ICMPV6_TYPE(ICMP6_RA)), DROP, c),
            Flow(Table.SPOOF_GUARD, SpoofGuard.DROP_RA, (IN_PORT(port), ICMP6, m.ICMPV6_TYPE(ICMP6_REDIRECT)), DROP, c),
            Flow(Table.SPOOF_GUARD, SpoofGuard.DROP_NA, (IN_PORT(port), ICMP6, m.ICMPV6_TYPE(ICMP6_NA)), DROP, c),
        ]
        for own in v6 + [ll]:
            flows += [
                Flow(Table.SPOOF_GUARD, SpoofGuard.ALLOW_NA, (*src, ICMP6, m.ICMPV6_TYPE(ICMP6_NA), m.ND_TARGET(own)),
                     to_l3, c),
                Flow(Table.SPOOF_GUARD, SpoofGuard.ALLOW_NS, (*src, ICMP6, m.IPV6_SRC(own), m.ICMPV6_TYPE(ICMP6_NS)),
                     to_responder, c),
                Flow(Table.SPOOF_GUARD, SpoofGuard.POD, (*src, IPV6, m.IPV6_SRC(own)), to_ct, c),
                Flow(Table.NEIGHBOR_RESPONDER, NeighborResponder.ANSWER,
                     (ICMP6, m.ICMPV6_TYPE(ICMP6_NS), m.ND_TARGET(own)), (output(port),), c),
            ]
        for ip in v6:
            flows.append(Flow(Table.L3_FORWARDING, L3Forwarding.POD, (IPV6, m.ETH_DST(gmac), m.IPV6_DST(ip)),
                              to_pod, c))
    return flows
