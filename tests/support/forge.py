"""Send hand-built Ethernet frames from inside a Pod (run with ``ip netns exec POD python3 forge.py``).

    python3 forge.py eth0 icmp   SRC_MAC DST_MAC SRC_IP DST_IP COUNT
    python3 forge.py eth0 arp-reply SRC_MAC DST_MAC SENDER_IP TARGET_IP COUNT   (SHA = SRC_MAC)
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import sys


def mac(m: str) -> bytes:
    return bytes.fromhex(m.replace(":", ""))


def csum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def icmp_frame(src_mac: str, dst_mac: str, src_ip: str, dst_ip: str) -> bytes:
    icmp = struct.pack("!BBHHH", 8, 0, 0, 0x4242, 1) + b"ferry-forged"
    icmp = icmp[:2] + struct.pack("!H", csum(icmp)) + icmp[4:]
    total = 20 + len(icmp)
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 1, 0, 64, 1, 0,
                      ipaddress.IPv4Address(src_ip).packed, ipaddress.IPv4Address(dst_ip).packed)
    hdr = hdr[:10] + struct.pack("!H", csum(hdr)) + hdr[12:]
    return mac(dst_mac) + mac(src_mac) + b"\x08\x00" + hdr + icmp


def arp_reply_frame(src_mac: str, dst_mac: str, sender_ip: str, target_ip: str) -> bytes:
    arp = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 2, mac(src_mac),
                      ipaddress.IPv4Address(sender_ip).packed, mac(dst_mac),
                      ipaddress.IPv4Address(target_ip).packed)
    return mac(dst_mac) + mac(src_mac) + b"\x08\x06" + arp


def main(argv: list[str]) -> int:
    ifname, kind, src_mac, dst_mac, a, b, count = argv
    frame = icmp_frame(src_mac, dst_mac, a, b) if kind == "icmp" else arp_reply_frame(src_mac, dst_mac, a, b)
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((ifname, 0))
    for _ in range(int(count)):
        s.send(frame)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
