"""``bgp.peers[i].address: defaultGateway``: the peer is the Node's default gateway of the peer's
``addressFamily``, read from the main routing table when route-sync starts.  One config (one
ConfigMap for a DaemonSet) then serves Nodes on different segments, each peering with its own
segment's router.

    cfg = gateway.resolve(cfg, Netlink().routes)   # every defaultGateway peer by its address

Pure but for the ``routes_of`` callable (the kernel's routes of one family)."""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from collections.abc import Callable, Sequence

from cni.kernel.netlink import RouteEntry

from ..config import Config, ConfigError

DEFAULT_DST = {4: "0.0.0.0/0", 6: "::/0"}
AF = {4: socket.AF_INET, 6: socket.AF_INET6}


def default_gateway(routes: Sequence[RouteEntry], family: int) -> str | None:
    """The next hop of the default route of ``family`` (the lowest metric among those with a
    gateway that is not link-local: a BGP session needs an address it can bind to without a
    scope); None when there is none."""
    best: tuple[int, str] | None = None
    for r in routes:
        if r.dst != DEFAULT_DST[family] or not r.gw:
            continue
        gw = ipaddress.ip_address(r.gw)
        if gw.version != family or gw.is_link_local:
            continue
        key = (r.metric or 0, str(gw))
        if best is None or key < best:
            best = key
    return best[1] if best else None


def resolve(cfg: Config, routes_of: Callable[[int], Sequence[RouteEntry]]) -> Config:
    """``cfg`` with every ``defaultGateway`` peer replaced by the Node's default gateway of its
    family; :class:`ConfigError` naming the peer's key when the Node has none, or when two peers
    end up at one address."""
    if cfg.bgp is None or not any(p.default_gateway for p in cfg.bgp.peers):
        return cfg
    cache: dict[int, Sequence[RouteEntry]] = {}
    peers = []
    for i, p in enumerate(cfg.bgp.peers):
        if not p.default_gateway:
            peers.append(p)
            continue
        fam = p.address_family or 4
        if fam not in cache:
            cache[fam] = routes_of(AF[fam])
        gw = default_gateway(cache[fam], fam)
        if gw is None:
            raise ConfigError(f"bgp.peers[{i}].address", f"defaultGateway: the Node has no IPv{fam} default route "
                                                         "with a (global) gateway to peer with")
        peers.append(dataclasses.replace(p, address=gw))
    seen: set[str] = set()
    for i, p in enumerate(peers):
        if p.address in seen:
            raise ConfigError(f"bgp.peers[{i}].address", f"{p.address} (the Node's default gateway) is listed twice")
        seen.add(p.address)
    return dataclasses.replace(cfg, bgp=dataclasses.replace(cfg.bgp, peers=tuple(peers)))
