"""A Node of the lab's Kubernetes cluster rebooted: what a real reboot loses, lost; what is on disk,
kept; then the Node started again as ``Cluster.node_up`` starts it.

A reboot (issue 42) loses every process of the Node (its containers, the kubelet, containerd,
kube-proxy, Open vSwitch: Ferry's openvswitch container or the host's daemons), every mount (the
Pods' network namespaces, containerd's rootfs and shm mounts, the kubelet's tmpfs volumes: the
Node's mount namespace is dropped and made afresh), what lives on tmpfs (``/run``: the Open
vSwitch run directory with the saved flows' copy, ``/run/ferry`` with route-sync's state and
``uplink.json``, ``/run/netns``, ``/run/containerd``, ``/run/wireguard``) and the kernel's state
of its network namespace (the Pods' namespaces and veths, Open vSwitch's taps, routes, neighbours,
nftables and iptables rules, conntrack).  It keeps the machine's NIC (the Node's ``eth0``, the
segment's veth, which the lab does not recreate: it is renamed back from ``eth0~`` if route-sync
had moved it onto the bridge, and configured as the machine's network configuration does at boot:
the lab's ``netplan`` lines) and what is on disk: ``/var/lib/ferry`` (Ferry's IPAM store, Open
vSwitch's ``conf.db``), ``/var/lib/kubelet``, ``/var/lib/containerd`` (the images: none is
imported again), ``/var/lib/cni``, ``/etc/cni/net.d``, ``/opt/cni/bin``, the logs.  With
``ovsDaemons: host`` the lab's host Open vSwitch keeps its ``conf.db`` (in its run directory here,
the lab's stand-in for ``/etc/openvswitch``) and is started first, as a host's service is.

:func:`plan` says all that as plain data (pure); :func:`apply` does it."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from lab import netplan, ovs
from lab.kube import cluster as kube_cluster
from lab.kube.plan import NodePlan
from lab.layout import NodePaths
from lab.manifest import Manifest
from lab.sh import LabError, ip_batch, pids_in, run
from lab.topology import Topology, node_netns

NIC = "eth0"  # the Node's uplink, the segment's veth (lab.netplan)
MOVED_NIC = NIC + "~"  # its name while route-sync has it on the bridge (routesync.apply.uplink)
TMPFS_PREFIXES = ("/run/", "/var/run/")  # what a real host mounts as tmpfs
HOST_OVS_KEEP = ("conf.db",)  # the host's database, kept across a reboot (/etc/openvswitch on a host)
MOUNT_NS_UMOUNTS = 8  # as lab.kube.cluster.teardown: a mount point may carry several mounts


@dataclass(frozen=True)
class RebootPlan:
    node: str
    netns: str  # the Node's network namespace (kept: the machine)
    node_plan: NodePlan
    pod_netns: tuple[str, ...]  # the Pods' namespaces the lab attached on this machine (``ip netns``)
    tmpfs_dirs: tuple[tuple[str, tuple[str, ...]], ...]  # (directory on this machine, names kept in it)
    nic_config: tuple[str, ...]  # ``ip -batch`` lines: the NIC as the machine's network configuration sets it
    sysctls: tuple[str, ...]  # the Node namespace's, as at boot
    tx_csum_off: tuple[str, ...]  # links whose TX checksum offload the lab turns off
    host_ovs: bool  # ovsDaemons host: the lab starts the Node's Open vSwitch before the kubelet


def plan(lab: str, topo: Topology, node: NodePlan, paths: NodePaths, pod_netns: tuple[str, ...]) -> RebootPlan:
    """What rebooting ``node`` loses and how it starts again (pure)."""
    assert topo.kubernetes is not None
    host_ovs = not topo.kubernetes.ferry_runs_ovs
    tmpfs = []
    for src, dst in node.binds:
        if dst.startswith(TMPFS_PREFIXES):
            keep = HOST_OVS_KEEP if host_ovs and os.path.normpath(src) == os.path.normpath(paths.ovs) else ()
            tmpfs.append((src, keep))
    ns = node_netns(lab, node.name)
    net = netplan.plan(lab, topo)
    nic = tuple(net.stages[-1].get(ns, []))
    return RebootPlan(node.name, ns, node, pod_netns, tuple(tmpfs), nic, net.sysctls.get(ns, ()),
                      net.tx_csum_off.get(ns, ()), host_ovs)


# ---------------------------------------------------------------- the applier

def links(netns: str) -> list[str]:
    """The names of ``netns``'s links (``ip -o link``: ``2: name@peer: <...>``)."""
    out = run(["ip", "-n", netns, "-o", "link", "show"]).stdout
    return [line.split(":", 2)[1].strip().split("@", 1)[0] for line in out.splitlines() if ":" in line]


def mounts_under(path: str) -> list[str]:
    """Mount points on this machine at or below ``path`` (a directory this never empties)."""
    root = os.path.realpath(path).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if (p.rstrip("/") + "/").startswith(root)]


def empty_dir(path: str, keep: tuple[str, ...]) -> None:
    """Everything in ``path`` but ``keep`` removed (a tmpfs after a reboot); refuses a directory
    with a mount below it on this machine (that would be the host's, not the Node's)."""
    if not os.path.isdir(path):
        return
    if mounts_under(path):
        raise LabError(f"{path}: mounts below it on this machine ({mounts_under(path)}): not emptied")
    for entry in os.listdir(path):
        if entry in keep:
            continue
        full = os.path.join(path, entry)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full)
        else:
            os.unlink(full)


def kill_processes(p: RebootPlan, manifest: Manifest) -> None:
    """Every process of the Node: its containers (cgroup root), what runs in its mount namespace
    (kubelet, containerd, kube-proxy, shims), then whatever is left in its network namespace or in
    its Pods' (the host's Open vSwitch, wireguard-go, the lab's echo servers)."""
    kube_cluster.stop_node(p.node_plan.mount_ns, p.node_plan.cgroup_root)
    for _ in range(3):
        pids = set(pids_in([p.netns, *p.pod_netns]))
        if not pids:
            break
        for pid in pids:
            kube_cluster.kill(pid)
        kube_cluster.wait_gone(pids)
    for proc in p.node_plan.processes:
        for e in manifest.of_kind("pid"):
            if e.get("role") == proc.role:
                manifest.forget("pid", **{k: v for k, v in e.items() if k != "kind"})


def drop_mounts(p: RebootPlan, manifest: Manifest) -> None:
    """The Node's mount namespace dropped (every mount in it goes with its last holder), the
    Pods' namespaces detached here: nothing holds the old Pods' network namespaces any more."""
    for _ in range(MOUNT_NS_UMOUNTS):
        if subprocess.run(["umount", "-l", p.node_plan.mount_ns], capture_output=True, check=False).returncode != 0:
            break
    for ns in p.pod_netns:
        run(["ip", "netns", "del", ns], check=False)
        manifest.forget("netns", name=ns)


def reset_network(p: RebootPlan) -> None:
    """The Node's network namespace as a boot leaves it: no link but loopback and the NIC (the
    Pods' veths and Open vSwitch's taps die with the kernel), the NIC under its own name with the
    machine's configuration, no routes, neighbours, rules of nftables or iptables, conntrack."""
    ns = p.netns
    names = links(ns)
    for name in names:
        if name not in ("lo", NIC, MOVED_NIC):
            run(["ip", "-n", ns, "link", "del", name], check=False)  # a veth may go with its peer first
    if MOVED_NIC in names:
        if NIC in links(ns):  # an internal port of that name outlived its daemon
            run(["ip", "-n", ns, "link", "del", NIC])
        ip_batch(ns, [f"link set {MOVED_NIC} down", f"link set {MOVED_NIC} name {NIC}"])
    ip_batch(ns, [f"link set {NIC} down", f"addr flush dev {NIC}", "neigh flush all"])
    run(["ip", "-4", "-n", ns, "route", "flush", "table", "main"])
    run(["ip", "-6", "-n", ns, "route", "flush", "table", "main", "dev", NIC])
    run(["nft", "flush", "ruleset"], netns=ns)
    run(["conntrack", "-F"], netns=ns, check=False)  # may be missing or empty: no state either way
    if p.sysctls:
        run(["sysctl", "-q", "-w", *p.sysctls], netns=ns)
    ip_batch(ns, list(p.nic_config))
    for dev in p.tx_csum_off:
        run(["ethtool", "-K", dev, "tx", "off"], netns=ns)
    left = [n for n in links(ns) if n not in ("lo", NIC)]
    if left:
        raise LabError(f"{p.node}: links outlived the reboot: {left}")


def apply(cluster: kube_cluster.Cluster, p: RebootPlan, paths: NodePaths) -> float:
    """Reboot the Node: down (processes, mounts, tmpfs, kernel state), then up (the host's Open
    vSwitch when it has one, containerd, the kubelet, kube-proxy).  Returns the kubelet's start
    (``time.monotonic()``)."""
    m = cluster.manifest
    kill_processes(p, m)
    drop_mounts(p, m)
    reset_network(p)
    for path, keep in p.tmpfs_dirs:
        empty_dir(path, keep)
    kube_cluster.remove_cgroup(p.node_plan.cgroup_root)
    kube_cluster.make_cgroup(p.node_plan.cgroup_root)
    if p.host_ovs:
        ovs.start(p.netns, paths, m)
    kube_cluster.make_mount_ns(p.node_plan, m)
    return cluster.start_node(p.node_plan, cluster.images(), missing_only=True)
