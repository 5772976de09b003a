"""The wire evidence without root: pcap files read (both byte orders, micro- and nanosecond
stamps, a last record being written), frames decoded layer by layer (802.1Q, IPv4 and IPv6 with
extension headers and fragments, VXLAN, Geneve with options, GRE with its optional fields, ICMP
errors' quotes, ARP, neighbour discovery, WireGuard's messages), and the evidence they make:
flows between Nodes, Pod addresses seen where and inside what.  Frames are built here byte by
byte after the RFCs' layouts, not by the code under test."""

from __future__ import annotations

import ipaddress
import socket
import struct

import pytest

from lab import pcap, topology, wireevidence
from lab.pcap import Ports
from lab.wireevidence import Flow

PORTS = Ports(vxlan=frozenset({4789}), geneve=frozenset({6081}), wireguard=frozenset({51820}))
MAC_A, MAC_B = bytes.fromhex("020000000001"), bytes.fromhex("020000000002")
N1, N2, N3 = "192.168.77.11", "192.168.77.12", "192.168.88.13"
N1_6, N2_6 = "fd00:77::b", "fd00:77::c"
P1, P3 = "10.244.1.5", "10.244.3.7"
P1_6, P3_6 = "fd00:10:244:1::5", "fd00:10:244:3::7"
PODS = [ipaddress.ip_network("10.244.0.0/16"), ipaddress.ip_network("fd00:10:244::/48")]


# ------------------------------------------------------------------ frames, byte by byte

def eth(ethertype: int, payload: bytes, vlans: tuple[int, ...] = ()) -> bytes:
    tags = b"".join(struct.pack("!HH", 0x8100, v) for v in vlans)
    return MAC_A + MAC_B + tags + struct.pack("!H", ethertype) + payload


def ipv4(src: str, dst: str, proto: int, payload: bytes, frag: int = 0) -> bytes:
    head = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 1, frag, 64, proto, 0,
                       socket.inet_aton(src), socket.inet_aton(dst))
    return head + payload


def ipv6(src: str, dst: str, nxt: int, payload: bytes) -> bytes:
    return (struct.pack("!IHBB", 6 << 28, len(payload), nxt, 64) + socket.inet_pton(socket.AF_INET6, src)
            + socket.inet_pton(socket.AF_INET6, dst) + payload)


def udp(sport: int, dport: int, payload: bytes) -> bytes:
    return struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


def tcp(sport: int, dport: int) -> bytes:
    return struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 5 << 4, 0x02, 65535, 0, 0)


def icmp(kind: int, payload: bytes = b"\0" * 4) -> bytes:
    return struct.pack("!BBHI", kind, 0, 0, 0) + payload


def vxlan(frame: bytes) -> bytes:
    return struct.pack("!II", 0x08000000, 7 << 8) + frame


def geneve(proto: int, payload: bytes, options: bytes = b"") -> bytes:
    assert len(options) % 4 == 0
    return struct.pack("!BBHI", len(options) // 4, 0, proto, 7 << 8) + options + payload


def gre(proto: int, payload: bytes, csum: bool = False, key: bool = False, seq: bool = False) -> bytes:
    flags = (0x8000 if csum else 0) | (0x2000 if key else 0) | (0x1000 if seq else 0)
    return struct.pack("!HH", flags, proto) + b"\0\0\0\0" * (csum + key + seq) + payload


def arp(spa: str, tpa: str) -> bytes:
    return struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, MAC_A, socket.inet_aton(spa), b"\0" * 6,
                       socket.inet_aton(tpa))


def wg(kind: int, size: int) -> bytes:
    return bytes([kind, 0, 0, 0]) + b"\x5a" * (size - 4)


def rec(frame: bytes, ts: float = 1.0) -> pcap.Record:
    return pcap.Record(ts, frame, len(frame))


def decode(frame: bytes) -> pcap.Packet:
    return pcap.decode(rec(frame), pcap.LINKTYPE_ETHERNET, PORTS)


def pcap_file(frames: list[bytes], order: str = "<", nanos: bool = False, snap: int = 65535,
              linktype: int = 1) -> bytes:
    magic = 0xA1B23C4D if nanos else 0xA1B2C3D4
    out = struct.pack(order + "IHHiIII", magic, 2, 4, 0, 0, snap, linktype)
    for i, f in enumerate(frames):
        kept = f[:snap]
        out += struct.pack(order + "IIII", 100 + i, 500 if not nanos else 500_000, len(kept), len(f)) + kept
    return out


# ------------------------------------------------------------------ the file

@pytest.mark.parametrize("order, nanos", [("<", False), (">", False), ("<", True), (">", True)])
def test_records_in_either_byte_order_and_stamp_unit(order: str, nanos: bool) -> None:
    frames = [eth(0x0800, ipv4(N1, N2, 1, icmp(8))), eth(0x0806, arp(N1, N2))]
    linktype, recs = pcap.records(pcap_file(frames, order, nanos))
    assert linktype == pcap.LINKTYPE_ETHERNET
    assert [r.data for r in recs] == frames
    assert recs[1].ts == pytest.approx(101.0005)


def test_a_last_record_being_written_is_left_out_and_the_snap_length_is_kept() -> None:
    frames = [eth(0x0800, ipv4(N1, N2, 1, icmp(8, b"x" * 100))) for _ in range(3)]
    blob = pcap_file(frames, snap=60)
    _, recs = pcap.records(blob[:-5])
    assert len(recs) == 2 and all(len(r.data) == 60 and r.orig_len == len(frames[0]) for r in recs)


@pytest.mark.parametrize("blob, message", [(b"\x0a\x0d\x0d\x0a" + b"\0" * 40, "pcapng"),
                                           (b"GIF89a" + b"\0" * 40, "not a pcap file"), (b"", "not a pcap")])
def test_what_is_not_pcap_is_refused(blob: bytes, message: str) -> None:
    with pytest.raises(pcap.PcapError, match=message):
        pcap.records(blob)


def test_linux_cooked_captures_decode_too() -> None:
    payload = ipv4(N1, P3, 17, udp(1, 2, b""))
    sll = struct.pack("!HHH8sH", 0, 1, 6, b"\0" * 8, 0x0800) + payload
    p = pcap.decode(rec(sll), pcap.LINKTYPE_LINUX_SLL, PORTS)
    assert [(x.src, x.dst) for x in p.layers] == [(N1, P3)]
    with pytest.raises(pcap.PcapError, match="link type 105"):
        pcap.decode(rec(b"\0" * 40), 105, PORTS)


# ------------------------------------------------------------------ the frames

def test_ipv4_tcp_behind_two_tags() -> None:
    p = decode(eth(0x0800, ipv4(P1, P3, 6, tcp(40000, 7777)), vlans=(100, 7)))
    assert p.vlans == (100, 7) and p.ethertype == 0x0800 and not p.truncated
    (o,) = p.layers
    assert (o.depth, o.src, o.dst, o.proto, o.sport, o.dport, o.inside) == (0, P1, P3, "tcp", 40000, 7777, None)


def test_vxlan_carries_an_inner_frame_whose_addresses_are_decoded() -> None:
    inner = eth(0x0800, ipv4(P1, P3, 1, icmp(8)))
    p = decode(eth(0x0800, ipv4(N1, N3, 17, udp(50000, 4789, vxlan(inner)))))
    assert [(x.depth, x.src, x.dst, x.proto, x.inside) for x in p.layers] == [
        (0, N1, N3, "udp", None), (1, P1, P3, "icmp", "vxlan")]
    assert p.layers[1].icmp_type == 8


def test_geneve_with_options_over_ipv6_and_ip_payloads() -> None:
    inner = eth(0x86DD, ipv6(P1_6, P3_6, 58, icmp(128)))
    p = decode(eth(0x86DD, ipv6(N1_6, N2_6, 17, udp(1, 6081, geneve(0x6558, inner, options=b"\1" * 12)))))
    assert [(x.src, x.dst, x.inside) for x in p.layers] == [(N1_6, N2_6, None), (P1_6, P3_6, "geneve")]
    bare = decode(eth(0x0800, ipv4(N1, N2, 17, udp(1, 6081, geneve(0x0800, ipv4(P1, P3, 6, tcp(1, 2)))))))
    assert [(x.src, x.inside) for x in bare.layers] == [(N1, None), (P1, "geneve")]


@pytest.mark.parametrize("fields", [{}, {"key": True}, {"csum": True, "key": True, "seq": True}])
def test_gre_with_its_optional_fields_over_ethernet_and_ip(fields: dict) -> None:
    inner = eth(0x0800, ipv4(P1, P3, 1, icmp(0)))
    p = decode(eth(0x0800, ipv4(N1, N3, 47, gre(0x6558, inner, **fields))))
    assert [(x.proto, x.src, x.inside) for x in p.layers] == [("gre", N1, None), ("icmp", P1, "gre")]
    p = decode(eth(0x0800, ipv4(N1, N3, 47, gre(0x86DD, ipv6(P1_6, P3_6, 17, udp(1, 2, b"")), **fields))))
    assert [(x.src, x.inside) for x in p.layers] == [(N1, None), (P1_6, "gre")]


def test_an_icmp_error_quotes_the_packet_that_caused_it() -> None:
    quoted = ipv4(P1, P3, 17, udp(1, 2, b""))[:28]
    p = decode(eth(0x0800, ipv4(N2, P1, 1, icmp(3, quoted))))
    assert [(x.src, x.dst, x.inside) for x in p.layers] == [(N2, P1, None), (P1, P3, "icmp-quote")]
    q6 = ipv6(P1_6, P3_6, 17, udp(1, 2, b""))
    p = decode(eth(0x86DD, ipv6(N1_6, P1_6, 58, icmp(2, q6))))
    assert p.layers[1].src == P1_6 and p.layers[1].inside == "icmp-quote"


def test_ipv6_extension_headers_and_fragments() -> None:
    hbh = bytes([17, 0]) + b"\0" * 6  # next header UDP, 8 bytes
    p = decode(eth(0x86DD, ipv6(N1_6, N2_6, 0, hbh + udp(5, 53, b""))))
    assert (p.layers[0].proto, p.layers[0].dport) == ("udp", 53)
    first = bytes([17, 0]) + struct.pack("!HI", 0x0001, 9)  # offset 0, more fragments
    later = bytes([17, 0]) + struct.pack("!HI", 0x00B9, 9)  # offset 23 * 8
    assert decode(eth(0x86DD, ipv6(N1_6, N2_6, 44, first + udp(5, 53, b"")))).layers[0].dport == 53
    p = decode(eth(0x86DD, ipv6(N1_6, N2_6, 44, later + b"\1" * 8)))
    assert (p.layers[0].proto, p.layers[0].dport) == ("udp", None)
    # IPv4: a later fragment of a VXLAN datagram is not taken for a VXLAN header
    p = decode(eth(0x0800, ipv4(N1, N3, 17, b"\xff" * 40, frag=0x00B9)))
    assert [(x.proto, x.dport) for x in p.layers] == [("udp", None)]


def test_arp_and_neighbour_discovery_name_addresses() -> None:
    p = decode(eth(0x0806, arp(N1, P3)))
    assert {(n.kind, n.address) for n in p.named} == {("arp", N1), ("arp", P3)} and not p.layers
    ns = struct.pack("!BBHI", 135, 0, 0, 0) + socket.inet_pton(socket.AF_INET6, P3_6)
    p = decode(eth(0x86DD, ipv6(N1_6, "ff02::1:ff00:7", 58, ns)))
    assert [(n.kind, n.address) for n in p.named] == [("nd", P3_6)]


@pytest.mark.parametrize("kind, size, name", [(1, 148, "handshake-initiation"), (2, 92, "handshake-response"),
                                              (3, 64, "cookie-reply"), (4, 32, "transport-data"),
                                              (4, 32 + 16 * 90, "transport-data"), (4, 40, None), (1, 100, None),
                                              (9, 148, None)])
def test_wireguard_messages_by_type_and_length(kind: int, size: int, name: str | None) -> None:
    frame = eth(0x0800, ipv4(N1, N2, 17, udp(51820, 51820, wg(kind, size))))
    assert decode(frame).layers[0].wireguard == name
    cut = pcap.decode(pcap.Record(1.0, frame[:80], len(frame)), pcap.LINKTYPE_ETHERNET, PORTS)
    assert cut.layers[0].wireguard == name  # from the UDP length, not the bytes the capture kept
    other = eth(0x0800, ipv4(N1, N2, 17, udp(40000, 9999, wg(kind, size))))
    assert decode(other).layers[0].wireguard is None  # another port: not taken for WireGuard


def test_what_the_snap_length_cut_says_so() -> None:
    inner = eth(0x0800, ipv4(P1, P3, 1, icmp(8)))
    frame = eth(0x0800, ipv4(N1, N3, 17, udp(1, 4789, vxlan(inner))))
    p = pcap.decode(pcap.Record(1.0, frame[:14 + 20 + 8 + 8 + 14 + 10], len(frame)), 1, PORTS)
    assert p.truncated and [x.src for x in p.layers] == [N1]
    assert decode(b"\x01\x02").truncated


# ------------------------------------------------------------------ the evidence

def test_evidence_of_clear_tunnelled_and_encrypted_frames() -> None:
    nodes = {N1, N2, N3, N1_6, N2_6}
    vx = eth(0x0800, ipv4(N1, N3, 17, udp(50000, 4789, vxlan(eth(0x0800, ipv4(P1, P3, 1, icmp(8)))))))
    routed = eth(0x0800, ipv4(P1, P3, 6, tcp(40000, 7777)))
    wgd = eth(0x0800, ipv4(N1, N2, 17, udp(51820, 51820, wg(4, 128))))
    nd = eth(0x86DD, ipv6(N1_6, N2_6, 58, struct.pack("!BBHI", 136, 0, 0, 0) + socket.inet_pton(socket.AF_INET6, N1_6)))
    ext = eth(0x0800, ipv4(N1, "192.168.99.2", 6, tcp(1, 7777)))
    ev = wireevidence.evidence({"a/node-1": [decode(f) for f in (vx, routed, wgd, nd, ext)], "a/router": []},
                               nodes, PODS, {"a/node-1": 0})
    assert ev.total == 5 and ev.packets["a/router"] == 0
    assert ev.node_flows == {Flow(N1, N3, "udp", 4789): 1, Flow(N1, N2, "udp", 51820): 1,
                             Flow(N1_6, N2_6, "icmpv6", icmp_type=136): 1}
    assert ev.wireguard == {(N1, N2, "transport-data"): 1}
    assert ev.pod_addresses == {P1, P3} and ev.inside() == {"vxlan", None}
    assert ev.not_wireguard(51820) == {Flow(N1, N3, "udp", 4789)}
    assert ev.flows_between_nodes() == {Flow(N1, N3, "udp", 4789), Flow(N1, N2, "udp", 51820)}
    (vx_seen,) = [s for s in ev.sightings if s.inside == "vxlan" and s.role == "src"]
    assert (vx_seen.address, vx_seen.depth, vx_seen.point, vx_seen.outer) == (P1, 1, "a/node-1",
                                                                              Flow(N1, N3, "udp", 4789))
    text = ev.report()
    assert "Pod addresses on the wire: 2 (10.244.1.5, 10.244.3.7)" in text and "transport-data 1" in text


def test_evidence_of_an_encrypted_capture_has_no_pod_address() -> None:
    frames = [eth(0x0800, ipv4(N1, N2, 17, udp(51820, 51820, wg(k, s)))) for k, s in ((1, 148), (2, 92), (4, 64))]
    ev = wireevidence.evidence({"a/node-2": [decode(f) for f in frames]}, {N1, N2}, PODS)
    assert not ev.sightings and ev.not_wireguard(51820) == set()
    assert "Pod addresses on the wire: none" in ev.report()
    # an ARP or a neighbour solicitation for a Pod address is a sighting too
    ev = wireevidence.evidence({"a/node-2": [decode(eth(0x0806, arp(N1, P1)))]}, {N1, N2}, PODS)
    assert [(s.address, s.role) for s in ev.sightings] == [(P1, "arp")]


def test_capture_points_ports_and_pod_networks_of_a_topology() -> None:
    t = topology.load(topology.DEFAULT_TOPOLOGY.replace("default.yaml", "wireguard.yaml"))
    pts = wireevidence.points(t, "x")
    assert [(p.name, p.netns, p.nodes) for p in pts] == [
        ("a/router", "x-seg-a", ("node-1", "node-2")), ("a/node-1", "x-seg-a", ("node-1",)),
        ("a/node-2", "x-seg-a", ("node-2",)), ("b/router", "x-seg-b", ("node-3",)),
        ("b/node-3", "x-seg-b", ("node-3",))]
    assert wireevidence.ports_of(t) == Ports(frozenset({4789}), frozenset({6081}), frozenset({51820}))
    t2 = topology.parse({**topology.to_doc(t), "routeSync": {"tunnelType": "geneve", "tunnelPort": 7000}})
    assert wireevidence.ports_of(t2).geneve == {6081, 7000}
    assert [str(n) for n in wireevidence.pod_networks(t)] == ["10.244.0.0/16", "fd00:10:244::/48"]
    assert wireevidence.node_transport_addresses(t) == {"192.168.77.11", "fd00:77::b", "192.168.77.12",
                                                        "fd00:77::c", "192.168.88.13", "fd00:88::d"}
