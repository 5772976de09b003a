"""NetworkPolicy realization on a real Kubernetes cluster (issue 27): how long after the API has a
policy every Node enforces it, and how long after a selected Pod is Running its allowed peers
reach it, each beside a reference measured in the same run.

    python -m bench.bench_policy_realize [--pods-per-node 100] [--policies 100] [--reach 20]
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
from typing import Any

import yaml

from bench.bench_kube import NODES, running_watch
from bench.bench_kube import topology as kube_topology
from bench.util import FirstSeen, percentile
from lab import ovs
from lab.api import Lab, Node, ensure_cni_bin
from lab.kube import pods as kube_pods
from lab.kube.cluster import Cluster, kubectl_argv

PORT_BASE = 20000
# the policies' peers: an address block, so that each rule has flows whatever Pods exist (a rule
# whose podSelector matches no Pod allows nothing, and has none)
CLIENTS = "10.244.0.0/16"
OPEN_NS = "bench-open"  # no policy there: the reference Pods
CLOSED_PORT = 81
ENFORCE_GOAL_MS = 500.0  # issue 27: p99
REACH_GOAL_MS = 1000.0  # issue 27: p99
ENFORCE_TIMEOUT = 30.0

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
           "    doc = json.loads(line); ns = doc['metadata']['namespace']\n"
           "    body = json.dumps(doc).encode()\n"
           "    sent = time.monotonic()\n"
           "    conn.request('POST', f'/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies', body,\n"
           "                 {'Content-Type': 'application/json'})\n"
           "    r = conn.getresponse(); r.read()\n"
           "    print(sent, time.monotonic(), r.status, flush=True)\n")


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


def measure_enforcement(lab: Lab, policies: int) -> dict[str, Any]:
    cluster = lab.kube()
    monitors = [flow_monitor(lab.node(n), lab.topology.bridge) for n in NODES]
    watch = api_watch(kubectl_argv(cluster.plan, ["get", "networkpolicies", "-n", kube_pods.NAMESPACE, "--watch",
                                                 "-o", "name"]))
    enforced, seen_api, answered, spread = [], [], [], []
    post = creator(cluster)
    assert post.stdin is not None and post.stdout is not None
    with ExitStack() as running:
        for w in (watch, *monitors):
            running.callback(w.close)
        running.callback(post.wait, 10)
        running.callback(post.stdin.close)
        for i in range(policies):
            doc = group_policy(i)
            post.stdin.write(json.dumps(doc) + "\n")
            post.stdin.flush()
            sent, done, status = post.stdout.readline().split()
            if status != "201":
                raise RuntimeError(f"creating {doc['metadata']['name']}: HTTP {status}")
            t0 = float(sent)
            at = [m.wait(PORT_BASE + i, ENFORCE_TIMEOUT) for m in monitors]
            api = watch.wait(doc["metadata"]["name"], ENFORCE_TIMEOUT)
            enforced.append((max(at) - t0) * 1000)
            seen_api.append((api - t0) * 1000)
            answered.append((float(done) - t0) * 1000)
            spread.append((max(at) - min(at)) * 1000)
    out = {"enforced_all_nodes": summary(enforced), "api_watch": summary(seen_api),
           "create_answered": summary(answered), "node_spread": summary(spread)}
    ours = out["enforced_all_nodes"]
    out["ratios"] = {"enforced_over_api_p50": ours["p50_ms"] / max(out["api_watch"]["p50_ms"], 0.1),
                     "enforced_p99_over_goal": ours["p99_ms"] / ENFORCE_GOAL_MS}
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods-per-node", type=int, default=100)
    ap.add_argument("--policies", type=int, default=100)
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
        result["settled_before_reach"] = settle(lab)
        result["reach"] = measure_reach(lab, args.reach)
        r = result["reach"]
        log(f"Running -> reachable: policy p50 {r['policy']['p50_ms']} ms p99 {r['policy']['p99_ms']} ms; "
            f"open p50 {r['open']['p50_ms']} ms p99 {r['open']['p99_ms']} ms")
        result["loadavg"] = os.getloadavg()
    finally:
        if not args.keep:
            lab.down()
    print(json.dumps({k: v for k, v in result.items() if k not in ("enforcement", "reach")}, indent=1))
    for section in ("enforcement", "reach"):
        sub = {k: ({kk: vv for kk, vv in v.items() if kk not in ("samples_ms", "tries")} if isinstance(v, dict) else v)
               for k, v in result[section].items()}
        print(section, json.dumps(sub, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
