"""ADD, DEL, CHECK, STATUS and GC of the ``ferry`` plugin: thin steps over small backends.

Each command reads the conf and the node state, then drives the lean system layer
(``cni.kernel.netlink``, ``cni.ovs.ovsdb``, ``cni.ovs.ofctl``) and IPAM (``ipam.api``).  ADD pushes an undo
for everything it creates, so a failure at any step leaves nothing behind.  Standard library
only: this runs once per Pod."""

from __future__ import annotations

import os

from cni.lean.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

    from cni.kernel.netlink import Netlink
    from cni.ovs.openflow.bridge import OpenFlow
    from cni.ovs.ovsdb import Ovsdb
    from cni.pipeline.podnet import PodNet
    from ipam.api import IpamConfig

from cni.commands.rollback import Rollback
from cni.commands.steps import (
    Step,
    check_sandbox,
    external_ids,
    forget_neighbours,
    isolate_host_end,
    open_pod_netns,
    ovs_clients,
    reported,
)
from cni.lean import addr
from cni.node import config as cfg
from cni.node.locks import attachment_lock, locked
from cni.pipeline import tables as pl
from cni.pipeline.flows import GatewayPort, PodPort, base_flows, pod_flows
from cni.spec.errors import (
    CHECK_FAILED,
    INTERFACE_EXISTS,
    INVALID_CONFIG,
    NETLINK_FAILURE,
    NOT_READY,
    OVS_FAILURE,
    CniError,
)
from cni.spec.request import Request
from cni.spec.result import DNS, Interface, IPConfig, Result, Route

# ---------------------------------------------------------------------------- helpers


def _random_mac() -> str:
    b = bytearray(os.urandom(6))
    b[0] = (b[0] & 0xFC) | 0x02  # unicast, locally administered
    return ":".join(f"{x:02x}" for x in b)


def _ipam(conf_dict: dict, node: cfg.NodeContext) -> tuple[ModuleType, IpamConfig]:
    from ipam import api as ipam_api

    return ipam_api, ipam_api.parse_config(conf_dict, node.pod_cidrs)


def _requested_ips(req: Request) -> list[str]:
    out = [a for a in req.args.get("IP", "").split(",") if a]
    runtime = req.config.get("runtimeConfig") or {}
    if isinstance(runtime, dict):
        ips = runtime.get("ips") or []
        if not isinstance(ips, list) or not all(isinstance(x, str) for x in ips):
            raise CniError(INVALID_CONFIG, "runtimeConfig.ips must be a list of addresses")
        out += ips
    return out


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


def _lone_gateway(conf: cfg.PluginConfig, node: cfg.NodeContext, ovsdb: Ovsdb, host_nl: Netlink) -> tuple[Gateway, bool]:
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
            gw_mac = _random_mac()
            ovsdb.add_port(node.bridge, pl.GATEWAY_PORT, {pl.EXT_OWNER: "node", pl.EXT_MAC: gw_mac},
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
    if link is None or not link.up or link.mtu != node.mtu or link.mac != (port.external_ids.get(pl.EXT_MAC) or link.mac):
        return None
    cidrs = _gateway_cidrs(node.pod_cidrs)
    if not set(cidrs) <= set(host_nl.addrs(link.index)):
        return None
    return Gateway(port.ofport, link.mac, cidrs)


def _gateway(conf: cfg.PluginConfig, node: cfg.NodeContext, ovsdb: Ovsdb, host_nl: Netlink) -> tuple[Gateway, bool]:
    if node.state is not None:
        g = node.state.gateway
        return Gateway(g.ofport, g.mac, tuple(g.addresses)), False
    return _lone_gateway(conf, node, ovsdb, host_nl)


def _pick_host_name(req: Request, node: cfg.NodeContext, ovsdb: Ovsdb, of: OpenFlow, host_nl: Netlink) -> str:
    """The host veth name; a leftover of an earlier failed attempt of this attachment is removed,
    a name held by another attachment (a hash collision) moves us to the next salt."""
    for salt in range(8):
        name = pl.host_veth_name(req.container_id, req.ifname, salt)
        if host_nl.link_get(name) is None:
            return name
        port = ovsdb.port(name)
        ours = port is None or (port.external_ids.get(pl.EXT_CONTAINER_ID) == req.container_id
                                and port.external_ids.get(pl.EXT_IFNAME) == req.ifname)
        if ours:
            req.logger().warning(f"removing leftover {name} of an earlier attempt of {req.container_id}/{req.ifname}")
            of.del_flows(pl.pod_cookie(req.container_id, req.ifname))
            if port is not None:
                ovsdb.del_port(node.bridge, name)
            host_nl.link_del(name)
            return name
    raise CniError(INTERFACE_EXISTS, f"no free host interface name for {req.container_id}/{req.ifname}")


def _dns(conf: cfg.PluginConfig) -> DNS:
    d = conf.dns
    return DNS(nameservers=list(d.get("nameservers") or []), domain=str(d.get("domain") or ""),
               search=list(d.get("search") or []), options=list(d.get("options") or []))


# ---------------------------------------------------------------------------- ADD


NOTED_PREFIX = "cni-version-noted-"  # + cniVersion: beside the state file, once per boot (a tmpfs)


def note_version_limits(req: Request, conf: cfg.PluginConfig, result: Result) -> None:
    """Say once (per Node boot and cniVersion) what the conflist's version cannot carry.

    A conflist below 1.1.0 is the install's choice for a runtime whose libcni reads no newer
    results (install-cni --cni-version auto); the result then leaves out the MTUs, and the runtime
    never calls STATUS or GC. Once, not per ADD: a marker file beside the state file records it."""
    dropped = result.left_out(req.cni_version)
    if not dropped:
        return
    marker = os.path.join(os.path.dirname(conf.state_file) or ".", NOTED_PREFIX + req.cni_version)
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
    except FileExistsError:
        return
    except OSError as e:
        req.logger().debug(f"cannot create {marker}: {e}")  # say it anyway; it may repeat
    req.logger().info(
        f"cniVersion {req.cni_version} (the conflist's; 1.1 features off): results leave out "
        f"{', '.join(dropped)}; STATUS and GC need 1.1.0 and are not called. Said once per boot ({marker})")


def add(req: Request) -> Result:
    conf = cfg.parse(req.config)
    state_id = _state_id(conf.state_file)  # before the read: a later replacement is noticed
    node = cfg.node_context(conf, need_state=True)
    if node.mode == "networkPolicyOnly":
        from cni.commands import chained  # Ferry chained after the primary CNI: take its interface, no IPAM

        result = chained.add(req, conf, node)
        note_version_limits(req, conf, result)
        return result
    from cni.kernel.netlink import Netlink

    ipam_api, ipam_conf = _ipam(req.config, node)
    requested = _requested_ips(req)
    podfd = open_pod_netns(req.netns)
    step = Step(req.log)
    try:
        with reported(step), attachment_lock(conf.lock_dir, req.container_id, req.ifname), Netlink() as host_nl, Rollback(req.logger()) as undo:
            ovsdb, of = ovs_clients(node)
            step("gateway")
            gw, install_base = _gateway(conf, node, ovsdb, host_nl)
            step(f"netns {req.netns}")
            with Netlink.in_netns(podfd) as pod_nl:
                if pod_nl.link_get(req.ifname) is not None:
                    raise CniError(INTERFACE_EXISTS, f"interface {req.ifname!r} already exists in {req.netns}")
                step("IPAM")
                ips = ipam_api.allocate(ipam_conf, req.container_id, req.ifname, requested)
                undo.push("IPAM addresses", lambda: ipam_api.release(ipam_conf, req.container_id, req.ifname))
                for ip in ips:
                    ip.interface = 1
                pod = _pod_net(node, conf, ips)
                step("host interface name")
                host = _pick_host_name(req, node, ovsdb, of, host_nl)
                mac = _random_mac()
                step(f"veth {host}/{req.ifname}")
                undo.push(f"veth {host}", lambda: host_nl.link_del(host))
                # Born up and promiscuous, its peer down (no carrier, so the Node's stack starts
                # nothing on it yet): two link notifications per ADD instead of four, and each one
                # costs ovs-vswitchd a re-read of every link and route of the Node.
                host_nl.create_veth(host, req.ifname, podfd, pod.mtu, peer_mac=mac, promisc=True, up=True)
                if node.datapath == "netdev":
                    step(f"isolate {host} from the Node's stack")
                    isolate_host_end(host)  # before the carrier: no frame of the Pod's reaches the stack
                step(f"OVS port {host}")
                # Undo first: an insert whose ofport never comes (vswitchd down) stays in OVSDB.
                undo.push(f"OVS port {host}", lambda: ovsdb.del_port(node.bridge, host))
                # The port's rows are committed with a requested ofport, and the flows go in while
                # vswitchd opens the interface and the Pod's side is configured: all three side by side.
                pending = ovsdb.add_port_start(node.bridge, host, external_ids(req, ips, mac),
                                               ofports=pl.pod_ofports(req.container_id, req.ifname))
                step("per-Pod flows")
                cookie = pl.pod_cookie(req.container_id, req.ifname)
                addresses = tuple(i.address for i in ips)
                ofport = pending.ofport_request if pending.ofport_request is not None else pending.finish()
                flows = pod_flows(PodPort(cookie, ofport, mac, addresses), gw.mac, gw.ofport)
                if install_base:
                    flows = base_flows(GatewayPort(gw.ofport, gw.mac, gw.addresses)) + flows
                undo.push("per-Pod flows", lambda: of.del_flows(cookie))
                of.add_flows(flows)
                step(f"configure {req.ifname} in {req.netns}")
                _configure_pod_interface(pod_nl, podfd, req.ifname, ips, node, pod)
                if node.state is not None and _state_id(conf.state_file) != state_id:
                    # route-sync rewrote the state (a path, the mode or the underlay changed) since
                    # it was read: it may have updated the Node's Pods before this one's port was
                    # in OVS, so this ADD brings its own Pod up to date (docs/design.md, MTU)
                    step("state file changed: MTUs again")
                    pod = _refresh_pod_net(conf, ips, pod_nl, host_nl, host, req.ifname, pod)
                step(f"ofport of {host}")
                assigned = pending.finish()
                if assigned != ofport:  # vswitchd could not honour the request: flows for the real one
                    req.logger().warning(f"{host}: asked for ofport {ofport}, vswitchd assigned {assigned}")
                    ofport = assigned
                    of.del_flows(cookie)
                    of.add_flows(pod_flows(PodPort(cookie, ofport, mac, addresses), gw.mac, gw.ofport))
                step("forget stale neighbours")
                forget_neighbours(host_nl, node.gateway_name, [i.address for i in ips])
                step("announce addresses")
                _announce(podfd, req.ifname, mac, ips, req.logger())
            undo.commit()
    finally:
        os.close(podfd)
    step.report(req.logger(), "ADD")
    req.logger().info(f"{host} on {node.bridge} port {ofport}, {','.join(i.address for i in ips)}")
    result = Result(
        interfaces=[Interface(name=host), Interface(name=req.ifname, mac=mac, sandbox=req.netns, mtu=pod.mtu)],
        ips=ips, routes=[Route(dst=r.dst, gw=r.gw, mtu=r.mtu) for r in pod.routes], dns=_dns(conf))
    note_version_limits(req, conf, result)
    return result


def _state_id(path: str) -> tuple[int, int] | None:
    """(inode, mtime) of the state file: route-sync replaces it by rename, so a new inode."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _pod_net(node: cfg.NodeContext, conf: cfg.PluginConfig, ips: list[IPConfig]) -> PodNet:
    """The Pod's interface MTU and routes (``cni.pipeline.podnet``: per-path MTUs)."""
    from cni.pipeline import podnet

    gateways = {ip.family: ip.gateway for ip in ips if ip.gateway}
    return podnet.for_state(node.state, gateways, conf.mtu, fallback_mtu=node.mtu)


def _refresh_pod_net(conf: cfg.PluginConfig, ips: list[IPConfig], pod_nl: Netlink, host_nl: Netlink, host: str,
                     ifname: str, before: PodNet) -> PodNet:
    """Re-read the node state and converge the new Pod's interface, host veth and routes."""
    node = cfg.node_context(conf, need_state=False)
    pod = _pod_net(node, conf, ips)
    if pod != before:
        if pod.mtu != before.mtu:
            host_nl.link_set(host, mtu=pod.mtu)
        sync_pod_routes(pod_nl, ifname, pod)
    return pod


def sync_pod_routes(pod_nl: Netlink, ifname: str, want: PodNet) -> bool:
    """Make ``ifname`` (in ``pod_nl``'s netns) hold ``want`` (a ``cni.pipeline.podnet.PodNet``): its MTU,
    then its routes through a gateway.  Returns whether anything changed."""
    import _socket

    from cni.pipeline import podnet

    link = pod_nl.link_get(ifname)
    if link is None:
        raise CniError(NETLINK_FAILURE, f"{ifname} vanished from the Pod's netns")
    if link.mtu != want.mtu:
        pod_nl.link_set(link.index, mtu=want.mtu)  # first: the kernel adjusts IPv6 route MTUs to it
    have = [(r.dst, r.gw, r.mtu) for af in (_socket.AF_INET, _socket.AF_INET6)
            for r in pod_nl.routes(family=af, index=link.index) if r.gw and r.proto != 2]
    todo = podnet.changes(want, want.mtu, have)
    for r in todo.put:
        pod_nl.route_add(r.dst, r.gw, link.index, replace=True, mtu=r.mtu)
    for dst, gw in todo.delete:
        pod_nl.route_del(dst, gw, link.index)
    return link.mtu != want.mtu or bool(todo.put or todo.delete)


def _configure_pod_interface(pod_nl: Netlink, podfd: int, ifname: str, ips: list[IPConfig], node: cfg.NodeContext,
                             pod) -> None:
    index = pod_nl.link_index(ifname)
    if index is None:
        raise CniError(NETLINK_FAILURE, f"{ifname} vanished from the Pod's netns")
    lo = pod_nl.link_get("lo")
    if lo is not None and not lo.up:
        pod_nl.link_set(lo.index, up=True)
    has_v6 = any(ip.family == 6 for ip in ips)
    if has_v6 or node.datapath == "netdev":
        from cni.kernel.netns import entered

        with entered(podfd):
            if has_v6:  # no DAD for the link-local either: the interface is usable at once
                with open(f"/proc/sys/net/ipv6/conf/{ifname}/accept_dad", "w") as f:
                    f.write("0")
            if node.datapath == "netdev":  # the userspace datapath never fills in partial checksums
                from cni.kernel.ethtool import set_tx_checksum

                set_tx_checksum(ifname, False)
    for ip in ips:
        pod_nl.addr_add(index, ip.address, nodad=True)
    pod_nl.link_set(index, up=True)
    for r in pod.routes:  # the default route first: the others go through the same gateway
        pod_nl.route_add(r.dst, r.gw, index, mtu=r.mtu)


def _announce(podfd: int, ifname: str, mac: str, ips: list[IPConfig], log: Any) -> None:
    """Gratuitous ARP / unsolicited NA from the Pod, sent by a forked child that the plugin does
    not wait for: opening and closing an AF_PACKET socket costs ~16 ms of kernel RCU grace period
    (packet_release -> synchronize_net), a third of an ADD, for a courtesy message (OVS forwards
    it to the gateway port; the Node's cache was already flushed)."""
    from cni.kernel.announce import garp_frame, na_frame

    frames = []
    for ip in ips:
        host = addr.host(ip.address)
        frames.append(garp_frame(mac, host) if ip.family == 4 else na_frame(mac, host))
    try:
        pid = os.fork()
    except OSError as e:
        log.warning(f"could not announce on {ifname}: {e}")
        return
    if pid:
        return
    try:  # the child: never touches the CNI result, exits on its own
        import _socket

        from cni.kernel.netns import setns

        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        setns(podfd)
        sock = _socket.socket(_socket.AF_PACKET, _socket.SOCK_RAW | _socket.SOCK_CLOEXEC)
        sock.bind((ifname, 0))
        for frame in frames:
            sock.send(frame)
    finally:
        os._exit(0)


# ---------------------------------------------------------------------------- DEL


class _Background:
    """One blocking call on a thread of its own (the GIL is released in its syscalls) while the
    caller goes on; :meth:`join` waits for it and re-raises what it raised."""

    __slots__ = ("_done", "error")

    def __init__(self, call: Any) -> None:
        import _thread  # built in: threading's import is not worth it for one thread

        self.error: BaseException | None = None
        self._done = _thread.allocate_lock()
        self._done.acquire()
        _thread.start_new_thread(self._run, (call,))

    def _run(self, call: Any) -> None:
        try:
            call()
        except BaseException as e:  # noqa: BLE001 (handed to join(), which re-raises it)
            self.error = e
        finally:
            self._done.release()

    def join(self) -> None:
        self._done.acquire()
        if self.error is not None:
            raise self.error


def _delete_links(names: list[str]) -> None:
    from cni.kernel.netlink import Netlink

    with Netlink() as nl:  # a socket of its own: the caller's is busy meanwhile
        for name in names:
            nl.link_del(name)


def delete(req: Request) -> None:
    conf = cfg.parse(req.config)
    node = cfg.node_context(conf, need_state=False)
    if node.mode == "networkPolicyOnly":
        from cni.commands import chained

        return chained.delete(req, conf, node)
    from cni.kernel.netlink import Netlink

    step = Step(req.log)
    with reported(step), attachment_lock(conf.lock_dir, req.container_id, req.ifname) as lock, Netlink() as host_nl:
        ovsdb, of = ovs_clients(node)
        step("find OVS port")
        ports = ovsdb.find_ports({pl.EXT_CONTAINER_ID: req.container_id, pl.EXT_IFNAME: req.ifname})
        names = sorted({p.name for p in ports} | {pl.host_veth_name(req.container_id, req.ifname)})
        # The kernel takes 15-20 ms to unregister a veth pair (RCU grace periods), most of a DEL,
        # and OVS takes its time to drop flows and ports: the veths go on a thread meanwhile.
        # The veth goes before its port: deleted while ovs-vswitchd still holds its AF_PACKET
        # socket (netdev), the kernel's unregister would wait for that reference.
        step("delete veths")
        veths = _Background(lambda: _delete_links(names))
        try:
            step("delete per-Pod flows")
            if ports or ovsdb.bridge(node.bridge) is not None:
                of.del_flows(pl.pod_cookie(req.container_id, req.ifname))
            for p in ports:
                step(f"delete OVS port {p.name}")
                ovsdb.del_port(node.bridge, p.name)
                step("forget stale neighbours")
                forget_neighbours(host_nl, node.gateway_name,
                                   [a for a in p.external_ids.get(pl.EXT_IPS, "").split(",") if a])
        finally:
            step("wait for the veths to go")
            veths.join()
        step("IPAM release")
        from ipam import api as ipam_api

        # Releasing is keyed by (container ID, ifname): it needs the store, not the ranges, so a
        # DEL while the node state is gone (route-sync down, /run cleared) still frees them. The
        # plugin always allocates through ferry-ipam (an absent ipam section means its defaults).
        ipam_api.release(ipam_api.release_config(req.config), req.container_id, req.ifname)
        lock.remove()
    step.report(req.logger(), "DEL")


# ---------------------------------------------------------------------------- CHECK


def check(req: Request) -> None:
    conf = cfg.parse(req.config)
    node = cfg.node_context(conf, need_state=False)
    if node.mode == "networkPolicyOnly":
        from cni.commands import chained

        return chained.check(req, conf, node)
    prev = req.prev_result
    if prev is None:
        raise CniError(INVALID_CONFIG, "CHECK needs prevResult")
    step = Step()
    with reported(step):
        problems = _check(req, prev, node, conf, step)
    if problems:
        raise CniError(CHECK_FAILED, "; ".join(problems))


def _check(req: Request, prev: Result, node: cfg.NodeContext, conf: cfg.PluginConfig, step: Step) -> list[str]:
    from cni.kernel.netlink import Netlink

    problems: list[str] = []
    podfd = open_pod_netns(req.netns)
    step("sandbox interface")
    try:
        with Netlink.in_netns(podfd) as pod_nl:
            problems += check_sandbox(req, prev, pod_nl)
            problems += _check_mtus(req, _pod_net(node, conf, prev.ips), pod_nl)
    finally:
        os.close(podfd)
    step("OVS port and flows")
    ovsdb, of = ovs_clients(node)
    ports = ovsdb.find_ports({pl.EXT_CONTAINER_ID: req.container_id, pl.EXT_IFNAME: req.ifname})
    host_names = [i.name for i in prev.interfaces if not i.sandbox]
    if not ports:
        problems.append(f"OVS port for {req.container_id}/{req.ifname} is missing from bridge {node.bridge}")
    else:
        port = ports[0]
        if host_names and port.name not in host_names:
            problems.append(f"OVS port {port.name} is not the host interface {host_names[0]} of prevResult")
        want_ips = ",".join(i.address for i in prev.ips)
        if port.external_ids.get(pl.EXT_IPS) != want_ips:
            problems.append(f"OVS port {port.name} external_ids {pl.EXT_IPS}={port.external_ids.get(pl.EXT_IPS)!r},"
                            f" expected {want_ips!r}")
        with Netlink() as host_nl:
            if host_nl.link_get(port.name) is None:
                problems.append(f"host veth {port.name} is missing")
        cookie = pl.pod_cookie(req.container_id, req.ifname)
        installed = of.dump_flows(cookie=cookie)
        sandbox = next((i for i in prev.interfaces if i.sandbox), None)
        if sandbox is not None and port.ofport and port.ofport > 0:
            gw_mac, gw_ofport = _gateway_port(node, ovsdb)
            want = pod_flows(PodPort(cookie, port.ofport, sandbox.mac, tuple(i.address for i in prev.ips)), gw_mac,
                             gw_ofport)
            if len(installed) < len(want):
                problems.append(f"per-Pod flows missing: {len(installed)} of {len(want)} installed "
                                f"(cookie {cookie.match()})")
    if conf.ipam or node.pod_cidrs:
        ipam_api, ipam_conf = _ipam(req.config, node)
        try:
            ipam_api.check(ipam_conf, req.container_id, req.ifname, [i.address for i in prev.ips])
        except CniError as e:
            problems.append(e.msg)
    return problems


def _gateway_port(node: cfg.NodeContext, ovsdb: Ovsdb) -> tuple[str, int | None]:
    if node.state is not None:
        return node.state.gateway.mac, node.state.gateway.ofport
    port = ovsdb.port(pl.GATEWAY_PORT)
    if port is None:
        return "00:00:00:00:00:00", None
    return port.mac_in_use or "00:00:00:00:00:00", port.ofport


def _check_mtus(req: Request, want: PodNet, pod_nl: Netlink) -> list[str]:
    """The interface MTU and each route's MTU as the Node's paths want them now (route-sync
    keeps running Pods at that, so a prevResult from before a mode change is not the measure)."""
    import _socket

    from cni.pipeline import podnet

    link = pod_nl.link_get(req.ifname)
    if link is None:
        return []  # said by check_sandbox
    have = [(r.dst, r.gw, r.mtu) for af in (_socket.AF_INET, _socket.AF_INET6)
            for r in pod_nl.routes(family=af, index=link.index) if r.gw and r.proto != 2]
    todo = podnet.changes(want, link.mtu, have)
    problems = []
    if todo.mtu is not None:
        problems.append(f"interface {req.ifname} has MTU {link.mtu}, the Node's paths want {want.mtu}")
    present = {(addr.canonical_network(d), addr.host(g)): m for d, g, m in have}
    for r in todo.put:
        m = present.get((addr.canonical_network(r.dst), addr.host(r.gw)))
        problems.append(f"route {r.dst} via {r.gw} " + ("is missing" if m is None else f"has MTU {m or '-'}")
                        + f" in {req.ifname}, wanted MTU {r.mtu or '-'}")
    return problems


# ---------------------------------------------------------------------------- STATUS, GC


def status(req: Request) -> None:
    conf = cfg.parse(req.config)
    try:
        node = cfg.node_context(conf, need_state=True)
    except CniError as e:
        raise CniError(NOT_READY, e.msg) from None
    ovsdb, _ = ovs_clients(node)
    try:
        if node.state is not None and ovsdb.bridge(node.bridge) is None:
            raise CniError(NOT_READY, f"bridge {node.bridge} does not exist")
        if node.state is None:
            ovsdb.bridge(node.bridge)  # reachable is enough: ADD creates the bridge on a lone Node
    except CniError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to reach OVS means "not ready"
        raise CniError(NOT_READY, f"Open vSwitch is not reachable at {node.ovsdb}: {e}") from None
    ipam_api, ipam_conf = _ipam(req.config, node)
    ipam_api.status(ipam_conf)


def gc(req: Request) -> None:
    conf = cfg.parse(req.config)
    node = cfg.node_context(conf, need_state=False)
    valid = set()
    for a in req.config.get("cni.dev/valid-attachments") or []:
        if isinstance(a, dict):
            valid.add((str(a.get("containerID", "")), str(a.get("ifname", ""))))
    from cni.kernel.netlink import Netlink

    ovsdb, of = ovs_clients(node)
    released = []
    step = Step()
    step("GC of OVS ports")
    with reported(step), Netlink() as host_nl:
        for port in ovsdb.find_ports({pl.EXT_OWNER: "pod"}):
            cid, ifname = port.external_ids.get(pl.EXT_CONTAINER_ID, ""), port.external_ids.get(pl.EXT_IFNAME, "")
            if (cid, ifname) in valid:
                continue
            if port.external_ids.get("ferry-chained"):  # the veth is the primary CNI's: undo only ours
                from cni.commands import chained

                chained.undo_port(host_nl, ovsdb, of, node, port)
            else:
                of.del_flows(pl.pod_cookie(cid, ifname))
                ovsdb.del_port(node.bridge, port.name)
                host_nl.link_del(port.name)
            released.append(f"{cid}/{ifname}")
    if conf.ipam or node.pod_cidrs:
        ipam_api, ipam_conf = _ipam(req.config, node)
        for cid, ifname in ipam_api.gc(ipam_conf, valid):
            released.append(f"{cid}/{ifname} (IPAM)")
    req.logger().info(f"GC released {len(released)} attachments: {', '.join(released) or '-'}")
