"""cni.kernel.netlink.link_add_request (a link of a kind without IFLA_INFO_DATA: wireguard) against
the kernel's documented message format (linux/netlink.h, linux/rtnetlink.h, linux/if_link.h) and
pyroute2's encoding of the same IFLA_LINKINFO. Pure: the kernel's answer is
tests/routesync/wireguard/test_kernel.py's."""

from __future__ import annotations

import struct

import pytest
from pyroute2 import IPBatch
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from cni.kernel.netlink import RTM_NEWLINK, link_add_request, unpack_attrs

NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
IFLA_IFNAME, IFLA_LINKINFO, IFLA_INFO_KIND = 3, 18, 1


def test_the_bytes_are_the_documented_layout() -> None:
    msg_type, flags, body = link_add_request("ferry-wg0", "wireguard")
    assert (msg_type, flags) == (16, NLM_F_CREATE | NLM_F_EXCL)  # RTM_NEWLINK
    expected = (
        # struct ifinfomsg: ifi_family AF_UNSPEC, pad, ifi_type, ifi_index 0, ifi_flags, ifi_change
        struct.pack("=BxHiII", 0, 0, 0, 0, 0)
        # struct nlattr {nla_len, nla_type}, payload padded to NLA_ALIGNTO (4): "ferry-wg0\0" + 2
        + struct.pack("=HH", 4 + 10, IFLA_IFNAME) + b"ferry-wg0\0" + b"\0\0"
        # IFLA_LINKINFO nesting IFLA_INFO_KIND "wireguard" (13 bytes, padded to 16): 4 + 16
        + struct.pack("=HH", 20, IFLA_LINKINFO)
        + struct.pack("=HH", 4 + 9, IFLA_INFO_KIND) + b"wireguard" + b"\0\0\0"
    )
    assert body == expected
    assert len(body) % 4 == 0


@pytest.mark.parametrize(("name", "kind"), [("ferry-wg0", "wireguard"), ("w", "wireguard"),
                                            ("fifteen-chars-x", "wireguard"), ("br-x", "bridge")])
def test_pyroute2_encodes_the_same_message(name: str, kind: str) -> None:
    """Byte for byte but one: pyroute2 ends IFLA_INFO_KIND with a NUL (nla_len one more, the NUL
    being a padding byte here), iproute2 and Ferry do not; the kernel copies either (nla_strscpy)."""
    ipb = IPBatch()
    try:
        ipb.link("add", ifname=name, kind=kind)
        raw = bytes(ipb.batch)
    finally:
        ipb.close()
    length, mtype, flags = struct.unpack_from("=IHH", raw)
    theirs = bytearray(raw[16:length])
    msg_type, our_flags, ours = link_add_request(name, kind)
    assert mtype == msg_type == RTM_NEWLINK
    assert flags & ~(NLM_F_REQUEST | NLM_F_ACK) == our_flags  # request() adds REQUEST|ACK
    info_at = theirs.index(struct.pack("=HH", len(kind) + 5, IFLA_INFO_KIND))
    theirs[info_at] -= 1  # its NUL
    assert bytes(theirs) == ours

    # and pyroute2's decoder reads Ferry's message as what was meant
    msg = ifinfmsg(struct.pack("=IHHII", 16 + len(ours), RTM_NEWLINK, our_flags, 1, 0) + ours)
    msg.decode()
    assert msg.get_attr("IFLA_IFNAME") == name
    assert msg.get_attr("IFLA_LINKINFO").get_attr("IFLA_INFO_KIND") == kind
    assert msg.get_attr("IFLA_LINKINFO").get_attr("IFLA_INFO_DATA") is None


def test_nothing_but_the_name_and_the_kind() -> None:
    _t, _f, body = link_add_request("ferry-wg0", "wireguard")
    attrs = unpack_attrs(body, 16)
    assert set(attrs) == {IFLA_IFNAME, IFLA_LINKINFO}
    assert set(unpack_attrs(attrs[IFLA_LINKINFO])) == {IFLA_INFO_KIND}
