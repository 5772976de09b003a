"""What the real-Kubernetes suites share: whether this machine can run a cluster (and why not), the
default topology as a Kubernetes cluster, and a lab factory whose clusters are torn down even when
a test fails. Lab names start with "tk" plus the pid and a counter."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from lab import tools
from lab.api import Lab
from lab.kube.cluster import Cluster, cgroup_pids, wait_for
from routesync.config import OVS_HOST
from tests.support.waiting import HANG

_counter = itertools.count()


REPO = tools.REPO


def lab_name() -> str:
    return f"tk{os.getpid() % 100000:x}{next(_counter)}"[:12]


def can_run() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for t in ("ovs-vswitchd", "containerd", "runc", "ctr", "podman", "mmdebstrap", "nsenter"):
        if shutil.which(t) is None:
            return f"{t} not installed (make install)"
    for t in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl",
              "kube-proxy"):
        if not os.access(tools.tool(t), os.X_OK):
            return f"{t} not built (tools/build-go-tools.sh kubernetes)"
    for t, tool_set in (("coredns", "coredns"), ("agnhost", "kube-e2e")):
        if not os.access(tools.tool(t), os.X_OK):
            return f"{t} not built (tools/build-go-tools.sh {tool_set})"
    if not os.access(os.path.join(REPO, "dist", "ferry", "ferry-route-sync"), os.X_OK):
        return "no frozen bundle (make dist)"
    return None


def topology(route_sync: dict[str, Any], route_pod_cidrs: bool | str = False, nodes: int = 3,
             join_later: tuple[str, ...] = (), ovs_daemons: str = OVS_HOST,
             bgp: dict[str, Any] | None = None) -> dict[str, Any]:
    """The default topology (node-1, node-2 on segment a; node-3, node-4 on b behind the router),
    as a Kubernetes cluster; ``ovs_daemons`` ferry: Nodes without Open vSwitch of their own (Ferry's
    openvswitch container runs it), host: the lab starts it on each Node; ``route_pod_cidrs`` bgp
    with ``bgp`` (router.bgp): the router learns the Pod CIDRs from route-sync over BGP."""
    all_nodes = [{"name": "node-1", "segment": "a"}, {"name": "node-2", "segment": "a"},
                 {"name": "node-3", "segment": "b"}, {"name": "node-4", "segment": "b"}]
    return {"datapath": "netdev", "clusterCIDRs": ["10.244.0.0/16", "fd00:10:244::/48"],
            "segments": {"a": {"ipv4": "192.168.77.0/24", "ipv6": "fd00:77::/64"},
                         "b": {"ipv4": "192.168.88.0/24", "ipv6": "fd00:88::/64"}},
            "router": {"routePodCIDRs": route_pod_cidrs, **({"bgp": bgp} if bgp is not None else {})},
            "nodes": all_nodes[:nodes],
            "routeSync": {"resyncSeconds": 5, **route_sync},
            "kubernetes": {"joinLater": list(join_later), "ovsDaemons": ovs_daemons}}


def switch_kube_proxy(lab: Lab, mode: str) -> None:
    """Every Node's kube-proxy restarted in ``mode`` (iptables or nftables); returns once each
    Node's Service rules are the new mode's alone (the other mode's gone), so a probe after it
    exercises ``mode``."""
    lab.kube().switch_kube_proxy(mode)

    def switched(node: str) -> bool:
        n = lab.node(node)
        table = n.exec(["nft", "list", "table", "ip", "kube-proxy"])
        nft_rules = table.returncode == 0 and "service-ips" in table.stdout
        ipt_rules = "KUBE-SERVICES" in n.exec(["iptables-save", "-t", "nat"]).stdout
        return nft_rules and not ipt_rules if mode == "nftables" else ipt_rules and not nft_rules

    for n in lab.nodes:
        wait_for(f"{n.name}: kube-proxy's {mode} rules alone", lambda name=n.name: switched(name), HANG)


def parent(pid: int) -> int:
    """``pid``'s parent (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def ancestors(pid: int) -> list[str]:
    """The command names of ``pid``'s parents, nearest first."""
    out = []
    while pid > 1:
        try:
            pid = parent(pid)
            with open(f"/proc/{pid}/comm") as f:
                out.append(f.read().strip())
        except (OSError, ValueError, IndexError):
            break
    return out


def lab_factory(cni_bin: str) -> Iterator[Callable[[dict[str, Any]], Lab]]:
    labs: list[Lab] = []

    def make(topo: dict[str, Any]) -> Lab:
        reason = can_run()
        if reason:
            pytest.skip(reason)
        lab = Lab.up(topo, name=lab_name(), cni_bin=cni_bin)
        labs.append(lab)
        return lab

    yield make
    for lab in labs:
        lab.down()


def route_sync_pid(cluster: Cluster, node: str) -> int:
    """route-sync's process in Ferry's Pod on ``node`` (found in the Node's cgroup root)."""
    for pid in sorted(cgroup_pids(cluster.plan.node(node).cgroup_root)):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"ferry-route-sync") and b"run" in argv:
            return pid
    raise AssertionError(f"no route-sync process on {node}")


def restart(lab: Lab, event: str, node: str) -> None:
    """Restart one part on ``node`` and return once it runs again: ``kube-proxy``,
    ``ovs-vswitchd`` (its flows and userspace conntrack die with it), ``route-sync`` (SIGKILL;
    the kubelet restarts its container), or the cluster's ``kube-apiserver`` (away until the
    caller's ``then`` ran: see :func:`api_server_away`)."""
    cluster = lab.kube()
    if event == "kube-proxy":
        cluster.stop(f"{node}/kube-proxy")
        cluster.start(f"{node}/kube-proxy")
    elif event == "ovs-vswitchd":
        lab.restart_vswitchd(node)
    elif event == "route-sync":
        old = route_sync_pid(cluster, node)
        os.kill(old, signal.SIGKILL)

        def restarted() -> bool:
            try:
                return route_sync_pid(cluster, node) != old
            except AssertionError:
                return False
        wait_for(f"route-sync to run again on {node} (the kubelet restarts its container)", restarted, HANG)
    else:
        raise ValueError(event)


def api_server_away(lab: Lab, then: Callable[[], None]) -> None:
    """Stop the API server, run ``then`` while it is away, start it again and wait until ready."""
    cluster = lab.kube()
    cluster.stop("kube-apiserver")
    try:
        then()
    finally:
        cluster.start("kube-apiserver")
        wait_for("kube-apiserver /readyz again", cluster.api_ready, HANG)


# The traffic modes the Kubernetes suites run.  noEncap-bgp: every Node's route-sync peers with its
# default gateway (the router's FRR, one ConfigMap for Nodes on two segments); networkPolicyOnly:
# Ferry chained after the Nodes' primary CNI (ptp + host-local, the router routes the Pod CIDRs).
@dataclass(frozen=True)
class Mode:
    name: str
    route_sync: dict[str, Any]
    route_pod_cidrs: bool | str = False
    bgp: dict[str, Any] | None = None  # router.bgp, with route_pod_cidrs "bgp"

    def topology(self, **kw: Any) -> dict[str, Any]:
        return topology(self.route_sync, self.route_pod_cidrs, bgp=self.bgp, **kw)


MODES = [
    Mode("encap-vxlan", {"trafficEncapMode": "encap", "tunnelType": "vxlan"}),
    Mode("encap-geneve", {"trafficEncapMode": "encap", "tunnelType": "geneve"}),
    Mode("encap-gre", {"trafficEncapMode": "encap", "tunnelType": "gre"}),
    Mode("noEncap", {"trafficEncapMode": "noEncap"}, route_pod_cidrs=True),
    Mode("hybrid", {"trafficEncapMode": "hybrid", "tunnelType": "vxlan"}),
    Mode("noEncap-fastPath", {"trafficEncapMode": "noEncap", "fastPath": True}, route_pod_cidrs=True),
    Mode("noEncap-bgp", {"trafficEncapMode": "noEncap"}, route_pod_cidrs="bgp",
         bgp={"asn": 65000, "nodeASN": 64512, "holdTime": 3}),
    Mode("networkPolicyOnly", {"trafficEncapMode": "networkPolicyOnly"}, route_pod_cidrs=True),
]
