"""The fast path's data-plane MAC source: the kernel's neighbour table (pyroute2).

For each destination (a peer's transport address) the kernel's route lookup gives the next hop
(the peer itself on a shared segment, else this Node's router towards it); its MAC is read from
the neighbour table (ARP for IPv4, NDP for IPv6) when the entry is usable (REACHABLE, STALE,
DELAY, PROBE, PERMANENT), and resolution is triggered (``NTF_USE``) when it is not.

A watcher thread listens to RTM_NEWNEIGH/RTM_DELNEIGH on its own netlink socket and sets
:attr:`NextHops.changed` when a watched next hop's usable MAC changes (appears, changes, e.g.
the router failed over and sent a gratuitous ARP / unsolicited NA, or disappears); the daemon
wakes up on it and reconciles.  A state change with the same MAC (STALE → REACHABLE) is no news.

Pure parts: :func:`usable_mac`.  The lookups reuse the tunnel-neighbour helper's netlink calls."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from routesync.apply.tnlneigh import NUD_FAILED, NUD_INCOMPLETE, TunnelNeighbors
from routesync.model import NextHop

if TYPE_CHECKING:
    from routesync.apply.routes import RouteApplier

LOG = logging.getLogger(__name__)

RTMGRP_NEIGH = 0x4
RTM_NEWNEIGH, RTM_DELNEIGH = 28, 29
NETLINK_ROUTE = 0
CLONE_NEWNET = 0x40000000
RESOLVE_TIMEOUT = 0.3  # a reconcile waits at most this long for new next hops


def usable_mac(state: int, lladdr: str | None, deleted: bool = False) -> str | None:
    """The MAC a neighbour entry gives, or None while it is unresolved, failed or gone."""
    if deleted or not lladdr or state & (NUD_INCOMPLETE | NUD_FAILED):
        return None
    return str(lladdr).lower()


class NextHops:
    """Resolves destinations to next hops with MACs and watches those next hops for changes."""

    def __init__(self, routes: RouteApplier, netns: str | None = None) -> None:
        self._nl = TunnelNeighbors(routes, run_dir="", bridge="")  # its kernel lookups only
        self.netns = netns
        self.changed = threading.Event()
        self._lock = threading.Lock()
        self._known: dict[str, str | None] = {}  # next-hop address -> usable MAC last seen
        self._asked: set[str] = set()  # next hops already waited for once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.events = 0  # neighbour events that changed a watched next hop's MAC

    # -- resolution (called by the daemon's reconcile thread)
    def resolve(self, destinations: Iterable[str], timeout: float = RESOLVE_TIMEOUT) -> dict[str, NextHop]:
        """{destination: NextHop}; an unresolved next hop is probed and, the first time, waited
        for (at most ``timeout`` for all); later reconciles only re-probe it."""
        self.start()
        hops: dict[str, tuple[str, int]] = {}
        for d in destinations:
            nh = self._nl.next_hop(d)
            if nh is not None:
                hops[d] = (str(ipaddress.ip_address(nh[0])), nh[1])
        macs: dict[tuple[str, int], str | None] = {}
        pending: set[tuple[str, int]] = set()
        for key in set(hops.values()):
            macs[key] = self._nl._lladdr(*key)
            if macs[key] is None:
                self._nl._probe(*key)
                if key[0] not in self._asked:
                    pending.add(key)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            time.sleep(0.01)
            for key in list(pending):
                macs[key] = self._nl._lladdr(*key)
                if macs[key] is not None:
                    pending.discard(key)
        with self._lock:
            self._asked |= {k[0] for k in macs}
            self._known = {k[0]: m for k, m in macs.items()}
        if pending:
            LOG.info("fast path: next hops not resolved yet: %s", ", ".join(sorted(k[0] for k in pending)))
        return {d: NextHop(key[0], macs[key]) for d, key in hops.items()}

    # -- events
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="neigh-watch", daemon=True)
            self._thread.start()

    def _event(self, msg: Any) -> None:
        dst = msg.get_attr("NDA_DST")
        if dst is None:
            return
        ip = str(ipaddress.ip_address(dst))
        mac = usable_mac(msg["state"], msg.get_attr("NDA_LLADDR"), msg["header"]["type"] == RTM_DELNEIGH)
        with self._lock:
            if ip not in self._known or self._known[ip] == mac:
                return
            LOG.info("neighbour %s: %s -> %s", ip, self._known[ip], mac)
            self._known[ip] = mac
        self.events += 1
        self.changed.set()

    def _socket(self) -> socket.socket:
        """A netlink socket subscribed to neighbour events, in ``netns`` when given (setns
        changes only the calling thread's namespace: this thread is the watcher's own)."""
        if self.netns:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(os.path.join("/run/netns", self.netns), os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {self.netns}")
            finally:
                os.close(fd)
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sock.bind((0, RTMGRP_NEIGH))
        sock.settimeout(0.2)
        return sock

    def _watch(self) -> None:
        # A plain socket, read to the end of each datagram: pyroute2's reader keeps messages
        # it has read in its own queue, where select() on its fd no longer sees them.
        from pyroute2.netlink.rtnl.ndmsg import ndmsg

        try:
            sock = self._socket()
        except Exception:
            LOG.exception("neighbour watcher not started; MAC changes are seen at the next resync only")
            return
        try:
            while not self._stop.is_set():
                try:
                    data = sock.recv(1 << 16)
                except TimeoutError:
                    continue
                except OSError as e:  # ENOBUFS: events were lost; reconcile to catch up
                    LOG.info("neighbour events lost (%s): reconciling", e)
                    self.changed.set()
                    continue
                offset = 0
                while offset + 16 <= len(data):
                    length, kind = struct.unpack_from("=IH", data, offset)
                    if length < 16:
                        break
                    if kind in (RTM_NEWNEIGH, RTM_DELNEIGH):
                        try:
                            msg = ndmsg(data[offset:offset + length])
                            msg.decode()
                            self._event(msg)
                        except Exception as e:  # noqa: BLE001 - one odd message must not end the watch
                            LOG.debug("neighbour event ignored: %s", e)
                    offset += (length + 3) & ~3
        finally:
            sock.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
