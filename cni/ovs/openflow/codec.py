"""OpenFlow 1.3 messages as bytes: FLOW_MODs from :class:`cni.pipeline.tables.Flow` values (their
typed match and actions, never their text), HELLO, BARRIER, ECHO, ONF bundles (EXT-230, what
``ovs-ofctl -O OpenFlow13 --bundle`` sends), METER_MODs and what asks for packet-ins (the async
config, Nicira's packet-in format; their decoding: :mod:`.packetin`), and the framing and errors
of what the switch answers.  A field or action it cannot express raises :class:`OpenFlowError`: there is no other
path to the switch.  Standard library only (the plugin encodes a Pod's flows on every ADD)."""

from __future__ import annotations

import struct

from cni.lean.typecheck import TYPE_CHECKING
from cni.pipeline.actions import (
    Conjunction,
    Controller,
    Ct,
    DecTtl,
    Goto,
    Load,
    Move,
    Output,
    PopVlan,
    PushVlan,
    Resubmit,
    SetField,
)
from cni.pipeline.match import BIT_MASKABLE, ETH_TYPE, IP_PROTO, MASKABLE, Field, Proto

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from cni.pipeline.actions import Action
    from cni.pipeline.match import FieldSpec, MatchItem
    from cni.pipeline.tables import Cookie, Flow

OFP_VERSION = 4  # OpenFlow 1.3
OFPT_HELLO, OFPT_ERROR, OFPT_ECHO_REQUEST, OFPT_ECHO_REPLY, OFPT_EXPERIMENTER = 0, 1, 2, 3, 4
OFPT_FLOW_MOD, OFPT_BARRIER_REQUEST, OFPT_BARRIER_REPLY = 14, 20, 21
OFPT_SET_ASYNC, OFPT_METER_MOD = 28, 29
OFPFC_ADD, OFPFC_DELETE = 0, 3
OFPMC_ADD, OFPMC_MODIFY = 0, 1
OFPMF_PKTPS, OFPMF_BURST, OFPMF_STATS = 0x2, 0x4, 0x8
OFPMBT_DROP = 1
OFPET_METER_MOD_FAILED, OFPMMFC_METER_EXISTS = 12, 1
OFPR_ACTION = 1
NXT_SET_PACKET_IN_FORMAT, NXPIF_NXT_PACKET_IN2 = 16, 2
NXAST_CONTROLLER2 = 37
NXAC2PT_MAX_LEN, NXAC2PT_USERDATA, NXAC2PT_METER_ID = 0, 3, 5
OFPTT_ALL, OFPP_ANY, OFPG_ANY = 0xFF, 0xFFFFFFFF, 0xFFFFFFFF
OFP_NO_BUFFER = 0xFFFFFFFF
OFPIT_GOTO_TABLE, OFPIT_APPLY_ACTIONS = 1, 4
OFPAT_OUTPUT, OFPAT_DEC_NW_TTL, OFPAT_SET_FIELD, OFPAT_EXPERIMENTER = 0, 24, 25, 0xFFFF
OFPAT_PUSH_VLAN, OFPAT_POP_VLAN = 17, 18
NX_VENDOR_ID, NXAST_RESUBMIT_TABLE, NXAST_REG_MOVE, NXAST_REG_LOAD = 0x00002320, 14, 6, 7
NXAST_CT, NX_CT_F_COMMIT, NX_CT_RECIRC_NONE = 35, 1, 0xFF
NXAST_CONJUNCTION = 34
OFPP_IN_PORT_10 = 0xFFF8  # OpenFlow 1.0 port numbers in Nicira actions
ONF_EXPERIMENTER_ID = 0x4F4E4600
ONFT_BUNDLE_CONTROL, ONFT_BUNDLE_ADD_MESSAGE = 2300, 2301
OFPBCT_OPEN_REQUEST, OFPBCT_COMMIT_REQUEST, OFPBCT_COMMIT_REPLY = 0, 4, 5
OFPBF_ATOMIC, OFPBF_ORDERED = 1, 2
FULL_COOKIE_MASK = (1 << 64) - 1

HEADER = struct.Struct("!BBHI")
_FLOW_MOD = struct.Struct("!QQBBHHHIIIH2x")
_BUNDLE = struct.Struct("!IIIHH")  # experimenter, exp_type, bundle_id, type (control) / pad (add), flags
_OUTPUT = struct.Struct("!HHIH6x")
_U32 = struct.Struct("!I")
_DEC_TTL = struct.pack("!HH4x", OFPAT_DEC_NW_TTL, 8)
_EMPTY_MATCH = struct.pack("!HH4x", 1, 4)
_POP_VLAN = struct.pack("!HH4x", OFPAT_POP_VLAN, 8)


class OpenFlowError(Exception):
    """The switch refused a message, or a flow holds something this encoder does not express."""


class SwitchRefused(OpenFlowError):
    """An OFPT_ERROR the switch answered: its type and code (``OFPET_*``, ``OFPxxx_*``)."""

    def __init__(self, text: str, etype: int, code: int) -> None:
        super().__init__(text)
        self.etype, self.code = etype, code


# ---------------------------------------------------------------- match

def _tlv(f: Field) -> bytes:
    spec = f.spec
    n = spec.length
    if f.mask is not None:
        return _U32.pack(spec.header | 0x100 | 2 * n) + f.value.to_bytes(n, "big") + f.mask.to_bytes(n, "big")
    if f.prefix is None:
        return _U32.pack(spec.header | n) + f.value.to_bytes(n, "big")
    bits = 8 * n
    if f.prefix == 0:
        return b""  # /0: no constraint
    if f.prefix == bits:
        return _U32.pack(spec.header | n) + f.value.to_bytes(n, "big")
    mask = ((1 << f.prefix) - 1) << (bits - f.prefix)
    return (_U32.pack(spec.header | 0x100 | 2 * n) + (f.value & mask).to_bytes(n, "big")
            + mask.to_bytes(n, "big"))


def _missing_prerequisite(fields: dict[FieldSpec, Field]) -> str:
    """The first missing prerequisite, "" when there is none (OVS would refuse the flow-mod)."""
    eth = fields.get(ETH_TYPE)
    proto = fields.get(IP_PROTO)
    for spec in fields:
        need = _PREREQ.get(spec.name)
        if need is None:
            continue
        types, ip_proto = need
        if eth is None or eth.value not in types:
            return f"{spec.name} needs eth_type {' or '.join(hex(t) for t in types)}"
        if ip_proto is not None and (proto is None or proto.value != ip_proto):
            return f"{spec.name} needs ip_proto {ip_proto}"
    return ""


_PREREQ: dict[str, tuple[tuple[int, ...], int | None]] = {
    "ip_proto": ((0x0800, 0x86DD), None),
    "ipv4_src": ((0x0800,), None), "ipv4_dst": ((0x0800,), None),
    "arp_op": ((0x0806,), None), "arp_spa": ((0x0806,), None), "arp_tpa": ((0x0806,), None),
    "arp_sha": ((0x0806,), None), "arp_tha": ((0x0806,), None),
    "ipv6_src": ((0x86DD,), None), "ipv6_dst": ((0x86DD,), None),
    "icmpv6_type": ((0x86DD,), 58), "icmpv6_code": ((0x86DD,), 58), "nd_target": ((0x86DD,), 58),
    "nd_tll": ((0x86DD,), 58),
    "tcp_dst": ((0x0800, 0x86DD), 6), "udp_dst": ((0x0800, 0x86DD), 17), "sctp_dst": ((0x0800, 0x86DD), 132),
}


def encode_match(items: tuple[MatchItem, ...]) -> bytes:
    """An OXM match (``ofp_match`` type 1, padded), fields in prerequisite order."""
    if not items:
        return _EMPTY_MATCH
    fields: dict[FieldSpec, Field] = {}
    for item in items:
        if isinstance(item, Field):
            f = item
            if f.prefix is not None and f.spec not in MASKABLE:
                raise OpenFlowError(f"match {f.text()!r}: {f.spec.name} is not matched by prefix here")
            if f.mask is not None and f.spec not in BIT_MASKABLE:
                raise OpenFlowError(f"match {f.text()!r}: {f.spec.name} is not matched by bit mask here")
            fields[f.spec] = f
        elif isinstance(item, Proto):
            for f in item.fields:
                fields[f.spec] = f
        else:
            raise OpenFlowError(f"match item {item!r} is not expressed by this encoder")
    missing = _missing_prerequisite(fields)
    if missing:
        raise OpenFlowError(f"match {','.join(i.text() for i in items)!r}: {missing}")
    body = b"".join(_tlv(f) for f in sorted(fields.values(), key=_order))
    length = 4 + len(body)
    return struct.pack("!HH", 1, length) + body + b"\0" * (-length % 8)


def _order(f: Field) -> int:
    return f.spec.order


# ---------------------------------------------------------------- actions

def _output(a: Output) -> bytes:
    return _OUTPUT.pack(OFPAT_OUTPUT, 16, a.port, 0)


def _set_field(a: SetField) -> bytes:
    spec = a.spec
    oxm = _U32.pack(spec.header | spec.length) + a.value.to_bytes(spec.length, "big")
    size = 4 + len(oxm)
    pad = -size % 8
    return struct.pack("!HH", OFPAT_SET_FIELD, size + pad) + oxm + b"\0" * pad


def _move(a: Move) -> bytes:
    if not (a.src.nxm_header and a.dst.nxm_header) or a.src.length != a.dst.length:
        raise OpenFlowError(f"{a.text()}: not expressed by this encoder")
    return struct.pack("!HHIHHHHII", OFPAT_EXPERIMENTER, 24, NX_VENDOR_ID, NXAST_REG_MOVE,
                       8 * a.src.length, 0, 0, a.src.nxm_header, a.dst.nxm_header)


def _load(a: Load) -> bytes:
    """NXAST_REG_LOAD: ofs_nbits is the first bit written << 6 | the number of bits - 1."""
    offset, bits = a.bits()
    if (not a.dst.nxm_header or bits > 64 or offset + bits > 8 * a.dst.length
            or not 0 <= a.value < 1 << bits):
        raise OpenFlowError(f"{a.text()}: not expressed by this encoder")
    return struct.pack("!HHIHHIQ", OFPAT_EXPERIMENTER, 24, NX_VENDOR_ID, NXAST_REG_LOAD, offset << 6 | bits - 1,
                       a.dst.nxm_header, a.value)


def _dec_ttl(_a: DecTtl) -> bytes:
    return _DEC_TTL


def _push_vlan(a: PushVlan) -> bytes:
    return struct.pack("!HHH2x", OFPAT_PUSH_VLAN, 8, a.ethertype)


def _pop_vlan(_a: PopVlan) -> bytes:
    return _POP_VLAN


def _resubmit(a: Resubmit) -> bytes:
    return struct.pack("!HHIHHB3x", OFPAT_EXPERIMENTER, 16, NX_VENDOR_ID, NXAST_RESUBMIT_TABLE, OFPP_IN_PORT_10,
                       int(a.table))


def _ct(a: Ct) -> bytes:
    """NXAST_CT: flags, an immediate zone, the recirculation table, then the nested actions."""
    nested = b"".join(_set_field(x) for x in a.exec)
    table = NX_CT_RECIRC_NONE if a.table is None else int(a.table)
    return struct.pack("!HHIHHIHB3xH", OFPAT_EXPERIMENTER, 24 + len(nested), NX_VENDOR_ID, NXAST_CT,
                       NX_CT_F_COMMIT if a.commit else 0, 0, a.zone, table, 0) + nested


def _conjunction(a: Conjunction) -> bytes:
    """NXAST_CONJUNCTION: the clause 0-based on the wire (ovs-ofctl writes it 1-based), the number of
    clauses, the conjunction's id."""
    return struct.pack("!HHIHBBI", OFPAT_EXPERIMENTER, 16, NX_VENDOR_ID, NXAST_CONJUNCTION, a.clause - 1,
                       a.n_clauses, a.id)


def _prop(ptype: int, value: bytes) -> bytes:
    """An OpenFlow property: type, length (without padding), value, padded to 8 bytes."""
    size = 4 + len(value)
    return struct.pack("!HH", ptype, size) + value + b"\0" * (-size % 8)


def _controller(a: Controller) -> bytes:
    """NXAST_CONTROLLER2: 6 zero bytes, then its properties (only those not at their default)."""
    props = b""
    if a.max_len != 0xFFFF:
        props += _prop(NXAC2PT_MAX_LEN, struct.pack("!H", a.max_len))
    if a.userdata:
        props += _prop(NXAC2PT_USERDATA, a.userdata)
    if a.meter_id is not None:
        props += _prop(NXAC2PT_METER_ID, _U32.pack(a.meter_id))
    return struct.pack("!HHIH6x", OFPAT_EXPERIMENTER, 16 + len(props), NX_VENDOR_ID, NXAST_CONTROLLER2) + props


_ACTIONS: dict[type, Callable[[Any], bytes]] = {
    Output: _output, SetField: _set_field, Move: _move, Load: _load, DecTtl: _dec_ttl, Resubmit: _resubmit,
    Ct: _ct, Conjunction: _conjunction, PushVlan: _push_vlan, PopVlan: _pop_vlan, Controller: _controller,
}


def encode_instructions(actions: tuple[Action, ...]) -> bytes:
    """APPLY_ACTIONS with every action but a final :class:`Goto`, then GOTO_TABLE for it.  A flow
    with :class:`Conjunction` actions has no others (OVS refuses the mix)."""
    if any(isinstance(a, Conjunction) for a in actions) and not all(isinstance(a, Conjunction) for a in actions):
        raise OpenFlowError(f"conjunction() with other actions in {','.join(x.text() for x in actions)!r}")
    encoded: list[bytes] = []
    goto = b""
    for a in actions:
        if goto:
            raise OpenFlowError(f"actions after goto_table in {','.join(x.text() for x in actions)!r}")
        if isinstance(a, Goto):
            goto = struct.pack("!HHB3x", OFPIT_GOTO_TABLE, 8, int(a.table))
            continue
        encode = _ACTIONS.get(type(a))
        if encode is None:
            raise OpenFlowError(f"action {a!r} is not expressed by this encoder")
        encoded.append(encode(a))
    if not encoded:
        return goto
    body = b"".join(encoded)
    return struct.pack("!HH4x", OFPIT_APPLY_ACTIONS, 8 + len(body)) + body + goto


# ---------------------------------------------------------------- messages

def message(mtype: int, xid: int, body: bytes = b"") -> bytes:
    return HEADER.pack(OFP_VERSION, mtype, HEADER.size + len(body), xid) + body


def flow_mod(cookie: int, cookie_mask: int, table: int, command: int, priority: int, match: bytes,
             instructions: bytes, xid: int) -> bytes:
    """One OFPT_FLOW_MOD: idle/hard timeouts 0, no buffer, any out_port/out_group, no flags."""
    return message(OFPT_FLOW_MOD, xid, _FLOW_MOD.pack(cookie, cookie_mask, table, command, 0, 0, priority,
                                                      OFP_NO_BUFFER, OFPP_ANY, OFPG_ANY, 0)
                   + match + instructions)


def flow_mod_add(flow: Flow, xid: int = 0) -> bytes:
    """Add (or overwrite: same table, priority and match) ``flow``."""
    return flow_mod(flow.cookie.value, 0, int(flow.table), OFPFC_ADD, flow.priority, encode_match(flow.match),
                    encode_instructions(flow.actions), xid)


def flow_mod_delete(cookie: Cookie, xid: int = 0, table: int = OFPTT_ALL) -> bytes:
    """Delete every flow of exactly ``cookie``, in every table or in ``table``."""
    return flow_mod(cookie.value, FULL_COOKIE_MASK, int(table), OFPFC_DELETE, 0, _EMPTY_MATCH, b"", xid)


def hello() -> bytes:
    return message(OFPT_HELLO, 0)


def barrier(xid: int) -> bytes:
    return message(OFPT_BARRIER_REQUEST, xid)


def with_xid(msg: bytes, xid: int) -> bytes:
    """``msg`` with its header's transaction id replaced."""
    return msg[:4] + _U32.pack(xid) + msg[8:]


def bundle_control(bundle_id: int, ctype: int, xid: int, flags: int = OFPBF_ATOMIC | OFPBF_ORDERED) -> bytes:
    return message(OFPT_EXPERIMENTER, xid, _BUNDLE.pack(ONF_EXPERIMENTER_ID, ONFT_BUNDLE_CONTROL, bundle_id,
                                                       ctype, flags))


def bundle_add(bundle_id: int, msg: bytes, flags: int = OFPBF_ATOMIC | OFPBF_ORDERED) -> bytes:
    """``msg`` (a complete OpenFlow message) into bundle ``bundle_id``; the outer xid is the inner
    one (OVS checks they are equal)."""
    return (HEADER.pack(OFP_VERSION, OFPT_EXPERIMENTER, 24 + len(msg), 0)[:4] + msg[4:8]
            + _BUNDLE.pack(ONF_EXPERIMENTER_ID, ONFT_BUNDLE_ADD_MESSAGE, bundle_id, 0, flags) + msg)


def meter_mod(meter_id: int, packets_per_second: int, burst: int, xid: int, command: int = OFPMC_ADD) -> bytes:
    """OFPT_METER_MOD: meter ``meter_id`` in packets per second with a burst, one drop band."""
    band = struct.pack("!HHII4x", OFPMBT_DROP, 16, packets_per_second, burst)
    return message(OFPT_METER_MOD, xid, struct.pack("!HHI", command, OFPMF_PKTPS | OFPMF_BURST | OFPMF_STATS,
                                                    meter_id) + band)


def set_packet_in2(xid: int) -> bytes:
    """NXT_SET_PACKET_IN_FORMAT nxt_packet_in2: packet-ins as NXT_PACKET_IN2 (they carry userdata)."""
    return message(OFPT_EXPERIMENTER, xid, struct.pack("!III", NX_VENDOR_ID, NXT_SET_PACKET_IN_FORMAT,
                                                       NXPIF_NXT_PACKET_IN2))


def set_async(xid: int, packet_in_reasons: int = 1 << OFPR_ACTION) -> bytes:
    """OFPT_SET_ASYNC: packet-ins of ``packet_in_reasons`` (a bit per OFPR_*) in either role, no
    port-status or flow-removed messages (a management-socket connection gets none by default)."""
    return message(OFPT_SET_ASYNC, xid, struct.pack("!IIIIII", packet_in_reasons, packet_in_reasons, 0, 0, 0, 0))


def bundle_reply(msg: bytes) -> tuple[int, int] | None:
    """(bundle id, control type) of an ONF bundle control message, else None."""
    if len(msg) < 24 or msg[1] != OFPT_EXPERIMENTER:
        return None
    experimenter, exp_type, bundle_id, ctype, _flags = _BUNDLE.unpack_from(msg, 8)
    if experimenter != ONF_EXPERIMENTER_ID or exp_type != ONFT_BUNDLE_CONTROL:
        return None
    return bundle_id, ctype


# ---------------------------------------------------------------- what the switch sends

def split(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete messages at the front of ``buf``, and the rest (an incomplete one)."""
    out = []
    while len(buf) >= 8:
        length = HEADER.unpack_from(buf)[2]
        if length < 8:
            raise OpenFlowError("malformed OpenFlow message")
        if len(buf) < length:
            break
        out.append(buf[:length])
        buf = buf[length:]
    return out, buf


def error_text(msg: bytes) -> str:
    """What an OFPT_ERROR says, for a message naming the refused request."""
    etype, code = struct.unpack_from("!HH", msg, 8)
    return f"switch refused message {HEADER.unpack_from(msg)[3]} (OpenFlow error type {etype} code {code})"


def refused(msg: bytes, context: str) -> SwitchRefused:
    """The error to raise for an OFPT_ERROR, ``context`` first."""
    etype, code = struct.unpack_from("!HH", msg, 8)
    return SwitchRefused(f"{context}: {error_text(msg)}", etype, code)
