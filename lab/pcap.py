"""pcap files (``tcpdump -w``) read, and their frames decoded down to what the wire evidence needs
(``lab.wireevidence``): the IP addresses at every layer, outer and inner (inside VXLAN, Geneve and
GRE, and the packet an ICMP error quotes), the transport protocol and ports, the addresses ARP and
IPv6 neighbour discovery name, 802.1Q tags, and WireGuard's message types.

Pure and standard library only (``struct``, ``socket``'s address formatting): bytes in, plain data
out.  A frame cut short by the capture's snap length decodes as far as its bytes go and says so
(``Packet.truncated``); a file's last record cut short (read while tcpdump writes it) is left out.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

from cni.pipeline.modes import GENEVE, GRE, VXLAN

# link types (the file header's "network"): https://www.tcpdump.org/linktypes.html
LINKTYPE_ETHERNET = 1
LINKTYPE_LINUX_SLL = 113  # tcpdump -i any
LINKTYPE_LINUX_SLL2 = 276
MAGICS = {b"\xd4\xc3\xb2\xa1": ("<", 1e-6), b"\xa1\xb2\xc3\xd4": (">", 1e-6),
          b"\x4d\x3c\xb2\xa1": ("<", 1e-9), b"\xa1\xb2\x3c\x4d": (">", 1e-9)}
PCAPNG = b"\x0a\x0d\x0d\x0a"

ETH_IPV4, ETH_IPV6, ETH_ARP, ETH_TEB = 0x0800, 0x86DD, 0x0806, 0x6558  # TEB: an Ethernet frame follows
VLAN_TPIDS = (0x8100, 0x88A8)
IP_ICMP, IP_TCP, IP_UDP, IP_GRE, IP_ICMPV6, IP_ESP = 1, 6, 17, 47, 58, 50
# (GRE's IP protocol and the tunnel type are one word, declared in cni.pipeline.modes)
PROTO_NAMES = {IP_ICMP: "icmp", IP_TCP: "tcp", IP_UDP: "udp", IP_GRE: GRE, IP_ICMPV6: "icmpv6", IP_ESP: "esp"}
IPV6_EXT = {0, 43, 60}  # hop-by-hop, routing, destination options: (len + 1) * 8 bytes
IPV6_FRAG, IPV6_AH = 44, 51
ICMP_ERRORS = {3, 4, 5, 11, 12}  # they quote the packet that caused them
ICMPV6_ERRORS = {1, 2, 3, 4}
ND_NS, ND_NA = 135, 136
# WireGuard's messages: type -> (name, length or None for transport data: 32 + 16 n)
WG_MESSAGES = {1: ("handshake-initiation", 148), 2: ("handshake-response", 92), 3: ("cookie-reply", 64),
               4: ("transport-data", None)}
MAX_DEPTH = 4  # tunnels in tunnels in ICMP quotes: deeper is not decoded


class PcapError(ValueError):
    """Not a pcap file this reader knows."""


@dataclass(frozen=True)
class Record:
    ts: float  # seconds since the epoch
    data: bytes  # what the capture kept (at most its snap length)
    orig_len: int  # the frame's length on the wire


@dataclass(frozen=True)
class Ports:
    """Which UDP ports carry what (``lab.wireevidence.ports_of``: a lab's tunnel ports, the
    WireGuard port): a datagram to a tunnel port is decoded inside."""

    vxlan: frozenset[int] = frozenset()
    geneve: frozenset[int] = frozenset()
    wireguard: frozenset[int] = frozenset()


@dataclass(frozen=True)
class IpLayer:
    """One IP header of a frame and what follows it.  ``depth`` 0 is the outer packet; each tunnel
    (or ICMP error quote) adds one, ``inside`` naming how it was reached."""

    depth: int
    src: str
    dst: str
    proto: str  # PROTO_NAMES' word, else the number
    size: int  # the IP packet's length (header included), as its header says
    sport: int | None = None
    dport: int | None = None
    icmp_type: int | None = None
    inside: str | None = None  # None (outer) | vxlan | geneve | gre | icmp-quote
    wireguard: str | None = None  # a WireGuard message's type (WG_MESSAGES' name) in this UDP datagram


@dataclass(frozen=True)
class Named:
    """An address a frame names outside an IP header's source and destination: ARP's sender and
    target, a neighbour solicitation's or advertisement's target."""

    depth: int
    kind: str  # arp | nd
    address: str


@dataclass(frozen=True)
class Packet:
    ts: float
    length: int  # the frame's length on the wire
    ethertype: int  # the outermost frame's, after its tags
    layers: tuple[IpLayer, ...] = ()
    named: tuple[Named, ...] = ()
    vlans: tuple[int, ...] = ()  # the outer frame's 802.1Q VIDs, outermost first
    truncated: bool = False  # the capture cut it before the end of a header decoded here

    @property
    def outer(self) -> IpLayer | None:
        return next((layer for layer in self.layers if layer.depth == 0), None)


# ------------------------------------------------------------------------------ the file

def records(blob: bytes) -> tuple[int, list[Record]]:
    """The link type and the records of a pcap file's bytes."""
    if blob[:4] == PCAPNG:
        raise PcapError("a pcapng file (tcpdump -w writes pcap unless told otherwise)")
    if len(blob) < 24 or blob[:4] not in MAGICS:
        raise PcapError(f"not a pcap file (magic {blob[:4].hex() or 'empty'})")
    order, unit = MAGICS[blob[:4]]
    linktype = struct.unpack(order + "I", blob[20:24])[0] & 0x0FFFFFFF
    out: list[Record] = []
    head = struct.Struct(order + "IIII")
    pos = 24
    while pos + 16 <= len(blob):
        sec, frac, incl, orig = head.unpack_from(blob, pos)
        if pos + 16 + incl > len(blob):
            break  # being written
        out.append(Record(sec + frac * unit, blob[pos + 16:pos + 16 + incl], orig))
        pos += 16 + incl
    return linktype, out


def read(path: str) -> tuple[int, list[Record]]:
    with open(path, "rb") as f:
        return records(f.read())


def packets(path: str, ports: Ports | None = None) -> list[Packet]:
    """Every frame of the pcap file at ``path``, decoded."""
    linktype, recs = read(path)
    return [decode(r, linktype, ports or Ports()) for r in recs]


# ------------------------------------------------------------------------------ the frames

@dataclass
class _Walk:
    ports: Ports
    layers: list[IpLayer] = field(default_factory=list)
    named: list[Named] = field(default_factory=list)
    truncated: bool = False


def decode(rec: Record, linktype: int = LINKTYPE_ETHERNET, ports: Ports | None = None) -> Packet:
    w = _Walk(ports or Ports())
    data = rec.data
    vlans: tuple[int, ...] = ()
    if linktype == LINKTYPE_ETHERNET:
        ethertype, vlans, payload = _ethernet(data, w)
    elif linktype == LINKTYPE_LINUX_SLL and len(data) >= 16:
        ethertype, payload = struct.unpack_from("!H", data, 14)[0], data[16:]
    elif linktype == LINKTYPE_LINUX_SLL2 and len(data) >= 20:
        ethertype, payload = struct.unpack_from("!H", data, 0)[0], data[20:]
    elif linktype in (LINKTYPE_ETHERNET, LINKTYPE_LINUX_SLL, LINKTYPE_LINUX_SLL2):
        ethertype, payload, w.truncated = 0, b"", True
    else:
        raise PcapError(f"link type {linktype}: this reader knows Ethernet and Linux cooked captures")
    _l3(ethertype, payload, 0, None, w)
    return Packet(rec.ts, rec.orig_len, ethertype, tuple(w.layers), tuple(w.named), vlans, w.truncated)


def _ethernet(data: bytes, w: _Walk) -> tuple[int, tuple[int, ...], bytes]:
    """An Ethernet frame's ethertype (after its 802.1Q/802.1ad tags), its VIDs and payload."""
    if len(data) < 14:
        w.truncated = True
        return 0, (), b""
    ethertype = struct.unpack_from("!H", data, 12)[0]
    pos, vids = 14, list[int]()
    while ethertype in VLAN_TPIDS:
        if len(data) < pos + 4:
            w.truncated = True
            return 0, tuple(vids), b""
        tci, ethertype = struct.unpack_from("!HH", data, pos)
        vids.append(tci & 0x0FFF)
        pos += 4
    return ethertype, tuple(vids), data[pos:]


def _l3(ethertype: int, data: bytes, depth: int, inside: str | None, w: _Walk) -> None:
    if depth > MAX_DEPTH:
        return
    if ethertype == ETH_IPV4:
        _ipv4(data, depth, inside, w)
    elif ethertype == ETH_IPV6:
        _ipv6(data, depth, inside, w)
    elif ethertype == ETH_ARP:
        _arp(data, depth, w)
    elif ethertype == ETH_TEB:
        inner, _vids, payload = _ethernet(data, w)
        _l3(inner, payload, depth, inside, w)


def _addr(family: int, raw: bytes) -> str:
    return socket.inet_ntop(family, raw)


def _ipv4(data: bytes, depth: int, inside: str | None, w: _Walk) -> None:
    if len(data) < 20 or data[0] >> 4 != 4:
        w.truncated = w.truncated or len(data) < 20
        return
    ihl = (data[0] & 0x0F) * 4
    total, frag, proto = struct.unpack_from("!H", data, 2)[0], struct.unpack_from("!H", data, 6)[0], data[9]
    src, dst = _addr(socket.AF_INET, data[12:16]), _addr(socket.AF_INET, data[16:20])
    payload = data[ihl:total] if total >= ihl else data[ihl:]
    first = frag & 0x1FFF == 0  # only the first fragment has the transport header
    _l4(proto if first else -1, proto, payload, src, dst, total, depth, inside, w, socket.AF_INET)


def _ipv6(data: bytes, depth: int, inside: str | None, w: _Walk) -> None:
    if len(data) < 40 or data[0] >> 4 != 6:
        w.truncated = w.truncated or len(data) < 40
        return
    plen, nxt = struct.unpack_from("!HB", data, 4)
    src, dst = _addr(socket.AF_INET6, data[8:24]), _addr(socket.AF_INET6, data[24:40])
    payload = data[40:40 + plen]
    first = True
    while nxt in IPV6_EXT or nxt in (IPV6_FRAG, IPV6_AH):
        if len(payload) < 8:
            w.truncated = True
            break
        if nxt == IPV6_FRAG:
            first = first and struct.unpack_from("!H", payload, 2)[0] >> 3 == 0
            size = 8
        elif nxt == IPV6_AH:
            size = (payload[1] + 2) * 4
        else:
            size = (payload[1] + 1) * 8
        nxt, payload = payload[0], payload[size:]
    _l4(nxt if first else -1, nxt, payload, src, dst, 40 + plen, depth, inside, w, socket.AF_INET6)


def _l4(proto: int, number: int, data: bytes, src: str, dst: str, size: int, depth: int, inside: str | None,
        w: _Walk, family: int) -> None:
    """The transport header after an IP header (``proto`` -1: a later fragment, none)."""
    name = PROTO_NAMES.get(number, str(number))
    if proto in (IP_TCP, IP_UDP):
        if len(data) < 4:
            w.truncated = True
            w.layers.append(IpLayer(depth, src, dst, name, size, inside=inside))
            return
        sport, dport = struct.unpack_from("!HH", data, 0)
        wg = None
        if proto == IP_UDP and w.ports.wireguard & {sport, dport} and len(data) >= 8:
            wg = _wireguard(data[8:], struct.unpack_from("!H", data, 4)[0] - 8)
        w.layers.append(IpLayer(depth, src, dst, name, size, sport, dport, inside=inside, wireguard=wg))
        if proto == IP_UDP:
            _udp_tunnel(sport, dport, data[8:], depth, w)
    elif proto in (IP_ICMP, IP_ICMPV6):
        if len(data) < 8:
            w.truncated = True
            w.layers.append(IpLayer(depth, src, dst, name, size, inside=inside))
            return
        kind = data[0]
        w.layers.append(IpLayer(depth, src, dst, name, size, icmp_type=kind, inside=inside))
        if kind in (ICMP_ERRORS if proto == IP_ICMP else ICMPV6_ERRORS):
            _l3(ETH_IPV4 if proto == IP_ICMP else ETH_IPV6, data[8:], depth + 1, "icmp-quote", w)
        elif proto == IP_ICMPV6 and kind in (ND_NS, ND_NA):
            if len(data) >= 24:
                w.named.append(Named(depth, "nd", _addr(family, data[8:24])))
            else:
                w.truncated = True
    elif proto == IP_GRE:
        w.layers.append(IpLayer(depth, src, dst, name, size, inside=inside))
        _gre(data, depth, w)
    else:
        w.layers.append(IpLayer(depth, src, dst, name, size, inside=inside))


def _udp_tunnel(sport: int, dport: int, data: bytes, depth: int, w: _Walk) -> None:
    if dport in w.ports.vxlan:
        if len(data) < 8:
            w.truncated = True
            return
        inner, _vids, payload = _ethernet(data[8:], w)
        _l3(inner, payload, depth + 1, VXLAN, w)
    elif dport in w.ports.geneve:
        if len(data) < 8:
            w.truncated = True
            return
        opts = (data[0] & 0x3F) * 4
        proto = struct.unpack_from("!H", data, 2)[0]
        _l3(proto, data[8 + opts:], depth + 1, GENEVE, w)


def _gre(data: bytes, depth: int, w: _Walk) -> None:
    if len(data) < 4:
        w.truncated = True
        return
    flags, proto = struct.unpack_from("!HH", data, 0)
    pos = 4 + 4 * sum(1 for bit in (0x8000, 0x2000, 0x1000) if flags & bit)  # checksum, key, sequence
    _l3(proto, data[pos:], depth + 1, GRE, w)


def _arp(data: bytes, depth: int, w: _Walk) -> None:
    if len(data) < 8:
        w.truncated = True
        return
    ptype, hlen, plen = struct.unpack_from("!HBB", data, 2)
    if ptype != ETH_IPV4 or plen != 4:
        return
    if len(data) < 8 + 2 * (hlen + plen):
        w.truncated = True
        return
    spa = data[8 + hlen:8 + hlen + 4]
    tpa = data[8 + 2 * hlen + 4:8 + 2 * hlen + 8]
    w.named += [Named(depth, "arp", _addr(socket.AF_INET, spa)), Named(depth, "arp", _addr(socket.AF_INET, tpa))]


def _wireguard(data: bytes, length: int) -> str | None:
    """The WireGuard message a UDP payload is (``data`` as captured, ``length`` on the wire), by
    its type and length (all but its header is encrypted); None when it is none of them."""
    if len(data) < 4 or data[1:4] != b"\0\0\0" or data[0] not in WG_MESSAGES:
        return None
    name, size = WG_MESSAGES[data[0]]
    if size is None:  # header 16, the packet padded to 16, the tag 16 (a keepalive: nothing)
        return name if length >= 32 and length % 16 == 0 else None
    return name if length == size else None
