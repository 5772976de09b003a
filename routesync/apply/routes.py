"""Host routes, permanent neighbours, gateway addresses, forwarding and MTU (pyroute2).

Routes route-sync installs carry protocol ``FERRY_ROUTE_PROTO`` in the main table; ``sync`` lists
only routes of that protocol, so it adopts what an earlier run left, removes what is no longer
desired, re-adds what someone deleted, and never touches a route of any other protocol.
Neighbours: only NUD_PERMANENT entries on the gateway port are Ferry's.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Self

from cni.pipeline import GATEWAY_PORT
from routesync.model import FERRY_ROUTE_PROTO, HostRoute, Neighbor

LOG = logging.getLogger(__name__)

MAIN_TABLE = 254
RTNH_F_ONLINK = 4
NUD_PERMANENT = 0x80


@dataclass
class RouteDiff:
    added: list[HostRoute] = field(default_factory=list)
    deleted: list[HostRoute] = field(default_factory=list)
    neigh_added: list[Neighbor] = field(default_factory=list)
    neigh_deleted: list[Neighbor] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.deleted or self.neigh_added or self.neigh_deleted)


def normalize(route: HostRoute) -> HostRoute:
    """Canonical text for dst and gw so desired and installed compare equal."""
    dst = str(ipaddress.ip_network(route.dst, strict=False))
    gw = str(ipaddress.ip_address(route.gw)) if route.gw else None
    return HostRoute(dst=dst, gw=gw, dev=route.dev, onlink=route.onlink)


def _loose(route: HostRoute) -> tuple[str, str | None, bool]:
    return (route.dst, route.gw, route.onlink)


def plan_routes(desired: Iterable[HostRoute], installed: Iterable[HostRoute]
                ) -> tuple[list[HostRoute], list[HostRoute]]:
    """(add, delete).  A desired route with ``dev=None`` matches an installed one on any device."""
    want = {normalize(r) for r in desired}
    have = set(installed)
    add, keep = [], set()
    for r in sorted(want, key=repr):
        hit = r if r in have else None
        if hit is None and r.dev is None:
            hit = next((h for h in have if _loose(h) == _loose(r)), None)
        if hit is None:
            add.append(r)
        else:
            keep.add(hit)
    delete = sorted((h for h in have if h not in keep), key=repr)
    return add, delete


class RouteApplier:
    """pyroute2 in the current network namespace (or ``netns``, a name under /run/netns).

    Built on pyroute2's AsyncIPRoute driven by a private event loop: bulk route changes keep up
    to 256 requests in flight (~0.5 ms/route where the sync API costs ~1.9 ms/route), and a dump
    does not pay one event-loop round per message (~3x faster for 1,000 routes)."""

    CHUNK = 256

    def __init__(self, gateway: str = GATEWAY_PORT, netns: str | None = None,
                 proto: int = FERRY_ROUTE_PROTO) -> None:
        import asyncio

        from pyroute2 import AsyncIPRoute

        self.gateway = gateway
        self.netns = netns
        self.proto = proto
        self._loop = asyncio.new_event_loop()
        self._a: Any = AsyncIPRoute(netns=netns) if netns else AsyncIPRoute()

    def close(self) -> None:
        if self._a is not None:
            self._a.close()
            self._loop.close()
            self._a = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro: Any) -> Any:
        return self._loop.run_until_complete(coro)

    def _dump(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        async def collect() -> list[Any]:
            return [m async for m in await getattr(self._a, method)(*args, **kwargs)]
        return self._run(collect())

    def _bulk(self, method: str, command: str, argsets: list[dict[str, Any]]) -> None:
        import asyncio

        async def run(chunk: list[dict[str, Any]]) -> None:
            await asyncio.gather(*(getattr(self._a, method)(command, **a) for a in chunk))

        for i in range(0, len(argsets), self.CHUNK):
            self._run(run(argsets[i:i + self.CHUNK]))

    def _bulk_route(self, command: str, argsets: list[dict[str, Any]]) -> None:
        self._bulk("route", command, argsets)

    # -- links
    def index(self, dev: str) -> int | None:
        found = self._run(self._a.link_lookup(ifname=dev))
        return found[0] if found else None

    def _need(self, dev: str) -> int:
        idx = self.index(dev)
        if idx is None:
            raise LookupError(f"no link {dev!r}")
        return idx

    def _names(self) -> dict[int, str]:
        return {lk["index"]: lk.get_attr("IFLA_IFNAME") for lk in self._dump("get_links")}

    # -- routes
    def installed(self) -> set[HostRoute]:
        """Routes of our protocol in the main table, both families."""
        names = self._names()
        out = set()
        for family in (socket.AF_INET, socket.AF_INET6):
            for r in self._dump("get_routes", family=family, table=MAIN_TABLE):
                if r["proto"] != self.proto:
                    continue
                dst = r.get_attr("RTA_DST") or ("0.0.0.0" if family == socket.AF_INET else "::")
                oif = r.get_attr("RTA_OIF")
                out.add(HostRoute(
                    dst=str(ipaddress.ip_network(f"{dst}/{r['dst_len']}", strict=False)),
                    gw=r.get_attr("RTA_GATEWAY"),
                    dev=names.get(oif, str(oif)) if oif else None,
                    onlink=bool(r["flags"] & RTNH_F_ONLINK)))
        return out

    def _route_args(self, r: HostRoute) -> dict[str, Any]:
        args: dict[str, Any] = {"dst": r.dst, "table": MAIN_TABLE, "proto": self.proto}
        if r.gw:
            args["gateway"] = r.gw
        if r.dev:
            args["oif"] = self._need(r.dev)
        if r.onlink:
            args["flags"] = RTNH_F_ONLINK
        if not r.gw:
            args["scope"] = 253  # link
        return args

    def sync(self, routes: set[HostRoute], neighbors: set[Neighbor] | None = None) -> RouteDiff:
        """Make our routes (and permanent neighbours on the gateway port) equal the desired."""
        diff = RouteDiff()
        if neighbors is not None:
            diff.neigh_added, diff.neigh_deleted = self.sync_neighbors(neighbors)
        add, delete = plan_routes(routes, self.installed())
        self._bulk_route("del", [self._del_args(r) for r in delete])
        # routes without a next hop first: an IPv6 /128 to the peer gateway precedes the CIDR via it
        self._bulk_route("replace", [self._route_args(r) for r in add if r.gw is None])
        self._bulk_route("replace", [self._route_args(r) for r in add if r.gw is not None])
        diff.added, diff.deleted = add, delete
        if diff.changed:
            LOG.info("routes: +%d -%d, neighbours +%d -%d", len(add), len(delete),
                     len(diff.neigh_added), len(diff.neigh_deleted))
        return diff

    def delete_all(self) -> int:
        """Teardown: every route of our protocol goes, nothing else."""
        _, delete = plan_routes((), self.installed())
        self._bulk_route("del", [self._del_args(r) for r in delete])
        return len(delete)

    def _del_args(self, r: HostRoute) -> dict[str, Any]:
        return {"dst": r.dst, "table": MAIN_TABLE, "proto": self.proto,
                **({"gateway": r.gw} if r.gw else {})}

    # -- neighbours
    def installed_neighbors(self, devs: Iterable[str]) -> set[Neighbor]:
        out = set()
        for dev in set(devs):
            idx = self.index(dev)
            if idx is None:
                continue
            for n in self._dump("get_neighbours", ifindex=idx):
                if n["state"] & NUD_PERMANENT and n.get_attr("NDA_LLADDR"):
                    out.add(Neighbor(ip=str(ipaddress.ip_address(n.get_attr("NDA_DST"))),
                                     mac=n.get_attr("NDA_LLADDR").lower(), dev=dev))
        return out

    def sync_neighbors(self, neighbors: set[Neighbor]) -> tuple[list[Neighbor], list[Neighbor]]:
        want = {Neighbor(str(ipaddress.ip_address(n.ip)), n.mac.lower(), n.dev) for n in neighbors}
        have = self.installed_neighbors({self.gateway} | {n.dev for n in want})
        delete = sorted(have - want, key=repr)
        add = sorted(want - have, key=repr)
        self._bulk("neigh", "del", [{"dst": n.ip, "ifindex": self._need(n.dev)} for n in delete])
        self._bulk("neigh", "replace", [{"dst": n.ip, "lladdr": n.mac, "ifindex": self._need(n.dev),
                                         "state": NUD_PERMANENT} for n in add])
        return add, delete

    # -- addresses, link settings
    def addresses(self, dev: str) -> set[str]:
        """Global (non link-local) addresses on ``dev`` as CIDRs."""
        out = set()
        for a in self._dump("get_addr", index=self._need(dev)):
            ip = ipaddress.ip_address(a.get_attr("IFA_ADDRESS"))
            if ip.is_link_local:
                continue
            out.add(f"{ip}/{a['prefixlen']}")
        return out

    def set_gateway_addresses(self, dev: str, cidrs: Iterable[str]) -> tuple[list[str], list[str]]:
        """Exactly ``cidrs`` (plus kernel link-local) on ``dev``, link up. Returns (added, removed)."""
        idx = self._need(dev)
        want = {str(ipaddress.ip_interface(c)) for c in cidrs}
        have = {str(ipaddress.ip_interface(c)) for c in self.addresses(dev)}
        removed = sorted(have - want)
        added = sorted(want - have)
        for c in removed:
            i = ipaddress.ip_interface(c)
            self._run(self._a.addr("del", index=idx, address=str(i.ip), prefixlen=i.network.prefixlen))
        for c in added:
            i = ipaddress.ip_interface(c)
            self._run(self._a.addr("add", index=idx, address=str(i.ip),
                                   prefixlen=i.network.prefixlen,
                                   **({"flags": 0x02} if i.version == 6 else {})))  # IFA_F_NODAD
        self._run(self._a.link("set", index=idx, state="up"))
        return added, removed

    def link_info(self, dev: str) -> tuple[str, int] | None:
        """(MAC, MTU) of ``dev``, None when absent."""
        idx = self.index(dev)
        if idx is None:
            return None
        link = self._dump("get_links", idx)[0]
        return link.get_attr("IFLA_ADDRESS"), link.get_attr("IFLA_MTU")

    def set_mtu(self, dev: str, mtu: int) -> bool:
        idx = self._need(dev)
        current = self._dump("get_links", idx)[0].get_attr("IFLA_MTU")
        if current == mtu:
            return False
        self._run(self._a.link("set", index=idx, mtu=mtu))
        return True

    def set_forwarding(self, ipv4: bool = True, ipv6: bool = True) -> None:
        """net.ipv4.ip_forward and net.ipv6.conf.all.forwarding, in this applier's namespace."""
        settings = {"net/ipv4/ip_forward": ipv4, "net/ipv6/conf/all/forwarding": ipv6}
        for key, on in settings.items():
            value = "1" if on else "0"
            if self.netns is None:
                path = f"/proc/sys/{key}"
                with open(path) as f:
                    if f.read().strip() == value:
                        continue
                with open(path, "w") as f:
                    f.write(value)
            else:
                subprocess.run(["ip", "netns", "exec", self.netns, "sysctl", "-q", "-w",
                                f"{key.replace('/', '.')}={value}"], check=True)
