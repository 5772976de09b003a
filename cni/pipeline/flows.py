"""Planners for the base flows (one set per bridge) and the per-Pod flows, as plain data.

Pure functions: addresses, MACs and ofports in, :class:`cni.pipeline.tables.Flow` lists out.  The
plugin installs the per-Pod flows and deletes them by the same cookie; route-sync (or the plugin
on a lone Node) installs the base flows.  Values are validated here (``cni.lean.addr``, MAC syntax)
before they reach flow text, so nothing a user controls can change a flow's meaning."""

from __future__ import annotations

from cni.lean import addr
from cni.lean.record import record
from cni.pipeline.tables import BASE_COOKIE, Cookie, Flow, Table, goto

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

_HEX = frozenset("0123456789abcdef")

# Priorities, so that related flows read in one place.
PRIO_MISS = 0
PRIO_DEFAULT = 190
PRIO_MATCH = 200
PRIO_GUARD_ALLOW_ND = 203
PRIO_GUARD_DROP_NA = 204
PRIO_GUARD_ALLOW_NA = 205
PRIO_GUARD_DROP_RA = 210
PRIO_GRATUITOUS = 210

ICMP6_NS, ICMP6_NA, ICMP6_RA, ICMP6_REDIRECT = 135, 136, 134, 137


def mac(value: str) -> str:
    """A validated, lower-case MAC (raises ValueError)."""
    v = value.lower() if isinstance(value, str) else ""
    parts = v.split(":")
    if len(v) != 17 or len(parts) != 6 or any(len(p) != 2 or not _HEX.issuperset(p) for p in parts):
        raise ValueError(f"not a MAC address: {value!r}")
    return v


def link_local(mac_address: str) -> str:
    """The EUI-64 IPv6 link-local address the kernel derives from ``mac_address``."""
    b = bytearray(bytes.fromhex(mac(mac_address).replace(":", "")))
    b[0] ^= 0x02
    eui = bytes(b[:3]) + b"\xff\xfe" + bytes(b[3:])
    return addr.format_ip(int.from_bytes(b"\xfe\x80" + b"\x00" * 6 + eui, "big"), 128)


def arp_responder_actions(answer_mac: str, answer_ip: str) -> str:
    """Turn an ARP request into the reply "``answer_ip`` is at ``answer_mac``", sent back out
    of the port it came in on."""
    m = "0x" + mac(answer_mac).replace(":", "")
    ip, bits = addr.parse_ip(answer_ip)
    if bits != 32:
        raise ValueError(f"not an IPv4 address: {answer_ip!r}")
    return ("move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],"
            f"mod_dl_src:{mac(answer_mac)},"
            "load:0x2->NXM_OF_ARP_OP[],"
            "move:NXM_NX_ARP_SHA[]->NXM_NX_ARP_THA[],"
            f"load:{m}->NXM_NX_ARP_SHA[],"
            "move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],"
            f"load:0x{ip:08x}->NXM_OF_ARP_SPA[],"
            "IN_PORT")


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


def base_flows(gw: GatewayPort) -> list[Flow]:
    """Flows every bridge needs once: table misses, the gateway's own traffic and neighbours."""
    gmac = mac(gw.mac)
    port = int(gw.ofport)
    v4, v6 = _split(gw.addresses)
    c = BASE_COOKIE
    flows = [
        Flow(Table.CLASSIFIER, PRIO_MATCH, f"in_port={port},arp", goto(Table.NEIGHBOR_RESPONDER), c),
        Flow(Table.CLASSIFIER, PRIO_MATCH, f"in_port={port},icmp6,icmp_type={ICMP6_NS}",
             goto(Table.NEIGHBOR_RESPONDER), c),
        Flow(Table.CLASSIFIER, PRIO_DEFAULT, f"in_port={port}", goto(Table.L3_FORWARDING), c),
        Flow(Table.CLASSIFIER, PRIO_MISS, "", "drop", c),
        Flow(Table.SPOOF_GUARD, PRIO_MISS, "", "drop", c),
        Flow(Table.NEIGHBOR_RESPONDER, PRIO_MISS, "", "drop", c),
        Flow(Table.L3_FORWARDING, PRIO_MISS, "", goto(Table.L2_FORWARDING), c),
        Flow(Table.L2_FORWARDING, PRIO_MATCH, f"dl_dst={gmac}", f"output:{port}", c),
        # Unsolicited NAs (only a Pod's own, SpoofGuard saw to that) reach the Node's stack.
        Flow(Table.L2_FORWARDING, PRIO_MATCH, f"icmp6,dl_dst=33:33:00:00:00:01,icmp_type={ICMP6_NA}",
             f"output:{port}", c),
        Flow(Table.L2_FORWARDING, PRIO_MISS, "", "drop", c),
    ]
    for ip in v4:
        flows.append(Flow(Table.NEIGHBOR_RESPONDER, PRIO_MATCH, f"arp,arp_op=1,arp_tpa={ip}",
                          arp_responder_actions(gmac, ip), c))
    for ip in v6 + [link_local(gmac)]:
        flows.append(Flow(Table.NEIGHBOR_RESPONDER, PRIO_MATCH,
                          f"icmp6,icmp_type={ICMP6_NS},nd_target={ip}", f"output:{port}", c))
    return flows


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
    src = f"in_port={port},dl_src={pmac}"
    flows = [
        Flow(Table.CLASSIFIER, PRIO_MATCH, f"in_port={port}", goto(Table.SPOOF_GUARD), c),
        Flow(Table.L2_FORWARDING, PRIO_MATCH, f"dl_dst={pmac}", f"output:{port}", c),
    ]
    for ip in v4:
        flows += [
            Flow(Table.SPOOF_GUARD, PRIO_MATCH, f"{src},arp,arp_spa={ip},arp_sha={pmac}",
                 goto(Table.NEIGHBOR_RESPONDER), c),
            Flow(Table.SPOOF_GUARD, PRIO_MATCH, f"{src},ip,nw_src={ip}", goto(Table.L3_FORWARDING), c),
            Flow(Table.NEIGHBOR_RESPONDER, PRIO_MATCH, f"arp,arp_op=1,arp_tpa={ip}",
                 arp_responder_actions(pmac, ip), c),
            *([Flow(Table.NEIGHBOR_RESPONDER, PRIO_GRATUITOUS,
                    f"arp,in_port={port},arp_op=1,arp_spa={ip},arp_tpa={ip}", f"output:{int(gateway_ofport)}", c)]
              if gateway_ofport is not None else []),
            Flow(Table.L3_FORWARDING, PRIO_MATCH, f"ip,dl_dst={gmac},nw_dst={ip}",
                 f"mod_dl_src:{gmac},mod_dl_dst:{pmac},dec_ttl,{goto(Table.L2_FORWARDING)}", c),
        ]
    if v6:
        ll = link_local(pmac)
        flows += [
            Flow(Table.SPOOF_GUARD, PRIO_GUARD_DROP_RA, f"in_port={port},icmp6,icmp_type={ICMP6_RA}", "drop", c),
            Flow(Table.SPOOF_GUARD, PRIO_GUARD_DROP_RA, f"in_port={port},icmp6,icmp_type={ICMP6_REDIRECT}",
                 "drop", c),
            Flow(Table.SPOOF_GUARD, PRIO_GUARD_DROP_NA, f"in_port={port},icmp6,icmp_type={ICMP6_NA}", "drop", c),
        ]
        for own in v6 + [ll]:
            flows += [
                Flow(Table.SPOOF_GUARD, PRIO_GUARD_ALLOW_NA,
                     f"{src},icmp6,icmp_type={ICMP6_NA},nd_target={own}", goto(Table.L3_FORWARDING), c),
                Flow(Table.SPOOF_GUARD, PRIO_GUARD_ALLOW_ND, f"{src},icmp6,ipv6_src={own},icmp_type={ICMP6_NS}",
                     goto(Table.NEIGHBOR_RESPONDER), c),
                Flow(Table.SPOOF_GUARD, PRIO_MATCH, f"{src},ipv6,ipv6_src={own}", goto(Table.L3_FORWARDING), c),
                Flow(Table.NEIGHBOR_RESPONDER, PRIO_MATCH, f"icmp6,icmp_type={ICMP6_NS},nd_target={own}",
                     f"output:{port}", c),
            ]
        for ip in v6:
            flows.append(Flow(Table.L3_FORWARDING, PRIO_MATCH, f"ipv6,dl_dst={gmac},ipv6_dst={ip}",
                              f"mod_dl_src:{gmac},mod_dl_dst:{pmac},dec_ttl,{goto(Table.L2_FORWARDING)}", c))
    return flows


def base_cookie_flows_match() -> str:
    return BASE_COOKIE.match()
