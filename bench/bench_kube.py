"""Pod start latency on a real Kubernetes cluster: Ferry (its DaemonSet, encap/VXLAN) against
Debian's bridge + host-local on the same kind of cluster, measured in the same run.

    python -m bench.bench_kube [--pods 30] [--json OUT] [--cni-bin DIR]

For each CNI a three-Node ferry-lab cluster comes up (``ferry-lab up --kubernetes``, with
``kubernetes.cni: bridge`` for the reference); both stay up while ``--pods`` Pods per cluster,
spread round-robin over the Nodes, are created one after another through the API, alternating
between the clusters, so both see the same machine load. A Pod's latency is from just before its
``kubectl create`` to the moment a watch on the API (``kubectl get pods --watch``, started before
the first create) reports it Running with ``status.podIPs``: what a user waits for. Percentiles are
nearest-rank; each cluster's up time is reported beside them. Both are dual-stack; Debian's
``bridge`` waits for IPv6 duplicate address detection in the Pod before it answers, Ferry turns DAD
off for the Pod's addresses (it owns them), which is most of the difference at p50."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from bench.util import FirstSeen, percentile
from lab.api import Lab, ensure_cni_bin
from lab.kube import pods as kube_pods
from lab.kube.cluster import kubectl_argv

NODES = ("node-1", "node-2", "node-3")
CNIS = ("bridge", "ferry")


def topology(cni: str) -> dict[str, Any]:
    return {"datapath": "netdev", "clusterCIDRs": ["10.244.0.0/16", "fd00:10:244::/48"],
            "segments": {"a": {"ipv4": "192.168.77.0/24", "ipv6": "fd00:77::/64"},
                         "b": {"ipv4": "192.168.88.0/24", "ipv6": "fd00:88::/64"}},
            "nodes": [{"name": "node-1", "segment": "a"}, {"name": "node-2", "segment": "a"},
                      {"name": "node-3", "segment": "b"}],
            "routeSync": {"trafficEncapMode": "encap", "tunnelType": "vxlan"},
            "kubernetes": {"cni": cni}}


class RunningPods:
    """``kubectl get pods --watch -o json``'s lines in, the names of Pods Running with IPs out:
    kubectl prints one pretty JSON object per event, over many lines."""

    def __init__(self) -> None:
        self.buf = ""
        self.depth = 0

    def __call__(self, line: str) -> list[str]:
        self.buf += line
        self.depth += line.count("{") - line.count("}")
        if self.depth != 0 or not self.buf.strip():
            return []
        text, self.buf = self.buf, ""
        try:
            ev = json.loads(text)
        except ValueError:
            return []
        obj = ev.get("object", ev)
        st = obj.get("status") or {}
        running = st.get("phase") == "Running" and st.get("podIPs")
        return [obj.get("metadata", {}).get("name", "")] if running else []


def running_watch(argv: list[str]) -> FirstSeen:
    """The first time each Pod is seen Running with IPs (``argv``: a kubectl pods watch, JSON)."""
    return FirstSeen(argv, RunningPods())


def measure(pods: int, cni_bin: str) -> list[dict[str, Any]]:
    """Both clusters up, then the Pods created alternately on each (same load, same moment)."""
    labs: dict[str, Lab] = {}
    up_s: dict[str, float] = {}
    lat: dict[str, list[float]] = {c: [] for c in CNIS}
    watches: dict[str, FirstSeen] = {}
    try:
        for cni in CNIS:
            t0 = time.monotonic()
            labs[cni] = Lab.up(topology(cni), name=f"bk{cni[:2]}{os.getpid() % 10000}", cni_bin=cni_bin)
            up_s[cni] = time.monotonic() - t0
            watches[cni] = running_watch(kubectl_argv(labs[cni].kube().plan, [
                "get", "pods", "-n", kube_pods.NAMESPACE, "--watch", "--output-watch-events", "-o", "json"]))
        clusters = {c: labs[c].kube() for c in CNIS}
        for i in range(pods):
            node = NODES[i % len(NODES)]
            order = CNIS if i % 2 == 0 else tuple(reversed(CNIS))
            for cni in order:
                pod = kube_pods.api_name(node, f"b{i}")
                start = time.monotonic()
                clusters[cni].kubectl("create", "-f", "-", input=json.dumps(kube_pods.pod_spec(pod, node)))
                lat[cni].append((watches[cni].wait(pod, 120) - start) * 1000)
    finally:
        for w in watches.values():
            w.close()
        for lab in labs.values():
            lab.down()
    return [{"cni": c, "pods": pods, "cluster_up_s": round(up_s[c], 1),
             "p50_ms": round(percentile(lat[c], 50), 1), "p90_ms": round(percentile(lat[c], 90), 1),
             "p99_ms": round(percentile(lat[c], 99), 1), "max_ms": round(max(lat[c]), 1),
             "samples_ms": [round(x, 1) for x in lat[c]]} for c in CNIS]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=30)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--cni-bin", help="CNI_PATH with ferry (launchers; the cluster uses the image anyway)")
    args = ap.parse_args(argv)
    cni_bin = ensure_cni_bin(os.path.abspath(args.cni_bin or os.path.join("build", "cni-bin")))
    results = measure(args.pods, cni_bin)
    ref, ferry = results
    print(f"{'cni':<8}{'up s':>8}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for r in results:
        print(f"{r['cni']:<8}{r['cluster_up_s']:>8}{r['p50_ms']:>10}{r['p90_ms']:>10}{r['p99_ms']:>10}{r['max_ms']:>10}")
    print(f"ferry/bridge: p50 {ferry['p50_ms'] / ref['p50_ms']:.2f}x, p99 {ferry['p99_ms'] / ref['p99_ms']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
