"""The fast path's data-plane MAC source: the kernel's neighbour table (``cni.kernel.netlink``).

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
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from cni.kernel import neighbours
from cni.kernel.neighbours import NUD_FAILED, NUD_INCOMPLETE, RTMGRP_NEIGH, Neighbour
from cni.kernel.netlink import RTM_DELNEIGH, RTM_NEWNEIGH, Netlink
from routesync.apply.tnlneigh import TunnelNeighbors
from routesync.model import NextHop

if TYPE_CHECKING:
    from routesync.apply.routes import RouteApplier

LOG = logging.getLogger(__name__)

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
            macs[key] = self._nl.lladdr(*key)
            if macs[key] is None:
                self._nl.probe(*key)
                if key[0] not in self._asked:
                    pending.add(key)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            time.sleep(0.01)
            for key in list(pending):
                macs[key] = self._nl.lladdr(*key)
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
        """Subscribe to neighbour events here, before the caller's first lookup, and watch them on
        a thread: a subscription made on the thread could come after the lookup it should follow,
        and an entry resolved in between (the first probe's answer) would be missed until the
        entry's next change (the fast path to another subnet's peers held back by a minute)."""
        if self._thread is not None:
            return
        try:
            sock = self._socket()
        except Exception:
            LOG.exception("neighbour watcher not started; MAC changes are seen at the next resync only")
            self._thread = threading.Thread(target=lambda: None, name="neigh-watch", daemon=True)  # not again
            self._thread.start()
            return
        self._thread = threading.Thread(target=self._watch, args=(sock,), name="neigh-watch", daemon=True)
        self._thread.start()

    def _event(self, kind: int, n: Neighbour) -> None:
        if n.ip is None:
            return
        ip = str(ipaddress.ip_address(n.ip))
        mac = usable_mac(n.state, n.mac, kind == RTM_DELNEIGH)
        with self._lock:
            if ip not in self._known or self._known[ip] == mac:
                return
            LOG.info("neighbour %s: %s -> %s", ip, self._known[ip], mac)
            self._known[ip] = mac
        self.events += 1
        self.changed.set()

    def _socket(self) -> Netlink:
        """A netlink socket subscribed to neighbour events, in ``netns`` when given."""
        if self.netns:
            return Netlink.in_netns(f"/run/netns/{self.netns}", groups=RTMGRP_NEIGH)
        return Netlink(groups=RTMGRP_NEIGH)

    def _watch(self, sock: Netlink) -> None:
        try:
            while not self._stop.is_set():
                try:
                    events = sock.events(timeout=0.2)
                except OSError as e:  # ENOBUFS: events were lost; reconcile to catch up
                    LOG.info("neighbour events lost (%s): reconciling", e)
                    self.changed.set()
                    continue
                for kind, body in events:
                    if kind not in (RTM_NEWNEIGH, RTM_DELNEIGH):
                        continue
                    try:
                        self._event(kind, neighbours.decode(body))
                    except Exception as e:  # noqa: BLE001 - one odd message must not end the watch
                        LOG.debug("neighbour event ignored: %s", e)
        finally:
            sock.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
