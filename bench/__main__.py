"""``make bench``: every benchmark, one results file, a report and plots.

    python -m bench [--quick] [--out results/DATE] [--cni-bin DIR] [--only startup,cni,...] [--docs DIR]

Runs, each as its own process with ``--json``: ``startup`` (bench_startup), ``cni`` (bench_cni, with
its encryption phase: ADD through a state file that says encryption wireguard against one in
clear, issue 30), ``ipam`` (bench_ipam), ``routesync`` (bench_routesync), ``dataplane``
(bench_dataplane: every path it knows, the WireGuard ones ``wg-vxlan`` and ``wg-gateway`` beside
their clear references, with TCP round trips after each iperf3 run), ``services``
(bench_services: on Kubernetes clusters with kube-proxy), ``policy`` (bench_policy: NetworkPolicy's
planner on a simulated 10,000-Pod cluster, and 1,000 policies' flows on a real bridge),
``policy-replay`` (bench_policy_replay: generated Pod and policy event streams through the
incremental policy planner beside the full one, at 10,000 Pods / 1,000 policies and 150,000 /
10,000 over 5,000 Nodes, RSS at 30,000 / 3,000, the differential test's replay of 1,000,000
events, and the ClusterNetworkPolicy tiers' incremental planner beside their full one at 10,000
Pods / 40 policies), ``policy-pass`` (bench_policy_pass: route-sync's NetworkPolicy pass per Pod
event at 30,000 Pods / 3,000 policies, the host judge applied by element beside written whole),
``spans`` (bench_spans: the index a controller would publish each Node's
remote Pods by, issue 46, event by event beside the full ``relevance.spans``, at 30,000 Pods /
3,000 policies over 1,000 Nodes, and the (Pod, Node) pairs the spans hold against every Pod on
every Node; for both ``policyPeers``: egress judged at the destination too, or at its source
only), ``realize``
(bench_policy_realize: policy created → enforced on every Node, and a selected Pod Running →
reachable, on a Kubernetes cluster with 100 Pods per Node), ``scale`` (bench_scale, issue 46: the
lab's real API server with 1,000 simulated Nodes, 29,000 Pods and 3,000 policies, PeerSlices beside
a watch of every Pod: what each real Node receives, API write -> flow in OVS, CPU and RSS), ``system``
(bench_system: the plugin's netlink, OVSDB and OpenFlow calls against pyroute2, ovsdbapp and
ovs-vsctl, one operation at a time, and each stack's import).  Their
outputs are collected into ``OUT/results.json`` (``meta`` + ``benchmarks``: status, seconds,
error, data), then ``bench.report`` writes ``OUT/report.md`` and the PNG plots.  A failing
benchmark is marked failed in the report and the others still run; the exit status is non-zero
when any failed.  ``--quick`` (or ``BENCH_QUICK=1``): 10 Pods, 100 peers, 2 s iperf and small
sample counts (300 TCP round trips per data-plane run), IPAM on a /22 instead of the /16, 1,000 Pods
and 100 policies, 2,000 Pods over 200 Nodes for ``spans``, 5 timings per system call; no ``realize``
(its figures need the 300-Pod cluster: ``--only realize`` runs it alone) and no ``scale`` (two
clusters of its size: ``--only scale``; ``python -m bench.bench_scale --quick`` is its small
form).  Each benchmark's own output goes to ``OUT/<name>.log``."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORDER = ("startup", "cni", "ipam", "routesync", "dataplane", "services", "policy", "policy-replay", "policy-pass",
         "spans", "realize", "scale", "system")
TIMEOUT_S = {"startup": 600, "cni": 1800, "ipam": 1800, "routesync": 3600, "dataplane": 1800, "services": 1800,
             "policy": 3600, "policy-replay": 14400, "policy-pass": 3600, "spans": 3600, "realize": 3600,
             "scale": 10800, "system": 600}


def commands(quick: bool, cni_bin: str | None) -> dict[str, list[str]]:
    """Each benchmark's argv (without ``--json``): plain data."""
    cb = ["--cni-bin", cni_bin] if cni_bin else []
    if quick:
        return {
            "startup": ["bench.bench_startup", "--runs", "20", *cb],
            "cni": ["bench.bench_cni", "--quick", *cb],
            "ipam": ["bench.bench_ipam", "--iterations", "30", "--exec-iterations", "5", "--subnet", "10.66.0.0/22",
                     *cb],
            "routesync": ["bench.bench_routesync", "--quick"],
            "dataplane": ["bench.bench_dataplane", "--quick", *cb],
            "services": ["bench.bench_services", "--seconds", "2", "--reps", "1", "--rtt", "10", "--modes", "encap",
                         *cb],
            "policy": ["bench.bench_policy", "--quick", *cb],
            "policy-replay": ["bench.bench_policy_replay", "--scale", "2000:200:20:18", "--pod-events", "300",
                              "--policy-events", "30", "--rss", "3000:300:30:27", "--diff-events", "2000",
                              "--tiers", "2000:20:20:18"],
            "policy-pass": ["bench.bench_policy_pass", "--scale", "3000:300:30:100", "--events", "40"],
            "spans": ["bench.bench_spans", "--quick"],
            "system": ["bench.bench_system", "--n", "5"],
        }
    return {
        "startup": ["bench.bench_startup", "--runs", "100", *cb],
        "cni": ["bench.bench_cni", "--pods", "200", "--conc", "8", *cb],
        "ipam": ["bench.bench_ipam", *cb],
        "routesync": ["bench.bench_routesync", "--peers", "100,1000,5000", "--changes", "50",
                      "--change-peers", "1000"],
        "dataplane": ["bench.bench_dataplane", "--seconds", "10", "--reps", "3", *cb],
        "services": ["bench.bench_services", "--seconds", "10", "--reps", "3", *cb],
        "policy": ["bench.bench_policy", "--runs", "3", "--seconds", "10", "--reps", "3", *cb],
        "policy-replay": ["bench.bench_policy_replay", "--diff-events", "1000000"],
        "policy-pass": ["bench.bench_policy_pass", "--events", "200"],
        "spans": ["bench.bench_spans"],
        "realize": ["bench.bench_policy_realize", *cb],
        "scale": ["bench.bench_scale", *cb],
        "system": ["bench.bench_system", "--n", "50"],
    }


def machine() -> str:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(ln.split()[1] for ln in f if ln.startswith("MemTotal")))
            mem = f", {kb / 1024 / 1024:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    distro = ""
    try:
        with open("/etc/os-release") as f:
            distro = next((ln.split("=", 1)[1].strip().strip('"') for ln in f if ln.startswith("PRETTY_NAME")), "")
    except OSError:
        pass
    return (f"{distro}, kernel {platform.release()}, {os.cpu_count()} vCPU {cpu}{mem}, "
            f"Python {platform.python_version()}, {_ovs_version()}")


def _ovs_version() -> str:
    try:
        out = subprocess.run(["ovs-vswitchd", "--version"], capture_output=True, text=True, check=False,
                             timeout=10).stdout
        return out.splitlines()[0].strip() if out else "ovs-vswitchd ?"
    except OSError:
        return "no ovs-vswitchd"


def _commit() -> str:
    p = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                       check=False)
    return p.stdout.strip() or "?"


def run_one(name: str, argv: Sequence[str], out_dir: str) -> dict[str, Any]:
    """Run one benchmark, its output to ``<name>.log``; its JSON, or why it failed."""
    js = os.path.join(out_dir, f"{name}.json")
    logf = os.path.join(out_dir, f"{name}.log")
    full = [sys.executable, "-m", *argv, "--json", js]
    t0 = time.monotonic()
    print(f"[bench] {name}: {' '.join(full[2:])}", file=sys.stderr, flush=True)
    with open(logf, "w") as log:
        try:
            p = subprocess.run(full, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False,
                               timeout=TIMEOUT_S[name])
            rc: int | None = p.returncode
        except subprocess.TimeoutExpired:
            rc = None
    seconds = time.monotonic() - t0
    data = None
    if os.path.exists(js):
        with open(js) as f:
            data = json.load(f)
    if rc == 0 and data is not None:
        print(f"[bench] {name}: ok in {seconds:.0f} s", file=sys.stderr, flush=True)
        return {"status": "ok", "seconds": seconds, "data": data, "log": os.path.basename(logf)}
    with open(logf, errors="replace") as f:
        tail = f.read()[-1500:]
    why = "timed out" if rc is None else f"exit {rc}" + ("" if data is not None else ", no JSON")
    print(f"[bench] {name}: FAILED ({why}); see {logf}; its last lines:\n" +
          "\n".join(f"[bench]   | {line}" for line in tail.splitlines()[-25:]), file=sys.stderr, flush=True)
    # a benchmark that failed part-way may still have written figures (dataplane: other paths)
    return {"status": "failed", "seconds": seconds, "error": f"{why}: {tail}", "data": data,
            "log": os.path.basename(logf)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", default=os.environ.get("BENCH_QUICK") == "1",
                    help="small version (also BENCH_QUICK=1)")
    ap.add_argument("--out", help="results directory (default results/<UTC date-time>)")
    ap.add_argument("--cni-bin", help="CNI_PATH directory with ferry, ferry-ipam (make bin's build/cni-bin)")
    ap.add_argument("--only", help=f"comma-separated subset of {','.join(ORDER)}")
    ap.add_argument("--docs", help="also write DOCS/benchmarks.md (+ DOCS/benchmarks/*.png) from this run")
    args = ap.parse_args(argv)
    started = datetime.datetime.now(datetime.UTC)
    out = os.path.abspath(args.out or os.path.join(ROOT, "results", started.strftime("%Y%m%dT%H%M%SZ")))
    os.makedirs(out, exist_ok=True)
    cni_bin = os.path.abspath(args.cni_bin) if args.cni_bin else None
    only = [x.strip() for x in args.only.split(",")] if args.only else list(ORDER)
    bad = [x for x in only if x not in ORDER]
    if bad:
        print(f"--only: unknown {bad}; known {', '.join(ORDER)}", file=sys.stderr)
        return 2
    cmds = commands(args.quick, cni_bin)
    meta = {"date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(), "commit": _commit(),
            "quick": args.quick, "command": "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    benchmarks: dict[str, Any] = {}
    results = {"meta": meta, "benchmarks": benchmarks}
    for name in ORDER:
        if name in only and name in cmds:  # the quick run leaves out what has no small version
            benchmarks[name] = run_one(name, cmds[name], out)
    meta["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    meta["seconds"] = round((datetime.datetime.now(datetime.UTC) - started).total_seconds())
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    from bench import report

    docs = args.docs
    if docs and args.quick:
        print("[bench] quick run: docs/benchmarks.md keeps the latest full run", file=sys.stderr)
        docs = None
    report_path = report.write(out, docs)
    failed = [k for k, v in benchmarks.items() if v["status"] != "ok"]
    print(f"[bench] report: {report_path}{f'; FAILED: {failed}' if failed else ''}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
