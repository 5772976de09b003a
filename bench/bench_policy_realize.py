"""NetworkPolicy realization on a real Kubernetes cluster (issue 27): how long after the API has a
policy every Node enforces it, and how long after a selected Pod is Running its allowed peers
reach it, each beside a reference measured in the same run.

    python -m bench.bench_policy_realize [--pods-per-node 100] [--policies 100] [--tier-policies 50] [--reach 20]
                                         [--json OUT] [--cni-bin DIR]

One three-Node ferry-lab cluster (``ferry-lab up --kubernetes``, encap/VXLAN, kube-proxy and
CoreDNS as everywhere), Ferry from its image and DaemonSet.  ``--pods-per-node`` Pods on each Node
(the lab's busybox, ``sleep``), Pod ``j`` of every Node labelled ``grp=g<j % policies>``, so each
policy below selects one Pod or more on every Node and every Node has work for each.

**Policy created -> enforced on every Node.** ``--policies`` NetworkPolicies, created one after
another through the API (each POSTed on one kept-alive connection from the external host, the moment
the request leaves being "created", :data:`CREATOR`): policy ``i`` selects ``grp=g<i>`` and allows
ingress from the cluster's IPv4 Pod CIDR (an ``ipBlock``) on TCP port ``20000 + i`` only, a port no
other flow names. On each Node an ``ovs-ofctl monitor watch:`` on the bridge reports flow additions
as they happen; a policy is enforced on a Node at the first added flow that matches ``tp_dst=<its
port>`` (route-sync installs a plan's flows in one transaction, so its isolation drops come with
it), on every Node at the last of the three. The reference, in the same run: the same policy seen by
a watch on the API (``kubectl get networkpolicies --watch``), i.e. what any controller could know at
best. Each policy waits for the previous one to be enforced everywhere (a queue of changes would
measure throughput, not latency). Goal: p99 <= 500 ms.

**A ClusterNetworkPolicy beside a NetworkPolicy** (issue 43: "policy created -> enforced p99 for a
ClusterNetworkPolicy <= that of a NetworkPolicy in the same run").  ``--tier-policies`` pairs, created
the same way, the two kinds taking turns to go first (:func:`tier_order`): pair ``i`` is an Admin-tier
Accept and a NetworkPolicy allow with the same subject (``grp=g<i>``) and the same peers (every Pod
of every Namespace), each on a port only it names (:func:`tier_pair`); enforced on a Node at the
first added flow naming its port, as above, and each kind beside its own API watch.

**Pod Running -> reachable by the peers a policy allows.**  A prober Pod on node-1 (``role=prober``)
and a policy allowing it, all ports, into Pods labelled ``reach=yes``.  ``--reach`` Pods are
created on node-2 and node-3 in turn, half labelled ``reach=yes`` in ``default`` (where policies
exist, so the plugin's ADD holds the Pod closed until route-sync has planned it) and half in a
namespace without any policy (the reference: open from the ADD on).  A watch on the API times each
Pod Running with addresses; from then a process in the prober's netns connects to a closed port
of the Pod every few milliseconds (50 ms timeout each) until a reset comes back: a packet reached
the Pod.  The figure is reset time minus Running time (negative: reachable before the watch said
Running).  Goal: p99 <= 1 s.

Each measurement starts once the cluster has settled (:func:`settle`: Nodes and kube-system Pods
Ready, the load average under twice the core count), the waits and load averages in the results.
Percentiles are nearest-rank.  The two clocks are the same (``CLOCK_MONOTONIC``, shared by every
process of the machine)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import yaml

from bench.bench_kube import NODES, running_watch
from bench.bench_kube import topology as kube_topology
from bench.util import FirstSeen, percentile
from lab import ovs
from lab.api import Lab, Node, ensure_cni_bin
from lab.kube import pods as kube_pods
from lab.kube.cluster import Cluster, kubectl_argv
from routesync.policy.cnp.model import GROUP as CNP_GROUP
from routesync.policy.cnp.model import VERSION as CNP_VERSION

PORT_BASE = 20000
# the policies' peers: an address block, so that each rule has flows whatever Pods exist (a rule
# whose podSelector matches no Pod allows nothing, and has none)
CLIENTS = "10.244.0.0/16"
OPEN_NS = "bench-open"  # no policy there: the reference Pods
CLOSED_PORT = 81
ENFORCE_GOAL_MS = 500.0  # issue 27: p99
REACH_GOAL_MS = 1000.0  # issue 27: p99
ENFORCE_TIMEOUT = 30.0
# the tiers' figure (issue 43): each policy's port, one range per kind, apart from PORT_BASE's
NP_TIER_PORT_BASE = 21000
CNP_PORT_BASE = 22000
NP_KIND, CNP_KIND = "networkpolicy", "clusternetworkpolicy"

# the prober's loop, in its netns: for each address on stdin, connect to a closed port until a
# reset comes back; print the moment (CLOCK_MONOTONIC) and how many tries
PROBER = ("import socket, sys, time, errno\n"
          "for line in sys.stdin:\n"
          "    addr, port = line.split()\n"
          "    fam = socket.AF_INET6 if ':' in addr else socket.AF_INET\n"
          "    tries = 0\n"
          "    while True:\n"
          "        tries += 1\n"
          "        s = socket.socket(fam, socket.SOCK_STREAM); s.settimeout(0.05)\n"
          "        try:\n"
          "            rc = s.connect_ex((addr, int(port)))\n"
          "        except OSError as e:\n"
          "            rc = e.errno\n"
          "        s.close()\n"
          "        if rc in (errno.ECONNREFUSED, 0):\n"
          "            break\n"
          "    print(time.monotonic(), tries, flush=True)\n")


# the creator, in the external host's netns (where the API server is reached): for each policy (a
# JSON line on stdin), POST it on one kept-alive TLS connection with the admin's certificate; print
# the moment the request left (CLOCK_MONOTONIC), the moment the answer came and its status.  "Created"
# is when the request is sent, not when a kubectl process is spawned: on this 2-core machine a
# kubectl start (Go runtime, kubeconfig, discovery cache) costs 100 ms and more under load, a cost
# of the client, not of the cluster.
CREATOR = ("import http.client, json, ssl, sys, time, urllib.parse\n"
           "server, ca, cert, key = sys.argv[1:5]\n"
           "u = urllib.parse.urlsplit(server)\n"
           "ctx = ssl.create_default_context(cafile=ca); ctx.load_cert_chain(cert, key)\n"
           "conn = http.client.HTTPSConnection(u.hostname, u.port or 443, context=ctx)\n"
           "for line in sys.stdin:\n"
           "    req = json.loads(line)\n"
           "    body = json.dumps(req['doc']).encode()\n"
           "    sent = time.monotonic()\n"
           "    conn.request('POST', req['path'], body, {'Content-Type': 'application/json'})\n"
           "    r = conn.getresponse(); r.read()\n"
           "    print(sent, time.monotonic(), r.status, flush=True)\n")


def collection_path(doc: dict[str, Any]) -> str:
    """Where the API server creates ``doc``: a NetworkPolicy in its namespace, a
    ClusterNetworkPolicy at the cluster's scope."""
    group_version = doc["apiVersion"]
    if doc["kind"] == "NetworkPolicy":
        return f"/apis/{group_version}/namespaces/{doc['metadata']['namespace']}/networkpolicies"
    if doc["kind"] == "ClusterNetworkPolicy":
        return f"/apis/{group_version}/clusternetworkpolicies"
    raise ValueError(f"kind: {doc['kind']!r} is not a policy this bench creates")


def creator(cluster: Cluster) -> subprocess.Popen[str]:
    """The :data:`CREATOR` process, with the admin kubeconfig's server and credentials."""
    with open(cluster.plan.admin_kubeconfig) as f:
        conf = yaml.safe_load(f)
    server, user = conf["clusters"][0]["cluster"], conf["users"][0]["user"]
    argv = ["nsenter", f"--net=/run/netns/{cluster.plan.control_plane[0].netns}", "--", sys.executable, "-I", "-S",
            "-c", CREATOR, server["server"], server["certificate-authority"], user["client-certificate"],
            user["client-key"]]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def log(msg: str) -> None:
    print(f"[bench_policy_realize] {msg}", file=sys.stderr, flush=True)


def group_policy(i: int) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": f"bench-g{i}", "namespace": kube_pods.NAMESPACE},
            "spec": {"podSelector": {"matchLabels": {"grp": f"g{i}"}}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"ipBlock": {"cidr": CLIENTS}}],
                                  "ports": [{"protocol": "TCP", "port": PORT_BASE + i}]}]}}


def reach_policy() -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "bench-reach", "namespace": kube_pods.NAMESPACE},
            "spec": {"podSelector": {"matchLabels": {"reach": "yes"}}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "prober"}}}]}]}}


def bulk_pods(per_node: int, policies: int) -> dict[str, Any]:
    items = []
    for node in NODES:
        for j in range(per_node):
            doc = kube_pods.pod_spec(kube_pods.api_name(node, f"bulk{j}"), node)
            doc["metadata"]["labels"]["grp"] = f"g{j % policies}"
            items.append(doc)
    return {"apiVersion": "v1", "kind": "List", "items": items}


PORT_MATCH = re.compile(r"\btp_dst=(\d+)\b")


def added_ports(line: str) -> list[int]:
    """The ``tp_dst`` ports of a flow that an ``ovs-ofctl monitor`` line reports added or
    modified (none for removed ones)."""
    if "event=ADDED" not in line and "event=MODIFIED" not in line:
        return []
    return [int(m[1]) for m in PORT_MATCH.finditer(line)]


def flow_monitor(node: Node, bridge: str) -> FirstSeen:
    """``ovs-ofctl monitor <bridge> watch:`` on one Node: the moment each port first shows up in
    an added (or modified) flow."""
    # !initial: not the flows already there; stdbuf: each line as it comes (OVS 3.1 prints the
    # first reply on stdout, the updates after it on stderr)
    argv = ["stdbuf", "-oL", "ovs-ofctl", "monitor", f"unix:{os.path.join(node.paths.ovs, bridge)}.mgmt",
            "watch:!initial"]
    return FirstSeen(["ip", "netns", "exec", node.netns, *argv], added_ports, env=ovs.env(node.paths),
                     stderr_too=True)


def api_watch(argv: list[str]) -> FirstSeen:
    """``kubectl get <kind> --watch -o name``: the moment each name is first seen."""
    return FirstSeen(argv, lambda line: [n] if (n := line.strip().split("/")[-1]) else [])


def summary(samples: list[float]) -> dict[str, Any]:
    return {"n": len(samples), "p50_ms": round(percentile(samples, 50), 1), "p90_ms": round(percentile(samples, 90), 1),
            "p99_ms": round(percentile(samples, 99), 1), "max_ms": round(max(samples), 1),
            "samples_ms": [round(x, 1) for x in samples]}


@dataclass(frozen=True)
class Timing:
    """One policy's figures, ms from the moment its POST left: enforced on every Node, seen by a
    watch on the API, the POST answered, and the spread between the first and the last Node."""

    enforced: float
    api: float
    answered: float
    spread: float


def create_and_time(post: subprocess.Popen[str], monitors: list[FirstSeen], watch: FirstSeen,
                    doc: dict[str, Any], port: int) -> Timing:
    """POSTs ``doc`` through the :data:`CREATOR` and waits until every Node's bridge has a flow
    naming ``port`` and the API watch has seen it."""
    assert post.stdin is not None and post.stdout is not None
    post.stdin.write(json.dumps({"path": collection_path(doc), "doc": doc}) + "\n")
    post.stdin.flush()
    sent, done, status = post.stdout.readline().split()
    if status != "201":
        raise RuntimeError(f"creating {doc['kind']} {doc['metadata']['name']}: HTTP {status}")
    t0 = float(sent)
    at = [m.wait(port, ENFORCE_TIMEOUT) for m in monitors]
    api = watch.wait(doc["metadata"]["name"], ENFORCE_TIMEOUT)
    return Timing((max(at) - t0) * 1000, (api - t0) * 1000, (float(done) - t0) * 1000, (max(at) - min(at)) * 1000)


def measure_enforcement(lab: Lab, policies: int) -> dict[str, Any]:
    cluster = lab.kube()
    monitors = [flow_monitor(lab.node(n), lab.topology.bridge) for n in NODES]
    watch = api_watch(kubectl_argv(cluster.plan, ["get", "networkpolicies", "-n", kube_pods.NAMESPACE, "--watch",
                                                 "-o", "name"]))
    post = creator(cluster)
    assert post.stdin is not None
    timings = []
    with ExitStack() as running:
        for w in (watch, *monitors):
            running.callback(w.close)
        running.callback(post.wait, 10)
        running.callback(post.stdin.close)
        for i in range(policies):
            timings.append(create_and_time(post, monitors, watch, group_policy(i), PORT_BASE + i))
    out = {"enforced_all_nodes": summary([t.enforced for t in timings]),
           "api_watch": summary([t.api for t in timings]),
           "create_answered": summary([t.answered for t in timings]),
           "node_spread": summary([t.spread for t in timings])}
    ours = out["enforced_all_nodes"]
    out["ratios"] = {"enforced_over_api_p50": ours["p50_ms"] / max(out["api_watch"]["p50_ms"], 0.1),
                     "enforced_p99_over_goal": ours["p99_ms"] / ENFORCE_GOAL_MS}
    return out


def tier_pair(i: int) -> dict[str, tuple[dict[str, Any], int]]:
    """Policy ``i`` of the tiers' figure as both kinds, each with the port only it names: the same
    subject (``grp=g<i>`` in the bench's namespace) and the same peers (every Pod of every
    Namespace), an Admin-tier Accept beside a NetworkPolicy's allow."""
    np_port, cnp_port = NP_TIER_PORT_BASE + i, CNP_PORT_BASE + i
    np = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
          "metadata": {"name": f"bench-np-g{i}", "namespace": kube_pods.NAMESPACE},
          "spec": {"podSelector": {"matchLabels": {"grp": f"g{i}"}}, "policyTypes": ["Ingress"],
                   "ingress": [{"from": [{"namespaceSelector": {}}],
                                "ports": [{"protocol": "TCP", "port": np_port}]}]}}
    cnp = {"apiVersion": f"{CNP_GROUP}/{CNP_VERSION}", "kind": "ClusterNetworkPolicy",
           "metadata": {"name": f"bench-cnp-g{i}"},
           "spec": {"tier": "Admin", "priority": i % 1001,
                    "subject": {"pods": {"namespaceSelector": {"matchLabels": {
                        "kubernetes.io/metadata.name": kube_pods.NAMESPACE}},
                        "podSelector": {"matchLabels": {"grp": f"g{i}"}}}},
                    "ingress": [{"name": "bench", "action": "Accept", "from": [{"namespaces": {}}],
                                 "protocols": [{"tcp": {"destinationPort": {"number": cnp_port}}}]}]}}
    return {NP_KIND: (np, np_port), CNP_KIND: (cnp, cnp_port)}


def tier_order(i: int) -> tuple[str, str]:
    """Which kind goes first for policy ``i``: they take turns, so neither always meets the
    other's wake."""
    return (NP_KIND, CNP_KIND) if i % 2 == 0 else (CNP_KIND, NP_KIND)


def measure_tiers(lab: Lab, policies: int) -> dict[str, Any]:
    """Issue 43: a ClusterNetworkPolicy created -> enforced on every Node beside a NetworkPolicy of
    the same subject and peers, the two kinds interleaved in one run (:func:`tier_pair`)."""
    cluster = lab.kube()
    monitors = [flow_monitor(lab.node(n), lab.topology.bridge) for n in NODES]
    watches = {NP_KIND: api_watch(kubectl_argv(cluster.plan, ["get", "networkpolicies", "-n", kube_pods.NAMESPACE,
                                                              "--watch", "-o", "name"])),
               CNP_KIND: api_watch(kubectl_argv(cluster.plan, ["get", "clusternetworkpolicies", "--watch",
                                                               "-o", "name"]))}
    post = creator(cluster)
    assert post.stdin is not None
    timings: dict[str, list[Timing]] = {NP_KIND: [], CNP_KIND: []}
    with ExitStack() as running:
        for w in (*watches.values(), *monitors):
            running.callback(w.close)
        running.callback(post.wait, 10)
        running.callback(post.stdin.close)
        for i in range(policies):
            pair = tier_pair(i)
            for kind in tier_order(i):
                doc, port = pair[kind]
                timings[kind].append(create_and_time(post, monitors, watches[kind], doc, port))
    out: dict[str, Any] = {}
    for kind, ts in timings.items():
        out[kind] = {"enforced_all_nodes": summary([t.enforced for t in ts]), "api_watch": summary([t.api for t in ts])}
    out["ratios"] = {"cnp_over_np_p99": out[CNP_KIND]["enforced_all_nodes"]["p99_ms"]
                     / max(out[NP_KIND]["enforced_all_nodes"]["p99_ms"], 0.1),
                     "cnp_over_np_p50": out[CNP_KIND]["enforced_all_nodes"]["p50_ms"]
                     / max(out[NP_KIND]["enforced_all_nodes"]["p50_ms"], 0.1)}
    return out


def measure_reach(lab: Lab, n: int) -> dict[str, Any]:
    cluster = lab.kube()
    cluster.kubectl("create", "namespace", OPEN_NS, check=False)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(reach_policy()))
    prober = lab.add_pod("node-1", "prober")
    cluster.kubectl("label", "pod", "-n", kube_pods.NAMESPACE, kube_pods.api_name("node-1", "prober"),
                    "role=prober", "--overwrite")
    proc = subprocess.Popen(["ip", "netns", "exec", prober.netns, sys.executable, "-I", "-S", "-c", PROBER],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    watches = {ns: running_watch(kubectl_argv(cluster.plan, ["get", "pods", "-n", ns, "--watch",
                                                            "--output-watch-events", "-o", "json"]))
               for ns in (kube_pods.NAMESPACE, OPEN_NS)}
    got: dict[str, list[float]] = {"policy": [], "open": []}
    tries: dict[str, list[int]] = {"policy": [], "open": []}
    try:
        for k in range(n):
            case = "policy" if k % 2 == 0 else "open"
            ns = kube_pods.NAMESPACE if case == "policy" else OPEN_NS
            node = NODES[1 + (k // 2) % 2]
            name = kube_pods.api_name(node, f"reach{k}")
            doc = kube_pods.pod_spec(name, node, namespace=ns)
            if case == "policy":
                doc["metadata"]["labels"]["reach"] = "yes"
            cluster.kubectl("create", "-f", "-", input=json.dumps(doc))
            running = watches[ns].wait(name, 120)
            ip = cluster.kubectl("get", "pod", "-n", ns, name, "-o", "jsonpath={.status.podIP}").stdout.strip()
            proc.stdin.write(f"{ip} {CLOSED_PORT}\n")
            proc.stdin.flush()
            at, count = proc.stdout.readline().split()
            got[case].append((float(at) - running) * 1000)
            tries[case].append(int(count))
            # gone before the next: with 100 bulk Pods a Node is near the kubelet's 110-Pod limit
            cluster.kubectl("delete", "pod", "-n", ns, name, "--wait=true", "--grace-period=1")
    finally:
        for w in watches.values():
            w.close()
        proc.stdin.close()
        proc.wait(10)
    out: dict[str, Any] = {c: {**summary(v), "tries": tries[c]} for c, v in got.items()}
    out["ratios"] = {"policy_over_open_p50": out["policy"]["p50_ms"] / max(out["open"]["p50_ms"], 1.0),
                     "policy_p99_over_goal": out["policy"]["p99_ms"] / REACH_GOAL_MS}
    return out


def wait_pods_running(lab: Lab, want: int, timeout: float) -> float:
    """Seconds until ``want`` Pods of the namespace are Running (polled through the API)."""
    t0 = time.monotonic()
    cluster = lab.kube()
    while True:
        out = cluster.kubectl("get", "pods", "-n", kube_pods.NAMESPACE, "--field-selector", "status.phase=Running",
                              "-o", "name", check=False).stdout
        running = sum(1 for line in out.splitlines() if "/" in line and "bulk" in line)
        if running >= want:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{running} of {want} Pods Running after {timeout}s")
        time.sleep(2)  # a progress poll of a bulk start, not a measurement


SETTLE_TIMEOUT = 600.0


def settle(lab: Lab) -> dict[str, Any]:
    """Before a measurement: every Node Ready, every kube-system Pod Ready, and the machine's
    1-minute load average under twice its core count.  Starting 300 Pods on three Nodes of one
    2-core machine drives the load average to 40 and makes a kubelet miss its heartbeats; figures
    taken in that wake measure the start's backlog, not the policy path.  The settled cluster
    itself (three kubelets and containerds, 300 shims, the control plane) keeps it near 3 here.
    Returns the seconds waited and the load average the measurement starts at."""
    t0 = time.monotonic()
    cluster = lab.kube()
    cluster.kubectl("wait", "--for=condition=Ready", "nodes", "--all", f"--timeout={int(SETTLE_TIMEOUT)}s",
                    timeout=SETTLE_TIMEOUT + 30)
    cluster.kubectl("wait", "--for=condition=Ready", "pods", "--all", "-n", "kube-system",
                    f"--timeout={int(SETTLE_TIMEOUT)}s", timeout=SETTLE_TIMEOUT + 30)
    busy = 2 * (os.cpu_count() or 1)
    while os.getloadavg()[0] >= busy and time.monotonic() - t0 < SETTLE_TIMEOUT:
        time.sleep(1)  # the load average is a decaying mean: polled, as nothing announces it
    return {"waited_s": round(time.monotonic() - t0, 1), "loadavg": [round(x, 2) for x in os.getloadavg()]}


def flows_per_node(lab: Lab) -> dict[str, int]:
    return {n: sum(1 for line in lab.node(n).ofctl("dump-flows").splitlines() if "cookie=" in line) for n in NODES}


def brief(section: Any) -> Any:
    """A section's figures without their samples, for the terminal."""
    if not isinstance(section, dict):
        return section
    return {k: brief(v) for k, v in section.items() if k not in ("samples_ms", "tries")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods-per-node", type=int, default=100)
    ap.add_argument("--policies", type=int, default=100)
    ap.add_argument("--tier-policies", type=int, default=50,
                    help="ClusterNetworkPolicies and as many NetworkPolicies for the tiers' figure (0: none)")
    ap.add_argument("--reach", type=int, default=20, help="Pods created for the reachability figure (half each case)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--cni-bin", help="CNI_PATH with ferry (launchers; the cluster uses the image anyway)")
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    args = ap.parse_args(argv)
    cni_bin = ensure_cni_bin(os.path.abspath(args.cni_bin or os.path.join("build", "cni-bin")))
    t0 = time.monotonic()
    lab = Lab.up(kube_topology("ferry"), name=f"bpr{os.getpid() % 10000}", cni_bin=cni_bin)
    result: dict[str, Any] = {"pods_per_node": args.pods_per_node, "policies": args.policies,
                              "cluster_up_s": round(time.monotonic() - t0, 1)}
    try:
        lab.kube().kubectl("apply", "-f", "-", input=json.dumps(bulk_pods(args.pods_per_node, args.policies)))
        result["pods_running_s"] = round(wait_pods_running(lab, args.pods_per_node * len(NODES), 1800), 1)
        log(f"{args.pods_per_node * len(NODES)} Pods Running in {result['pods_running_s']} s")
        result["settled_before_enforcement"] = settle(lab)
        log(f"settled: {result['settled_before_enforcement']}")
        result["flows_before"] = flows_per_node(lab)
        result["enforcement"] = measure_enforcement(lab, args.policies)
        result["flows_after"] = flows_per_node(lab)
        e = result["enforcement"]
        log(f"enforced on every Node: p50 {e['enforced_all_nodes']['p50_ms']} ms, p99 "
            f"{e['enforced_all_nodes']['p99_ms']} ms; API watch p50 {e['api_watch']['p50_ms']} ms")
        if args.tier_policies:
            result["settled_before_tiers"] = settle(lab)
            result["tiers"] = measure_tiers(lab, min(args.tier_policies, args.policies))
            t = result["tiers"]
            log("tiers, enforced on every Node p50/p99: " + "; ".join(
                f"{k} {t[k]['enforced_all_nodes']['p50_ms']}/{t[k]['enforced_all_nodes']['p99_ms']} ms"
                for k in (NP_KIND, CNP_KIND)) + f"; ClusterNetworkPolicy / NetworkPolicy p99 "
                f"{t['ratios']['cnp_over_np_p99']:.2f}")
        result["settled_before_reach"] = settle(lab)
        result["reach"] = measure_reach(lab, args.reach)
        r = result["reach"]
        log(f"Running -> reachable: policy p50 {r['policy']['p50_ms']} ms p99 {r['policy']['p99_ms']} ms; "
            f"open p50 {r['open']['p50_ms']} ms p99 {r['open']['p99_ms']} ms")
        result["loadavg"] = os.getloadavg()
    finally:
        if not args.keep:
            lab.down()
    sections = ("enforcement", "tiers", "reach")
    print(json.dumps({k: v for k, v in result.items() if k not in sections}, indent=1))
    for section in (s for s in sections if s in result):
        print(section, json.dumps(brief(result[section]), indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
