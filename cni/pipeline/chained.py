"""The flows of a chained (networkPolicyOnly) Pod beyond the per-Pod set: OVS answers the Pod's
ARP and neighbour solicitations for its next hops with the gateway port's MAC. Pure planners,
shared by the plugin's chained ADD and route-sync's replay of chained ports."""

from __future__ import annotations

from cni.lean import addr
from cni.lean.typecheck import TYPE_CHECKING
from cni.pipeline import match as m
from cni.pipeline import tables as pl
from cni.pipeline.actions import TO_IN_PORT, Move, Resubmit, SetField
from cni.pipeline.flows import arp_responder_actions, mac
from cni.pipeline.match import ARP, ICMP6, IN_PORT
from cni.pipeline.tables import Flow, NeighborResponder, Table

if TYPE_CHECKING:
    from cni.pipeline.actions import Action

ICMP6_NS, ICMP6_NA = 135, 136
ND_NA_FLAGS = 0xE0000000  # Router | Solicited | Override
ND_OPT_TLL = 2


def na_responder_actions(answer_mac: str, answer_ip: str) -> tuple[Action, ...]:
    """Turn a neighbour solicitation for ``answer_ip`` into the first half of its advertisement:
    addresses swapped, type NA with R|S|O flags, the source link-layer option retyped as a target
    option.  The option's MAC is written by a second flow (:func:`next_hop_flows`): OVS allows
    ``nd_tll`` only in a flow whose match says ICMPv6 type 136, so the rewritten packet is
    resubmitted to the same table, where it matches as an NA."""
    ip, bits = addr.parse_ip(answer_ip)
    if bits != 128:
        raise ValueError(f"not an IPv6 address: {answer_ip!r}")
    return (Move(m.ETH_SRC, m.ETH_DST), SetField(m.ETH_SRC, m.mac_value(answer_mac)),
            Move(m.IPV6_SRC, m.IPV6_DST), SetField(m.IPV6_SRC, ip),
            SetField(m.ICMPV6_TYPE, ICMP6_NA), SetField(m.ICMPV6_CODE, 0),
            SetField(m.ND_RESERVED, ND_NA_FLAGS), SetField(m.ND_OPTIONS_TYPE, ND_OPT_TLL),
            SetField(m.NW_TTL, 255), Resubmit(Table.NEIGHBOR_RESPONDER))


def next_hop_flows(cookie: pl.Cookie, ofport: int, gateways: tuple[str, ...], gateway_mac: str) -> list[Flow]:
    """OVS answers the Pod's ARP / NS for its next hops with the gateway port's MAC, so the Pod
    sends everything to ``ferry-gw0`` (the Node's routing).  Per Pod (``in_port``): Pods share
    the next hop address, and one Pod's DEL must not take another's answer away."""
    gmac = mac(gateway_mac)
    port = int(ofport)
    flows = []
    for g in gateways:
        h = addr.host(g)
        if addr.family(h) == 4:
            flows.append(Flow(Table.NEIGHBOR_RESPONDER, NeighborResponder.NEXT_HOP,
                              (ARP, IN_PORT(port), m.ARP_OP(1), m.ARP_TPA(h)), arp_responder_actions(gmac, h), cookie))
        else:
            flows += [
                Flow(Table.NEIGHBOR_RESPONDER, NeighborResponder.NEXT_HOP,
                     (ICMP6, IN_PORT(port), m.ICMPV6_TYPE(ICMP6_NS), m.ND_TARGET(h)), na_responder_actions(gmac, h),
                     cookie),
                # Only the rewritten NS gets here: SpoofGuard lets a Pod's NA through only for its
                # own addresses, never for its next hop.
                Flow(Table.NEIGHBOR_RESPONDER, NeighborResponder.NEXT_HOP,
                     (ICMP6, IN_PORT(port), m.ICMPV6_TYPE(ICMP6_NA), m.ND_TARGET(h)),
                     (SetField(m.ND_TLL, m.mac_value(gmac)), TO_IN_PORT), cookie),
            ]
    return flows
