"""Running Pods kept at their paths' MTUs: interface MTU (both veth ends) and routes with MTUs.

When a peer changes path, or the mode, the tunnel type or the underlay MTU changes, the routes a
Pod should hold change (``cni.pipeline.podnet``: the same pure function ADD uses, fed the node state
route-sync just wrote).  This applier enters each local Pod's network namespace (known from its
OVS port's ``external_ids``: ``ferry-netns``) and converges it, under the plugin's attachment
lock (``cni.node.locks``), so it never races an ADD or DEL of that Pod; a Pod whose port went away
meanwhile, or whose namespace is gone, is skipped without error.

Entering: ``cni.kernel.netlink.Netlink.in_netns`` ``setns``-es the calling thread into the
Pod's namespace only while it opens a netlink socket there (a socket stays in the namespace it
was created in), and comes back; pyroute2's ``IPRoute(netns=...)`` forked a helper process
(~4 ms) and, by default, created a namespace that did not exist.

Which Pods: every Pod whose last converged plan differs from the current one (all of them after
a mode/MTU change, none after a change that leaves the plan alone), new Pods once, and every Pod
on a full pass (drift: someone changed a route in a Pod)."""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cni.kernel import podroutes
from cni.kernel.netlink import Netlink
from cni.node.locks import attachment_lock
from cni.node.nodestate import NodeState
from cni.pipeline import podnet
from cni.pipeline.modes import NETWORK_POLICY_ONLY
from cni.pipeline.tables import EXT_CHAINED, EXT_CONTAINER_ID, EXT_IFNAME, EXT_IPS, EXT_NETNS

LOG = logging.getLogger(__name__)


class NetnsGone(Exception):
    """The Pod's network namespace (or its interface) no longer exists."""


@dataclass
class PodSyncReport:
    """One pass over the Node's Pods: how many were changed, already right, skipped (gone
    meanwhile) and failed (with the first errors)."""

    updated: int = 0
    unchanged: int = 0
    skipped: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def touched(self) -> int:
        return self.updated + self.unchanged + self.skipped + self.failed


@dataclass(frozen=True)
class PodPort:
    """A Pod as its OVS port's external_ids describe it."""

    name: str  # the host veth (the OVS port)
    container_id: str
    ifname: str
    netns: str
    ips: tuple[str, ...]


def pod_ports(rows: list[dict[str, Any]]) -> list[PodPort]:
    """:meth:`OvsApplier.pod_ports` rows -> Pods this applier converges (chained ports, where the
    primary CNI owns the Pod's routes, and rows lacking a key are left out)."""
    out = []
    for r in rows:
        ids = r.get("external_ids") or {}
        if ids.get(EXT_CHAINED):
            continue
        cid, ifname, netns = ids.get(EXT_CONTAINER_ID), ids.get(EXT_IFNAME), ids.get(EXT_NETNS)
        if not (cid and ifname and netns):
            continue
        ips = tuple(a for a in (ids.get(EXT_IPS) or "").split(",") if a)
        out.append(PodPort(r["name"], cid, ifname, netns, ips))
    return sorted(out, key=lambda p: p.name)


def want_for(state: NodeState, pod: PodPort, inputs: podnet.PodInputs | None = None) -> podnet.PodNet:
    """What ``pod`` should hold (``podnet.for_state``); ``inputs``: ``podnet.pod_inputs(state)``,
    reduced once for every Pod of a sync."""
    if inputs is None:
        inputs = podnet.pod_inputs(state)
    return podnet.plan_for(inputs, podnet.gateways_of(state, list(pod.ips)))


def netlink_in(path: str) -> Netlink:
    """A rtnetlink socket in the network namespace ``path``.  :class:`NetnsGone` when there is
    no such namespace."""
    try:
        return Netlink.in_netns(path)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.EINVAL):
            raise NetnsGone(f"network namespace {path} is gone") from None
        raise


def converge_pod(nl: Netlink, ifname: str, want: podnet.PodNet) -> bool:
    """Make ``ifname`` in ``nl``'s namespace hold ``want`` (``cni.kernel.podroutes.converge``,
    the plugin's ADD's too).  True when something changed; :class:`NetnsGone` without it."""
    changed = podroutes.converge(nl, ifname, want)
    if changed is None:
        raise NetnsGone(f"{ifname} is gone")
    return changed


class PodMtuApplier:
    """Converges the Node's running Pods to the node state's per-path MTUs.

    ``list_ports``: the OVS Pod port rows (``OvsApplier.pod_ports``); ``port``: one of them by
    name, None when gone (``OvsApplier.pod_port``; looked at again under the Pod's lock);
    ``set_host_mtu(name, mtu)``: the host veth end's MTU (in the Node's namespace, where OVS
    reads it); ``lock_dir``: the plugin's attachment locks."""

    def __init__(self, list_ports: Callable[[], list[dict[str, Any]]],
                 port: Callable[[str], dict[str, Any] | None],
                 set_host_mtu: Callable[[str, int], Any], lock_dir: str) -> None:
        self.list_ports = list_ports
        self.port = port
        self.set_host_mtu = set_host_mtu
        self.lock_dir = lock_dir
        self._done: dict[tuple[str, str, str], podnet.PodNet] = {}  # (cid, ifname, netns) -> converged to

    def sync(self, state: NodeState, full: bool = False) -> PodSyncReport:
        report = PodSyncReport()
        if state.mode == NETWORK_POLICY_ONLY:
            return report  # chained: the primary CNI owns the Pods' interface and routes
        pods = pod_ports(self.list_ports())
        inputs = podnet.pod_inputs(state)  # every peer's CIDRs reduced once, not once a Pod
        keys = {(p.container_id, p.ifname, p.netns) for p in pods}
        for k in [k for k in self._done if k not in keys]:
            del self._done[k]
        for pod in pods:
            key = (pod.container_id, pod.ifname, pod.netns)
            want = want_for(state, pod, inputs)
            if not full and self._done.get(key) == want:
                continue
            try:
                changed = self._converge(pod, want)
            except NetnsGone as e:
                report.skipped += 1
                self._done.pop(key, None)
                LOG.debug("Pod %s/%s skipped: %s", pod.container_id[:12], pod.ifname, e)
                continue
            except Exception as e:  # noqa: BLE001 - one Pod's failure must not stop the others
                report.failed += 1
                self._done.pop(key, None)
                if len(report.errors) < 5:
                    report.errors.append(f"{pod.name}: {type(e).__name__}: {e}")
                continue
            if changed is None:
                report.skipped += 1
                continue
            self._done[key] = want
            if changed:
                report.updated += 1
            else:
                report.unchanged += 1
        if report.failed:
            LOG.warning("Pods' MTUs: %d failed (%s)", report.failed, "; ".join(report.errors))
        return report

    def _converge(self, pod: PodPort, want: podnet.PodNet) -> bool | None:
        """True/False: changed or not; None: the Pod went away before its lock was ours."""
        with attachment_lock(self.lock_dir, pod.container_id, pod.ifname) as lock:
            row = self.port(pod.name)  # still there, still this Pod (not re-plugged meanwhile)?
            still = pod_ports([row]) if row is not None else []
            if not still or still[0] != pod:
                if not still:
                    lock.remove()  # deleted meanwhile: no lock file left behind for it
                return None
            with netlink_in(pod.netns) as nl:
                host_changed = bool(self.set_host_mtu(pod.name, want.mtu))  # OVS's end of the veth
                return converge_pod(nl, pod.ifname, want) or host_changed
