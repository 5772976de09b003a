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
from cni.pipeline.actions import DEC_TTL, DROP, TO_IN_PORT, Ct, Load, Move, SetField, goto, output
from cni.pipeline.match import ARP, ICMP, ICMP6, IN_PORT, IP, IPV6, mac
from cni.pipeline.tables import (
    BASE_COOKIE,
    CT_MARK_VIA_GATEWAY,
    CT_MARK_VIA_MASK,
    CT_ZONE,
    Classifier,
    Conntrack,
    ConntrackCommit,
    ConntrackState,
    Cookie,
    Flow,
    L2Forwarding,
    L3Forwarding,
    NeighborResponder,
    SpoofGuard,
    Table,
    ladder,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from cni.pipeline.actions import Action

__all__ = ["GatewayPort", "PodPort", "arp_responder_actions", "base_flows", "commit_flows", "from_host_reply_flow",
           "host_return_flow", "link_local", "mac", "miss_flow", "pending_flows", "pod_flows", "via_flag"]

ICMP6_NS, ICMP6_NA, ICMP6_RA, ICMP6_REDIRECT = 135, 136, 134, 137
ICMP_REDIRECT = 5


def miss_flow(table: Table, cookie: Cookie = BASE_COOKIE) -> Flow:
    """``table``'s miss flow, as its declaration (:class:`cni.pipeline.tables.Ladder`) says."""
    decl = ladder(table)
    return Flow(table, decl.MISS, (), DROP if decl.MISS_GOTO is None else (goto(decl.MISS_GOTO),), cookie)


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


def _networks(addresses: Sequence[str]) -> list[tuple[int, str]]:
    """(family, network CIDR) of every CIDR among ``addresses`` (plain addresses name none)."""
    out = []
    for a in addresses:
        if "/" not in a:
            continue
        value, plen, bits = addr.parse_interface(a)
        out.append((4 if bits == 32 else 6, f"{addr.format_ip(addr.network(value, plen, bits), bits)}/{plen}"))
    return out


def _net_field(family: int, cidr: str, source: bool) -> m.Field:
    if family == 4:
        return m.address(m.IPV4_SRC if source else m.IPV4_DST, cidr)
    return m.address(m.IPV6_SRC if source else m.IPV6_DST, cidr)


def host_return_flow(family: int, mark: int, gateway_mac: str, ofport: int, cookie: Cookie) -> Flow:
    """ConntrackState: a reply of a connection whose first packets came from the host through
    ``ofport`` (``mark``) goes back there, addressed to that port's MAC."""
    return Flow(Table.CONNTRACK_STATE, ConntrackState.HOST_RETURN,
                (IP if family == 4 else IPV6, m.ct_state(m.CT_TRK | m.CT_RPL),
                 m.masked(m.CT_MARK, mark, CT_MARK_VIA_MASK)),
                (SetField(m.ETH_DST, m.mac_value(gateway_mac)), output(ofport)), cookie)


def via_flag(mark: int) -> Action:
    """Conntrack: note in reg0 which host port a local Pod's packet came through (``mark``)."""
    return Load(mark, m.REG0)


def commit_flows(mark: int, then: tuple[Action, ...], cookie: Cookie) -> list[Flow]:
    """ConntrackCommit: a new connection flagged ``mark`` in reg0 is committed with that mark
    (ct() needs the packet's family in the match: one flow each)."""
    commit = Ct(CT_ZONE, commit=True, exec=(SetField(m.CT_MARK, mark),))
    return [Flow(Table.CONNTRACK_COMMIT, ConntrackCommit.COMMIT_VIA,
                 (proto, m.ct_state(m.CT_NEW | m.CT_TRK), m.masked(m.REG0, mark, CT_MARK_VIA_MASK)),
                 (commit, *then), cookie) for proto in (IP, IPV6)]


def conntrack_flows(gw: GatewayPort, local_cidrs: Sequence[tuple[int, str]]) -> list[Flow]:
    """Conntrack, ConntrackState, ConntrackCommit and the NetworkPolicy tables' misses (see
    :mod:`cni.pipeline.tables`).  Every IP packet is looked up in :data:`CT_ZONE`; one of a known
    connection skips policy; a new one is committed after it.  A local Pod's packets the host
    forwards back into OVS through the gateway (kube-proxy's DNAT: to a local Pod, a tunnel, the
    fast path) are committed with :data:`CT_MARK_VIA_GATEWAY`, and a reply of such a connection
    goes to the host, which undoes its NAT, instead of straight to the Pod (that would see the
    backend's address)."""
    port = int(gw.ofport)
    c = BASE_COOKIE
    lookup = Ct(CT_ZONE, table=Table.CONNTRACK_STATE)
    to_commit, to_l3 = (goto(Table.CONNTRACK_COMMIT),), (goto(Table.L3_FORWARDING),)
    flows = [
        miss_flow(Table.CONNTRACK, c),
        Flow(Table.CONNTRACK, Conntrack.LOOKUP, (IP,), (lookup,), c),
        Flow(Table.CONNTRACK, Conntrack.LOOKUP, (IPV6,), (lookup,), c),
        miss_flow(Table.CONNTRACK_STATE, c),
        # replies of a known connection skip policy; its original direction crosses policy on
        # every packet (the switch caches the verdict per megaflow), so a policy that starts to
        # deny a connection stops it, not only new ones
        Flow(Table.CONNTRACK_STATE, ConntrackState.KNOWN, (m.ct_state(m.CT_TRK | m.CT_EST | m.CT_RPL),), to_commit, c),
        Flow(Table.CONNTRACK_STATE, ConntrackState.KNOWN, (m.ct_state(m.CT_TRK | m.CT_REL),), to_commit, c),
        miss_flow(Table.EGRESS_ADMIN, c),
        miss_flow(Table.EGRESS_RULE, c),
        miss_flow(Table.EGRESS_DEFAULT, c),
        miss_flow(Table.EGRESS_BASELINE, c),
        miss_flow(Table.INGRESS_ADMIN, c),
        miss_flow(Table.INGRESS_RULE, c),
        miss_flow(Table.INGRESS_DEFAULT, c),
        miss_flow(Table.INGRESS_BASELINE, c),
        miss_flow(Table.CONNTRACK_COMMIT, c),
        Flow(Table.CONNTRACK_COMMIT, ConntrackCommit.COMMIT, (IP, m.ct_state(m.CT_NEW | m.CT_TRK)),
             (Ct(CT_ZONE, commit=True), *to_l3), c),
        Flow(Table.CONNTRACK_COMMIT, ConntrackCommit.COMMIT, (IPV6, m.ct_state(m.CT_NEW | m.CT_TRK)),
             (Ct(CT_ZONE, commit=True), *to_l3), c),
    ]
    if not local_cidrs:
        return flows
    for family, cidr in local_cidrs:
        proto = IP if family == 4 else IPV6
        flows.append(Flow(Table.CONNTRACK, Conntrack.VIA_GATEWAY,
                          (IN_PORT(port), proto, _net_field(family, cidr, True)),
                          (via_flag(CT_MARK_VIA_GATEWAY), lookup), c))
    flows += commit_flows(CT_MARK_VIA_GATEWAY, to_l3, c)
    for family in sorted({f for f, _c in local_cidrs}):
        flows.append(host_return_flow(family, CT_MARK_VIA_GATEWAY, gw.mac, port, c))
    flows.append(from_host_reply_flow(port, c))
    return flows


def from_host_reply_flow(ofport: int, cookie: Cookie) -> Flow:
    """ConntrackState: a reply that comes *from* the host (through ``ofport``) has crossed the
    host already: it never goes back to it, whatever port its connection was marked with (on
    an asymmetric path, a reply the host routed in through the gateway for a connection that left
    through the uplink port would otherwise bounce between the two)."""
    return Flow(Table.CONNTRACK_STATE, ConntrackState.FROM_HOST,
                (IN_PORT(int(ofport)), m.ct_state(m.CT_TRK | m.CT_RPL)), (goto(Table.CONNTRACK_COMMIT),), cookie)


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
    """Flows every bridge needs once: table misses, the gateway's own traffic and neighbours.

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
        miss_flow(Table.CLASSIFIER, c),
        miss_flow(Table.SPOOF_GUARD, c),
        miss_flow(Table.NEIGHBOR_RESPONDER, c),
        miss_flow(Table.L3_FORWARDING, c),
        Flow(Table.L2_FORWARDING, L2Forwarding.GATEWAY, (m.ETH_DST(gmac),), to_gw, c),
        # Unsolicited NAs (only a Pod's own, SpoofGuard saw to that) reach the Node's stack.
        Flow(Table.L2_FORWARDING, L2Forwarding.GATEWAY,
             (ICMP6, m.ETH_DST("33:33:00:00:00:01"), m.ICMPV6_TYPE(ICMP6_NA)), to_gw, c),
        miss_flow(Table.L2_FORWARDING, c),
    ]
    for ip in v4:
        flows.append(Flow(Table.NEIGHBOR_RESPONDER, NeighborResponder.ANSWER, (ARP, m.ARP_OP(1), m.ARP_TPA(ip)),
                          arp_responder_actions(gmac, ip), c))
    for ip in v6 + [link_local(gmac)]:
        flows.append(Flow(Table.NEIGHBOR_RESPONDER, NeighborResponder.ANSWER,
                          (ICMP6, m.ICMPV6_TYPE(ICMP6_NS), m.ND_TARGET(ip)), to_gw, c))
    return flows + conntrack_flows(gw, _networks(gw.addresses) + _networks(via_gateway_cidrs))


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
