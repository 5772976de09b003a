"""route-sync's OpenFlow 1.3 encoding, beside the plugin's (:mod:`cni.ovs.ofnative`, which it builds on).

Masked address matches (``nw_dst=10.0.1.0/24``, ``ipv6_src=fd00::/64``), tunnel destinations
(``set_field:<ip>->tun_dst`` / ``tun_ipv6_dst``) and OpenFlow 1.3 bundles (ONF extension EXT-230,
what ``ovs-ofctl -O OpenFlow13 --bundle`` sends), so route-sync's atomic per-peer replacement
needs no ovs-ofctl exec.  Kept out of :mod:`cni.ovs.ofnative` because the plugin imports that once per
Pod and needs none of this.  ``tests/system/test_ofnative.py`` installs every kind of route-sync
flow both ways and compares ``ovs-ofctl dump-flows``."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TypeVar, cast

from cni.lean import addr
from cni.ovs.ofnative import (
    HEADER,
    MATCH_KEYS,
    MATCH_ORDER,
    OFP_VERSION,
    OFPAT_SET_FIELD,
    OFPFC_ADD,
    OFPIT_APPLY_ACTIONS,
    OXM_FIELDS,
    SHORTHANDS,
    OpenFlowError,
    encode_flow_mod,
    encode_instructions,
    encode_oxm,
    encode_value,
)
from cni.pipeline.tables import Flow

T = TypeVar("T")


class ItemCache:
    """Match and action items (text -> TLVs / action bytes) encoded once: route-sync's thousands
    of flows share most of their items.  Bounded: cleared past ``limit`` entries."""

    def __init__(self, limit: int = 50_000) -> None:
        self.limit = limit
        self._items: dict[str, object] = {}

    def get(self, item: str, encode: Callable[[str], T]) -> T:
        got = self._items.get(item)
        if got is None:
            got = encode(item)
            if len(self._items) > self.limit:
                self._items.clear()
            self._items[item] = got
        return cast(T, got)  # stored by this method from ``encode`` under this item's key


OFPT_EXPERIMENTER = 4
ONF_EXPERIMENTER_ID = 0x4F4E4600
ONFT_BUNDLE_CONTROL, ONFT_BUNDLE_ADD_MESSAGE = 2300, 2301
OFPBCT_OPEN_REQUEST, OFPBCT_OPEN_REPLY, OFPBCT_CLOSE_REQUEST, OFPBCT_CLOSE_REPLY = 0, 1, 2, 3
OFPBCT_COMMIT_REQUEST, OFPBCT_COMMIT_REPLY, OFPBCT_DISCARD_REQUEST, OFPBCT_DISCARD_REPLY = 4, 5, 6, 7
OFPBF_ATOMIC, OFPBF_ORDERED = 1, 2
_BUNDLE = struct.Struct("!IIIHH")  # experimenter, exp_type, bundle_id, type (control) / pad (add), flags

_MASKABLE = frozenset({"ipv4_src", "ipv4_dst", "ipv6_src", "ipv6_dst"})
# Tunnel metadata, NXM class 0x0001 (ovs-fields(7)): set_field name -> (header without length, bytes).
_NXM_TUNNEL = {"tun_dst": ((0x0001 << 16) | (32 << 9), 4), "tun_ipv6_dst": ((0x0001 << 16) | (110 << 9), 16)}


def _masked(field: str, text: str) -> bytes | None:
    """OXM value+mask of ``<address>/<prefix length>`` (host bits cleared, as ovs-ofctl does);
    the exact value for a full-length prefix; None for /0 (no constraint)."""
    ip, _, plen_text = text.partition("/")
    value, bits = addr.parse_ip(ip)
    length = OXM_FIELDS[field][1]
    if bits // 8 != length:
        raise OpenFlowError(f"{field}={text}: wrong address family")
    if not plen_text.isdigit() or int(plen_text) > bits:
        raise OpenFlowError(f"{field}={text}: bad prefix length")
    plen = int(plen_text)
    if plen == 0:
        return None
    mask = ((1 << plen) - 1) << (bits - plen)
    if plen == bits:
        return encode_oxm(field, value.to_bytes(length, "big"))
    number = OXM_FIELDS[field][0]
    return (struct.pack("!I", (0x8000 << 16) | (number << 9) | (1 << 8) | (2 * length))
            + (value & mask).to_bytes(length, "big") + mask.to_bytes(length, "big"))


def _match_item(item: str) -> list[tuple[str, bytes | None]]:
    """One ``key[=value]`` of a match as (OXM field, TLV or None for "no constraint")."""
    key, eq, value = item.partition("=")
    if not eq:
        if key not in SHORTHANDS:
            raise OpenFlowError(f"match {item!r} is not spoken here")
        return [(f, encode_oxm(f, v.to_bytes(OXM_FIELDS[f][1], "big"))) for f, v in SHORTHANDS[key].items()]
    if key not in MATCH_KEYS:
        raise OpenFlowError(f"match {item!r} is not spoken here")
    f = MATCH_KEYS[key]
    if "/" in value:
        if f not in _MASKABLE:
            raise OpenFlowError(f"match {item!r} is not spoken here")
        return [(f, _masked(f, value))]
    return [(f, encode_oxm(f, encode_value(f, value)))]


def encode_match_masked(text: str, cache: ItemCache | None = None) -> bytes:
    """:func:`cni.ovs.ofnative.encode_match` plus ``<prefix>/<length>`` on the IPv4/IPv6 source/destination."""
    cache = cache if cache is not None else ItemCache()
    fields: dict[str, bytes | None] = {}
    for item in filter(None, text.split(",")):
        fields.update(cache.get("m " + item, lambda i: _match_item(i[2:])))
    body = b"".join(tlv for f in MATCH_ORDER if (tlv := fields.get(f)) is not None)
    length = 4 + len(body)
    return struct.pack("!HH", 1, length) + body + b"\0" * (-length % 8)


def _set_tunnel_field(item: str) -> bytes:
    value, sep, name = item[len("set_field:"):].partition("->")
    if not sep or name not in _NXM_TUNNEL:
        raise OpenFlowError(f"action {item!r} is not spoken here")
    header, length = _NXM_TUNNEL[name]
    number, bits = addr.parse_ip(value)
    if bits // 8 != length:
        raise OpenFlowError(f"{item!r}: wrong address family")
    oxm = struct.pack("!I", header | length) + number.to_bytes(length, "big")
    size = 4 + len(oxm)
    return struct.pack("!HH", OFPAT_SET_FIELD, size + (-size % 8)) + oxm + b"\0" * (-size % 8)


def _action_item(item: str) -> tuple[bool, bytes]:
    """(is goto_table, its instruction / the action's bytes) of one action item."""
    if item.startswith("set_field:"):
        return False, _set_tunnel_field(item)
    encoded = encode_instructions(item)
    if item.startswith("goto_table:"):
        return True, encoded
    return False, encoded[8:]  # the action inside its one-action APPLY_ACTIONS ("drop": none)


def encode_instructions_ext(text: str, cache: ItemCache | None = None) -> bytes:
    """:func:`cni.ovs.ofnative.encode_instructions` plus ``set_field:<ip>->tun_dst|tun_ipv6_dst``."""
    cache = cache if cache is not None else ItemCache()
    actions: list[bytes] = []
    goto = b""
    for item in text.split(","):
        if goto:
            raise OpenFlowError(f"actions after goto_table in {text!r}")
        is_goto, encoded = cache.get("a " + item, lambda i: _action_item(i[2:]))
        if is_goto:
            goto = encoded
        elif encoded:
            actions.append(encoded)
    out = b""
    if actions:
        body = b"".join(actions)
        out = struct.pack("!HH4x", OFPIT_APPLY_ACTIONS, 8 + len(body)) + body
    return out + goto


def flow_mod_add_ext(flow: Flow, xid: int, cache: ItemCache | None = None) -> bytes:
    """:func:`cni.ovs.ofnative.flow_mod_add` for route-sync's flows (masked matches, tunnel destinations)."""
    return encode_flow_mod(flow.cookie.value, 0, int(flow.table), OFPFC_ADD, flow.priority,
                     encode_match_masked(flow.match, cache), encode_instructions_ext(flow.actions, cache), xid)


def with_xid(message: bytes, xid: int) -> bytes:
    """``message`` with its header's transaction id replaced."""
    return message[:4] + struct.pack("!I", xid) + message[8:]


def bundle_control(bundle_id: int, ctype: int, xid: int, flags: int = OFPBF_ATOMIC | OFPBF_ORDERED) -> bytes:
    return (HEADER.pack(OFP_VERSION, OFPT_EXPERIMENTER, 24, xid)
            + _BUNDLE.pack(ONF_EXPERIMENTER_ID, ONFT_BUNDLE_CONTROL, bundle_id, ctype, flags))


def bundle_add(bundle_id: int, message: bytes, flags: int = OFPBF_ATOMIC | OFPBF_ORDERED) -> bytes:
    """``message`` (a complete OpenFlow message) into bundle ``bundle_id``; the outer xid is the
    inner one (OVS checks they are equal)."""
    xid = message[4:8]
    return (HEADER.pack(OFP_VERSION, OFPT_EXPERIMENTER, 24 + len(message), 0)[:4] + xid
            + _BUNDLE.pack(ONF_EXPERIMENTER_ID, ONFT_BUNDLE_ADD_MESSAGE, bundle_id, 0, flags) + message)


def bundle_reply(message: bytes) -> tuple[int, int] | None:
    """(bundle id, control type) of an ONF bundle control message, else None."""
    if len(message) < 24 or message[1] != OFPT_EXPERIMENTER:
        return None
    experimenter, exp_type, bundle_id, ctype, _flags = _BUNDLE.unpack_from(message, 8)
    if experimenter != ONF_EXPERIMENTER_ID or exp_type != ONFT_BUNDLE_CONTROL:
        return None
    return bundle_id, ctype
