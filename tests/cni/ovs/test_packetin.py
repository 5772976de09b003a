"""cni.ovs.openflow.packetin reads an NXT_PACKET_IN2 and the connection its packet opens as
``ovs-ofctl ofp-print`` reads the same bytes (a property over random connections, userdata and
truncations), and the messages that ask for packet-ins and make the denied log's meter are what
ovs-ofctl says they are.  No root: only ovs-ofctl's own printer."""

from __future__ import annotations

import ipaddress
import re
import shutil
import struct
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni.ovs.openflow import codec, packetin

pytestmark = pytest.mark.skipif(shutil.which("ovs-ofctl") is None, reason="needs ovs-ofctl")

PAYLOAD = bytes(range(40))  # what a max_len cut takes off (never the headers: 128 bytes is room for them)
PROTOS = {6: "tcp", 17: "udp", 132: "sctp", 1: "icmp", 58: "icmp6"}


def _prop(ptype: int, value: bytes) -> bytes:
    n = 4 + len(value)
    return struct.pack("!HH", ptype, n) + value + b"\0" * (-n % 8)


def frame(family: int, proto: int, src: str, dst: str, a: int, b: int, vlan: int | None) -> bytes:
    """An Ethernet frame opening the connection (ports, or ICMP type and code, in a and b)."""
    if proto in (6, 17, 132):
        l4 = struct.pack("!HH", a, b) + (struct.pack("!IIBBHHH", 1, 0, 0x50, 0x02, 8192, 0, 0) if proto == 6
                                         else b"\0" * (4 if proto == 17 else 8))
    else:
        l4 = struct.pack("!BBHI", a, b, 0, 0)
    if family == 4:
        l3 = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(l4) + len(PAYLOAD), 1, 0, 64, proto, 0,
                         ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed)
        ethertype = 0x0800
    else:
        l3 = struct.pack("!IHBB16s16s", 6 << 28, len(l4) + len(PAYLOAD), proto, 64, ipaddress.IPv6Address(src).packed,
                         ipaddress.IPv6Address(dst).packed)
        ethertype = 0x86DD
    eth = bytes.fromhex("020000000001020000000002")
    if vlan is not None:
        eth += struct.pack("!HH", 0x8100, vlan)
    return eth + struct.pack("!H", ethertype) + l3 + l4 + PAYLOAD


def packet_in2(packet: bytes, full_len: int, table: int, cookie: int, userdata: bytes) -> bytes:
    body = (_prop(packetin.NXPINT_PACKET, packet) + _prop(packetin.NXPINT_FULL_LEN, struct.pack("!I", full_len))
            + _prop(packetin.NXPINT_TABLE_ID, bytes([table])) + _prop(packetin.NXPINT_COOKIE,
                                                                       b"\0" * 4 + struct.pack("!Q", cookie))
            + _prop(packetin.NXPINT_REASON, bytes([codec.OFPR_ACTION])) + _prop(packetin.NXPINT_USERDATA, userdata))
    return struct.pack("!BBHIII", 4, 4, 16 + len(body), 0, codec.NX_VENDOR_ID, packetin.NXT_PACKET_IN2) + body


def ofp_print(msg: bytes) -> str:
    return subprocess.run(["ovs-ofctl", "ofp-print", msg.hex()], check=True, capture_output=True, text=True).stdout


def fields(flow_line: str) -> dict[str, str]:
    out = {}
    for part in flow_line.split(" ")[0].split(","):
        k, _, v = part.partition("=")
        out[k] = v
    return out


v4 = st.ip_addresses(v=4).map(str)
v6 = st.ip_addresses(v=6).map(str)


@st.composite
def connections(draw: st.DrawFn) -> tuple:
    family = draw(st.sampled_from((4, 6)))
    proto = draw(st.sampled_from((6, 17, 132, 1 if family == 4 else 58)))
    addr = v4 if family == 4 else v6
    ports = st.integers(0, 65535) if proto in (6, 17, 132) else st.integers(0, 255)
    return (family, proto, draw(addr), draw(addr), draw(ports), draw(ports),
            draw(st.one_of(st.none(), st.integers(1, 4094))))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(connections(), st.binary(min_size=1, max_size=300), st.integers(0, 254), st.integers(0, 2**64 - 1),
       st.integers(0, 40))
def test_decoded_as_ovs_ofctl_reads_it(conn: tuple, userdata: bytes, table: int, cookie: int, cut: int) -> None:
    family, proto = conn[0], conn[1]
    whole = frame(*conn)
    packet = whole[:len(whole) - cut]  # max_len cut the tail off
    msg = packet_in2(packet, len(whole), table, cookie, userdata)
    text = ofp_print(msg)
    # table 0 and cookie 0xffffffffffffffff (none) go unsaid
    head = re.search(r"\): (?:table_id=(\d+) )?(?:cookie=(0x[0-9a-f]+) )?total_len=(\d+)", text)
    assert head, text
    ud = re.search(r"userdata=([0-9a-f.]+)", text)
    assert ud, text
    # ovs-ofctl parses no L4 of a packet shorter than its IP length says: the connection is read
    # off the whole packet, as the switch matched it before max_len cut it
    whole_text = text if not cut else ofp_print(packet_in2(whole, len(whole), table, cookie, userdata))
    flow = fields(whole_text.strip().splitlines()[-1])

    pin = packetin.packet_in2(msg)
    assert pin is not None
    assert (pin.table, pin.cookie, pin.full_len) == (int(head[1] or 0), int(head[2] or "0xffffffffffffffff", 16),
                                                  int(head[3]))
    assert pin.userdata == bytes.fromhex(ud[1].replace(".", ""))
    assert pin.reason == codec.OFPR_ACTION and pin.packet == packet
    c = packetin.connection(pin.packet)
    assert c is not None
    word = PROTOS[proto] + ("6" if family == 6 and proto in (6, 17, 132) else "")
    assert word in flow, flow
    assert (c.family, c.proto) == (family, proto)
    if family == 4:
        assert (c.src, c.dst) == (flow["nw_src"], flow["nw_dst"])
    else:
        assert (c.src, c.dst) == (flow["ipv6_src"], flow["ipv6_dst"])
    if proto in (6, 17, 132):
        assert (c.sport, c.dport) == (int(flow["tp_src"]), int(flow["tp_dst"]))
    else:
        assert (c.sport, c.dport) == (int(flow["icmp_type"]), int(flow["icmp_code"]))


def test_other_messages_are_not_packet_ins() -> None:
    assert packetin.packet_in2(codec.barrier(1)) is None
    assert packetin.packet_in2(codec.set_packet_in2(1)) is None
    with pytest.raises(ValueError, match="past the message"):
        packetin.packet_in2(packet_in2(b"x" * 20, 20, 1, 1, b"u")[:-8] + struct.pack("!HH", 7, 200))
    assert packetin.connection(b"\0" * 13) is None
    assert packetin.connection(bytes(12) + b"\x08\x06" + bytes(28)) is None  # ARP


def test_the_log_line_names_the_connection() -> None:
    tcp = packetin.connection(frame(4, 6, "10.244.1.5", "10.244.2.7", 41234, 80, None))
    udp6 = packetin.connection(frame(6, 17, "fd00::5", "fd00::7", 5353, 53, 7))
    icmp = packetin.connection(frame(4, 1, "10.0.0.1", "10.0.0.2", 8, 0, None))
    assert tcp is not None and udp6 is not None and icmp is not None
    assert tcp.text() == "TCP 10.244.1.5:41234 -> 10.244.2.7:80"
    assert udp6.text() == "UDP [fd00::5]:5353 -> [fd00::7]:53"
    assert icmp.text() == "ICMP 10.0.0.1 -> 10.0.0.2 type 8 code 0"


def test_what_asks_for_packet_ins_and_the_meter_are_what_ovs_ofctl_says() -> None:
    assert "format=nxt_packet_in2" in ofp_print(codec.set_packet_in2(1))
    text = ofp_print(codec.set_async(2))
    assert re.search(r"primary:\s+PACKET_IN: action\s+PORT_STATUS: \(off\)\s+FLOW_REMOVED: \(off\)", text), text
    assert re.search(r"secondary:\s+PACKET_IN: action\s", text), text
    text = ofp_print(codec.meter_mod(1, 100, 1000, 3))
    assert "ADD meter=1 pktps burst stats bands=" in text and "type=drop rate=100 burst_size=1000" in text
    assert "MOD meter=7" in ofp_print(codec.meter_mod(7, 5, 5, 3, codec.OFPMC_MODIFY))
