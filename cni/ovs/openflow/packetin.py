"""What the switch sends up with a ``controller()`` action, decoded: an NXT_PACKET_IN2 (the
packet-in format that carries the action's userdata; :func:`codec.set_packet_in2` asks for it)
into its properties, and the packet it carries into the connection it opens (protocol,
addresses, ports).  Standard library only, as the rest of the codec; pure (bytes in, values out):
tests/cni/ovs/test_packetin.py holds it against ``ovs-ofctl ofp-print``'s reading of the same bytes."""

from __future__ import annotations

import socket
import struct

from cni.lean.record import record
from cni.ovs.openflow.codec import NX_VENDOR_ID, OFPT_EXPERIMENTER

NXT_PACKET_IN2 = 30
NXPINT_PACKET, NXPINT_FULL_LEN, NXPINT_TABLE_ID, NXPINT_COOKIE, NXPINT_REASON, NXPINT_USERDATA = 0, 1, 3, 4, 5, 7
NXPINT_METADATA = 6

_PROP = struct.Struct("!HH")
_NX_HEADER = struct.Struct("!II")  # vendor, subtype (after the OpenFlow header)
ETH_IP, ETH_IPV6, ETH_VLAN, ETH_QINQ = 0x0800, 0x86DD, 0x8100, 0x88A8
PROTO_NAMES = {1: "ICMP", 6: "TCP", 17: "UDP", 58: "ICMPv6", 132: "SCTP"}
_PORTED = frozenset({6, 17, 132})
_IPV6_EXTENSIONS = frozenset({0, 43, 60})  # hop-by-hop, routing, destination options (fragment: 44)


@record(frozen=True)
class PacketIn:
    """An NXT_PACKET_IN2: the packet (``full_len`` its length before ``max_len`` cut it), the
    table and cookie of the flow that sent it, the reason (OFPR_*), the action's userdata."""

    packet: bytes
    full_len: int
    table: int
    cookie: int
    reason: int
    userdata: bytes


@record(frozen=True)
class Connection:
    """The first packet's view of a connection: ``proto`` its IP protocol number, ports for TCP,
    UDP and SCTP (ICMP: type and code in their place), addresses as text."""

    family: int
    proto: int
    src: str
    dst: str
    sport: int | None = None
    dport: int | None = None

    def text(self) -> str:
        """``TCP 10.244.1.5:41234 -> 10.244.2.7:80``, ``UDP [fd00::5]:53 -> ...``,
        ``ICMP 10.0.0.1 -> 10.0.0.2 type 8 code 0``, ``proto 47 10.0.0.1 -> 10.0.0.2``."""
        name = PROTO_NAMES.get(self.proto, f"proto {self.proto}")
        if self.proto in _PORTED and self.sport is not None:
            if self.family == 6:
                return f"{name} [{self.src}]:{self.sport} -> [{self.dst}]:{self.dport}"
            return f"{name} {self.src}:{self.sport} -> {self.dst}:{self.dport}"
        tail = f" type {self.sport} code {self.dport}" if self.sport is not None else ""
        return f"{name} {self.src} -> {self.dst}{tail}"


def props(body: bytes) -> list[tuple[int, bytes]]:
    """OpenFlow properties (type, value without padding) of ``body``; raises ValueError when one
    runs past the end or is shorter than its header."""
    out: list[tuple[int, bytes]] = []
    i = 0
    while i + 4 <= len(body):
        ptype, plen = _PROP.unpack_from(body, i)
        if plen < 4 or i + plen > len(body):
            raise ValueError(f"property {ptype} at {i}: length {plen} past the message's {len(body)} bytes")
        out.append((ptype, body[i + 4:i + plen]))
        i += (plen + 7) // 8 * 8
    return out


def packet_in2(msg: bytes) -> PacketIn | None:
    """``msg`` (one whole OpenFlow message) as an NXT_PACKET_IN2; None when it is another message.
    Raises ValueError when it is one but malformed."""
    if len(msg) < 16 or msg[1] != OFPT_EXPERIMENTER:
        return None
    vendor, subtype = _NX_HEADER.unpack_from(msg, 8)
    if vendor != NX_VENDOR_ID or subtype != NXT_PACKET_IN2:
        return None
    packet, full_len, table, cookie, reason, userdata = b"", None, 0, 0, 0, b""
    for ptype, value in props(msg[16:]):
        if ptype == NXPINT_PACKET:
            packet = value
        elif ptype == NXPINT_FULL_LEN and len(value) >= 4:
            full_len = struct.unpack_from("!I", value)[0]
        elif ptype == NXPINT_TABLE_ID and value:
            table = value[0]
        elif ptype == NXPINT_COOKIE and len(value) >= 12:  # 4 bytes of padding, then the cookie
            cookie = struct.unpack_from("!Q", value, 4)[0]
        elif ptype == NXPINT_REASON and value:
            reason = value[0]
        elif ptype == NXPINT_USERDATA:
            userdata = value
    return PacketIn(packet, len(packet) if full_len is None else full_len, table, cookie, reason, userdata)


def connection(frame: bytes) -> Connection | None:
    """The connection an Ethernet frame (802.1Q/802.1ad tags skipped) opens; None for a frame that
    is not IP or is cut before its addresses.  Ports are None when the frame is cut before them,
    or for a later IPv4/IPv6 fragment."""
    if len(frame) < 14:
        return None
    ethertype, i = struct.unpack_from("!H", frame, 12)[0], 14
    while ethertype in (ETH_VLAN, ETH_QINQ) and len(frame) >= i + 4:
        ethertype, i = struct.unpack_from("!H", frame, i + 2)[0], i + 4
    if ethertype == ETH_IP:
        if len(frame) < i + 20:
            return None
        ihl = (frame[i] & 0x0F) * 4
        proto = frame[i + 9]
        later_fragment = struct.unpack_from("!H", frame, i + 6)[0] & 0x1FFF
        src, dst = socket.inet_ntop(socket.AF_INET, frame[i + 12:i + 16]), socket.inet_ntop(socket.AF_INET,
                                                                                            frame[i + 16:i + 20])
        return _with_ports(Connection(4, proto, src, dst), frame, i + ihl, bool(later_fragment))
    if ethertype == ETH_IPV6:
        if len(frame) < i + 40:
            return None
        proto = frame[i + 6]
        src = socket.inet_ntop(socket.AF_INET6, frame[i + 8:i + 24])
        dst = socket.inet_ntop(socket.AF_INET6, frame[i + 24:i + 40])
        j, later_fragment = i + 40, False
        while len(frame) >= j + 8 and (proto in _IPV6_EXTENSIONS or proto == 44):
            if proto == 44:
                later_fragment = bool(struct.unpack_from("!H", frame, j + 2)[0] & 0xFFF8)
                proto, j = frame[j], j + 8
            else:
                proto, j = frame[j], j + (frame[j + 1] + 1) * 8
        return _with_ports(Connection(6, proto, src, dst), frame, j, later_fragment)
    return None


def _with_ports(c: Connection, frame: bytes, at: int, later_fragment: bool) -> Connection:
    if later_fragment:
        return c
    if c.proto in _PORTED and len(frame) >= at + 4:
        sport, dport = struct.unpack_from("!HH", frame, at)
        return Connection(c.family, c.proto, c.src, c.dst, sport, dport)
    if c.proto in (1, 58) and len(frame) >= at + 2:
        return Connection(c.family, c.proto, c.src, c.dst, frame[at], frame[at + 1])
    return c
