"""The neighbour table (ARP/NDP) as route-sync uses it, on a ``cni.kernel.netlink`` socket.

Permanent entries added and removed in batches, the table dumped, one entry looked up or
resolved (``NTF_USE``), and neighbour events decoded.  Apart from ``cni.kernel.netlink`` (the
plugin, which only forgets entries, keeps to :meth:`Netlink.neigh_del` there) so that the
per-Pod path does not load it."""

from __future__ import annotations

import _socket as socket
import errno

from cni.kernel.netlink import (
    NDA_DST,
    NDA_LLADDR,
    NDMSG,
    NLM_F_CREATE,
    NLM_F_REPLACE,
    RTM_DELNEIGH,
    RTM_GETNEIGH,
    RTM_NEWNEIGH,
    Netlink,
    NetlinkError,
    mac_text,
    neigh_body,
    unpack_attrs,
)
from cni.lean.record import record

RTMGRP_NEIGH = 0x4  # multicast group of neighbour events: Netlink(groups=RTMGRP_NEIGH)
NUD_INCOMPLETE, NUD_FAILED, NUD_NOARP, NUD_PERMANENT = 0x01, 0x20, 0x40, 0x80
NTF_USE = 0x01  # on RTM_NEWNEIGH: start resolution, change nothing else


@record(frozen=True)
class Neighbour:
    index: int
    ip: str | None  # NDA_DST
    mac: str | None  # NDA_LLADDR; None while unresolved
    state: int  # NUD_*
    flags: int = 0  # NTF_*


def add_request(index: int, address: str, mac: str, state: int = NUD_PERMANENT) -> tuple[int, int, bytes]:
    """An RTM_NEWNEIGH (create or replace) for :meth:`Netlink.batch`."""
    return RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, neigh_body(index, address, state, 0, mac)


def del_request(index: int, address: str) -> tuple[int, int, bytes]:
    """An RTM_DELNEIGH for :meth:`Netlink.batch`."""
    return RTM_DELNEIGH, 0, neigh_body(index, address)


def probe_request(index: int, address: str) -> tuple[int, int, bytes]:
    """An RTM_NEWNEIGH with NTF_USE for :meth:`Netlink.batch`: the kernel starts resolving
    ``address`` (ARP/NDP) now, as if a packet were waiting for it (the message pyroute2 sends
    for ``neigh("replace", ..., flags=NTF_USE)``: state PERMANENT, which NTF_USE leaves unapplied)."""
    return RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, neigh_body(index, address, NUD_PERMANENT, NTF_USE)


def decode(body: bytes) -> Neighbour:
    """An RTM_NEWNEIGH / RTM_DELNEIGH body (a dump part, a lookup's answer, an event); ``ip``
    None for what is not IPv4/IPv6 (a bridge's forwarding entry)."""
    family, index, state, flags, _type = NDMSG.unpack_from(body)
    a = unpack_attrs(body, NDMSG.size)
    ip = socket.inet_ntop(family, a[NDA_DST]) if NDA_DST in a and family in (socket.AF_INET, socket.AF_INET6) \
        else None
    return Neighbour(index=index, ip=ip, mac=mac_text(a[NDA_LLADDR]) if NDA_LLADDR in a else None,
                     state=state, flags=flags)


def get(nl: Netlink, index: int, address: str) -> Neighbour | None:
    """The entry of ``address`` on link ``index``; None when there is none."""
    try:
        answers = nl.request(RTM_GETNEIGH, 0, neigh_body(index, address), f"get neighbour {address}")
    except NetlinkError as e:
        if e.errno in (errno.ENOENT, errno.ESRCH, errno.ENODEV):
            return None
        raise
    return decode(answers[0]) if answers else None


def dump(nl: Netlink, index: int | None = None, family: int = socket.AF_UNSPEC) -> list[Neighbour]:
    """The IPv4/IPv6 neighbour table (of link ``index`` when given; one family when given)."""
    out = []
    for b in nl.dump(RTM_GETNEIGH, NDMSG.pack(family, 0, 0, 0, 0), "dump neighbours"):
        n = decode(b)
        if (index is None or n.index == index) and n.ip is not None:
            out.append(n)
    return out
