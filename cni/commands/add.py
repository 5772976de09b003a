"""ADD of the ``ferry`` plugin: the Pod's veth, addresses, routes, OVS port and flows.

Reads the conf and the node state, then drives the lean system layer (``cni.kernel.netlink``,
``cni.ovs.ovsdb``, ``cni.ovs.openflow``) and IPAM (``cni.ipam.api``).  ADD pushes an undo for everything
it creates, so a failure at any step leaves nothing behind.  On a Node without
route-sync the bridge and gateway come from :mod:`cni.commands.gateway`.  Imports no other verb:
an ADD loads only what it runs.  Standard library only: this runs once per Pod."""

from __future__ import annotations

import os

from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from cni.kernel.netlink import Netlink
    from cni.ovs.openflow.bridge import OpenFlow
    from cni.ovs.ovsdb import Ovsdb
    from cni.pipeline.podnet import PodNet

from cni.commands.gateway import node_gateway
from cni.commands.rollback import Rollback
from cni.commands.steps import (
    Step,
    external_ids,
    forget_neighbours,
    ipam_for,
    isolate_host_end,
    open_pod_netns,
    ovs_clients,
    pod_net,
    policy_pending,
    random_mac,
    reported,
)
from cni.lean import addr
from cni.node import config as cfg
from cni.node.locks import attachment_lock
from cni.pipeline import tables as pl
from cni.pipeline.flows import GatewayPort, PodPort, base_flows, pod_flows
from cni.pipeline.modes import NETDEV, NETWORK_POLICY_ONLY
from cni.spec.errors import INTERFACE_EXISTS, INVALID_CONFIG, NETLINK_FAILURE, CniError
from cni.spec.request import Request
from cni.spec.result import DNS, Interface, IPConfig, Result, Route


def _requested_ips(req: Request) -> list[str]:
    out = [a for a in req.args.get("IP", "").split(",") if a]
    runtime = req.config.get("runtimeConfig") or {}
    if isinstance(runtime, dict):
        ips = runtime.get("ips") or []
        if not isinstance(ips, list) or not all(isinstance(x, str) for x in ips):
            raise CniError(INVALID_CONFIG, "runtimeConfig.ips must be a list of addresses")
        out += ips
    return out


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
    node = cfg.node_context(conf, need_state=True, wait=req.logger().info)
    if node.mode == NETWORK_POLICY_ONLY:
        from cni.commands import chained  # Ferry chained after the primary CNI: take its interface, no IPAM

        result = chained.add(req, conf, node)
        note_version_limits(req, conf, result)
        return result
    from cni.kernel.netlink import Netlink

    ipam_api, ipam_conf = ipam_for(req.config, node)
    requested = _requested_ips(req)
    podfd = open_pod_netns(req.netns)
    step = Step(req.log)
    try:
        with reported(step), attachment_lock(conf.lock_dir, req.container_id, req.ifname), \
                Netlink() as host_nl, Rollback(req.logger()) as undo:
            ovsdb, of = ovs_clients(node)
            step("gateway")
            gw, install_base = node_gateway(conf, node, ovsdb, host_nl)
            step(f"netns {req.netns}")
            with Netlink.in_netns(podfd) as pod_nl:
                if pod_nl.link_get(req.ifname) is not None:
                    raise CniError(INTERFACE_EXISTS, f"interface {req.ifname!r} already exists in {req.netns}")
                step("IPAM")
                ips = ipam_api.allocate(ipam_conf, req.container_id, req.ifname, requested)
                undo.push("IPAM addresses", lambda: ipam_api.release(ipam_conf, req.container_id, req.ifname))
                for ip in ips:
                    ip.interface = 1
                pod = pod_net(node, conf, ips)
                step("host interface name")
                host = _pick_host_name(req, node, ovsdb, of, host_nl)
                mac = random_mac()
                step(f"veth {host}/{req.ifname}")
                undo.push(f"veth {host}", lambda: host_nl.link_del(host))
                # Born up and promiscuous, its peer down (no carrier, so the Node's stack starts
                # nothing on it yet): two link notifications per ADD instead of four, and each one
                # costs ovs-vswitchd a re-read of every link and route of the Node.
                host_nl.create_veth(host, req.ifname, podfd, pod.mtu, peer_mac=mac, promisc=True, up=True)
                if node.datapath == NETDEV:
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
                blocked = policy_pending(req, node.state, cookie, addresses)
                flows = pod_flows(PodPort(cookie, ofport, mac, addresses), gw.mac, gw.ofport) + blocked
                if install_base:
                    flows = base_flows(GatewayPort(gw.ofport, gw.mac, gw.addresses)) + flows
                undo.push("per-Pod flows", lambda: of.del_flows(cookie))
                of.add_flows(flows)
                step(f"configure {req.ifname} in {req.netns}")
                _configure_pod_interface(pod_nl, podfd, req.ifname, ips, node, pod)
                if node.state is not None and _state_id(conf.state_file) != state_id:
                    # route-sync rewrote the state (a path, the mode or the underlay changed) since
                    # it was read: it may have updated the Node's Pods before this one's port was
                    # in OVS, so this ADD brings its own Pod up to date (docs/design/contracts.md, MTU)
                    step("state file changed: MTUs again")
                    pod = _refresh_pod_net(conf, ips, pod_nl, host_nl, host, req.ifname, pod)
                step(f"ofport of {host}")
                assigned = pending.finish()
                if assigned != ofport:  # vswitchd could not honour the request: flows for the real one
                    req.logger().warning(f"{host}: asked for ofport {ofport}, vswitchd assigned {assigned}")
                    ofport = assigned
                    of.del_flows(cookie)
                    of.add_flows(pod_flows(PodPort(cookie, ofport, mac, addresses), gw.mac, gw.ofport) + blocked)
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


def _refresh_pod_net(conf: cfg.PluginConfig, ips: list[IPConfig], pod_nl: Netlink, host_nl: Netlink, host: str,
                     ifname: str, before: PodNet) -> PodNet:
    """Re-read the node state and converge the new Pod's interface, host veth and routes."""
    node = cfg.node_context(conf, need_state=False)
    pod = pod_net(node, conf, ips)
    if pod != before:
        if pod.mtu != before.mtu:
            host_nl.link_set(host, mtu=pod.mtu)
        sync_pod_routes(pod_nl, ifname, pod)
    return pod


def sync_pod_routes(pod_nl: Netlink, ifname: str, want: PodNet) -> bool:
    """Make ``ifname`` (in ``pod_nl``'s netns) hold ``want`` (a ``cni.pipeline.podnet.PodNet``): its MTU,
    then its routes through a gateway (``cni.kernel.podroutes``, route-sync's too).  Returns whether
    anything changed."""
    from cni.kernel import podroutes

    changed = podroutes.converge(pod_nl, ifname, want)
    if changed is None:
        raise CniError(NETLINK_FAILURE, f"{ifname} vanished from the Pod's netns")
    return changed


def _configure_pod_interface(pod_nl: Netlink, podfd: int, ifname: str, ips: list[IPConfig], node: cfg.NodeContext,
                             pod) -> None:
    index = pod_nl.link_index(ifname)
    if index is None:
        raise CniError(NETLINK_FAILURE, f"{ifname} vanished from the Pod's netns")
    lo = pod_nl.link_get("lo")
    if lo is not None and not lo.up:
        pod_nl.link_set(lo.index, up=True)
    has_v6 = any(ip.family == 6 for ip in ips)
    if has_v6 or node.datapath == NETDEV:
        from cni.kernel.netns import entered

        with entered(podfd):
            if has_v6:  # no DAD for the link-local either: the interface is usable at once
                with open(f"/proc/sys/net/ipv6/conf/{ifname}/accept_dad", "w") as f:
                    f.write("0")
            if node.datapath == NETDEV:  # the userspace datapath never fills in partial checksums
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
