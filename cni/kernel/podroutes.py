"""A Pod's interface MTU and routes converged to a :class:`cni.pipeline.podnet.PodNet`: the one
algorithm ADD (its own Pod again when route-sync replaced the state file meanwhile), CHECK (what
would change is what it reports) and route-sync's running-Pod sync (``routesync/apply/pods.py``)
share.

The plugin's routes in a Pod are those of its interface, in the main table, through a gateway,
and not the kernel's own (``RTPROT_KERNEL``: the connected route to the Node's Pod CIDR, IPv6's
link-local and multicast routes): :func:`held` picks them, :func:`plan` is the difference
(``podnet.changes``), both pure.  :func:`apply` and :func:`converge` are the thin netlink part:
the MTU first (the kernel adjusts IPv6 route MTUs to a link's new MTU), then routes added or
replaced, then those no longer wanted deleted.  Standard library only: ADD and CHECK run it per Pod."""

from __future__ import annotations

import _socket as socket  # the C module, as cni.kernel.netlink

from cni.kernel.netlink import RT_TABLE_MAIN, RTPROT_KERNEL, RTPROT_STATIC
from cni.lean.typecheck import TYPE_CHECKING
from cni.pipeline import podnet

if TYPE_CHECKING:
    from collections.abc import Iterable

    from cni.kernel.netlink import Link, Netlink, RouteEntry


def held(routes: Iterable[RouteEntry]) -> list[tuple[str, str, int]]:
    """``(dst, gw, mtu)`` of the plugin's routes among ``routes`` (one interface's, main table):
    through a gateway and not the kernel's."""
    return [(r.dst, r.gw, r.mtu) for r in routes if r.gw and r.proto != RTPROT_KERNEL and r.table == RT_TABLE_MAIN]


def plan(want: podnet.PodNet, link_mtu: int, routes: Iterable[RouteEntry]) -> podnet.PodChanges:
    """What makes an interface of MTU ``link_mtu`` holding ``routes`` hold ``want``."""
    return podnet.changes(want, link_mtu, held(routes))


def routes_of(nl: Netlink, index: int) -> list[RouteEntry]:
    """Both families' main-table routes on interface ``index``."""
    return [r for family in (socket.AF_INET, socket.AF_INET6) for r in nl.routes(family, index, RT_TABLE_MAIN)]


def apply(nl: Netlink, index: int, todo: podnet.PodChanges) -> bool:
    """Carry out ``todo`` on interface ``index``; whether anything was to do."""
    if todo.mtu is not None:
        nl.link_set(index, mtu=todo.mtu)
    for r in todo.put:
        nl.route_add(r.dst, r.gw, index, proto=RTPROT_STATIC, replace=True, mtu=r.mtu)
    for dst, gw in todo.delete:
        nl.route_del(dst, gw, index)  # False when already gone
    return not todo.empty


def converge(nl: Netlink, ifname: str, want: podnet.PodNet) -> bool | None:
    """Make ``ifname`` (in ``nl``'s namespace) hold ``want``: True when something changed,
    False when it already did, None when there is no such interface (the caller says what
    that means: ADD fails, route-sync skips the Pod)."""
    link: Link | None = nl.link_get(ifname)
    if link is None:
        return None
    if link.mtu != want.mtu:  # first, and before the routes are read: it moves IPv6 route MTUs
        nl.link_set(link.index, mtu=want.mtu)
    todo = plan(want, want.mtu, routes_of(nl, link.index))
    return apply(nl, link.index, todo) or link.mtu != want.mtu
