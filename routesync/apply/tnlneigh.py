"""OVS's tunnel neighbour cache, kept filled for every tunnel next hop.

A userspace (``netdev``) tunnel port builds the outer Ethernet header from OVS's own neighbour
cache (``ovs-appctl tnl/neigh/show``), keyed by the next hop of the outer destination (the
peer itself on the same segment, else the router).  OVS learns IPv4 entries by snooping ARP
that crosses the bridge, but the first packets to a new peer are dropped while it asks, and
OVS 3.1 never learns IPv6 entries from ND with flows that do not use NORMAL.  So route-sync
resolves each tunnel next hop in the kernel (the Node's stack owns the transport addresses on
the moved uplink) and writes the answer with ``tnl/neigh/set``: no first-packet loss, IPv6
underlays work, and a restarted ovs-vswitchd (empty cache) is refilled on the next reconcile.

Pure parts: :func:`tunnel_endpoints`, :func:`parse_show`, :func:`plan_set`.  The thin part,
:class:`TunnelNeighbors`, asks the kernel (through the route applier's netlink socket) and
speaks ``ovs-appctl``'s JSON-RPC on ovs-vswitchd's control socket itself (two ``ovs-appctl``
launches, ~25 ms each on a busy machine, per full pass otherwise); the binary only when the
socket cannot be used."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from cni.kernel.neighbours import NUD_FAILED, NUD_INCOMPLETE
from cni.pipeline.modes import PATH_TUNNEL
from routesync.model import PeerPlan

if TYPE_CHECKING:
    from routesync.apply.routes import RouteApplier

LOG = logging.getLogger(__name__)

# A reconcile waits at most this long for new next hops to resolve; a next hop that did not
# resolve is only re-probed later, never waited for again (a dead peer must not slow every
# reconcile).  What is missed is written at the next reconcile; meanwhile OVS ARPs by itself.
RESOLVE_TIMEOUT = 0.3

# OVS's tunnel neighbour cache drops an entry once it goes this long without a lookup or a set
# (``NEIGH_ENTRY_DEFAULT_IDLE_TIME``, 15 minutes; ``tnl/neigh/aging`` reads or changes it in OVS
# releases that have the command, 3.1 does not)
OVS_DEFAULT_AGING = 900.0

# How long an entry this object set stays trusted to be in the cache without reading it: at most
# this, and at most a third of the cache's aging (a set renews the entry for the whole aging, so
# the entry is there for at least the aging after it, unless something flushes the cache; a flush
# is repaired by a full pass, or by the first change after the trust ran out)
TRUST_MOST = 60.0


class TunnelNeighborError(RuntimeError):
    """ovs-appctl failed."""


def tunnel_endpoints(peers: Iterable[PeerPlan]) -> tuple[str, ...]:
    """Outer destinations of every tunnelled peer (sorted, unique)."""
    from cni.lean import addr  # integer arithmetic: 1,000 endpoints ~10x faster than ipaddress objects

    parsed = {addr.parse_ip(p.transport_address) for p in peers if p.path == PATH_TUNNEL and p.transport_address}
    return tuple(addr.format_ip(v, bits) for v, bits in sorted(parsed, key=lambda x: (x[1], x[0])))


def parse_show(text: str, bridge: str) -> dict[str, str]:
    """``tnl/neigh/show`` → {ip: mac} of ``bridge``."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) != 3 or words[2] != bridge:
            continue
        try:
            ip = str(ipaddress.ip_address(words[0]))
        except ValueError:
            continue
        out[ip] = words[1].lower()
    return out


def plan_set(want: Mapping[str, str], have: Mapping[str, str]) -> list[tuple[str, str]]:
    """Entries to (re)write: missing or with another MAC.  Extra entries are OVS's to age out."""
    return sorted((ip, mac.lower()) for ip, mac in want.items() if have.get(ip) != mac.lower())


class UnixctlError(Exception):
    """ovs-vswitchd answered a unixctl command with an error."""


def unixctl(path: str, method: str, params: list[str], timeout: float = 5.0) -> str:
    """``ovs-appctl -t <path> <method> <params>``: one JSON-RPC request on the control socket,
    its ``result`` text back; UnixctlError with the ``error`` text, OSError/ValueError when the
    socket or the answer is unusable."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(json.dumps({"method": method, "params": params, "id": 0}).encode())
        buf, decoder = b"", json.JSONDecoder()
        while True:
            data = sock.recv(65536)
            if not data:
                raise ValueError("ovs-vswitchd closed the control connection")
            buf += data
            try:
                reply, _ = decoder.raw_decode(buf.decode().lstrip())
            except ValueError:
                continue  # not complete yet
            break
    finally:
        sock.close()
    if not isinstance(reply, dict) or reply.get("id") != 0:
        raise ValueError(f"unexpected unixctl answer {reply!r}")
    if reply.get("error") is not None:
        raise UnixctlError(str(reply["error"]).strip())
    return str(reply.get("result") or "")


class TunnelNeighbors:
    """Keeps OVS's tunnel neighbour cache of ``bridge`` equal to the kernel's view of every
    tunnel next hop."""

    def __init__(self, routes: RouteApplier, run_dir: str, bridge: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.routes = routes
        self.run_dir = run_dir
        self.bridge = bridge
        self.clock = clock
        self.unresolved: set[str] = set()  # next hops that did not answer last time
        # next hop -> (MAC, when) of what this object set in the cache of the ovs-vswitchd
        # ``written_in`` (its pid): trusted by ``sync(..., trust_written=True)`` for ``trust_for``
        self.written: dict[str, tuple[str, float]] = {}
        self.written_in: int | None = None
        self._aging: tuple[int, float] | None = None  # (pid, seconds) of the cache's aging

    # -- ovs-appctl
    def _pid(self) -> int:
        try:
            with open(os.path.join(self.run_dir, "ovs-vswitchd.pid")) as f:
                return int(f.read().strip())
        except (OSError, ValueError) as e:
            raise TunnelNeighborError(f"no ovs-vswitchd pid in {self.run_dir}: {e}") from None

    def _target(self) -> str:
        return os.path.join(self.run_dir, f"ovs-vswitchd.{self._pid()}.ctl")

    def _appctl(self, *args: str) -> str:
        target = self._target()
        try:
            return unixctl(target, args[0], list(args[1:]))
        except UnixctlError as e:  # ovs-vswitchd answered: an error of the command
            raise TunnelNeighborError(f"ovs-appctl -t {target} {' '.join(args)}: {e}") from None
        except (OSError, ValueError) as e:
            LOG.info("unixctl on %s: %s; running ovs-appctl", target, e)
        argv = ["ovs-appctl", "-t", target, *args]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise TunnelNeighborError(f"{' '.join(argv)}: {proc.stderr.strip()}")
        return proc.stdout

    def installed(self) -> dict[str, str]:
        return parse_show(self._appctl("tnl/neigh/show"), self.bridge)

    # -- kernel
    def next_hop(self, dst: str) -> tuple[str, int] | None:
        """(next hop address, ifindex) the kernel uses towards ``dst``."""
        return self.next_hops((dst,)).get(dst)

    def next_hops(self, endpoints: Iterable[str]) -> dict[str, tuple[str, int]]:
        """{endpoint: (next hop, ifindex)} for many endpoints: one batch of route lookups on the
        route applier's netlink socket.  An endpoint without a route is left out."""
        endpoints = list(endpoints)
        out: dict[str, tuple[str, int]] = {}
        for dst, got in zip(endpoints, self.routes.route_lookups(endpoints), strict=True):
            if isinstance(got, Exception):
                LOG.info("no route to tunnel endpoint %s: %s", dst, got)
            elif got.index:
                out[dst] = (got.gw or dst, got.index)
        return out

    def lladdr(self, ip: str, ifindex: int) -> str | None:
        """The usable MAC of next hop ``ip`` on ``ifindex``; None while unresolved or failed."""
        try:
            n = self.routes.neighbour(ip, ifindex)
        except OSError as e:
            LOG.info("neighbour %s: %s", ip, e)
            return None
        if n is None or not n.mac or n.state & (NUD_INCOMPLETE | NUD_FAILED):
            return None
        return n.mac.lower()

    def probe(self, ip: str, ifindex: int) -> None:
        """Start resolving next hop ``ip`` (ARP/NDP) on ``ifindex``."""
        try:
            self.routes.probe_neighbour(ip, ifindex)
        except OSError as e:
            LOG.info("cannot start neighbour resolution of %s: %s", ip, e)

    def resolve(self, endpoints: Iterable[str], timeout: float = RESOLVE_TIMEOUT) -> dict[str, str]:
        """{next hop: MAC} for ``endpoints``; unresolved next hops are probed and waited for (at
        most ``timeout`` for all), those still unknown are left out (the next reconcile retries)."""
        hops = set(self.next_hops(endpoints).values())
        found: dict[str, str] = {}
        pending: set[tuple[str, int]] = set()
        for ip, idx in hops:
            mac = self.lladdr(ip, idx)
            if mac:
                found[ip] = mac
            else:
                self.probe(ip, idx)
                if ip not in self.unresolved:
                    pending.add((ip, idx))
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            time.sleep(0.01)
            for ip, idx in list(pending):
                mac = self.lladdr(ip, idx)
                if mac:
                    found[ip] = mac
                    pending.discard((ip, idx))
        if pending:
            LOG.warning("tunnel next hops not resolved yet: %s", ", ".join(sorted(ip for ip, _ in pending)))
        self.unresolved = {ip for ip, _ in hops} - set(found)
        return found

    def trust_for(self, pid: int) -> float:
        """Seconds an entry set in ovs-vswitchd ``pid`` is trusted to stay: ``TRUST_MOST``, or a
        third of the cache's aging when that is shorter (asked once per ovs-vswitchd)."""
        if self._aging is None or self._aging[0] != pid:
            try:
                aging = float(self._appctl("tnl/neigh/aging").strip())
            except (TunnelNeighborError, ValueError):  # OVS 3.1: no such command, the fixed idle time
                aging = OVS_DEFAULT_AGING
            self._aging = (pid, aging)
        return min(TRUST_MOST, self._aging[1] / 3)

    def sync(self, endpoints: Iterable[str], trust_written: bool = False) -> list[tuple[str, str]]:
        """Write missing/changed cache entries; returns what was written.

        ``trust_written`` (a Node change's new endpoints): no read of the cache (a round trip to
        ovs-vswitchd: ~0.3 ms of route-sync CPU and ~15 ms of wall time at 5,000 peers behind one
        router, on every change).  A next hop this object set with the same MAC in the same
        ovs-vswitchd less than ``trust_for`` ago is left alone; any other is set (a set of an
        entry that is there with that MAC renews it, so it is trusted from then on)."""
        endpoints = tuple(endpoints)
        if not endpoints:
            return []
        want = self.resolve(endpoints)
        pid = self._pid()
        if self.written_in != pid:  # another ovs-vswitchd: its cache started empty
            self.written, self.written_in = {}, pid
        if trust_written:
            now, bound = self.clock(), self.trust_for(pid)
            todo = []
            for ip, mac in sorted(want.items()):
                mac = mac.lower()
                set_as = self.written.get(ip)
                if set_as is None or set_as[0] != mac or now - set_as[1] >= bound:
                    todo.append((ip, mac))
        else:
            todo = plan_set(want, self.installed())
        # a renewal is not news; a full pass's repair is
        logged = [(ip, mac) for ip, mac in todo if not trust_written or self.written.get(ip, ("",))[0] != mac]
        for ip, mac in todo:
            self.written.pop(ip, None)  # not trusted while its set is on its way
            self._appctl("tnl/neigh/set", self.bridge, ip, mac)
            self.written[ip] = (mac, self.clock())
        if logged:
            LOG.info("tunnel neighbours set: %s", ", ".join(f"{ip}={mac}" for ip, mac in logged))
        return todo
