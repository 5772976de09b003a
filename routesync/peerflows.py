"""Per-peer and per-Node (mode) flows, as plain data.

PEER flows carry ``peer_cookie(name)``: replacing a peer's flows is "delete by that cookie, add
the new set" and removing a peer deletes by the same cookie.  NODE flows carry ``NODE_COOKIE``.
Values are validated (``ipaddress``, ``cni.flows.mac``) before they reach flow text."""

from __future__ import annotations

import ipaddress

from cni.flows import PRIO_MATCH, arp_responder_actions, mac
from cni.pipeline import NODE_COOKIE, VIRTUAL_MAC, Flow, Table, goto, peer_cookie

from .model import PeerPlan

PRIO_TUNNEL_IN = 210  # above the gateway's classifier flows


def node_flows(tunnel_ofport: int | None, gateway_mac: str) -> list[Flow]:
    """Classifier: what arrives from the tunnel is addressed to the virtual MAC; make it look
    routed by this Node's gateway so L3Forwarding's per-Pod flows (``dl_dst=<gw MAC>``) match."""
    if tunnel_ofport is None:
        return []
    return [Flow(Table.CLASSIFIER, PRIO_TUNNEL_IN, f"in_port={int(tunnel_ofport)}",
                 f"mod_dl_dst:{mac(gateway_mac)},{goto(Table.L3_FORWARDING)}", NODE_COOKIE)]


def peer_flows(peer: PeerPlan, gateway_mac: str, tunnel_ofport: int | None) -> list[Flow]:
    """Flows for one peer and family. Only the tunnel path needs any: routed and underlay peers
    leave through the gateway port (the L3Forwarding miss)."""
    if peer.path != "tunnel" or tunnel_ofport is None or peer.transport_address is None:
        return []
    gmac = mac(gateway_mac)
    port = int(tunnel_ofport)
    cookie = peer_cookie(peer.peer)
    remote = ipaddress.ip_address(peer.transport_address)
    tun_field = "tun_dst" if remote.version == 4 else "tun_ipv6_dst"
    flows: list[Flow] = []
    for cidr in peer.pod_cidrs:
        net = ipaddress.ip_network(cidr, strict=False)
        match = f"ip,nw_dst={net}" if net.version == 4 else f"ipv6,ipv6_dst={net}"
        flows.append(Flow(Table.L3_FORWARDING, PRIO_MATCH, match,
                          f"mod_dl_src:{gmac},mod_dl_dst:{VIRTUAL_MAC},dec_ttl,"
                          f"set_field:{remote}->{tun_field},output:{port}", cookie))
    if peer.peer_gateway is not None and ipaddress.ip_address(peer.peer_gateway).version == 4:
        gw = str(ipaddress.IPv4Address(peer.peer_gateway))
        flows.append(Flow(Table.NEIGHBOR_RESPONDER, PRIO_MATCH, f"arp,arp_op=1,arp_tpa={gw}",
                          arp_responder_actions(VIRTUAL_MAC, gw), cookie))
    return flows
