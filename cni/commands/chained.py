"""networkPolicyOnly: Ferry chained after the cluster's primary CNI (e.g. Debian's ``ptp``).

The primary CNI owns addressing and routing: it created the Pod's veth, gave the Pod its
addresses and a default route via a next hop (ptp: the gateway address it put on the host end),
and routes the Pod's addresses to the host end.  Ferry's chained ADD takes that attachment from
``prevResult`` and puts OVS in the middle, so every packet of the Pod crosses Ferry's pipeline
(SpoofGuard, per-Pod counters) while the Node's stack still does the routing:

* the host end of the veth becomes an OVS port (same ``external_ids`` as a normal ADD, so
  route-sync's replay and GC see an ordinary Pod port) and gets the usual per-Pod flows;
* OVS answers the Pod's ARP (IPv4) and neighbour solicitation (IPv6) for its next hop with the
  gateway port's MAC, so the Pod's packets go Pod → OVS → ``ferry-gw0`` → host routing;
* the Node's host route to each Pod address is moved from the veth to ``ferry-gw0`` (same
  metric, so one NLM_F_REPLACE swaps it), so traffic to the Pod enters OVS at the gateway port
  and is delivered by the per-Pod L3/L2 flows;
* netdev only: the host end is kept out of the Node's stack (``arp_ignore=8``, ``rp_filter=1``,
  ``disable_ipv6=1``, as a normal ADD does) and the Pod's TX checksum offload goes off.

Everything ADD changes on the primary CNI's objects is written down in the port's
``external_ids`` (``ferry-chained-*``), and DEL puts exactly that back (routes onto the veth,
sysctls, the IPv6 addresses ``disable_ipv6`` removed, TX checksum offload), then removes Ferry's
port and flows; the veth, addresses and IPAM stay for the primary CNI's own DEL.  ADD returns
``prevResult`` unchanged (it adds nothing the runtime needs to know).

Standard library only, like the rest of the per-Pod path."""

from __future__ import annotations

import os

from cni.commands.steps import HOST_END_ISOLATION, policy_pending
from cni.lean import addr
from cni.lean.record import record
from cni.lean.typecheck import TYPE_CHECKING
from cni.pipeline import tables as pl
from cni.pipeline.chained import next_hop_flows
from cni.pipeline.flows import mac, pod_flows
from cni.pipeline.modes import NETDEV
from cni.pipeline.tables import (
    EXT_CHAINED,
    EXT_CHAINED_GATEWAYS,
    EXT_CHAINED_ROUTES,
    EXT_CHAINED_SYSCTLS,
    EXT_CHAINED_TXCSUM,
    EXT_CHAINED_V6ADDRS,
    Flow,
)
from cni.spec.errors import CHECK_FAILED, INTERFACE_EXISTS, INVALID_CONFIG, NETLINK_FAILURE, CniError

if TYPE_CHECKING:
    from cni.kernel.netlink import Link, Netlink, RouteEntry
    from cni.node.config import NodeContext, PluginConfig
    from cni.ovs.openflow.bridge import OpenFlow
    from cni.ovs.ovsdb import Ovsdb, PortInfo
    from cni.spec.request import Request
    from cni.spec.result import IPConfig, Result


# ---------------------------------------------------------------------------- plan (pure)


@record(frozen=True)
class Attachment:
    """The primary CNI's attachment as ``prevResult`` describes it."""

    ifname: str
    mac: str  # "" when prevResult gives none (read from the Pod's netns then)
    host_name: str  # "" when prevResult lists no host interface
    ips: tuple[IPConfig, ...]

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(i.address for i in self.ips)

    @property
    def gateways(self) -> tuple[str, ...]:
        """The Pod's next hops, one per family, in prevResult's order."""
        out: list[str] = []
        for i in self.ips:
            if i.gateway and not any(addr.family(g) == i.family for g in out):
                out.append(i.gateway)
        return tuple(out)


def attachment(prev: Result | None, ifname: str) -> Attachment:
    """Find the Pod's interface (``sandbox`` set, named ``ifname``) and its addresses in
    ``prevResult``; the host interface is the one without ``sandbox`` (if listed)."""
    if prev is None:
        raise CniError(INVALID_CONFIG, "networkPolicyOnly: ferry must follow the primary CNI in the conflist "
                                       "(ADD without prevResult)")
    pod_index = next((n for n, i in enumerate(prev.interfaces) if i.sandbox and i.name == ifname), None)
    ips = tuple(ip for ip in prev.ips if ip.interface is None or ip.interface == pod_index)
    if not ips:
        raise CniError(INVALID_CONFIG, f"networkPolicyOnly: prevResult has no address for interface {ifname!r}")
    pod_mac = prev.interfaces[pod_index].mac if pod_index is not None else ""
    hosts = [i.name for i in prev.interfaces if not i.sandbox]
    return Attachment(ifname=ifname, mac=pod_mac.lower(), host_name=hosts[0] if len(hosts) == 1 else "", ips=ips)


def host_route_dst(address: str) -> str:
    """The Node's host route to one Pod address: ``10.244.1.5/32``, ``fd00::5/128``."""
    h = addr.host(address)
    return f"{h}/{32 if addr.family(address) == 4 else 128}"


def chained_flows(cookie: pl.Cookie, ofport: int, pod_mac: str, att: Attachment, gateway_mac: str,
                  gateway_ofport: int) -> list[Flow]:
    """Every flow of one chained Pod: the normal per-Pod flows plus its next-hop responder."""
    from cni.pipeline.flows import PodPort

    return (pod_flows(PodPort(cookie, ofport, pod_mac, att.addresses), gateway_mac, gateway_ofport)
            + next_hop_flows(cookie, ofport, att.gateways, gateway_mac))


@record(frozen=True)
class MovedRoute:
    """A host route of the primary CNI to a Pod address, moved to the gateway port by ADD."""

    dst: str  # "10.244.1.5/32"
    proto: int
    metric: int | None


def encode_routes(routes: list[MovedRoute]) -> str:
    return ";".join(f"{r.dst}|{r.proto}|{'' if r.metric is None else r.metric}" for r in routes)


def decode_routes(text: str) -> list[MovedRoute]:
    out = []
    for item in text.split(";"):
        parts = item.split("|")
        if len(parts) != 3:
            continue
        try:
            addr.parse_interface(parts[0])
            out.append(MovedRoute(parts[0], int(parts[1]), int(parts[2]) if parts[2] else None))
        except ValueError:
            continue
    return out


def encode_pairs(values: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in values.items())


def decode_pairs(text: str) -> dict[str, str]:
    out = {}
    for item in text.split(","):
        k, sep, v = item.partition("=")
        if sep and k:
            out[k] = v
    return out


# ---------------------------------------------------------------------------- system helpers


def _sysctl_path(family: str, host: str, key: str) -> str:
    if "/" in host or host in (".", ".."):
        raise ValueError(f"bad interface name {host!r}")
    return f"/proc/sys/net/{family}/conf/{host}/{key}"


def _read_sysctl(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _write_sysctl(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _isolation_values(host: str) -> dict[str, str]:
    """The host end's values of the isolation sysctls, by key; an IPv6 key is left out when the link
    has no IPv6 (an MTU below 1280, or IPv6 off in the kernel): there is none to turn off."""
    values = {}
    for family, key, _ in HOST_END_ISOLATION:
        try:
            values[key] = _read_sysctl(_sysctl_path(family, host, key))
        except FileNotFoundError:
            if family != "ipv6":
                raise
    return values


def _isolate(host: str) -> dict[str, str]:
    """netdev: the host end's frames are the Pod's, not the Node's (cni.commands.steps.isolate_host_end);
    returns the values it replaced."""
    before = _isolation_values(host)
    for family, key, value in HOST_END_ISOLATION:
        if key in before:
            _write_sysctl(_sysctl_path(family, host, key), value)
    return before


def _restore_sysctls(host: str, before: dict[str, str]) -> None:
    for family, key, _ in reversed(HOST_END_ISOLATION):
        if key in before and before[key].lstrip("-").isdigit():
            _write_sysctl(_sysctl_path(family, host, key), before[key])


def _pod_route(host_nl: Netlink, dst: str, index: int) -> RouteEntry | None:
    """The primary CNI's route to ``dst`` on link ``index`` (None: it has none)."""
    family = 10 if ":" in dst else 2
    want = addr.canonical_network(dst)
    for r in host_nl.routes(family=family, index=index):
        if addr.canonical_network(r.dst) == want and not r.gw:
            return r
    return None


def _find_host_link(host_nl: Netlink, pod_link: Link, att: Attachment) -> Link:
    """The host end of the Pod's veth: the Pod interface's peer ifindex (a veth's IFLA_LINK names
    its peer in the other namespace), else the host interface prevResult lists."""
    link = host_nl.link_get(pod_link.peer_index) if pod_link.peer_index else None
    if link is not None and link.peer_index == pod_link.index:
        if att.host_name and att.host_name != link.name:
            raise CniError(INVALID_CONFIG, f"prevResult's host interface {att.host_name} is not the peer "
                                           f"{link.name} of {att.ifname}")
        return link
    if att.host_name:
        link = host_nl.link_get(att.host_name)
        if link is not None:
            return link
    raise CniError(NETLINK_FAILURE, f"cannot find the host end of {att.ifname} (not a veth with its peer in "
                                    "the Node's namespace, and prevResult names no host interface)")


# ---------------------------------------------------------------------------- ADD


def add(req: Request, conf: PluginConfig, node: NodeContext) -> Result:
    from cni.commands.rollback import Rollback
    from cni.commands.steps import Step, open_pod_netns, ovs_clients, reported
    from cni.kernel.netlink import Netlink
    from cni.node.locks import attachment_lock

    att = attachment(req.prev_result, req.ifname)
    if node.state is None:
        raise CniError(INVALID_CONFIG, "networkPolicyOnly needs the node state file")
    gw = node.state.gateway
    podfd = open_pod_netns(req.netns)
    step = Step()
    try:
        with reported(step), attachment_lock(conf.lock_dir, req.container_id, req.ifname), \
                Netlink() as host_nl, Rollback(req.logger()) as undo:
            ovsdb, of = ovs_clients(node)
            step(f"Pod interface {req.ifname}")
            with Netlink.in_netns(podfd) as pod_nl:
                pod_link = pod_nl.link_get(req.ifname)
                if pod_link is None:
                    raise CniError(INVALID_CONFIG, f"interface {req.ifname!r} of prevResult is not in {req.netns}")
                pod_mac = mac(pod_link.mac)
                step("host end of the veth")
                host_link = _find_host_link(host_nl, pod_link, att)
                host = host_link.name
                port = ovsdb.port(host)
                if port is not None:
                    ids = port.external_ids
                    if (ids.get(pl.EXT_CONTAINER_ID), ids.get(pl.EXT_IFNAME)) != (req.container_id, req.ifname):
                        raise CniError(INTERFACE_EXISTS, f"{host} is already an OVS port of another attachment")
                    step(f"leftover OVS port {host}")  # an earlier ADD of this attachment: start over
                    undo_port(host_nl, ovsdb, of, node, port)
                gw_index = host_nl.link_index(gw.name)
                if gw_index is None:
                    raise CniError(NETLINK_FAILURE, f"gateway port {gw.name} has no kernel interface")
                step("host routes to the Pod")
                moved = []
                for ip in att.ips:
                    r = _pod_route(host_nl, host_route_dst(ip.address), host_link.index)
                    moved.append(MovedRoute(host_route_dst(ip.address), r.proto if r else 0, r.metric if r else None))
                ids = _port_ids(req, att, pod_mac)
                ids[EXT_CHAINED_ROUTES] = encode_routes(moved)
                if node.datapath == NETDEV:
                    step(f"TX checksum offload of {req.ifname}")
                    from cni.kernel.ethtool import get_tx_checksum, set_tx_checksum
                    from cni.kernel.netns import entered

                    with entered(podfd):
                        was = get_tx_checksum(req.ifname)
                        set_tx_checksum(req.ifname, False)
                    ids[EXT_CHAINED_TXCSUM] = "1" if was else "0"
                    undo.push(f"TX checksum offload of {req.ifname}", lambda: _set_pod_txcsum(podfd, req.ifname, was))
                    ids[EXT_CHAINED_V6ADDRS] = ",".join(a for a in host_nl.addrs(host_link.index, family=10))
                step(f"OVS port {host}")
                undo.push(f"OVS port {host}", lambda: ovsdb.del_port(node.bridge, host))
                if node.datapath == NETDEV:  # the sysctls' old values go in with the port
                    ids[EXT_CHAINED_SYSCTLS] = encode_pairs(_isolation_values(host))
                ofport = ovsdb.add_port(node.bridge, host, ids)
                step("per-Pod flows")
                cookie = pl.pod_cookie(req.container_id, req.ifname)
                undo.push("per-Pod flows", lambda: of.del_flows(cookie))
                # a namespace with policies: no new connection in or out until route-sync has the
                # Pod's policy in force (as a normal ADD: cni.commands.steps.policy_pending)
                of.add_flows(chained_flows(cookie, ofport, pod_mac, att, gw.mac, gw.ofport)
                             + policy_pending(req, node.state, cookie, att.addresses))
                step(f"host routes to the Pod via {gw.name}")
                undo.push("host routes to the Pod", lambda: _routes_back(host_nl, moved, host_link.index, gw_index))
                for m in moved:
                    host_nl.route_add(m.dst, None, gw_index, metric=m.metric, replace=True)
                if node.datapath == NETDEV:
                    step(f"isolate {host} from the Node's stack")
                    before = decode_pairs(ids[EXT_CHAINED_SYSCTLS])
                    v6 = [a for a in ids[EXT_CHAINED_V6ADDRS].split(",") if a]
                    undo.push(f"sysctls of {host}", lambda: _restore_host(host_nl, host, before, v6))
                    _isolate(host)
                step("forget stale neighbours")
                from cni.commands.steps import forget_neighbours

                forget_neighbours(host_nl, gw.name, list(att.addresses))
                for g in att.gateways:  # the Pod resolves its next hop afresh, through OVS
                    pod_nl.neigh_del(pod_link.index, addr.host(g))
            undo.commit()
    finally:
        os.close(podfd)
    req.logger().info(f"chained: {host} on {node.bridge} port {ofport}, {','.join(att.addresses)}, "
                      f"next hops {','.join(att.gateways) or '-'}")
    assert req.prev_result is not None
    return req.prev_result


def _port_ids(req: Request, att: Attachment, pod_mac: str) -> dict[str, str]:
    from cni.commands.steps import external_ids

    ids = external_ids(req, list(att.ips), pod_mac)
    ids[EXT_CHAINED] = "1"
    ids[EXT_CHAINED_GATEWAYS] = ",".join(att.gateways)
    return ids


def _set_pod_txcsum(podfd: int, ifname: str, on: bool) -> None:
    from cni.kernel.ethtool import set_tx_checksum
    from cni.kernel.netns import entered

    with entered(podfd):
        set_tx_checksum(ifname, on)


def _route_back(host_nl: Netlink, m: MovedRoute, host_index: int | None, gw_index: int | None) -> None:
    """Put the primary CNI's route back on the veth (replacing ours); when the veth is gone,
    just remove ours."""
    if host_index is not None and host_nl.link_get(host_index) is not None and m.proto:
        host_nl.route_add(m.dst, None, host_index, proto=m.proto, metric=m.metric, replace=True)
    elif gw_index is not None:
        host_nl.route_del(m.dst, index=gw_index, metric=m.metric)


def _routes_back(host_nl: Netlink, moved: list[MovedRoute], host_index: int | None, gw_index: int | None) -> None:
    for m in moved:
        _route_back(host_nl, m, host_index, gw_index)


def _restore_host(host_nl: Netlink, host: str, before: dict[str, str], v6addrs: list[str]) -> None:
    """Sysctls back, then the IPv6 addresses that ``disable_ipv6`` removed."""
    link = host_nl.link_get(host)
    if link is None:
        return
    _restore_sysctls(host, before)
    if before.get("disable_ipv6", "1") == "0":
        have = set(host_nl.addrs(link.index, family=10))
        for a in v6addrs:
            if a not in have:
                host_nl.addr_add(link.index, a, nodad=True)


# ---------------------------------------------------------------------------- DEL


def undo_port(host_nl: Netlink, ovsdb: Ovsdb, of: OpenFlow, node: NodeContext, port: PortInfo) -> None:
    """Undo one chained ADD from what its port records: flows, port, routes, sysctls, addresses,
    the Pod's TX checksum offload.  The veth itself is the primary CNI's."""
    from cni.commands.steps import forget_neighbours

    ids = port.external_ids
    cid, ifname = ids.get(pl.EXT_CONTAINER_ID, ""), ids.get(pl.EXT_IFNAME, "")
    of.del_flows(pl.pod_cookie(cid, ifname))
    ovsdb.del_port(node.bridge, port.name)
    link = host_nl.link_get(port.name)
    gw_index = host_nl.link_index(node.gateway_name)
    if link is not None and EXT_CHAINED_SYSCTLS in ids:
        _restore_host(host_nl, port.name, decode_pairs(ids[EXT_CHAINED_SYSCTLS]),
                      [a for a in ids.get(EXT_CHAINED_V6ADDRS, "").split(",") if a])
    for m in decode_routes(ids.get(EXT_CHAINED_ROUTES, "")):
        _route_back(host_nl, m, link.index if link is not None else None, gw_index)
    if EXT_CHAINED_TXCSUM in ids and ids.get(pl.EXT_NETNS):
        _restore_txcsum(ids[pl.EXT_NETNS], ifname, ids[EXT_CHAINED_TXCSUM] == "1")
    forget_neighbours(host_nl, node.gateway_name,
                       [a for a in ids.get(pl.EXT_IPS, "").split(",") if a])


def _restore_txcsum(netns: str, ifname: str, on: bool) -> None:
    """Best effort: the Pod's netns (or its interface) may be gone already at DEL."""
    from cni.kernel.netns import open_netns

    try:
        fd = open_netns(netns)
    except OSError:
        return
    try:
        _set_pod_txcsum(fd, ifname, on)
    except OSError:
        pass
    finally:
        os.close(fd)


def delete(req: Request, conf: PluginConfig, node: NodeContext) -> None:
    """Undo chained ADD (idempotent: nothing recorded, nothing to do); the primary CNI's DEL,
    which runs next, removes its veth, addresses and IPAM record."""
    from cni.commands.steps import Step, ovs_clients, reported
    from cni.kernel.netlink import Netlink
    from cni.node.locks import attachment_lock

    step = Step()
    with reported(step), attachment_lock(conf.lock_dir, req.container_id, req.ifname) as lock, \
            Netlink() as host_nl:
        ovsdb, of = ovs_clients(node)
        step("find OVS port")
        ports = ovsdb.find_ports({pl.EXT_CONTAINER_ID: req.container_id, pl.EXT_IFNAME: req.ifname})
        if not ports and ovsdb.bridge(node.bridge) is not None:
            step("delete per-Pod flows")
            of.del_flows(pl.pod_cookie(req.container_id, req.ifname))
        for p in ports:
            step(f"undo chained port {p.name}")
            undo_port(host_nl, ovsdb, of, node, p)
        lock.remove()


# ---------------------------------------------------------------------------- CHECK


def check(req: Request, conf: PluginConfig, node: NodeContext) -> None:
    """The Pod's interface as prevResult says, its host end on the bridge with every flow, and the
    Node's routes to the Pod on the gateway port."""
    from cni.commands.steps import Step, check_sandbox, open_pod_netns, ovs_clients, reported
    from cni.kernel.netlink import Netlink

    att = attachment(req.prev_result, req.ifname)
    assert req.prev_result is not None
    problems: list[str] = []
    step = Step()
    with reported(step):
        podfd = open_pod_netns(req.netns)
        try:
            step("sandbox interface")
            with Netlink.in_netns(podfd) as pod_nl:
                problems += check_sandbox(req, req.prev_result, pod_nl)
                pod_link = pod_nl.link_get(req.ifname)
        finally:
            os.close(podfd)
        step("OVS port, flows and routes")
        ovsdb, of = ovs_clients(node)
        ports = ovsdb.find_ports({pl.EXT_CONTAINER_ID: req.container_id, pl.EXT_IFNAME: req.ifname})
        with Netlink() as host_nl:
            if not ports:
                problems.append(f"OVS port for {req.container_id}/{req.ifname} is missing from bridge {node.bridge}")
            elif pod_link is not None:
                port = ports[0]
                host = host_nl.link_get(port.name)
                if host is None or host.index != pod_link.peer_index:
                    problems.append(f"OVS port {port.name} is not the host end of {req.ifname}")
                if node.state is not None and port.ofport and port.ofport > 0:
                    cookie = pl.pod_cookie(req.container_id, req.ifname)
                    want = chained_flows(cookie, port.ofport, pod_link.mac, att, node.state.gateway.mac,
                                         node.state.gateway.ofport)
                    have = of.dump_flows(cookie=cookie)
                    if len(have) < len(want):
                        problems.append(f"per-Pod flows missing: {len(have)} of {len(want)} installed")
            gw_index = host_nl.link_index(node.gateway_name)
            for ip in att.ips:
                dst = host_route_dst(ip.address)
                if gw_index is None or _pod_route(host_nl, dst, gw_index) is None:
                    problems.append(f"route {dst} dev {node.gateway_name} is missing")
    if problems:
        raise CniError(CHECK_FAILED, "; ".join(problems))
