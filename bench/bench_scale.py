"""Ferry at cluster scale on a real API server (issue 46): what each real Node receives, what it
costs, and how long an API write takes to reach OVS, with PeerSlices (``policyPeers:
peerSlices``, ferry-controller) beside today's watch of every Pod (``policyPeers: cluster``), the
same cluster and churn for each, in one run.

    python -m bench.bench_scale [--nodes 1000] [--pods 29000] [--policies 3000] [--rate 20]
                                [--churn-seconds 60] [--burst 100] [--samples 20]
                                [--designs peerSlices,cluster] [--quick] [--json OUT] [--cni-bin DIR]

``--designs`` also takes ``peerSlicesSubscription``: peerSlices with ``ferry-controller --delivery
subscription`` (slices labelled with their group alone; each Node asks for the groups it reads, and
its watches here are the ones for the groups it reads at the churn's start).

For each design, one ferry-lab Kubernetes cluster (three real Nodes, encap/VXLAN, Ferry from its
DaemonSet; with peerSlices also ferry-controller's Deployment), then in its real API server
(:mod:`lab.kube.simulate`: objects whose status the bench sets, no kubelet behind them):

* ``--nodes`` simulated Nodes and ``--pods`` simulated Pods over them, in ``--pods / 300``
  Namespaces labelled ``team=t<i % 10>``; each Pod labelled ``app=a<i % 20>``,
  ``tier=web|db|cache`` and with a named port ``http``;
* ``--policies`` NetworkPolicies of the shapes people write (:func:`sim_policies`): default deny per
  Namespace, allow from a Namespace by label, from Pods by label, an ipBlock with except, a named
  port; they select simulated Pods (the controller plans them; no real Node reads them);
* on each real Node a Pod (``scale=srv-<node>``) selected by one policy of the lab's namespace:
  node-3's admits ``app=a1`` Pods of ``team=t1`` Namespaces (~1/200 of the Pods), node-2's
  ``tier=web`` Pods of ``team=t2`` (~1/30), node-1's a label no Pod has (it reads none).

Figures, per design:

* **received**, per real Node, during ``--churn-seconds`` of Pod operations at ``--rate`` a second
  (created, deleted, relabelled, at random over every simulated Pod): watch events and bytes
  (:mod:`lab.kube.watchcount`: the PeerSlice watches of the Node; for cluster, a watch of every Pod,
  which each Node's route-sync holds), split into events that change a Pod the Node's policies
  read (``relevance.reads`` of the cluster before and after the churn) and events that do not;
  route-sync's CPU per received event and its RSS, the Node's flows;
* **latency**, API write -> the flow in node-3's OVS (an ``ovs-ofctl monitor`` on its bridge: the
  first flow added or deleted that names the Pod's address, the policy's port or the Node's
  transport address), ``--samples`` of each: Pod added, Pod deleted, label moved into and out of
  the peer set, policy created and changed, Node added; taken while the churn runs, then Pod added
  during bursts of ``--burst`` operations in one second;
* the API server's and (peerSlices) the controller's CPU seconds over the churn and their RSS.

Percentiles nearest-rank; CPU from /proc (utime + stime).  ``--quick``: 100 Nodes, 2,900 Pods,
300 policies, 20 s of churn, 5 samples."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from bench.bench_kube import topology as kube_topology
from bench.util import FirstSeen, percentile
from lab import ovs
from lab.api import Lab, Node, ensure_cni_bin
from lab.kube import simulate as sim
from lab.kube.cluster import Cluster, cgroup_pids
from lab.kube.pods import api_name
from lab.kube.services import NAMESPACE as NS
from lab.kube.watchcount import Received, Watches, inputs_of
from routesync.model import TRANSPORT_ANNOTATION
from routesync.policy import relevance
from routesync.policy.subscription import subscribed

DESIGNS = ("peerSlices", "cluster")
# beside them with --designs: peerSlices with ferry-controller --delivery subscription (slices name no
# Node; each Node asks for its groups by name: docs/design/peerslices.md)
SUBSCRIPTION = "peerSlicesSubscription"
REAL = ("node-1", "node-2", "node-3")
TARGET = "node-3"  # the Node whose flows the latency figures watch
PODS_PER_NS = 300
PORT_BASE = 20000
LAT_TIMEOUT = 60.0
IPV4 = re.compile(r"(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3})(?![\d.])")
TP_DST = re.compile(r"tp_dst=(\d+)")
TUN_DST = re.compile(r"load:0x([0-9a-f]+)->NXM_NX_TUN_IPV4_DST")  # a tunnel's remote end, as ovs-ofctl prints it


def log(msg: str) -> None:
    print(f"[bench_scale] {msg}", file=sys.stderr, flush=True)


# -- the simulated cluster: plain data --

def ns_name(i: int) -> str:
    return f"scale-{i:03d}"


def ns_labels(name: str) -> dict[str, str]:
    return {"team": f"t{int(name.rsplit('-', 1)[1]) % 10}"}


def pod_labels(i: int) -> dict[str, str]:
    return {"app": f"a{i % 20}", "tier": ("web", "db", "cache")[i % 3], "v": "0"}


def _policy(ns: str, name: str, selector: dict[str, Any], ingress: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"namespace": ns, "name": name},
            "spec": {"podSelector": selector, "policyTypes": ["Ingress"], "ingress": ingress}}


SHAPES = ("deny", "from-namespace", "from-pods", "ipblock", "named-port")


def sim_policies(count: int, namespaces: list[str], rng: random.Random) -> list[dict[str, Any]]:
    """``count`` policies, the shapes dealt round the Namespaces (one default deny in each first)."""
    out = []
    for k in range(count):
        ns = namespaces[k % len(namespaces)]
        shape = SHAPES[(k // len(namespaces)) % len(SHAPES)]
        app = {"matchLabels": {"app": f"a{rng.randrange(20)}"}}
        name = f"{shape}-{k}"
        if shape == "deny":
            out.append(_policy(ns, name, {}, []))
        elif shape == "from-namespace":
            out.append(_policy(ns, name, app, [{"from": [{"namespaceSelector": {
                "matchLabels": {"team": f"t{rng.randrange(10)}"}}}]}]))
        elif shape == "from-pods":
            out.append(_policy(ns, name, {"matchLabels": {"tier": "db"}}, [{
                "from": [{"podSelector": {"matchLabels": {"tier": "web"}}}],
                "ports": [{"protocol": "TCP", "port": 5432}]}]))
        elif shape == "ipblock":
            out.append(_policy(ns, name, app, [{"from": [{"ipBlock": {
                "cidr": "10.244.0.0/16", "except": [f"10.244.{128 + rng.randrange(64)}.0/24"]}}]}]))
        else:
            out.append(_policy(ns, name, app, [{"from": [{"podSelector": {"matchLabels": {"tier": "web"}}}],
                                                "ports": [{"port": "http"}]}]))
    return out


def real_policies() -> list[dict[str, Any]]:
    """One per real Node's server Pod (module docstring)."""
    def peer(team: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        return [{"from": [{"namespaceSelector": {"matchLabels": {"team": team}},
                           "podSelector": {"matchLabels": labels}}]}]
    return [_policy(NS, "scale-node-3", {"matchLabels": {"scale": "srv-node-3"}}, peer("t1", {"app": "a1"})),
            _policy(NS, "scale-node-2", {"matchLabels": {"scale": "srv-node-2"}}, peer("t2", {"tier": "web"})),
            _policy(NS, "scale-node-1", {"matchLabels": {"scale": "srv-node-1"}},
                    [{"from": [{"podSelector": {"matchLabels": {"role": "nobody"}}}]}])]


# -- what a Node reads, from the API's objects --

def reads_of(api: Any, nodes: Iterable[str]) -> dict[str, frozenset[str]]:
    """``relevance.reads`` of each Node, from every Pod, Namespace and NetworkPolicy the API has."""
    inputs = inputs_of(api)
    return {n: relevance.reads(n, inputs) for n in nodes}


# -- the processes --

def cpu_rss(pid: int) -> tuple[float, int]:
    """(utime + stime in seconds, VmRSS in bytes) of ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return cpu, rss


def _argv(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def route_sync_pid(cluster: Cluster, node: str) -> int:
    for pid in sorted(cgroup_pids(cluster.plan.node(node).cgroup_root)):
        argv = _argv(pid)
        if argv and argv[0].endswith(b"ferry-route-sync") and b"run" in argv:
            return pid
    raise RuntimeError(f"no route-sync process on {node}")


def controller_pids(cluster: Cluster) -> list[int]:
    out = []
    for node in cluster.plan.nodes:
        for pid in sorted(cgroup_pids(node.cgroup_root)):
            argv = _argv(pid)
            if argv and argv[0].endswith(b"ferry-controller"):
                out.append(pid)
    return out


def apiserver_pid(cluster: Cluster) -> int:
    want = [a.encode() for a in cluster.plan.process("kube-apiserver").argv]
    for name in os.listdir("/proc"):
        if name.isdigit() and _argv(int(name))[:len(want)] == want:
            return int(name)
    raise RuntimeError("no kube-apiserver process")


# -- OVS: the moment a flow naming an address or a port is added or deleted --

def flow_keys(line: str) -> list[tuple[str, str]]:
    ev = "ADDED" if "event=ADDED" in line or "event=MODIFIED" in line else "DELETED" if "event=DELETED" in line else ""
    if not ev:
        return []
    tun = [str(ipaddress.IPv4Address(int(h, 16))) for h in TUN_DST.findall(line)]
    return [(ev, a) for a in IPV4.findall(line) + tun] + [(ev, f"port:{p}") for p in TP_DST.findall(line)]


def flow_monitor(node: Node, bridge: str) -> FirstSeen:
    argv = ["stdbuf", "-oL", "ovs-ofctl", "monitor", f"unix:{os.path.join(node.paths.ovs, bridge)}.mgmt",
            "watch:!initial"]
    return FirstSeen(["ip", "netns", "exec", node.netns, *argv], flow_keys, env=ovs.env(node.paths), stderr_too=True)


def flows(node: Node) -> int:
    return sum(1 for line in node.ofctl("dump-flows").splitlines() if "cookie=" in line)


def summary(samples_s: list[float]) -> dict[str, Any]:
    ms = [x * 1000 for x in samples_s]
    return {"n": len(ms), "p50_ms": round(percentile(ms, 50), 1) if ms else None,
            "p99_ms": round(percentile(ms, 99), 1) if ms else None, "max_ms": round(max(ms), 1) if ms else None}


# -- one design --

class Churn:
    """Pod operations at ``rate`` a second on a thread, at random over the simulated Pods."""

    def __init__(self, s: sim.Simulator, pods: dict[str, sim.SimPod], spare: Iterable[sim.SimPod], rate: float,
                 rng: random.Random) -> None:
        self.s, self.pods, self.spare, self.rate, self.rng = s, pods, iter(spare), rate, rng
        self.lock = threading.Lock()
        self.done = 0
        self.missed = 0
        # what it did to each Pod, in order: key -> [(kind, the app label after)] (the report names
        # what was done to the Pods behind events counted as referenced by no Node)
        self.did: dict[str, list[tuple[str, str | None]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def one(self) -> None:
        with self.lock:
            kind = self.rng.choice(("create", "delete", "relabel"))
            new = next(self.spare, None) if kind == "create" else None
            if new is not None:
                p = new
            else:
                kind = "relabel" if kind == "create" else kind
                key = self.rng.choice(list(self.pods))
                p = self.pods.pop(key) if kind == "delete" else self.pods[key]
        from kubernetes.client.exceptions import ApiException

        app: str | None = None  # the Pod's app label after the operation (None: deleted)
        try:
            if kind == "create":
                self.s.create_pod(p)
                app = p.labels.get("app")
                with self.lock:
                    self.pods[f"{p.namespace}/{p.name}"] = p  # others pick it once it exists
            elif kind == "delete":
                self.s.delete_pod(p)
            else:
                app = f"a{self.rng.randrange(20)}"
                self.s.label_pod(p, {"app": app})
            with self.lock:
                self.did.setdefault(f"{p.namespace}/{p.name}", []).append((kind, app))
        except ApiException as e:  # a relabel of a Pod a burst's other thread deleted meanwhile
            if e.status != 404:
                raise
            self.missed += 1
        self.done += 1

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            self.one()
            ahead = t0 + self.done / self.rate - time.monotonic()
            if ahead > 0:
                self._stop.wait(ahead)  # the rate, not a synchronisation: no figure depends on it

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def measure_latencies(lab: Lab, s: sim.Simulator, mon: FirstSeen, shape: argparse.Namespace,
                      t1_namespaces: list[str], spare_ips: Iterable[str], samples: int) -> dict[str, Any]:
    """API write -> node-3's flow, ``samples`` of each kind (module docstring)."""
    ips = iter(spare_ips)
    out: dict[str, list[float]] = {k: [] for k in ("pod_added", "pod_deleted", "label_into_peers",
                                                    "label_out_of_peers", "policy_created", "policy_changed",
                                                    "node_added")}

    def timed(kind: str, key: tuple[str, str], write: Callable[..., Any], *args: Any) -> None:
        t = time.monotonic()
        write(*args)
        try:
            out[kind].append(mon.wait_after(key, t, LAT_TIMEOUT) - t)
        except TimeoutError:
            log(f"{kind}: {key} not seen in node-3's flows within {LAT_TIMEOUT:.0f} s")
    from kubernetes import client

    net: Any = client.NetworkingV1Api(s.core.api_client)
    for k in range(samples):
        ns = t1_namespaces[k % len(t1_namespaces)]
        p = sim.SimPod(ns, f"lat-{k:03d}", sim.node_name(shape.nodes), {"app": "a1", "tier": "db", "v": "0"},
                       next(ips))
        timed("pod_added", ("ADDED", p.ip), s.create_pod, p)
        timed("label_out_of_peers", ("DELETED", p.ip), s.label_pod, p, {"app": "a2"})
        timed("label_into_peers", ("ADDED", p.ip), s.label_pod, p, {"app": "a1"})
        timed("pod_deleted", ("DELETED", p.ip), s.delete_pod, p)
        port = PORT_BASE + 2 * k
        pol = _policy(NS, f"lat-{k}", {"matchLabels": {"scale": "srv-node-3"}},
                      [{"from": [{"ipBlock": {"cidr": "10.244.0.0/16"}}], "ports": [{"port": port}]}])
        timed("policy_created", ("ADDED", f"port:{port}"), net.create_namespaced_network_policy, NS, pol)
        pol["spec"]["ingress"][0]["ports"][0]["port"] = port + 1
        timed("policy_changed", ("ADDED", f"port:{port + 1}"), net.replace_namespaced_network_policy, f"lat-{k}",
              NS, pol)
        net.delete_namespaced_network_policy(f"lat-{k}", NS)
        node = sim.node_objects(shape.nodes + 3 + k)[-1]  # past the latency and churn Pods' Nodes
        transport = node["metadata"]["annotations"][TRANSPORT_ANNOTATION]
        timed("node_added", ("ADDED", transport), s.create_nodes, [node])
    return {k: summary(v) for k, v in out.items()}


def burst_latency(s: sim.Simulator, churn: Churn, mon: FirstSeen, shape: argparse.Namespace, t1_namespaces: list[str],
                  spare_ips: Iterable[str], bursts: int, size: int) -> dict[str, Any]:
    """``bursts`` times: ``size`` operations within a second, one of them a Pod node-3 reads, added."""
    ips = iter(spare_ips)
    lat = []
    for b in range(bursts):
        p = sim.SimPod(t1_namespaces[b % len(t1_namespaces)], f"burst-{b:03d}", sim.node_name(shape.nodes),
                       {"app": "a1", "tier": "db", "v": "0"}, next(ips))
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=8) as pool:
            futures = [pool.submit(churn.one) for _ in range(size // 2)]
            t = time.monotonic()
            s.create_pod(p)
            futures += [pool.submit(churn.one) for _ in range(size - size // 2 - 1)]
            for f in futures:
                f.result()
        try:
            lat.append(mon.wait_after(("ADDED", p.ip), t, LAT_TIMEOUT) - t)
        except TimeoutError:
            log(f"burst {b}: {p.ip} not seen within {LAT_TIMEOUT:.0f} s")
        s.delete_pod(p)
    return summary(lat)


def split(events: list[Received], reads: frozenset[str], every_pod: bool,
          did: Mapping[str, list[tuple[str, str | None]]] | None = None) -> dict[str, Any]:
    """The events that changed a Pod the Node reads (before or after the churn) and the rest;
    the rest's Pods (at most 20) with what the churn did to each (``did``), so that a Pod read
    only in between (labelled into a peer set and out again) is told from one read never."""
    ref = [e for e in events if e.changed & reads]
    other = [e for e in events if not e.changed & reads]
    keys = sorted({k for e in other for k in e.changed})
    return {"events": len(events), "bytes": sum(e.size for e in events), "referenced": len(ref),
            "referenced_bytes": sum(e.size for e in ref), "not_referenced": len(other),
            "not_referenced_bytes": sum(e.size for e in other), "source": "every Pod" if every_pod else "PeerSlices",
            "not_referenced_pods": {k: [list(x) for x in (did or {}).get(k, [])] for k in keys[:20]}}


def run_design(design: str, args: argparse.Namespace, cni_bin: str) -> dict[str, Any]:
    from kubernetes import config as kconfig

    topo = kube_topology("ferry")
    topo["routeSync"] = {**topo["routeSync"], "policyPeers": "peerSlices" if design == SUBSCRIPTION else design}
    if design == SUBSCRIPTION:  # the controller starts with --delivery subscription (no rollout after)
        topo["kubernetes"] = {**topo["kubernetes"], "controllerDelivery": "subscription"}
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    lab = Lab.up(topo, name=f"bsc{os.getpid() % 1000}{design[0]}{len(design)}", cni_bin=cni_bin)
    result: dict[str, Any] = {"design": design, "cluster_up_s": round(time.monotonic() - t0, 1)}
    try:
        cluster = lab.kube()
        for n in REAL:
            lab.add_pod(n, "scalesrv")
            cluster.kubectl("label", "pod", "-n", NS, api_name(n, "scalesrv"), f"scale=srv-{n}", "--overwrite")
        namespaces = [ns_name(i) for i in range(max(10, args.pods // PODS_PER_NS))]
        per_node = -(-args.pods // args.nodes)
        pods = sim.pod_objects(args.nodes, per_node, namespaces, pod_labels, (("http", 8080),))[:args.pods]
        with sim.api_netns(cluster.plan.process("kube-apiserver").netns):
            api = kconfig.new_client_from_config(cluster.plan.admin_kubeconfig)
            s = sim.Simulator(api)
            from kubernetes import client

            net: Any = client.NetworkingV1Api(api)
            mon = flow_monitor(lab.node(TARGET), lab.topology.bridge)
            t = time.monotonic()
            s.create_namespaces(namespaces, ns_labels)
            # and two more: the latency Pods' Node, the churn's (a Pod bound to a Node that does not
            # exist is an orphan the Pod garbage collector deletes ~40 s later: extra churn, and
            # events no snapshot of what the Nodes read explains)
            s.create_nodes(sim.node_objects(args.nodes + 2))
            for pol in real_policies():
                net.create_namespaced_network_policy(NS, pol)
            s.each(lambda pol: net.create_namespaced_network_policy(pol["metadata"]["namespace"], pol),
                    sim_policies(args.policies, namespaces, rng))
            s.create_pods(pods)
            result["objects_written_s"] = round(time.monotonic() - t, 1)
            spare_ips = list(sim.node_pod_ips(args.nodes))
            t1 = [n for n in namespaces if ns_labels(n)["team"] == "t1"]
            # caught up: a Pod node-3 reads, written last, is in its flows (every earlier event was
            # handled before it: one watch, one order)
            last = sim.SimPod(t1[0], "caught-up", sim.node_name(args.nodes), {"app": "a1", "v": "0"}, spare_ips.pop())
            s.create_pod(last)
            mon.wait(("ADDED", last.ip), 1800)
            result["converged_s"] = round(time.monotonic() - t, 1)
            log(f"{design}: {args.nodes} Nodes, {len(pods)} Pods, {args.policies} policies written and in node-3's "
                f"flows in {result['converged_s']} s")
            reads_before = reads_of(api, REAL)
            watches = Watches(api)
            if design == "cluster":
                watches.every_pod()
            elif design == SUBSCRIPTION:  # the groups each Node asks for now (its own Pods do not churn)
                inputs = inputs_of(api)
                for n in REAL:
                    watches.groups_of(n, subscribed(n, inputs))
            else:
                for n in REAL:
                    watches.slices_of(n)
            procs = {n: route_sync_pid(cluster, n) for n in REAL}
            procs["kube-apiserver"] = apiserver_pid(cluster)
            for i, pid in enumerate(controller_pids(cluster)):
                procs[f"controller-{i}"] = pid
            before = {k: cpu_rss(pid) for k, pid in procs.items()}
            live = {f"{p.namespace}/{p.name}": p for p in pods}
            churn_ips = iter(sim.node_pod_ips(args.nodes + 1))  # a spare Node's block: Pods the churn creates
            spare = (sim.SimPod(namespaces[j % len(namespaces)], f"churn-{j:05d}", sim.node_name(args.nodes + 1),
                                pod_labels(j), ip, (("http", 8080),)) for j, ip in enumerate(churn_ips))
            churn = Churn(s, live, spare, args.rate, rng)
            t_churn = time.monotonic()
            churn.start()
            result["latency"] = measure_latencies(lab, s, mon, args, t1, spare_ips[:args.samples], args.samples)
            log(f"{design}: API write -> node-3's flow: {json.dumps(result['latency'])}")  # kept if a later step fails
            while time.monotonic() < t_churn + args.churn_seconds:
                time.sleep(0.5)  # the churn runs its course; nothing is measured by this wait
            churn.stop()
            window = time.monotonic() - t_churn
            after = {k: cpu_rss(pid) for k, pid in procs.items()}
            # the bursts' Pods: the spare addresses the latency Pods did not take, then theirs (each
            # of those Pods was deleted, and its flows seen gone, before)
            result["burst_pod_added"] = burst_latency(s, churn, mon, args, t1,
                                                      spare_ips[args.samples:] + spare_ips[:args.samples],
                                                      args.samples, args.burst)
            log(f"{design}: bursts of {args.burst}: {json.dumps(result['burst_pod_added'])}")
            watches.stop()
            if watches.errors:
                raise RuntimeError(f"a watch broke, its counts are short: {watches.errors}")
            reads_after = reads_of(api, REAL)
            result["churn"] = {"seconds": round(window, 1), "operations": churn.done, "missed_404": churn.missed}
            # the latency Pods: node-3's policy reads each by construction (the bench waited for
            # each in its flows), but each came and went inside the window, so neither snapshot of
            # what the Nodes read holds it
            sampled = frozenset(f"{t1[k % len(t1)]}/lat-{k:03d}" for k in range(args.samples))
            received = {}
            for n in REAL:
                events = watches.since("every-pod" if design == "cluster" else n, t_churn)
                events = [e for e in events if e.at <= t_churn + window]
                r = split(events, reads_before[n] | reads_after[n] | (sampled if n == TARGET else frozenset()),
                          design == "cluster", churn.did)
                cpu = after[n][0] - before[n][0]
                r.update(per_second=round(r["events"] / window, 1), route_sync_cpu_s=round(cpu, 2),
                         route_sync_cpu_ms_per_event=round(1000 * cpu / r["events"], 2) if r["events"] else None,
                         route_sync_rss_mb=round(after[n][1] / 2 ** 20, 1), flows=flows(lab.node(n)),
                         reads=len(reads_after[n]))
                received[n] = r
            result["received"] = received
            result["processes"] = {k: {"cpu_s": round(after[k][0] - before[k][0], 2),
                                       "cpu_cores": round((after[k][0] - before[k][0]) / window, 3),
                                       "rss_mb": round(after[k][1] / 2 ** 20, 1)}
                                   for k in procs if k not in REAL}
            mon.close()
    finally:
        if not args.keep:
            lab.down()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=29000)  # 29 a simulated Node (lab.kube.simulate)
    ap.add_argument("--policies", type=int, default=3000)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--churn-seconds", type=float, default=60.0)
    ap.add_argument("--burst", type=int, default=100)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--designs", default=",".join(DESIGNS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--keep", action="store_true", help="leave each lab up")
    ap.add_argument("--json")
    ap.add_argument("--cni-bin")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.pods, args.policies, args.churn_seconds, args.samples = 100, 2900, 300, 20.0, 5
    if -(-args.pods // args.nodes) > sim.PODS_PER_NODE:
        ap.error(f"--pods {args.pods} over --nodes {args.nodes}: at most {sim.PODS_PER_NODE} Pods a simulated Node")
    if args.samples > sim.PODS_PER_NODE - 1:  # the latency and burst Pods: one Node's block, one taken to catch up
        ap.error(f"--samples {args.samples}: at most {sim.PODS_PER_NODE - 1} (the addresses of one simulated Node)")
    cni_bin = ensure_cni_bin(os.path.abspath(args.cni_bin or os.path.join("build", "cni-bin")))
    results = {"nodes": args.nodes, "pods": args.pods, "policies": args.policies, "rate": args.rate,
               "burst": args.burst, "designs": {}}
    for design in args.designs.split(","):
        results["designs"][design] = run_design(design, args, cni_bin)
        print(json.dumps(results["designs"][design], indent=1))
        if args.json:  # after each design: a later one's failure keeps what was measured
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
