"""CHECK of the ``ferry`` plugin: is the attachment still what prevResult says and the Node wants?

Looks, never changes: the sandbox interface, its addresses, routes and MTUs, the OVS port and its
external_ids, the per-Pod flows and the IPAM record; every problem found is reported in one
``CniError``.  Standard library only: this runs once per Pod."""

from __future__ import annotations

import os

from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from cni.kernel.netlink import Netlink
    from cni.pipeline.podnet import PodNet

from cni.commands.gateway import gateway_port
from cni.commands.steps import Step, check_sandbox, ipam_for, open_pod_netns, ovs_clients, pod_net, reported
from cni.lean import addr
from cni.node import config as cfg
from cni.node.locks import attachment_lock
from cni.pipeline import tables as pl
from cni.pipeline.flows import PodPort, pod_flows
from cni.pipeline.modes import NETWORK_POLICY_ONLY
from cni.spec.errors import CHECK_FAILED, INVALID_CONFIG, CniError
from cni.spec.request import Request
from cni.spec.result import Result


def check(req: Request) -> None:
    """Under the attachment's lock (``cni.node.locks``): what CHECK looks at is never half made by
    an ADD, half undone by a DEL or GC, or half converged by route-sync's Pod MTU sync."""
    conf = cfg.parse(req.config)
    node = cfg.node_context(conf, need_state=False)
    with attachment_lock(conf.lock_dir, req.container_id, req.ifname):
        if node.mode == NETWORK_POLICY_ONLY:
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
            problems += _check_mtus(req, pod_net(node, conf, prev.ips), pod_nl)
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
            gw_mac, gw_ofport = gateway_port(node, ovsdb)
            want = pod_flows(PodPort(cookie, port.ofport, sandbox.mac, tuple(i.address for i in prev.ips)), gw_mac,
                             gw_ofport)
            if len(installed) < len(want):
                problems.append(f"per-Pod flows missing: {len(installed)} of {len(want)} installed "
                                f"(cookie {cookie.match()})")
    if conf.ipam or node.pod_cidrs:
        ipam_api, ipam_conf = ipam_for(req.config, node)
        try:
            ipam_api.check(ipam_conf, req.container_id, req.ifname, [i.address for i in prev.ips])
        except CniError as e:
            problems.append(e.msg)
    return problems


def _check_mtus(req: Request, want: PodNet, pod_nl: Netlink) -> list[str]:
    """The interface MTU and each route's MTU as the Node's paths want them now (route-sync
    keeps running Pods at that, so a prevResult from before a mode change is not the measure)."""
    from cni.kernel import podroutes

    link = pod_nl.link_get(req.ifname)
    if link is None:
        return []  # said by check_sandbox
    routes = podroutes.routes_of(pod_nl, link.index)
    todo = podroutes.plan(want, link.mtu, routes)
    have = podroutes.held(routes)
    problems = []
    if todo.mtu is not None:
        problems.append(f"interface {req.ifname} has MTU {link.mtu}, the Node's paths want {want.mtu}")
    present = {(addr.canonical_network(d), addr.host(g)): m for d, g, m in have}
    for r in todo.put:
        m = present.get((addr.canonical_network(r.dst), addr.host(r.gw)))
        problems.append(f"route {r.dst} via {r.gw} " + ("is missing" if m is None else f"has MTU {m or '-'}")
                        + f" in {req.ifname}, wanted MTU {r.mtu or '-'}")
    return problems
