"""The lone Node's bridge and gateway port, and the gateway every ADD and CHECK uses.

With route-sync running, the node state file names the gateway (its MAC, OpenFlow port and
addresses) and route-sync keeps the bridge; without it (a lone Node: the plugin alone, as in
``cnitool`` tests and ``make demo``) the first ADD creates the bridge, the gateway port with its
MAC and addresses, and says the base flows must be installed.  Standard library only: this runs
once per Pod."""

from __future__ import annotations

from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from cni.kernel.netlink import Netlink
    from cni.ovs.ovsdb import Ovsdb

from cni.commands.steps import random_mac
from cni.lean import addr
from cni.lean.record import record
from cni.node import config as cfg
from cni.node.locks import locked
from cni.pipeline import tables as pl
from cni.spec.errors import OVS_FAILURE, CniError


@record(frozen=True)
class Gateway:
    ofport: int
    mac: str
    addresses: tuple[str, ...]


def _gateway_cidrs(pod_cidrs: list[str]) -> tuple[str, ...]:
    out = []
    for c in pod_cidrs:
        out.append(addr.first_host_cidr(c))
    return tuple(out)


def _lone_gateway(conf: cfg.PluginConfig, node: cfg.NodeContext, ovsdb: Ovsdb,
                  host_nl: Netlink) -> tuple[Gateway, bool]:
    """On a Node without route-sync: the bridge and gateway port, created when absent.
    Returns the gateway and whether the base flows must be (re)installed.

    Once they are in place (every ADD but the first) a look without the Node lock suffices, so
    concurrent ADDs do not queue on it."""
    ready = _lone_gateway_ready(node, ovsdb, host_nl)
    if ready is not None:
        return ready, False
    with locked(conf.lock_dir, "node"):
        created = False
        if ovsdb.bridge(node.bridge) is None:
            ovsdb.ensure_bridge(node.bridge, node.datapath)
            created = True
        port = ovsdb.port(pl.GATEWAY_PORT)
        if port is None or port.ofport is None or port.ofport < 0:
            gw_mac = random_mac()
            ovsdb.add_port(node.bridge, pl.GATEWAY_PORT, {pl.EXT_OWNER: pl.OWNER_NODE, pl.EXT_MAC: gw_mac},
                           iface_type="internal", mac=gw_mac)
            port = ovsdb.port(pl.GATEWAY_PORT)
            created = True
        if port is None or port.ofport is None or port.ofport < 0:
            raise CniError(OVS_FAILURE, f"gateway port {pl.GATEWAY_PORT} got no OpenFlow port"
                           + (f" ({port.error})" if port is not None and port.error else ""))
        link = host_nl.link_get(pl.GATEWAY_PORT)
        if link is None:
            raise CniError(OVS_FAILURE, f"gateway port {pl.GATEWAY_PORT} has no kernel interface")
        # ovs-vswitchd applies Interface:mac after it assigns the ofport; set it ourselves so the
        # kernel, OVS and the flows agree from the first moment (the ARP responder answers with it).
        gw_mac = port.external_ids.get(pl.EXT_MAC) or link.mac
        if link.mac != gw_mac:
            host_nl.link_set(link.index, mac=gw_mac)
            link = host_nl.link_get(pl.GATEWAY_PORT)
            if link is None:
                raise CniError(OVS_FAILURE, f"gateway port {pl.GATEWAY_PORT} went away while being set up")
        cidrs = _gateway_cidrs(node.pod_cidrs)
        have = set(host_nl.addrs(link.index))
        for c in cidrs:
            if c not in have:
                host_nl.addr_add(link.index, c, nodad=True)
        if not link.up or link.mtu != node.mtu:
            host_nl.link_set(link.index, up=True, mtu=node.mtu)
        return Gateway(port.ofport, link.mac, cidrs), created


def _lone_gateway_ready(node: cfg.NodeContext, ovsdb: Ovsdb, host_nl: Netlink) -> Gateway | None:
    """The lone Node's gateway when its port, MAC, state and addresses are all as
    :func:`_lone_gateway` leaves them; None when anything is missing."""
    port = ovsdb.port(pl.GATEWAY_PORT)
    if port is None or port.ofport is None or port.ofport < 0:
        return None
    link = host_nl.link_get(pl.GATEWAY_PORT)
    if (link is None or not link.up or link.mtu != node.mtu
            or link.mac != (port.external_ids.get(pl.EXT_MAC) or link.mac)):
        return None
    cidrs = _gateway_cidrs(node.pod_cidrs)
    if not set(cidrs) <= set(host_nl.addrs(link.index)):
        return None
    return Gateway(port.ofport, link.mac, cidrs)


def node_gateway(conf: cfg.PluginConfig, node: cfg.NodeContext, ovsdb: Ovsdb, host_nl: Netlink) -> tuple[Gateway, bool]:
    """The gateway ADD plugs a Pod behind, and whether the base flows must be installed: route-sync's
    (from the node state; never) or the lone Node's (created when absent; yes when just created)."""
    if node.state is not None:
        g = node.state.gateway
        return Gateway(g.ofport, g.mac, tuple(g.addresses)), False
    return _lone_gateway(conf, node, ovsdb, host_nl)


def gateway_port(node: cfg.NodeContext, ovsdb: Ovsdb) -> tuple[str, int | None]:
    """The gateway's MAC and OpenFlow port, as CHECK plans the per-Pod flows to compare; a zero MAC
    and no port on a lone Node that has none yet."""
    if node.state is not None:
        return node.state.gateway.mac, node.state.gateway.ofport
    port = ovsdb.port(pl.GATEWAY_PORT)
    if port is None:
        return "00:00:00:00:00:00", None
    return port.mac_in_use or "00:00:00:00:00:00", port.ofport
