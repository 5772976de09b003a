"""The lab as a library, for pytest fixtures, benchmarks and the CLI.

    with Lab.up(name="tl1") as lab:              # default topology; or a path/dict/Topology
        a = lab.add_pod("node-1", "a")            # the real plugin, through cnitool
        b = lab.add_pod("node-1", "b")
        assert lab.ping(a, b.ipv4) and lab.tcp(a, b.ipv6)
        lab.node("node-1").exec(["ovs-ofctl", "dump-flows", "br-int"])   # its netns + OVS env
        lab.node("node-1").ovs_port_stats("ferry-gw0").rx_packets

``Lab.attach(name)`` reopens a lab another process built (all state is on disk)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import yaml

from cni.pipeline.tables import EXT_POD_NAME
from lab import build, layout, netplan, ovs, tools
from lab import topology as topology_mod
from lab.kube import cluster as kube_cluster
from lab.kube import lab_cluster
from lab.kube import pods as kube_pods
from lab.kube import reboot as kube_reboot
from lab.kube.cluster import Cluster
from lab.manifest import MANIFEST, Manifest
from lab.sh import LabError, cmdline, in_netns, run, running
from lab.topology import (
    NodeSpec,
    Topology,
    check_name,
    external_address,
    external_netns,
    node_addresses,
    node_netns,
    pod_netns,
    router_netns,
    segment_netns,
    to_doc,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ECHO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "echo.py")
ECHO_PORT = 7777
CNI_CACHE = "/var/lib/cni/results"
# A Pod through the API waits on the scheduler, the kubelet, containerd and the CNI: on a loaded
# 2-core machine with two clusters, a minute was seen to pass; this only bounds a hang.
KUBE_POD_TIMEOUT = 240.0


def default_cni_bin() -> str:
    return os.environ.get("FERRY_CNI_BIN") or os.path.join(REPO, "build", "cni-bin")


def cnitool() -> str:
    return tools.cnitool()


def ensure_cni_bin(path: str) -> str:
    """``path`` holding ``ferry``; written with ``python -m cni.launcher`` when absent."""
    if not os.access(os.path.join(path, "ferry"), os.X_OK):
        run([sys.executable, "-m", "cni.launcher", path], env={**os.environ, "PYTHONPATH": REPO})
    return path


def cnitool_container_id(netns_path: str) -> str:
    """cnitool's container ID for a netns path (sha512 of the path, first 10 bytes)."""
    return "cnitool-" + hashlib.sha512(netns_path.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Probe:
    """One connectivity probe's outcome; truthy when it passed."""

    ok: bool
    detail: str = ""
    ms: float | None = None
    peer: str | None = None  # tcp: the source address the server saw
    server: str | None = None  # tcp/udp: the address the answering server had (behind a Service: which one)

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class PortStats:
    rx_packets: int
    tx_packets: int
    rx_bytes: int
    tx_bytes: int
    rx_dropped: int
    tx_dropped: int
    raw: dict[str, int] = field(default_factory=dict)


def _strip(cidr: str) -> str:
    return cidr.split("/")[0]


@dataclass
class Pod:
    lab: Lab
    node: str
    name: str
    netns: str
    ips: list[str]  # CIDR notation, from the CNI result
    mac: str | None
    result: dict[str, Any]

    @property
    def ipv4(self) -> str | None:
        return next((_strip(a) for a in self.ips if ":" not in a), None)

    @property
    def ipv6(self) -> str | None:
        return next((_strip(a) for a in self.ips if ":" in a), None)

    def address(self, family: int) -> str | None:
        return self.ipv4 if family == 4 else self.ipv6

    def exec(self, argv: Sequence[str], check: bool = False, timeout: float = 30.0
             ) -> subprocess.CompletedProcess[str]:
        return run(argv, netns=self.netns, check=check, timeout=timeout)


@dataclass
class Host:
    """A namespace of the underlay (router, external host)."""

    name: str
    netns: str
    addresses: tuple[str, ...]  # the families it has, IPv4 first

    def address(self, family: int) -> str | None:
        """Its first address of ``family`` (None: it has none)."""
        return next((a for a in self.addresses if (":" in a) == (family == 6)), None)

    def exec(self, argv: Sequence[str], check: bool = False, timeout: float = 30.0
             ) -> subprocess.CompletedProcess[str]:
        return run(argv, netns=self.netns, check=check, timeout=timeout)


@dataclass
class Node:
    lab: Lab
    spec: NodeSpec
    netns: str
    paths: layout.NodePaths
    addresses: tuple[str | None, str | None]  # transport IPv4, IPv6 (None: its segment has no such family)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def ipv4(self) -> str | None:
        return self.addresses[0]

    @property
    def ipv6(self) -> str | None:
        return self.addresses[1]

    def address(self, family: int) -> str | None:
        return self.addresses[0 if family == 4 else 1]

    def exec(self, argv: Sequence[str], check: bool = False, timeout: float = 30.0
             ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the Node's namespace with its OVS_RUNDIR/OVS_DBDIR/OVS_LOGDIR."""
        return run(argv, netns=self.netns, env=ovs.env(self.paths), check=check, timeout=timeout)

    def vsctl(self, *args: str) -> str:
        return ovs.vsctl(self.paths, *args)

    def ofctl(self, *args: str, bridge: str | None = None) -> str:
        br = bridge or self.lab.topology.bridge
        cp = self.exec(["ovs-ofctl", *args[:1], f"unix:{os.path.join(self.paths.ovs, br)}.mgmt", *args[1:]],
                       check=True)
        return cp.stdout

    def vswitchd_answers(self) -> bool:
        return ovs.vswitchd_answers(self.paths)

    def ovs_port_stats(self, port: str) -> PortStats:
        """Live OpenFlow port counters (``ovs-ofctl dump-ports``; the OVSDB ``statistics`` column
        lags by up to 5 s)."""
        out = self.ofctl("dump-ports", port)
        raw: dict[str, int] = {}
        for direction in ("rx", "tx"):
            m = re.search(rf"{direction} pkts=(\d+|\?), bytes=(\d+|\?), drop=(\d+|\?)", out)
            if not m:
                raise LabError(f"{self.name}: no counters for port {port}: {out.strip()}")
            for key, value in zip(("packets", "bytes", "dropped"), m.groups(), strict=True):
                raw[f"{direction}_{key}"] = int(value) if value.isdigit() else 0
        return PortStats(raw["rx_packets"], raw["tx_packets"], raw["rx_bytes"], raw["tx_bytes"],
                         raw["rx_dropped"], raw["tx_dropped"], raw)

    def state(self) -> dict[str, Any] | None:
        """The Node's state file (written by route-sync), or None."""
        try:
            with open(self.paths.state_file) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def pods(self) -> list[Pod]:
        out = []
        try:
            names = sorted(os.listdir(self.paths.pods))
        except OSError:
            return []
        for fn in names:
            if fn.endswith(".json"):
                pod = self.lab._load_pod(self.name, fn[:-5])
                if pod:
                    out.append(pod)
        return out


class Lab:
    """A running lab.  Build with :meth:`up`, reopen with :meth:`attach`, remove with :meth:`down`."""

    def __init__(self, name: str, topology: Topology, directory: str, cni_bin: str, root: str | None):
        self.name = name
        self.topology = topology
        self.dir = directory
        self.cni_bin = cni_bin
        self.root = root
        self._echo_lock = threading.Lock()
        self._nodes = {n.name: Node(self, n, node_netns(name, n.name), layout.node_paths(directory, n.name),
                                    node_addresses(topology, n)) for n in topology.nodes}

    # ---------------------------------------------------------------- lifecycle
    @classmethod
    def up(cls, topology: Topology | str | dict | None = None, name: str = "demo",
           cni_bin: str | None = None, root: str | None = None,
           log: Callable[[str], None] | None = None) -> Lab:
        topo, doc = _topology(topology)
        cni_bin = os.path.abspath(cni_bin or default_cni_bin())
        build.up(topo, doc, name, cni_bin, root, log=log)
        return cls(name, topo, layout.lab_dir(name, root), cni_bin, root)

    @classmethod
    def attach(cls, name: str = "demo", root: str | None = None) -> Lab:
        directory = layout.lab_dir(name, root)
        try:
            m = Manifest.load(directory)
        except FileNotFoundError:
            raise LabError(f"no lab named {name!r} ({directory}); start one with `ferry-lab up --name {name}`") \
                from None
        if m.state != "up":
            raise LabError(f"lab {name!r} is {m.state}; `ferry-lab down --name {name}` and up again")
        with open(os.path.join(directory, build.TOPOLOGY_FILE)) as f:
            topo = topology_mod.parse(yaml.safe_load(f))
        return cls(name, topo, directory, m.info.get("cniBin") or default_cni_bin(), root)

    def down(self) -> None:
        build.down(self.name, self.root)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    @property
    def manifest(self) -> Manifest:
        return Manifest.load(self.dir)

    @property
    def route_sync(self) -> bool:
        """True when route-sync runs on the Nodes (else the plugin's lone-Node mode)."""
        return bool(self.manifest.info.get("routeSync"))

    # ---------------------------------------------------------------- parts
    def node(self, name: str) -> Node:
        try:
            return self._nodes[name]
        except KeyError:
            raise LabError(f"no node {name!r} in lab {self.name} (nodes: {', '.join(self._nodes)})") from None

    @property
    def nodes(self) -> list[Node]:
        return list(self._nodes.values())

    @property
    def router(self) -> Host:
        addrs = tuple(a for s in self.topology.segments for a in topology_mod.router_address(self.topology, s.name)
                      if a)
        return Host("router", router_netns(self.name), addrs)

    @property
    def external(self) -> Host:
        return Host("external", external_netns(self.name), tuple(a for a in external_address(self.topology) if a))

    def pods(self) -> list[Pod]:
        return [p for n in self.nodes for p in n.pods()]

    def pod(self, node: str, name: str) -> Pod:
        p = self._load_pod(node, name)
        if p is None:
            raise LabError(f"no pod {name!r} on {node} in lab {self.name}")
        return p

    # ---------------------------------------------------------------- pods
    def _cni_env(self, node: Node, pod: str) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                "NETCONFPATH": node.paths.netconf, "CNI_PATH": self.cni_bin,
                "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod}"}

    # ---------------------------------------------------------------- Kubernetes
    @property
    def kubernetes(self) -> bool:
        """A real cluster (``kubernetes`` topology key): Pods come from the API, Ferry from its DaemonSet."""
        return self.topology.kubernetes is not None

    def kube(self) -> Cluster:
        if self.topology.kubernetes is None:
            raise LabError(f"lab {self.name} is not a Kubernetes cluster (ferry-lab up --kubernetes)")
        t = self.topology
        assert t.kubernetes is not None
        # as lab.kube.cluster.up: the router follows the Nodes' Pod CIDRs on a cluster running Ferry
        # (static routes from the Node objects; with BGP, learned from route-sync)
        follows = t.route_pod_cidrs or t.router_bgp is not None or t.kubernetes.cni == "ferry"
        return Cluster(lab_cluster.cluster_plan(t, self.name, self.dir), self.manifest, lambda s: None,
                       router_netns(self.name) if follows else None, bgp=t.router_bgp is not None,
                       chained=t.chained)

    def _add_kube_pod(self, node: str, name: str, timeout: float) -> Pod:
        self.node(node)  # a Node of the lab's, or LabError
        cluster = self.kube()
        netns = pod_netns(self.name, node, name)
        if build.netns_exists(netns):
            raise LabError(f"pod {name} on {node} exists already (netns {netns})")
        api_name = kube_pods.api_name(node, name)
        cluster.kubectl("create", "-f", "-", input=json.dumps(kube_pods.pod_spec(api_name, node)))
        try:
            obj = kube_pods.wait_running(lambda: cluster.pod(kube_pods.NAMESPACE, api_name), timeout)
        except LabError as e:
            events = cluster.kubectl("get", "events", "-n", kube_pods.NAMESPACE, "--field-selector",
                                     f"involvedObject.name={api_name}", check=False).stdout
            raise LabError(f"{e}\nevents:\n{events}\nkube-scheduler log:\n"
                           f"{kube_cluster.tail(cluster.plan.process('kube-scheduler').log, 8)}") from None
        return self._attach_kube_pod(node, name, obj)

    def reattach_kube_pod(self, node: str, name: str) -> Pod:
        """The lab's handle on a Pod whose sandbox the kubelet made again (a Node's reboot): its
        namespace attached here anew, its record rewritten from its OVS port and the Pod object
        (which must run with its addresses)."""
        netns = pod_netns(self.name, node, name)
        if build.netns_exists(netns):
            raise LabError(f"pod {name} on {node}: {netns} is still attached")
        obj = self.kube().pod(kube_pods.NAMESPACE, kube_pods.api_name(node, name))
        st = (obj or {}).get("status") or {}
        if obj is None or st.get("phase") != "Running" or not st.get("podIPs"):
            raise LabError(f"pod {name} on {node} does not run with addresses: {json.dumps(st)[:400]}")
        return self._attach_kube_pod(node, name, obj, same_ips=True)

    def _attach_kube_pod(self, node: str, name: str, obj: dict[str, Any], same_ips: bool = False) -> Pod:
        """``same_ips``: only when the OVS port's addresses are the Pod object's (after a reboot the
        object may still show the dead sandbox's status; a chained port records no addresses)."""
        n = self.node(node)
        cluster = self.kube()
        netns = pod_netns(self.name, node, name)
        api_name = kube_pods.api_name(node, name)
        att = kube_pods.find_attachment(lambda argv: n.exec(argv), api_name, kube_pods.NAMESPACE)
        if att is None:
            raise LabError(f"Pod {name} runs but no OVS port on {node} names it (external_ids {EXT_POD_NAME})")
        pod_ips = {ip["ip"] for ip in obj["status"]["podIPs"]}
        if same_ips and {a.split("/")[0] for a in att.ips} != pod_ips:  # a status from before a reboot
            raise LabError(f"Pod {name}: its OVS port {att.port} has {att.ips}, the Pod object {sorted(pod_ips)}")
        self.manifest.record("netns", name=netns)
        kube_pods.attach_netns(cluster.plan.node(node).mount_ns, att.netns, netns)
        result = kube_pods.result_of(att)
        layout.write_json(n.paths.pod_result(name), {"netns": netns, "result": result,
                                                     "kubernetes": {"namespace": kube_pods.NAMESPACE,
                                                                    "name": api_name,
                                                                    "uid": obj["metadata"]["uid"],
                                                                    "podIPs": obj["status"]["podIPs"]}})
        return self._pod_from(node, name, netns, result)

    def _del_kube_pod(self, node: str, name: str, timeout: float) -> None:
        n = self.node(node)
        netns = pod_netns(self.name, node, name)
        run(["ip", "netns", "del", netns], check=False)  # detach first: the kubelet's DEL owns the rest
        self.manifest.forget("netns", name=netns)
        self.kube().kubectl("delete", "pod", "-n", kube_pods.NAMESPACE, kube_pods.api_name(node, name), "--wait=true",
                            f"--timeout={int(timeout)}s", timeout=timeout + 10)
        try:
            os.unlink(n.paths.pod_result(name))
        except FileNotFoundError:
            pass

    def add_pod(self, node: str, name: str, timeout: float = 30.0) -> Pod:
        """Create a netns and plug it with the ``ferry`` plugin via ``cnitool add`` in the Node's netns
        (on a Kubernetes lab: a Pod through the API, plugged by the kubelet's runtime)."""
        n = self.node(node)
        check_name("pod", name, 20)
        if self.kubernetes:
            return self._add_kube_pod(node, name, max(timeout, KUBE_POD_TIMEOUT))
        netns = pod_netns(self.name, node, name)
        if build.netns_exists(netns):
            raise LabError(f"pod {name} on {node} exists already (netns {netns})")
        ensure_cni_bin(self.cni_bin)
        m = self.manifest
        m.record("netns", name=netns)
        netns_path = os.path.join(build.NETNS_DIR, netns)
        cache = os.path.join(CNI_CACHE, f"{layout.NETWORK_NAME}-{cnitool_container_id(netns_path)}-eth0")
        m.record("file", path=cache)
        run(["ip", "netns", "add", netns])
        run(["ip", "-n", netns, "link", "set", "lo", "up"])
        # no DAD in the Pod either (as everywhere in the lab, lab.netplan.NO_DAD): a primary CNI
        # that does not add its addresses "nodad" (Debian's ptp, chained) waits ~2 s per Pod otherwise
        run(["sysctl", "-q", "-w", *netplan.NO_DAD], netns=netns)
        cp = run([cnitool(), "add", layout.NETWORK_NAME, netns_path], netns=n.netns,
                 env=self._cni_env(n, name), check=False, timeout=timeout)
        if cp.returncode != 0:
            run(["ip", "netns", "del", netns], check=False)
            m.forget("netns", name=netns)
            raise LabError(f"cnitool add {name} on {node} failed (rc={cp.returncode}): "
                           f"{(cp.stdout + cp.stderr).strip()}\n  plugin log: {n.paths.cni_log}")
        try:
            result = json.loads(cp.stdout)
        except ValueError:
            raise LabError(f"cnitool add {name}: result is not JSON: {cp.stdout[:500]!r}") from None
        layout.write_json(n.paths.pod_result(name), {"netns": netns, "result": result})
        pod = self._pod_from(node, name, netns, result)
        return pod

    def check_pod(self, node: str, name: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """``cnitool check`` of a Pod plugged by :meth:`add_pod` (its cached result is the
        prevResult); returns the completed process (rc 0: CHECK passed)."""
        n = self.node(node)
        netns_path = os.path.join(build.NETNS_DIR, pod_netns(self.name, node, name))
        return run([cnitool(), "check", layout.NETWORK_NAME, netns_path], netns=n.netns,
                   env=self._cni_env(n, name), check=False, timeout=timeout)

    def set_underlay_mtu(self, mtu: int, segments: Sequence[str] | None = None) -> None:
        """What an operator does to change the underlay MTU: every link of the segments (the
        switch, its ports, the router's leg) and each of their Nodes' physical uplink (``eth0``,
        or ``eth0~`` while route-sync has moved it onto the bridge).  Raising: switch first;
        lowering: Nodes first (a link never sends more than the next one takes)."""
        names = [s.name for s in self.topology.segments if segments is None or s.name in segments]
        switch: list[tuple[str, list[str]]] = []
        for seg in names:
            ports = ["router"] + [n.name for n in self.topology.nodes if n.segment == seg]
            switch.append((segment_netns(self.name, seg), ports + [netplan.SEGMENT_BRIDGE]))
            switch.append((router_netns(self.name), [f"eth-{seg}"]))
        nodes = []
        current = 0
        for spec in self.topology.nodes:
            if spec.segment in names:
                ns = node_netns(self.name, spec.name)
                cp = run(["ip", "-n", ns, "-o", "link", "show", "eth0~"], check=False)
                link = "eth0~" if cp.returncode == 0 else "eth0"
                if cp.returncode != 0:
                    cp = run(["ip", "-n", ns, "-o", "link", "show", "eth0"])
                found = re.search(r" mtu (\d+)", cp.stdout)
                current = max(current, int(found.group(1)) if found else 0)
                nodes.append((ns, [link]))
        order = switch + nodes if mtu >= current else nodes + switch
        for ns, links in order:
            for link in links:
                run(["ip", "-n", ns, "link", "set", link, "mtu", str(mtu)])

    def del_pod(self, node: str, name: str, timeout: float = 30.0) -> None:
        if self.kubernetes:
            return self._del_kube_pod(node, name, max(timeout, KUBE_POD_TIMEOUT))
        n = self.node(node)
        netns = pod_netns(self.name, node, name)
        netns_path = os.path.join(build.NETNS_DIR, netns)
        cp = run([cnitool(), "del", layout.NETWORK_NAME, netns_path], netns=n.netns,
                 env=self._cni_env(n, name), check=False, timeout=timeout)
        for pid in build.pids_in([netns]):
            ovs.signal_pid(pid, 9)
        run(["ip", "netns", "del", netns], check=False)
        try:
            os.unlink(n.paths.pod_result(name))
        except FileNotFoundError:
            pass
        m = self.manifest
        m.forget("netns", name=netns)
        if cp.returncode != 0:
            raise LabError(f"cnitool del {name} on {node} failed (rc={cp.returncode}): "
                           f"{(cp.stdout + cp.stderr).strip()}")
        cache = os.path.join(CNI_CACHE, f"{layout.NETWORK_NAME}-{cnitool_container_id(netns_path)}-eth0")
        m.forget("file", path=cache)

    def _load_pod(self, node: str, name: str) -> Pod | None:
        try:
            with open(self.node(node).paths.pod_result(name)) as f:
                d = json.load(f)
        except (OSError, ValueError):
            return None
        return self._pod_from(node, name, d["netns"], d["result"])

    def _pod_from(self, node: str, name: str, netns: str, result: dict[str, Any]) -> Pod:
        ifaces = result.get("interfaces") or []
        mac = next((i.get("mac") for i in ifaces if i.get("sandbox")), None)
        ips = [ip["address"] for ip in result.get("ips") or []]
        return Pod(self, node, name, netns, ips, mac, result)

    # ---------------------------------------------------------------- daemons
    def route_sync_pid(self, node: str) -> int | None:
        return build.route_sync_pid(self.manifest, self.node(node).name)

    def kill_route_sync(self, node: str, sig: int = 9, timeout: float = 30.0) -> int:
        """Signal ``node``'s route-sync (SIGKILL by default) and wait until it is gone (``timeout``
        only bounds a hang: a loaded machine may take a while to reap it)."""
        pid = self.route_sync_pid(node)
        if pid is None:
            raise LabError(f"no route-sync runs on {node}")
        ovs.signal_pid(pid, sig)
        deadline = time.monotonic() + timeout
        while running(pid):
            if time.monotonic() > deadline:
                raise LabError(f"route-sync {pid} on {node} did not exit")
            time.sleep(0.005)
        return pid

    def start_route_sync(self, node: str) -> int:
        """(Re)start ``node``'s route-sync with the lab's config; returns its pid."""
        if self.topology.route_sync is None:
            raise LabError(f"lab {self.name} has no routeSync")
        cmd = build.route_sync_command()
        if cmd is None:
            raise LabError("ferry-route-sync is not installed")
        n = self.node(node)
        return build.start_route_sync(cmd, self.topology, n.spec, self.name, self.dir, self.manifest)

    def reconfigure_route_sync(self, node: str, sig: int = 15, **changes: Any) -> int:
        """Stop ``node``'s route-sync (SIGTERM: it leaves what it installed), start it again with
        the lab's ``routeSync`` keys changed for this Node only (e.g. ``fastPath=False``); returns
        the new pid once it has written its state file again."""
        if self.topology.route_sync is None:
            raise LabError(f"lab {self.name} has no routeSync")
        cmd = build.route_sync_command()
        if cmd is None:
            raise LabError("ferry-route-sync is not installed")
        n = self.node(node)
        topo = dataclasses.replace(self.topology, route_sync=dataclasses.replace(self.topology.route_sync, **changes))
        if self.route_sync_pid(node) is not None:
            self.kill_route_sync(node, sig)
        try:
            os.unlink(n.paths.state_file)  # start_route_sync waits for a fresh one
        except FileNotFoundError:
            pass
        return build.start_route_sync(cmd, topo, n.spec, self.name, self.dir, self.manifest)

    def reboot(self, node: str) -> float:
        """Reboot ``node`` of a Kubernetes lab (:mod:`lab.kube.reboot`): everything a reboot loses
        lost (its Pods' namespaces, attached here, detached), then its host's Open vSwitch (if any),
        containerd, the kubelet and kube-proxy started again.  Returns the kubelet's start
        (``time.monotonic()``); the Pods come back as the kubelet makes them again
        (:meth:`reattach_kube_pod` then gives the lab's handle on each)."""
        cluster = self.kube()
        n = self.node(node)
        p = kube_reboot.plan(self.name, self.topology, cluster.plan.node(node), n.paths,
                             tuple(pod.netns for pod in n.pods()))
        return kube_reboot.apply(cluster, p, n.paths)

    def await_kube_pod_back(self, node: str, name: str, timeout: float) -> Pod:
        """:meth:`reattach_kube_pod` once the kubelet has made the Pod's sandbox again (a new OVS
        port whose namespace exists, the Pod object running with that port's addresses)."""
        got: list[Pod] = []

        def back() -> bool:
            try:
                got.append(self.reattach_kube_pod(node, name))
            except LabError:
                return False
            return True

        kube_cluster.wait_for(f"pod {name} on {node} back", back, timeout)
        return got[-1]

    def restart_vswitchd(self, node: str, sig: int = 9) -> None:
        """Kill ``node``'s ovs-vswitchd (its flows die with it) and start it again; on Nodes
        without Open vSwitch of their own, Ferry's openvswitch container starts it again, and
        this returns once the new one answers."""
        n = self.node(node)
        kube = self.topology.kubernetes
        if kube is not None and kube.ferry_runs_ovs:
            ovs.kill_and_await_restart(n.netns, n.paths, sig)
            return
        ovs.stop_vswitchd(n.paths, sig)
        ovs.start_vswitchd(n.netns, n.paths)

    # ---------------------------------------------------------------- probes
    def _where(self, addr: str) -> str:
        """The namespace holding ``addr`` (a Pod, a Node, the router or the external host)."""
        for n in self.nodes:
            if addr in (a for a in n.addresses if a):
                return n.netns
            for p in n.pods():
                if addr in (p.ipv4, p.ipv6):
                    return p.netns
        for h in (self.router, self.external):
            if addr in h.addresses:
                return h.netns
        for n in self.nodes:  # a Pod gateway address lives on its Node
            if addr in layout.gateway_addresses(n.spec):
                return n.netns
        raise LabError(f"address {addr} is not in lab {self.name}")

    def ensure_echo(self, netns: str) -> None:
        """Start the TCP echo server in ``netns`` unless one runs (recorded under the lab dir)."""
        with self._echo_lock:
            rec = os.path.join(self.dir, "echo", f"{netns}.pid")
            pid = ovs.read_pid(rec)
            if pid and ECHO in cmdline(pid):
                return
            os.makedirs(os.path.dirname(rec), exist_ok=True)
            errlog = os.path.join(os.path.dirname(rec), f"{netns}.log")
            with open(errlog, "ab") as err:
                proc = subprocess.Popen(
                    in_netns(netns, [sys.executable, "-I", "-S", ECHO, "serve", str(ECHO_PORT)]),
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, start_new_session=True, text=True)
            line = proc.stdout.readline() if proc.stdout else ""
            if proc.stdout:
                proc.stdout.close()
            if line.strip() != "ready":
                proc.kill()
                rc = proc.wait()
                with open(errlog, errors="replace") as f:
                    tail = "".join(f.readlines()[-20:])
                # what the echo server (or `ip netns exec`) said, and what the namespace holds
                addrs = run(["ip", "-br", "addr"], netns=netns, check=False)
                raise LabError(f"echo server in {netns} did not start (exit {rc}, printed {line!r}); {errlog}:\n"
                               f"{tail}\nip -br addr: {addrs.returncode} {addrs.stdout}{addrs.stderr}")
            self.manifest.record("pid", pid=proc.pid, netns=netns, what="echo")
            layout.write_atomic(rec, f"{proc.pid}\n")

    def ping(self, src: Pod | Host | Node, dst: str, count: int = 1, timeout: float = 2.0,
             interval: float | None = None) -> Probe:
        """``count`` echo requests (``interval`` seconds apart, ping's 1 s by default); passes
        when every one was answered."""
        t0 = time.monotonic()
        every = ["-i", f"{interval:g}"] if interval is not None else []
        cp = src.exec(["ping", "-n", "-q", "-c", str(count), *every, "-W", str(max(1, int(timeout))), dst],
                      timeout=timeout * count + 5)
        ms = round((time.monotonic() - t0) * 1000, 1)
        ok = cp.returncode == 0
        detail = "" if ok else (cp.stdout.strip().splitlines() or [cp.stderr.strip()])[-1]
        return Probe(ok, detail, ms)

    def tcp(self, src: Pod | Host | Node, dst: str, size: int = 65536, timeout: float = 3.0) -> Probe:
        """Send ``size`` bytes to an echo server in ``dst``'s namespace and check they come back."""
        self.ensure_echo(self._where(dst))
        return self.connect(src, dst, ECHO_PORT, size=size, timeout=timeout)

    def connect(self, src: Pod | Host | Node, addr: str, port: int, udp: bool = False, size: int = 1000,
                timeout: float = 3.0) -> Probe:
        """One echo exchange with ``addr``:``port`` (a Service address, a NodePort...): whatever
        answers there must be an echo server (:meth:`ensure_echo`, port :data:`ECHO_PORT`)."""
        verb = "connect-udp" if udp else "connect"
        cp = src.exec([sys.executable, "-I", "-S", ECHO, verb, addr, str(port), str(size), str(timeout)],
                      timeout=timeout + 10)
        try:
            r = json.loads(cp.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return Probe(False, f"client failed: {cp.stderr.strip()[-200:]}")
        return Probe(bool(r["ok"]), r.get("error") or "", r.get("ms"), r.get("peer"), r.get("server"))


def _topology(topology: Topology | str | dict | None) -> tuple[Topology, dict]:
    if isinstance(topology, Topology):
        return topology, to_doc(topology)
    if topology is None or isinstance(topology, str):
        with open(topology or topology_mod.DEFAULT_TOPOLOGY) as f:
            doc = yaml.safe_load(f) or {}
    else:
        doc = topology
    topo = topology_mod.parse(doc)
    return topo, to_doc(topo)


def exists(name: str, root: str | None = None) -> bool:
    return os.path.exists(os.path.join(layout.lab_dir(name, root), MANIFEST))


__all__ = ["Host", "Lab", "LabError", "Node", "Pod", "PortStats", "Probe", "exists"]
