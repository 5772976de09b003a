"""OpenFlow 1.3 spoken directly on a bridge's management socket, for the plugin's own flows.

An ``ovs-ofctl`` exec costs ~5 ms of CPU and 7-12 ms of wall time per call, once per ADD and
once per DEL.  The plugin needs two operations, always on flows it planned itself
(:mod:`cni.pipeline.flows`): add a Pod's flows, delete every flow of one cookie.  This module encodes
exactly the flow syntax :mod:`cni.pipeline.flows` produces (and refuses anything else, so a new kind of
flow cannot be silently mistranslated), sends the FLOW_MODs and a BARRIER, and raises on any
OFPT_ERROR.  ``tests/system/test_ofnative.py`` installs every planned flow both ways and compares
``ovs-ofctl dump-flows``.  Standard library only."""

from __future__ import annotations

import _socket
import struct

from cni.lean import addr

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from cni.pipeline.tables import Cookie, Flow

OFP_VERSION = 4  # OpenFlow 1.3
OFPT_HELLO, OFPT_ERROR, OFPT_ECHO_REQUEST, OFPT_ECHO_REPLY = 0, 1, 2, 3
OFPT_FLOW_MOD, OFPT_BARRIER_REQUEST, OFPT_BARRIER_REPLY = 14, 20, 21
OFPFC_ADD, OFPFC_DELETE = 0, 3
OFPTT_ALL, OFPP_ANY, OFPG_ANY, OFPP_IN_PORT = 0xFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFF8
OFP_NO_BUFFER = 0xFFFFFFFF
OFPIT_GOTO_TABLE, OFPIT_APPLY_ACTIONS = 1, 4
OFPAT_OUTPUT, OFPAT_DEC_NW_TTL, OFPAT_SET_FIELD, OFPAT_EXPERIMENTER = 0, 24, 25, 0xFFFF
NX_VENDOR_ID, NXAST_REG_MOVE, NXAST_REG_LOAD = 0x00002320, 6, 7

HEADER = struct.Struct("!BBHI")
_FLOW_MOD = struct.Struct("!QQBBHHHIIIH2x")

# OXM fields of class OPENFLOW_BASIC: name -> (field number, length).
OXM_FIELDS = {
    "in_port": (0, 4), "eth_dst": (3, 6), "eth_src": (4, 6), "eth_type": (5, 2), "ip_proto": (10, 1),
    "ipv4_src": (11, 4), "ipv4_dst": (12, 4), "arp_op": (21, 2), "arp_spa": (22, 4), "arp_tpa": (23, 4),
    "arp_sha": (24, 6), "arp_tha": (25, 6), "ipv6_src": (26, 16), "ipv6_dst": (27, 16),
    "icmpv6_type": (29, 1), "nd_target": (31, 16),
}
# Prerequisites before the fields that need them (OVS checks OXM order).
MATCH_ORDER = ("in_port", "eth_dst", "eth_src", "eth_type", "ip_proto", "ipv4_src", "ipv4_dst", "arp_op", "arp_spa",
          "arp_tpa", "arp_sha", "ipv6_src", "ipv6_dst", "icmpv6_type", "nd_target")
# ovs-ofctl's names in cni.pipeline.flows' text -> OXM names.
MATCH_KEYS = {"in_port": "in_port", "dl_src": "eth_src", "dl_dst": "eth_dst", "nw_src": "ipv4_src",
               "nw_dst": "ipv4_dst", "arp_op": "arp_op", "arp_spa": "arp_spa", "arp_tpa": "arp_tpa",
               "arp_sha": "arp_sha", "ipv6_src": "ipv6_src", "ipv6_dst": "ipv6_dst",
               "icmp_type": "icmpv6_type", "nd_target": "nd_target"}
SHORTHANDS = {"arp": {"eth_type": 0x0806}, "ip": {"eth_type": 0x0800}, "ipv6": {"eth_type": 0x86DD},
               "icmp6": {"eth_type": 0x86DD, "ip_proto": 58}}
# NXM headers (Nicira) named in move:/load: actions -> (OXM field for set_field, NXM header, bits).
_NXM = {"NXM_OF_ETH_DST": ("eth_dst", 0x00000206, 48), "NXM_OF_ETH_SRC": ("eth_src", 0x00000406, 48),
        "NXM_OF_ARP_OP": ("arp_op", 0x00001E02, 16), "NXM_OF_ARP_SPA": ("arp_spa", 0x00002004, 32),
        "NXM_OF_ARP_TPA": ("arp_tpa", 0x00002204, 32), "NXM_NX_ARP_SHA": ("arp_sha", 0x00012206, 48),
        "NXM_NX_ARP_THA": ("arp_tha", 0x00012406, 48)}


class OpenFlowError(Exception):
    """The switch refused a message, or the flow text is outside what this encoder speaks."""


def encode_value(field: str, text: str) -> bytes:
    length = OXM_FIELDS[field][1]
    if field in ("eth_src", "eth_dst", "arp_sha", "arp_tha"):
        from cni.pipeline.flows import mac

        return bytes.fromhex(mac(text).replace(":", ""))
    if field in ("ipv4_src", "ipv4_dst", "arp_spa", "arp_tpa", "ipv6_src", "ipv6_dst", "nd_target"):
        value, bits = addr.parse_ip(text)
        if bits // 8 != length:
            raise OpenFlowError(f"{field}={text}: wrong address family")
        return value.to_bytes(length, "big")
    return int(text, 0).to_bytes(length, "big")


def encode_oxm(field: str, value: bytes) -> bytes:
    number, length = OXM_FIELDS[field]
    return struct.pack("!I", (0x8000 << 16) | (number << 9) | length) + value


def encode_match(text: str) -> bytes:
    fields: dict[str, bytes] = {}
    for item in filter(None, text.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            if key not in SHORTHANDS:
                raise OpenFlowError(f"match {item!r} is not spoken here")
            for f, v in SHORTHANDS[key].items():
                fields[f] = v.to_bytes(OXM_FIELDS[f][1], "big")
        elif key in MATCH_KEYS:
            fields[MATCH_KEYS[key]] = encode_value(MATCH_KEYS[key], value)
        else:
            raise OpenFlowError(f"match {item!r} is not spoken here")
    body = b"".join(encode_oxm(f, fields[f]) for f in MATCH_ORDER if f in fields)
    length = 4 + len(body)
    return struct.pack("!HH", 1, length) + body + b"\0" * (-length % 8)


def _action_set_field(field: str, value: bytes) -> bytes:
    oxm = encode_oxm(field, value)
    length = 4 + len(oxm)
    pad = -length % 8
    return struct.pack("!HH", OFPAT_SET_FIELD, length + pad) + oxm + b"\0" * pad


def _nxm_name(text: str) -> str:
    if not text.endswith("[]") or text[:-2] not in _NXM:
        raise OpenFlowError(f"field {text!r} is not spoken here")
    return text[:-2]


def encode_instructions(text: str) -> bytes:
    actions: list[bytes] = []
    goto: int | None = None
    for item in text.split(","):
        if item == "drop":
            continue
        if goto is not None:
            raise OpenFlowError(f"actions after goto_table in {text!r}")
        if item.startswith("goto_table:"):
            goto = int(item.split(":", 1)[1])
        elif item.startswith("output:"):
            actions.append(struct.pack("!HHIH6x", OFPAT_OUTPUT, 16, int(item.split(":", 1)[1]), 0))
        elif item == "IN_PORT":
            actions.append(struct.pack("!HHIH6x", OFPAT_OUTPUT, 16, OFPP_IN_PORT, 0))
        elif item == "dec_ttl":
            actions.append(struct.pack("!HH4x", OFPAT_DEC_NW_TTL, 8))
        elif item.startswith(("mod_dl_src:", "mod_dl_dst:")):
            field = "eth_src" if item.startswith("mod_dl_src:") else "eth_dst"
            actions.append(_action_set_field(field, encode_value(field, item.split(":", 1)[1])))
        elif item.startswith("load:"):  # NXAST_REG_LOAD, as ovs-ofctl sends it
            value, _, dst = item[5:].partition("->")
            _field, header, bits = _NXM[_nxm_name(dst)]
            number = int(value, 0)
            if not 0 <= number < 1 << bits:
                raise OpenFlowError(f"{item!r}: value does not fit the field")
            actions.append(struct.pack("!HHIHHIQ", OFPAT_EXPERIMENTER, 24, NX_VENDOR_ID, NXAST_REG_LOAD,
                                       bits - 1, header, number))
        elif item.startswith("move:"):
            src, _, dst = item[5:].partition("->")
            _, src_header, src_bits = _NXM[_nxm_name(src)]
            _, dst_header, dst_bits = _NXM[_nxm_name(dst)]
            if src_bits != dst_bits:
                raise OpenFlowError(f"{item!r}: fields of different widths")
            actions.append(struct.pack("!HHIHHHHII", OFPAT_EXPERIMENTER, 24, NX_VENDOR_ID, NXAST_REG_MOVE,
                                       src_bits, 0, 0, src_header, dst_header))
        else:
            raise OpenFlowError(f"action {item!r} is not spoken here")
    out = b""
    if actions:
        body = b"".join(actions)
        out += struct.pack("!HH4x", OFPIT_APPLY_ACTIONS, 8 + len(body)) + body
    if goto is not None:
        out += struct.pack("!HHB3x", OFPIT_GOTO_TABLE, 8, goto)
    return out


def encode_flow_mod(cookie: int, cookie_mask: int, table: int, command: int, priority: int, match: bytes,
              instructions: bytes, xid: int) -> bytes:
    """One OFPT_FLOW_MOD: idle/hard timeouts 0, no buffer, any out_port/out_group, no flags."""
    body = (_FLOW_MOD.pack(cookie, cookie_mask, table, command, 0, 0, priority, OFP_NO_BUFFER, OFPP_ANY,
                           OFPG_ANY, 0) + match + instructions)
    return HEADER.pack(OFP_VERSION, OFPT_FLOW_MOD, HEADER.size + len(body), xid) + body


def flow_mod_add(flow: Flow, xid: int) -> bytes:
    return encode_flow_mod(flow.cookie.value, 0, int(flow.table), OFPFC_ADD, flow.priority, encode_match(flow.match),
                     encode_instructions(flow.actions), xid)


def flow_mod_delete(cookie: Cookie, xid: int) -> bytes:
    from cni.pipeline.tables import FULL_MASK

    return encode_flow_mod(cookie.value, FULL_MASK, OFPTT_ALL, OFPFC_DELETE, 0, encode_match(""), b"", xid)


class NativeOpenFlow:
    """One bridge's flow table over ``unix:<run_dir>/<bridge>.mgmt``, OpenFlow 1.3."""

    def __init__(self, bridge: str, run_dir: str, timeout: float = 10.0) -> None:
        self.bridge = bridge
        self.path = f"{run_dir.rstrip('/')}/{bridge}.mgmt"
        self.timeout = timeout

    def add_flows(self, flows: Sequence[Flow]) -> None:
        if flows:
            self.transact([flow_mod_add(f, i + 1) for i, f in enumerate(flows)])

    def del_flows(self, cookie: Cookie) -> None:
        self.transact([flow_mod_delete(cookie, 1)])

    def transact(self, messages: list[bytes]) -> None:
        """HELLO, the messages, a BARRIER; raise on the first OFPT_ERROR the switch answers."""
        barrier = len(messages) + 1
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(self.timeout)
            try:
                sock.connect(self.path)
            except OSError as e:
                raise OpenFlowError(f"bridge {self.bridge}: cannot connect to {self.path}: {e.strerror}"
                                    " (is ovs-vswitchd running?)") from None
            hello = HEADER.pack(OFP_VERSION, OFPT_HELLO, HEADER.size, 0)
            sock.sendall(hello + b"".join(messages) + HEADER.pack(OFP_VERSION, OFPT_BARRIER_REQUEST, 8, barrier))
            buf = b""
            while True:
                while len(buf) >= 8:
                    version, mtype, length, xid = HEADER.unpack_from(buf)
                    if length < 8:
                        raise OpenFlowError(f"bridge {self.bridge}: malformed OpenFlow message")
                    if len(buf) < length:
                        break
                    msg, buf = buf[:length], buf[length:]
                    if mtype == OFPT_ERROR:
                        etype, code = struct.unpack_from("!HH", msg, 8)
                        raise OpenFlowError(f"bridge {self.bridge}: switch refused message {xid} "
                                            f"(OpenFlow error type {etype} code {code})")
                    if mtype == OFPT_HELLO and version < OFP_VERSION:
                        raise OpenFlowError(f"bridge {self.bridge}: OpenFlow 1.3 not enabled on the bridge")
                    if mtype == OFPT_ECHO_REQUEST:
                        sock.sendall(HEADER.pack(version, OFPT_ECHO_REPLY, length, xid) + msg[8:])
                    if mtype == OFPT_BARRIER_REPLY and xid == barrier:
                        return
                data = sock.recv(65536)
                if not data:
                    raise OpenFlowError(f"bridge {self.bridge}: the switch closed the connection")
                buf += data
        finally:
            sock.close()
