"""Hand-built IPv6 and ARP frames sent from inside a Pod (``ip netns exec POD python3 forge6.py ...``).

    forge6.py IF echo6 SRC_MAC DST_MAC SRC_IP DST_IP COUNT         ICMPv6 echo request
    forge6.py IF na    SRC_MAC DST_MAC SRC_IP DST_IP TARGET COUNT  NA (override) "TARGET is at SRC_MAC"
    forge6.py IF ra    SRC_MAC SRC_LL COUNT                        RA to ff02::1 (router lifetime 1800 s)
    forge6.py IF garp  SRC_MAC IP COUNT                            gratuitous ARP request "IP is at SRC_MAC"
Standard library only (runs in a Pod with the system python)."""

from __future__ import annotations

import ipaddress
import socket
import struct
import sys

# Run as a script inside a Pod: the IPv4 forger's frame helpers sit beside it in tests/support.
from forge import csum, mac  # a sibling: run as a script, this file's folder is sys.path[0]


def _ipv6(src_mac: str, dst_mac: str, src: str, dst: str, icmp: bytes, hop: int = 255) -> bytes:
    s, d = ipaddress.IPv6Address(src).packed, ipaddress.IPv6Address(dst).packed
    pseudo = s + d + struct.pack("!I3xB", len(icmp), 58)
    icmp = icmp[:2] + struct.pack("!H", csum(pseudo + icmp)) + icmp[4:]
    hdr = struct.pack("!IHBB", 6 << 28, len(icmp), 58, hop) + s + d
    return mac(dst_mac) + mac(src_mac) + b"\x86\xdd" + hdr + icmp


def echo6(src_mac: str, dst_mac: str, src: str, dst: str) -> bytes:
    return _ipv6(src_mac, dst_mac, src, dst, struct.pack("!BBHHH", 128, 0, 0, 0x4242, 1) + b"ferry-forged", 64)


def na(src_mac: str, dst_mac: str, src: str, dst: str, target: str) -> bytes:
    body = struct.pack("!BBHI", 136, 0, 0, 0x20000000) + ipaddress.IPv6Address(target).packed  # O flag
    body += struct.pack("!BB", 2, 1) + mac(src_mac)  # target link-layer address option
    return _ipv6(src_mac, dst_mac, src, dst, body)


def ra(src_mac: str, src_ll: str) -> bytes:
    body = struct.pack("!BBHBBHII", 134, 0, 0, 64, 0, 1800, 0, 0)
    body += struct.pack("!BB", 1, 1) + mac(src_mac)  # source link-layer address option
    return _ipv6(src_mac, "33:33:00:00:00:01", src_ll, "ff02::1", body)


def garp(src_mac: str, ip: str) -> bytes:
    a = ipaddress.IPv4Address(ip).packed
    arp = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, mac(src_mac), a, b"\0" * 6, a)
    return b"\xff" * 6 + mac(src_mac) + b"\x08\x06" + arp


def main(argv: list[str]) -> int:
    ifname, kind, *rest = argv
    count = int(rest.pop())
    frame = {"echo6": echo6, "na": na, "ra": ra, "garp": garp}[kind](*rest)
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((ifname, 0))
    for _ in range(count):
        s.send(frame)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
