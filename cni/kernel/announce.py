"""Announce a Pod's addresses from inside its namespace: gratuitous ARP, unsolicited NA.

The raw Ethernet frames; ADD sends them on an AF_PACKET socket bound to the Pod's interface, from
a child it does not wait for (``cni.commands.add``), so neighbours (the gateway, other Pods)
refresh stale entries for a reused address at once.
"""

from __future__ import annotations

import _socket as socket
import struct

ETH_P_ARP = 0x0806
ETH_P_IPV6 = 0x86DD
BROADCAST = b"\xff" * 6
ALL_NODES_MAC = bytes.fromhex("333300000001")
ALL_NODES = socket.inet_pton(socket.AF_INET6, "ff02::1")
ICMPV6 = 58
ND_NEIGHBOR_ADVERT = 136
NA_FLAG_OVERRIDE = 0x20000000
ND_OPT_TARGET_LLADDR = 2


def _mac(mac: str) -> bytes:
    raw = bytes.fromhex(mac.replace(":", ""))
    if len(raw) != 6:
        raise ValueError(f"not a MAC address: {mac!r}")
    return raw


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071)."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def garp_frame(mac: str, ipv4: str) -> bytes:
    """A gratuitous ARP request: sender = target = ``ipv4``, to broadcast."""
    src, ip = _mac(mac), socket.inet_aton(ipv4)
    arp = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, src, ip, b"\0" * 6, ip)
    return BROADCAST + src + struct.pack("!H", ETH_P_ARP) + arp


def na_frame(mac: str, ipv6: str) -> bytes:
    """An unsolicited neighbour advertisement for ``ipv6`` (override set) to ff02::1, hop limit 255."""
    src, ip = _mac(mac), socket.inet_pton(socket.AF_INET6, ipv6)
    option = struct.pack("!BB6s", ND_OPT_TARGET_LLADDR, 1, src)
    body = struct.pack("!I16s", NA_FLAG_OVERRIDE, ip) + option
    length = 4 + len(body)
    pseudo = ip + ALL_NODES + struct.pack("!I3xB", length, ICMPV6)
    csum = checksum(pseudo + struct.pack("!BBH", ND_NEIGHBOR_ADVERT, 0, 0) + body)
    icmp = struct.pack("!BBH", ND_NEIGHBOR_ADVERT, 0, csum) + body
    ip6 = struct.pack("!IHBB16s16s", 6 << 28, length, ICMPV6, 255, ip, ALL_NODES)
    return ALL_NODES_MAC + src + struct.pack("!H", ETH_P_IPV6) + ip6 + icmp


