"""DEL of the ``ferry`` plugin: the Pod's veth, OVS port, flows and addresses go; idempotent.

Keyed by (container ID, ifname) alone: a DEL finds the OVS port by its external_ids and releases
the addresses from the IPAM store, so it works when the netns, the node state or the port is
already gone.  Standard library only: this runs once per Pod."""

from __future__ import annotations

from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

from cni.commands.steps import Step, forget_neighbours, ovs_clients, reported
from cni.node import config as cfg
from cni.node.locks import attachment_lock
from cni.pipeline import tables as pl
from cni.pipeline.modes import NETWORK_POLICY_ONLY
from cni.spec.request import Request


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
    if node.mode == NETWORK_POLICY_ONLY:
        from cni.commands import chained

        return chained.delete(req, conf, node)
    from cni.kernel.netlink import Netlink

    step = Step(req.log)
    with reported(step), attachment_lock(conf.lock_dir, req.container_id, req.ifname) as lock, Netlink() as host_nl:
        ovsdb, of = ovs_clients(node)
        step("connect to OVSDB")
        # a Node that has just started (a reboot): the kubelet stops the dead sandboxes while the
        # switch's container starts; waiting here saves the kubelet's retry ~10 s later
        ovsdb.connect(wait=conf.startup_wait, notice=req.logger().info)
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
        from cni.ipam import api as ipam_api

        # Releasing is keyed by (container ID, ifname): it needs the store, not the ranges, so a
        # DEL while the node state is gone (route-sync down, /run cleared) still frees them. The
        # plugin always allocates through ferry-ipam (an absent ipam section means its defaults).
        ipam_api.release(ipam_api.release_config(req.config), req.container_id, req.ifname)
        lock.remove()
    step.report(req.logger(), "DEL")
