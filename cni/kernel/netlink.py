"""A lean rtnetlink client: links (veth; kinds without data, e.g. wireguard), addresses, routes and
neighbours, standard library only.

One ``Netlink`` object wraps one NETLINK_ROUTE socket.  A netlink socket stays bound to the
network namespace it was created in, so ``Netlink.in_netns(path)`` enters the namespace only
to create the socket and every later call acts there without further setns.

Only the attributes Ferry needs are encoded or decoded.  Every request asks for an ACK and
waits for the answer carrying its own sequence number; errors raise ``NetlinkError`` (an
OSError with the kernel's errno, plus its extended-ack text when the kernel gives one).

The plugin and route-sync share it: route-sync adds thousands of requests per datagram
(:meth:`Netlink.batch` with the ``*_request`` builders) and listens to events
(``Netlink(groups=...)``, :meth:`Netlink.events`); what only route-sync needs of the neighbour
table lives in ``cni.kernel.neighbours`` (the plugin does not import it).
"""

from __future__ import annotations

import _socket as socket  # the C module: socket.py's enum conversions cost ~10 ms per exec
import errno as _errno
import os
import struct

from cni.lean.record import record
from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import TracebackType

# Message types and flags (linux/netlink.h, linux/rtnetlink.h).
NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK, RTM_SETLINK = 16, 17, 18, 19
RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
RTM_NEWNEIGH, RTM_DELNEIGH, RTM_GETNEIGH = 28, 29, 30
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK = 0x1, 0x2, 0x4
NLM_F_DUMP, NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 0x300, 0x100, 0x200, 0x400
NLM_F_ACK_TLVS = 0x200  # on NLMSG_ERROR: extended-ack attributes follow
NETLINK_CAP_ACK, NETLINK_EXT_ACK = 10, 11
NLMSGERR_ATTR_MSG = 1
SOL_NETLINK = 270

# Links.
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_LINK = 1, 3, 4, 5
IFLA_LINKINFO, IFLA_NET_NS_FD, IFLA_EXT_MASK = 18, 28, 29
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
VETH_INFO_PEER = 1
RTEXT_FILTER_SKIP_STATS = 1 << 3
IFF_UP, IFF_PROMISC = 0x1, 0x100

# Addresses.
IFA_ADDRESS, IFA_LOCAL, IFA_FLAGS = 1, 2, 8
IFA_F_NODAD, IFA_F_TENTATIVE = 0x02, 0x40

# Routes.
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_PREFSRC, RTA_TABLE = 1, 4, 5, 6, 7, 15
RTA_METRICS, RTAX_MTU = 8, 2  # a route's metrics (nested), its MTU among them
RTN_UNICAST = 1
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK, RT_SCOPE_HOST = 0, 253, 254
RTNH_F_ONLINK = 0x4
RT_TABLE_COMPAT, RT_TABLE_MAIN, RT_TABLE_LOCAL = 252, 254, 255
RTPROT_KERNEL, RTPROT_STATIC = 2, 4  # the kernel's own routes (connected, IPv6 link-local); configured ones

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, proto, scope, type, flags
NDMSG = struct.Struct("=BxxxiHBB")  # family, ifindex, state, flags, type
NDA_DST, NDA_LLADDR = 1, 2
_NLA = struct.Struct("=HH")
_RECV_BUF = 1 << 16


class NetlinkError(OSError):
    """A netlink request failed; ``errno`` is the kernel's (EEXIST, ENODEV, ESRCH, ...)."""


@record(frozen=True)
class Link:
    index: int
    name: str
    mac: str
    mtu: int
    up: bool
    kind: str | None = None
    peer_index: int | None = None  # IFLA_LINK (a veth's peer, possibly in another netns)


@record(frozen=True)
class RouteEntry:
    dst: str  # CIDR; "0.0.0.0/0" / "::/0" for default
    gw: str | None
    index: int | None
    proto: int
    table: int
    metric: int | None = None
    scope: int = RT_SCOPE_UNIVERSE
    mtu: int = 0  # RTAX_MTU; 0: none (the device's)
    prefsrc: str | None = None  # RTA_PREFSRC
    flags: int = 0  # rtm_flags (RTNH_F_ONLINK, ...)


# ---------------------------------------------------------------- encoding helpers (pure)

def _align(n: int) -> int:
    return (n + 3) & ~3


def pack_attr(kind: int, payload: bytes) -> bytes:
    head = _NLA.pack(_NLA.size + len(payload), kind)
    return head + payload + b"\0" * (_align(len(payload)) - len(payload))


def _u32(kind: int, value: int) -> bytes:
    return pack_attr(kind, struct.pack("=I", value))


def _str(kind: int, value: str) -> bytes:
    return pack_attr(kind, value.encode() + b"\0")


def unpack_attrs(data: bytes, offset: int = 0) -> dict[int, bytes]:
    """Top-level attributes of ``data`` from ``offset`` (last one wins, nesting flag stripped)."""
    out: dict[int, bytes] = {}
    end = len(data)
    while offset + _NLA.size <= end:
        length, kind = _NLA.unpack_from(data, offset)
        if length < _NLA.size:
            break
        out[kind & 0x3FFF] = data[offset + _NLA.size: offset + length]
        offset += _align(length)
    return out


def mac_bytes(mac: str) -> bytes:
    raw = bytes.fromhex(mac.replace(":", "").replace("-", ""))
    if len(raw) != 6:
        raise ValueError(f"not a MAC address: {mac!r}")
    return raw


def mac_text(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def _family(address: str) -> int:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def parse_cidr(cidr: str) -> tuple[int, bytes, int]:
    """(family, packed address, prefix length); a bare address gets the full length."""
    addr, _, plen = cidr.partition("/")
    family = _family(addr)
    packed = socket.inet_pton(family, addr)
    prefix = int(plen) if plen else len(packed) * 8
    if not 0 <= prefix <= len(packed) * 8:
        raise ValueError(f"bad prefix length in {cidr!r}")
    return family, packed, prefix


def _name_or_index(ref: str | int) -> tuple[int, bytes]:
    """ifinfomsg index and extra attributes selecting a link by index or by name."""
    if isinstance(ref, int):
        return ref, b""
    return 0, _str(IFLA_IFNAME, ref)


def _decode_link(body: bytes) -> Link:
    _fam, _type, index, flags, _change = _IFINFOMSG.unpack_from(body)
    a = unpack_attrs(body, _IFINFOMSG.size)
    kind = None
    if IFLA_LINKINFO in a:
        info = unpack_attrs(a[IFLA_LINKINFO])
        if IFLA_INFO_KIND in info:
            kind = info[IFLA_INFO_KIND].rstrip(b"\0").decode()
    peer = struct.unpack("=i", a[IFLA_LINK])[0] if IFLA_LINK in a else None
    return Link(
        index=index,
        name=a.get(IFLA_IFNAME, b"").rstrip(b"\0").decode(),
        mac=mac_text(a[IFLA_ADDRESS]) if IFLA_ADDRESS in a else "",
        mtu=struct.unpack("=I", a[IFLA_MTU])[0] if IFLA_MTU in a else 0,
        up=bool(flags & IFF_UP),
        kind=kind,
        peer_index=peer if peer and peer != index else None,
    )


def _decode_route(body: bytes) -> RouteEntry:
    family, dst_len, _s, _t, table, proto, scope, _type, flags = _RTMSG.unpack_from(body)
    a = unpack_attrs(body, _RTMSG.size)
    zero = "0.0.0.0" if family == socket.AF_INET else "::"
    dst = socket.inet_ntop(family, a[RTA_DST]) if RTA_DST in a else zero
    return RouteEntry(
        dst=f"{dst}/{dst_len}",
        gw=socket.inet_ntop(family, a[RTA_GATEWAY]) if RTA_GATEWAY in a else None,
        index=struct.unpack("=I", a[RTA_OIF])[0] if RTA_OIF in a else None,
        proto=proto,
        table=struct.unpack("=I", a[RTA_TABLE])[0] if RTA_TABLE in a else table,
        metric=struct.unpack("=I", a[RTA_PRIORITY])[0] if RTA_PRIORITY in a else None,
        scope=scope,
        mtu=_route_mtu(a[RTA_METRICS]) if RTA_METRICS in a else 0,
        prefsrc=socket.inet_ntop(family, a[RTA_PREFSRC]) if RTA_PREFSRC in a else None,
        flags=flags,
    )


def _route_mtu(metrics: bytes) -> int:
    raw = unpack_attrs(metrics).get(RTAX_MTU)
    return struct.unpack("=I", raw[:4])[0] if raw and len(raw) >= 4 else 0


def _route_body(dst: str, gw: str | None, index: int | None, table: int, proto: int,
                scope: int, flags: int, metric: int | None, mtu: int = 0,
                prefsrc: str | None = None) -> bytes:
    family, packed, plen = parse_cidr(dst)
    attrs = [_u32(RTA_TABLE, table)]
    if plen:
        attrs.append(pack_attr(RTA_DST, packed))
    if gw:
        if _family(gw) != family:
            raise ValueError(f"gateway {gw} is not of the family of {dst}")
        attrs.append(pack_attr(RTA_GATEWAY, socket.inet_pton(family, gw)))
    if index:
        attrs.append(_u32(RTA_OIF, index))
    if metric is not None:
        attrs.append(_u32(RTA_PRIORITY, metric))
    if mtu:
        attrs.append(pack_attr(RTA_METRICS, _u32(RTAX_MTU, mtu)))
    if prefsrc:
        attrs.append(pack_attr(RTA_PREFSRC, socket.inet_pton(family, prefsrc)))
    head = _RTMSG.pack(family, plen, 0, 0, table if table < 256 else RT_TABLE_COMPAT,
                       proto, scope, RTN_UNICAST, flags)
    return head + b"".join(attrs)


# ---------------------------------------------------------------- the socket


class Netlink:
    """One NETLINK_ROUTE socket, bound to the network namespace it was created in."""

    def __init__(self, groups: int = 0) -> None:
        """``groups``: multicast groups to listen to (RTMGRP_*; read with :meth:`events`)."""
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                                   socket.NETLINK_ROUTE)
        try:
            self._sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
            self._sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
        except OSError:  # older kernels: plain errors without text
            pass
        if groups:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self._sock.bind((0, groups))
        self._seq = 0

    @classmethod
    def in_netns(cls, path_or_fd: str | int, groups: int = 0) -> Netlink:
        """A socket acting inside another namespace (entered only while creating it)."""
        from cni.kernel.netns import entered

        with entered(path_or_fd):
            return cls(groups)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Netlink:  # noqa: PYI034 (typing costs ms to import)
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- transport

    def _send(self, msg_type: int, flags: int, body: bytes) -> int:
        self._seq += 1
        head = _NLMSGHDR.pack(_NLMSGHDR.size + len(body), msg_type, flags | NLM_F_REQUEST, self._seq, 0)
        self._sock.sendto(head + body, (0, 0))
        return self._seq

    def _replies(self, seq: int, what: str) -> Iterator[tuple[int, bytes]]:
        """(type, body) of each answer to ``seq`` until DONE or the ACK; raises on error."""
        while True:
            for mtype, flags, mseq, body in _messages(self._sock.recv(_RECV_BUF), what):
                if mseq != seq:
                    continue  # a late answer to an earlier request
                if mtype == NLMSG_DONE:
                    return
                if mtype == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", body)[0]
                    if code == 0:
                        return
                    raise NetlinkError(code, f"{what}: {os.strerror(code)}{_ext_ack(body, flags)}")
                yield mtype, body  # a dump part, or a single answer that an ACK follows

    def request(self, msg_type: int, flags: int, body: bytes, what: str) -> list[bytes]:
        """One request, acknowledged: the bodies answered before the ACK (usually none)."""
        seq = self._send(msg_type, flags | NLM_F_ACK, body)
        return [b for _t, b in self._replies(seq, what)]

    def dump(self, msg_type: int, body: bytes, what: str) -> list[bytes]:
        """The bodies of a dump (NLM_F_DUMP)."""
        seq = self._send(msg_type, NLM_F_DUMP, body)
        return [b for _t, b in self._replies(seq, what)]

    # -- links

    def create_veth(self, name: str, peer_name: str, peer_netns_fd: int, mtu: int,
                    peer_mac: str | None = None, mac: str | None = None, promisc: bool = False,
                    up: bool = False) -> None:
        """One RTM_NEWLINK: ``name`` here, ``peer_name`` already inside ``peer_netns_fd`` (down).

        ``up`` and ``promisc`` set those flags on ``name`` in the same message.  Every link
        notification costs each process that watches the namespace's links (ovs-vswitchd
        re-reads all links and routes on each one), so a veth that is born up and promiscuous
        (a switch port sets the flag itself and then finds it set) costs one notification where
        create, up and promisc cost three.  With the peer down there is no carrier yet: the
        kernel starts nothing on ``name`` (no IPv6 link-local) until the peer comes up."""
        peer = [_str(IFLA_IFNAME, peer_name), _u32(IFLA_NET_NS_FD, peer_netns_fd)]
        if mtu:
            peer.append(_u32(IFLA_MTU, mtu))
        if peer_mac:
            peer.append(pack_attr(IFLA_ADDRESS, mac_bytes(peer_mac)))
        peer_info = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + b"".join(peer)
        linkinfo = pack_attr(IFLA_INFO_KIND, b"veth") + pack_attr(
            IFLA_INFO_DATA, pack_attr(VETH_INFO_PEER, peer_info))
        attrs = [_str(IFLA_IFNAME, name), pack_attr(IFLA_LINKINFO, linkinfo)]
        if mtu:
            attrs.append(_u32(IFLA_MTU, mtu))
        if mac:
            attrs.append(pack_attr(IFLA_ADDRESS, mac_bytes(mac)))
        flags = (IFF_PROMISC if promisc else 0) | (IFF_UP if up else 0)
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, flags, flags) + b"".join(attrs)
        self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body,
                      f"create veth {name} (peer {peer_name})")

    def link_add(self, name: str, kind: str) -> None:
        """Create link ``name`` of ``kind`` (one configured after its creation): :func:`link_add_request`.
        EEXIST when the name is taken; EOPNOTSUPP (extended ack "Unknown device type") when the
        kernel has no such kind, not even as a module it can load."""
        self.request(*link_add_request(name, kind), f"create {kind} link {name}")

    def link_get(self, name_or_index: str | int) -> Link | None:
        index, sel = _name_or_index(name_or_index)
        body = (_IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0) + sel
                + _u32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS))
        try:
            answers = self.request(RTM_GETLINK, 0, body, f"get link {name_or_index}")
        except NetlinkError as e:
            if e.errno in (_errno.ENODEV, _errno.ENOENT):
                return None
            raise
        return _decode_link(answers[0]) if answers else None

    def link_index(self, name: str) -> int | None:
        link = self.link_get(name)
        return link.index if link else None

    def links(self) -> list[Link]:
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _u32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS)
        return [_decode_link(b) for b in self.dump(RTM_GETLINK, body, "dump links")]

    def link_set(self, name_or_index: str | int, up: bool | None = None, mtu: int | None = None,
                 mac: str | None = None, name: str | None = None) -> None:
        """Set what is given; ``name`` renames (the link selected by index)."""
        index, sel = _name_or_index(name_or_index)
        attrs = [sel]
        if name is not None:
            if not index:
                raise ValueError(f"rename {name_or_index!r}: select the link by index")
            attrs.append(_str(IFLA_IFNAME, name))
        if mtu is not None:
            attrs.append(_u32(IFLA_MTU, mtu))
        if mac is not None:
            attrs.append(pack_attr(IFLA_ADDRESS, mac_bytes(mac)))
        flags = IFF_UP if up else 0
        change = IFF_UP if up is not None else 0
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, flags, change) + b"".join(attrs)
        self.request(RTM_SETLINK, 0, body, f"set link {name_or_index}")

    def link_del(self, name_or_index: str | int) -> bool:
        """Delete a link (a veth takes its peer along); False when it was already gone."""
        index, sel = _name_or_index(name_or_index)
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0) + sel
        try:
            self.request(RTM_DELLINK, 0, body, f"delete link {name_or_index}")
        except NetlinkError as e:
            if e.errno in (_errno.ENODEV, _errno.ENOENT):
                return False
            raise
        return True

    # -- addresses

    def _addr_body(self, index: int, cidr: str, flags: int) -> bytes:
        family, packed, plen = parse_cidr(cidr)
        attrs = pack_attr(IFA_LOCAL, packed) + pack_attr(IFA_ADDRESS, packed)
        if flags:
            attrs += _u32(IFA_FLAGS, flags)
        return _IFADDRMSG.pack(family, plen, flags & 0xFF, RT_SCOPE_UNIVERSE, index) + attrs

    def addr_add(self, index: int, cidr: str, nodad: bool = True) -> None:
        """Add ``cidr`` (address/prefix) to link ``index``; IPv6 without DAD when ``nodad``."""
        flags = IFA_F_NODAD if nodad and ":" in cidr else 0
        self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, self._addr_body(index, cidr, flags),
                      f"add address {cidr} to link {index}")

    def addr_del(self, index: int, cidr: str) -> bool:
        try:
            self.request(RTM_DELADDR, 0, self._addr_body(index, cidr, 0),
                          f"delete address {cidr} from link {index}")
        except NetlinkError as e:
            if e.errno in (_errno.EADDRNOTAVAIL, _errno.ENODEV, _errno.ESRCH, _errno.ENOENT):
                return False
            raise
        return True

    def addrs(self, index: int | None, family: int | None = None, link_local: bool = False) -> list[str]:
        """CIDR strings on link ``index`` (IPv6 link-local only when ``link_local``); ``index``
        None: every link's, host-scope ones (the loopback's) left out."""
        body = _IFADDRMSG.pack(family or socket.AF_UNSPEC, 0, 0, 0, 0)
        out = []
        for b in self.dump(RTM_GETADDR, body, f"dump addresses of link {index}"):
            fam, plen, _flags, scope, idx = _IFADDRMSG.unpack_from(b)
            if (idx != index if index is not None else scope == RT_SCOPE_HOST) or (family and fam != family):
                continue
            a = unpack_attrs(b, _IFADDRMSG.size)
            raw = a.get(IFA_LOCAL) or a.get(IFA_ADDRESS)
            if raw is None:
                continue
            if fam == socket.AF_INET6 and raw[:2] == b"\xfe\x80" and not link_local:
                continue
            out.append(f"{socket.inet_ntop(fam, raw)}/{plen}")
        return out

    # -- routes

    def route_add(self, dst: str, gw: str | None, index: int, onlink: bool = False,
                  table: int = RT_TABLE_MAIN, proto: int = RTPROT_STATIC,
                  metric: int | None = None, replace: bool = False, mtu: int = 0,
                  scope: int | None = None, prefsrc: str | None = None) -> None:
        """Add a unicast route; without ``gw`` it is a link-scope (directly connected) route
        unless ``scope`` says otherwise.  ``mtu`` > 0: the route's MTU (what the kernel sends to
        ``dst`` at most); ``prefsrc``: the source address it prefers."""
        if scope is None:
            scope = RT_SCOPE_UNIVERSE if gw else RT_SCOPE_LINK
        body = _route_body(dst, gw, index, table, proto, scope, RTNH_F_ONLINK if onlink else 0, metric, mtu,
                           prefsrc)
        flags = NLM_F_CREATE | (NLM_F_REPLACE if replace else NLM_F_EXCL)
        self.request(RTM_NEWROUTE, flags, body, f"add route {dst} via {gw or '-'} dev {index}")

    def route_del(self, dst: str, gw: str | None = None, index: int | None = None,
                  table: int = RT_TABLE_MAIN, metric: int | None = None) -> bool:
        """Delete the route matching the given fields; False when there is none."""
        # proto 0 and scope RT_SCOPE_NOWHERE (255) act as wildcards for deletion.
        body = _route_body(dst, gw, index, table, 0, 255, 0, metric)
        try:
            self.request(RTM_DELROUTE, 0, body, f"delete route {dst}")
        except NetlinkError as e:
            if e.errno in (_errno.ESRCH, _errno.ENOENT, _errno.ENODEV):
                return False
            raise
        return True

    # -- neighbours

    def neigh_del(self, index: int, address: str) -> bool:
        """Forget the neighbour entry for ``address`` on link ``index``; False when there is none."""
        try:
            self.request(RTM_DELNEIGH, 0, neigh_body(index, address), f"delete neighbour {address}")
        except NetlinkError as e:
            if e.errno in (_errno.ENOENT, _errno.ESRCH, _errno.ENODEV):
                return False
            raise
        return True

    # -- events (a socket made with ``groups``)

    def events(self, timeout: float | None = None) -> list[tuple[int, bytes]]:
        """(type, body) of the messages of the next datagram; [] after ``timeout`` seconds
        without one.  OSError(ENOBUFS) when the kernel dropped events (the socket's buffer
        overflowed): whatever was watched must be read afresh."""
        self._sock.settimeout(timeout)
        try:
            data = self._sock.recv(_RECV_BUF)
        except TimeoutError:
            return []
        return [(mtype, body) for mtype, _flags, _seq, body in _messages(data, "events")]

    def routes(self, family: int, index: int | None = None, table: int | None = RT_TABLE_MAIN
               ) -> list[RouteEntry]:
        """Unicast routes of ``family`` (in ``table``; every table when None), on ``index``."""
        body = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
        out = []
        for b in self.dump(RTM_GETROUTE, body, "dump routes"):
            if _RTMSG.unpack_from(b)[7] != RTN_UNICAST:
                continue
            r = _decode_route(b)
            if (table is None or r.table == table) and (index is None or r.index == index):
                out.append(r)
        return out


    # -- batches (route-sync: thousands of routes per sync)

    def batch(self, requests: list[tuple[int, int, bytes]], what: str = "batch",
              window: int = 128) -> list[list[bytes] | NetlinkError]:
        """Send many requests ``(type, flags, body)`` (not dumps), each with NLM_F_ACK, ``window``
        of them per datagram, the kernel handling them in order; returns per request its answer
        bodies (empty for a plain ACK) or the :class:`NetlinkError` it got.  One round trip per
        ``window`` requests instead of one per request."""
        if not getattr(self, "_big_rcvbuf", False):
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
            except OSError:
                pass
            self._big_rcvbuf = True
        out: list[list[bytes] | NetlinkError] = [[] for _ in requests]
        for start in range(0, len(requests), window):
            pending: dict[int, int] = {}
            chunk = []
            for i in range(start, min(start + window, len(requests))):
                msg_type, flags, body = requests[i]
                self._seq += 1
                pending[self._seq] = i
                chunk.append(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), msg_type,
                                            flags | NLM_F_REQUEST | NLM_F_ACK, self._seq, 0) + body)
            self._sock.sendto(b"".join(chunk), (0, 0))
            while pending:
                for mtype, flags, mseq, body in _messages(self._sock.recv(_RECV_BUF), what):
                    at = pending.get(mseq)
                    if at is None:
                        continue  # a late answer to an earlier request
                    if mtype == NLMSG_ERROR:
                        code = -struct.unpack_from("=i", body)[0]
                        if code:
                            out[at] = NetlinkError(code, f"{what}: {os.strerror(code)}{_ext_ack(body, flags)}")
                        del pending[mseq]
                    elif mtype == NLMSG_DONE:
                        del pending[mseq]
                    else:
                        answers = out[at]
                        if isinstance(answers, list):
                            answers.append(body)
        return out



# ---------------------------------------------------------------- batch requests (pure)

def route_add_request(dst: str, gw: str | None, index: int | None, onlink: bool = False,
                      table: int = RT_TABLE_MAIN, proto: int = RTPROT_STATIC,
                      replace: bool = True, mtu: int = 0) -> tuple[int, int, bytes]:
    """An RTM_NEWROUTE for :meth:`Netlink.batch` (link scope without ``gw``; ``mtu`` > 0: the
    route's MTU)."""
    scope = RT_SCOPE_UNIVERSE if gw else RT_SCOPE_LINK
    body = _route_body(dst, gw, index, table, proto, scope, RTNH_F_ONLINK if onlink else 0, None, mtu)
    return RTM_NEWROUTE, NLM_F_CREATE | (NLM_F_REPLACE if replace else NLM_F_EXCL), body


def route_del_request(dst: str, gw: str | None = None, table: int = RT_TABLE_MAIN,
                      proto: int = 0) -> tuple[int, int, bytes]:
    """An RTM_DELROUTE for :meth:`Netlink.batch`; ``proto`` 0 matches any protocol."""
    return RTM_DELROUTE, 0, _route_body(dst, gw, None, table, proto, 255, 0, None)


def link_add_request(name: str, kind: str) -> tuple[int, int, bytes]:
    """An RTM_NEWLINK creating link ``name`` of ``kind`` with no IFLA_INFO_DATA (a kind whose
    configuration comes later, e.g. ``wireguard`` over its generic netlink family), for
    :meth:`Netlink.request` or :meth:`Netlink.batch`: an ifinfomsg, IFLA_IFNAME, IFLA_LINKINFO
    nesting IFLA_INFO_KIND (without a NUL, as iproute2 sends it); NLM_F_CREATE | NLM_F_EXCL."""
    body = (_IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _str(IFLA_IFNAME, name)
            + pack_attr(IFLA_LINKINFO, pack_attr(IFLA_INFO_KIND, kind.encode())))
    return RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body


def route_get_request(dst: str) -> tuple[int, int, bytes]:
    """An RTM_GETROUTE (the kernel's route lookup towards ``dst``) for :meth:`Netlink.batch`;
    decode the answer with :func:`decode_route`."""
    return RTM_GETROUTE, 0, _route_body(dst, None, None, 0, 0, 0, 0, None)


def neigh_body(index: int, address: str, state: int = 0, flags: int = 0, mac: str | None = None) -> bytes:
    """An ndmsg selecting ``address`` on link ``index`` (with NUD ``state``, NTF ``flags`` and
    the link-layer address ``mac`` when given)."""
    family, packed, _plen = parse_cidr(address)
    body = NDMSG.pack(family, index, state, flags, 0) + pack_attr(NDA_DST, packed)
    return body + pack_attr(NDA_LLADDR, mac_bytes(mac)) if mac else body


def decode_route(body: bytes) -> RouteEntry:
    """An RTM_NEWROUTE body (a dump part, a lookup's answer, an event)."""
    return _decode_route(body)


def _messages(data: bytes, what: str) -> Iterator[tuple[int, int, int, bytes]]:
    """(type, flags, seq, body) of each netlink message in one datagram."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, mtype, flags, mseq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            raise NetlinkError(_errno.EPROTO, f"{what}: malformed netlink message")
        yield mtype, flags, mseq, data[offset + _NLMSGHDR.size: offset + length]
        offset += _align(length)


def _ext_ack(body: bytes, flags: int) -> str:
    """The kernel's extended-ack message, if any (``: text``)."""
    if not flags & NLM_F_ACK_TLVS:
        return ""
    # error code + the original header (request payload is capped by NETLINK_CAP_ACK).
    inner_len = _NLMSGHDR.unpack_from(body, 4)[0] if len(body) >= 4 + _NLMSGHDR.size else 0
    capped = flags & 0x100
    offset = 4 + (_NLMSGHDR.size if capped else _align(inner_len))
    msg = unpack_attrs(body, offset).get(NLMSGERR_ATTR_MSG)
    if not msg:
        return ""
    return " (" + msg.rstrip(b"\0").decode(errors="replace") + ")"
