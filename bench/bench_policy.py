"""NetworkPolicy at scale (issue 27): the planner on a simulated cluster, and what 1,000 rules in
force cost a Pod → Pod connection on a real bridge.

    python -m bench.bench_policy [--pods 10000] [--namespaces 100] [--policies 1000] [--nodes 4]
                                 [--runs 5] [--seed 27] [--seconds 10] [--reps 3] [--no-dataplane]
                                 [--profile auto|always|never] [--quick] [--json OUT] [--cni-bin DIR]

**Planning, in-process, no cluster.**  :func:`generate` writes, from ``--seed``, the API objects of
a cluster as the API server serves them (JSON dicts): ``--namespaces`` labelled Namespaces,
``--pods`` dual-stack Pods spread over ``--nodes`` Nodes (2-3 labels each, a named container port
``http``), and ``--policies`` NetworkPolicies of mixed shapes (:data:`SHAPES`: default deny,
podSelector, namespaceSelector, both, matchExpressions, ipBlock with except, numeric, named and
endPort ports, egress to DNS, to a database tier and to the Internet).  Figures, each the median of
``--runs``:

* ``parse``: the reference, in the same run: reading the objects into the model
  (``routesync.policy.model.pod_from`` / ``namespace_from`` / ``policy_from``);
* ``plan``: ``routesync.policy.plan.plan()`` for node-1 (a quarter of the Pods), fresh conjunction
  ids each run; its flows and conjunctions;
* ``replan``: one policy changed (its port), planned again with the same ids, as route-sync does
  on a watch event; and how many flows the change adds and removes;
* peak RSS of a fresh process (``resource.getrusage``'s ``ru_maxrss``) that builds the inputs and
  plans once, next to the same process's peak after building the inputs only.

Times are wall (``perf_counter``) and this process's CPU (``process_time``, which the other
processes of a busy machine disturb far less).  With ``--profile auto`` a plan whose CPU time is
over the issue's budget (:data:`PLAN_BUDGET_S`) is run once more under cProfile and the hot spots
(by own time) are reported.

**Data plane, on a real bridge** (root): one Node (a netns with its own OVS, netdev bridge, as
tests/support/podnode.py builds), Pods ``client``, ``server`` and ``other`` plugged by the real
plugin through cnitool.  The policy set is the generated one, its last policies replaced by the
pair's: the server's namespace denies ingress by default, the client's namespace isolates egress,
and the last rule (by the planner's order) lets the client reach the server's iperf3 and echo
ports.  Repetitions alternate "no policy" (no policy flow on the bridge) and "policy" (the plan
installed through ``OpenFlow.add_flows``), the order swapped each repetition; before the runs a
probe checks the verdicts (client reaches the server; ``other`` does not while the policy is in
force).  Per case: iperf3's receiver rate (one TCP stream, client → server), the flows on the bridge
(``ovs-ofctl dump-flows``) and the datapath's megaflows right after the run
(``ovs-appctl dpctl/dump-flows``), and the CPU cost: ovs-vswitchd's and both iperf3 processes' CPU
seconds per Gbit received (as bench_dataplane counts it), which load from elsewhere disturbs far
less than the rate.  Target (issue 27): policy / no policy >= 0.9."""

from __future__ import annotations

import argparse
import cProfile
import ipaddress
import json
import os
import pstats
import random
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "bp"
LOCAL = "node-1"
PLAN_BUDGET_S = 2.0  # issue 27
RSS_BUDGET_MB = 300.0  # issue 27
THROUGHPUT_GOAL = 0.9  # issue 27: policy / no policy
ECHO_PORT = 7000  # the verdict probe's port, allowed next to iperf3's
TIERS = ("web", "api", "db", "cache")
ENVS = ("prod", "staging", "dev")
TEAMS = 20
APPS = 10  # per namespace

# policy shape -> weight; the first policy of most namespaces is a default deny (see generate)
SHAPES: dict[str, int] = {
    "pod-from-pod": 18,
    "from-namespace": 10,
    "namespace-and-pod": 12,
    "match-expressions": 8,
    "ip-block": 8,
    "named-port": 10,
    "port-range": 6,
    "egress-dns-db": 10,
    "egress-internet": 5,
    "multi-rule": 8,
    "default-deny-all": 3,
}


def log(msg: str) -> None:
    print(f"[bench_policy] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------
# The simulated cluster: API objects as JSON dicts, from a seed.

@dataclass(frozen=True)
class Cluster:
    namespaces: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    policies: list[dict[str, Any]]

    @property
    def objects(self) -> int:
        return len(self.namespaces) + len(self.pods) + len(self.policies)


def ns_name(i: int) -> str:
    return f"ns-{i:03d}"


def node_name(i: int) -> str:
    return f"node-{i + 1}"


def pod_cidrs(node: int) -> tuple[str, str]:
    """Node ``node``'s Pod CIDRs, which :func:`pod_ips` draws from (route-sync passes a Node's own
    to the planner: ``NodeFacts.pod_cidrs``)."""
    return f"10.{64 + node}.0.0/16", f"fd00:64:{node}::/64"


def local_facts() -> Any:
    """node-1 as route-sync plans it: its name and its Pod CIDRs."""
    from routesync.policy.plan import NodeFacts

    return NodeFacts(LOCAL, pod_cidrs=pod_cidrs(0))


def pod_ips(node: int, j: int) -> tuple[str, str]:
    """The ``j``-th Pod of Node ``node``: 10.(64+node).x.y and fd00:64:<node>::<j+1>."""
    v4 = ipaddress.IPv4Address((10 << 24) | ((64 + node) << 16)) + j + 1
    v6 = ipaddress.IPv6Address(f"fd00:64:{node}::") + j + 1
    return str(v4), str(v6)


def _pod(ns: str, k: int, node: int, j: int, rng: random.Random) -> dict[str, Any]:
    app = k % APPS
    labels = {"app": f"app-{app}", "tier": TIERS[app % len(TIERS)]}
    if rng.random() < 0.5:
        labels["version"] = rng.choice(("v1", "v2"))
    v4, v6 = pod_ips(node, j)
    return {"metadata": {"namespace": ns, "name": f"app-{app}-{k:04d}", "labels": labels},
            "spec": {"nodeName": node_name(node),
                     "containers": [{"name": "main", "ports": [
                         {"name": "http", "containerPort": 8080 if app % 2 else 8000, "protocol": "TCP"}]}]},
            "status": {"phase": "Running", "podIP": v4, "podIPs": [{"ip": v4}, {"ip": v6}]}}


def _labels(**kv: str) -> dict[str, Any]:
    return {"matchLabels": dict(kv)}


def _ports(*ports: int | str, protocol: str = "TCP") -> list[dict[str, Any]]:
    return [{"protocol": protocol, "port": p} for p in ports]


def _rule_for(shape: str, rng: random.Random, n_ns: int, peers_key: str = "from") -> dict[str, Any]:
    """One ingress rule of ``shape`` (the shapes a multi-rule policy mixes)."""
    app = f"app-{rng.randrange(APPS)}"
    if shape == "pod-from-pod":
        return {peers_key: [{"podSelector": _labels(app=app)}], "ports": _ports(rng.choice((80, 443, 8080)))}
    if shape == "from-namespace":
        return {peers_key: [{"namespaceSelector": _labels(team=f"team-{rng.randrange(TEAMS)}")}],
                "ports": _ports(rng.choice((80, 443)))}
    if shape == "namespace-and-pod":
        return {peers_key: [{"namespaceSelector": _labels(env=rng.choice(ENVS)),
                             "podSelector": _labels(tier=rng.choice(TIERS))}], "ports": _ports("http")}
    if shape == "match-expressions":
        return {peers_key: [{"podSelector": {"matchExpressions": [
                    {"key": "tier", "operator": "In", "values": sorted(rng.sample(TIERS, 2))},
                    {"key": "version", "operator": rng.choice(("Exists", "DoesNotExist"))}]}},
                  {"podSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": [app]}]},
                   "namespaceSelector": {"matchExpressions": [
                       {"key": "kubernetes.io/metadata.name", "operator": "In",
                        "values": sorted({ns_name(rng.randrange(n_ns)) for _ in range(3)})}]}}],
                "ports": _ports(8080, 9090)}
    if shape == "ip-block":
        k = rng.randrange(256)
        return {peers_key: [{"ipBlock": {"cidr": f"192.168.{k}.0/24", "except": [f"192.168.{k}.128/28"]}},
                            {"ipBlock": {"cidr": f"fd00:c0a8:{k:x}::/64", "except": [f"fd00:c0a8:{k:x}::/80"]}}],
                "ports": _ports(443)}
    if shape == "named-port":
        return {peers_key: [{"podSelector": {"matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["web", "api"]}]}}], "ports": _ports("http")}
    if shape == "port-range":
        first = rng.choice((30000, 8000, 10000))
        return {peers_key: [{"namespaceSelector": {"matchExpressions": [
                    {"key": "env", "operator": "In", "values": ["prod", "staging"]}]},
                    "podSelector": _labels(app=app)}],
                "ports": [{"protocol": "TCP", "port": first, "endPort": first + rng.choice((99, 767, 2767))}]}
    raise ValueError(shape)


def _policy(ns: str, name: str, shape: str, rng: random.Random, n_ns: int) -> dict[str, Any]:
    target = _labels(app=f"app-{rng.randrange(APPS)}")
    spec: dict[str, Any]
    if shape == "default-deny-ingress":
        spec = {"podSelector": {}, "policyTypes": ["Ingress"]}
    elif shape == "default-deny-all":
        spec = {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    elif shape == "egress-dns-db":
        spec = {"podSelector": _labels(tier="api"), "policyTypes": ["Egress"], "egress": [
            {"to": [{"namespaceSelector": _labels(**{"kubernetes.io/metadata.name": ns_name(0)}),
                     "podSelector": _labels(app="app-0")}],
             "ports": _ports(53, protocol="UDP") + _ports(53)},
            {"to": [{"podSelector": _labels(tier="db")}], "ports": _ports(5432, 6379)}]}
    elif shape == "egress-internet":
        spec = {"podSelector": target, "policyTypes": ["Egress"], "egress": [
            {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]}},
                    {"ipBlock": {"cidr": "::/0", "except": ["fd00::/8"]}}],
             "ports": _ports(443)}]}
    elif shape == "multi-rule":
        mixed = rng.sample(("pod-from-pod", "from-namespace", "ip-block", "named-port", "port-range"),
                           rng.choice((2, 3)))
        spec = {"podSelector": {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]},
                "ingress": [_rule_for(s, rng, n_ns) for s in mixed]}
    else:
        spec = {"podSelector": target, "policyTypes": ["Ingress"], "ingress": [_rule_for(shape, rng, n_ns)]}
    return {"metadata": {"namespace": ns, "name": name}, "spec": spec}


def generate(pods: int = 10_000, namespaces: int = 100, policies: int = 1000, nodes: int = 4,
             seed: int = 27) -> Cluster:
    """The cluster's API objects: the same arguments, the same objects (``random.Random(seed)``).
    Pods are spread evenly over namespaces and, round robin, over Nodes; policies evenly over
    namespaces, most namespaces' first one a default deny of ingress."""
    rng = random.Random(seed)
    nss = [{"metadata": {"name": ns_name(i), "labels": {"kubernetes.io/metadata.name": ns_name(i),
                                                         "team": f"team-{i % TEAMS}", "env": ENVS[i % len(ENVS)]}}}
           for i in range(namespaces)]
    per_node = [0] * nodes
    out_pods = []
    placement = [i % nodes for i in range(pods)]  # even, and independent of namespace and app
    rng.shuffle(placement)
    for i, node in enumerate(placement):
        out_pods.append(_pod(ns_name(i % namespaces), i // namespaces, node, per_node[node], rng))
        per_node[node] += 1
    shapes, weights = list(SHAPES), list(SHAPES.values())
    out_pols = []
    for i in range(policies):
        ns_i, k = i % namespaces, i // namespaces
        shape = "default-deny-ingress" if k == 0 and ns_i % 5 != 4 else rng.choices(shapes, weights)[0]
        out_pols.append(_policy(ns_name(ns_i), f"{shape}-{k:03d}", shape, rng, namespaces))
    return Cluster(nss, out_pods, out_pols)


def shape_counts(cluster: Cluster) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in cluster.policies:
        shape = p["metadata"]["name"].rsplit("-", 1)[0]
        out[shape] = out.get(shape, 0) + 1
    return dict(sorted(out.items()))


def parse(cluster: Cluster) -> Any:
    """The objects read into the planner's model: ``routesync.policy.plan.Inputs``."""
    from routesync.policy import model
    from routesync.policy.plan import Inputs

    namespaces = dict(model.namespace_from(n) for n in cluster.namespaces)
    pods = tuple(p for p in (model.pod_from(d) for d in cluster.pods) if p is not None)
    return Inputs(pods, namespaces, tuple(model.policy_from(d) for d in cluster.policies))


def changed(cluster: Cluster, which: int) -> Cluster:
    """The same cluster with policy ``which`` changed as an edit would: its rules' numeric ports
    moved by one, or (no numeric port) a port added."""
    pol = json.loads(json.dumps(cluster.policies[which]))
    spec = pol["spec"]
    rules = spec.get("ingress") or spec.get("egress") or []
    if not rules:
        spec["ingress"] = rules = [{"from": [{"podSelector": {}}]}]
        spec["policyTypes"] = sorted(set(spec.get("policyTypes") or []) | {"Ingress"})
    for r in rules:
        ports = r.setdefault("ports", [])
        nums = [p for p in ports if isinstance(p.get("port"), int) and "endPort" not in p]
        if nums:
            nums[0]["port"] += 1
        else:
            ports.append({"protocol": "TCP", "port": 9999})
    pols = list(cluster.policies)
    pols[which] = pol
    return Cluster(cluster.namespaces, cluster.pods, pols)


# ------------------------------------------------------------------------------------------
# Planning figures.

@dataclass
class Timed:
    """``runs`` calls of one function: wall and CPU seconds (this process's) of each, the last result."""

    wall: list[float]
    cpu: list[float]
    last: Any

    @property
    def wall_median(self) -> float:
        return statistics.median(self.wall)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)


def timed(fn: Callable[[int], Any], runs: int) -> Timed:
    """``fn(i)`` for i in range(runs), each timed (wall: perf_counter; CPU: process_time, which
    other processes on a busy machine disturb far less)."""
    out = Timed([], [], None)
    for i in range(runs):
        w, c = time.perf_counter(), time.process_time()
        out.last = fn(i)
        out.cpu.append(time.process_time() - c)
        out.wall.append(time.perf_counter() - w)
    return out


def flow_delta(before: list[Any], after: list[Any]) -> tuple[int, int]:
    """(added, removed) between two flow lists, a flow by its full text (a changed action is both)."""
    a, b = {f.text() for f in before}, {f.text() for f in after}
    return len(b - a), len(a - b)


def profile_plan(inputs: Any, top: int = 15) -> list[dict[str, Any]]:
    """One plan under cProfile: the ``top`` functions by own time."""
    from routesync.policy import plan as pp

    prof = cProfile.Profile(time.process_time)  # CPU, not wall: a busy machine inflates wall time
    prof.enable()
    pp.plan(inputs, local_facts())
    prof.disable()
    st = pstats.Stats(prof)
    rows = []
    for (path, line, fn), (_cc, ncalls, tottime, cumtime, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rel = os.path.relpath(path, ROOT) if path.startswith(ROOT) else os.path.basename(path)
        rows.append({"function": f"{rel}:{line}({fn})", "ncalls": ncalls, "tottime_s": round(tottime, 3),
                     "cumtime_s": round(cumtime, 3)})
    rows.sort(key=lambda r: -r["tottime_s"])
    total = sum(r["tottime_s"] for r in rows)
    return [dict(r, share=round(r["tottime_s"] / total, 3) if total else 0.0) for r in rows[:top]]


def rss_child(args: argparse.Namespace) -> dict[str, Any]:
    """In a fresh process: peak RSS after building the inputs, then after one plan."""
    from routesync.policy import plan as pp

    inputs = parse(generate(args.pods, args.namespaces, args.policies, args.nodes, args.seed))
    inputs_kb, inputs_now = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, vm_rss_kb()
    p = pp.plan(inputs, local_facts())
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"inputs_rss_mb": inputs_kb / 1024, "peak_rss_mb": peak_kb / 1024,
            "plan_rss_mb": (peak_kb - inputs_kb) / 1024, "flows": len(p.flows),
            # what the process holds (VmRSS), not its high-water mark: the plan kept in memory
            "vmrss_inputs_mb": inputs_now / 1024, "vmrss_with_plan_mb": vm_rss_kb() / 1024}


def vm_rss_kb() -> int:
    with open("/proc/self/status") as f:
        return int(next(ln.split()[1] for ln in f if ln.startswith("VmRSS:")))


def measure_rss(args: argparse.Namespace) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.bench_policy", "--rss-child", "--pods", str(args.pods),
            "--namespaces", str(args.namespaces), "--policies", str(args.policies), "--nodes", str(args.nodes),
            "--seed", str(args.seed)]
    cp = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False, timeout=1800)
    if cp.returncode != 0:
        raise RuntimeError(f"RSS child failed ({cp.returncode}): {cp.stderr[-800:]}")
    return dict(json.loads(cp.stdout.strip().splitlines()[-1]))


def measure_planning(args: argparse.Namespace) -> dict[str, Any]:
    from routesync.policy import plan as pp

    t = time.perf_counter()
    cluster = generate(args.pods, args.namespaces, args.policies, args.nodes, args.seed)
    gen_s = time.perf_counter() - t
    log(f"generated {cluster.objects:,} objects in {gen_s:.2f} s: {shape_counts(cluster)}")
    parsed = timed(lambda _i: parse(cluster), args.runs)
    inputs = parsed.last
    log(f"parse: median {parsed.wall_median:.3f} s wall, {parsed.cpu_median:.3f} s CPU, of {args.runs}")
    facts = local_facts()
    ids = [pp.ConjIds() for _ in range(args.runs)]  # fresh ids per run: every run a first plan
    planned = timed(lambda i: pp.plan(inputs, facts, ids[i]), args.runs)
    plan = planned.last
    log(f"plan: median {planned.wall_median:.3f} s wall, {planned.cpu_median:.3f} s CPU, of {args.runs}; "
        f"{len(plan.flows):,} flows, {len(plan.rules):,} conjunctions")
    # one policy with flows on this Node changed (the middle conjunction's), planned again with the
    # ids the last plan left, as route-sync does on a watch event; then back, and so on: every
    # run is a real change
    which_key = plan.rules[len(plan.rules) // 2].policy
    which = next(i for i, p in enumerate(cluster.policies)
                 if f"{p['metadata']['namespace']}/{p['metadata']['name']}" == which_key)
    edited = parse(changed(cluster, which))
    replans: list[Any] = []
    replanned = timed(lambda i: replans.append(pp.plan(edited if i % 2 == 0 else inputs, facts, ids[-1])),
                      args.runs)
    added, removed = flow_delta(plan.flows, replans[0].flows)
    del replans[1:]
    log(f"replan ({which_key} changed): median {replanned.wall_median:.3f} s wall, "
        f"{replanned.cpu_median:.3f} s CPU; +{added} -{removed} flows")
    local = sum(1 for p in inputs.pods if p.node == LOCAL)
    tables: dict[str, int] = {}
    for f in plan.flows:
        tables[str(f.table)] = tables.get(str(f.table), 0) + 1
    out: dict[str, Any] = {
        "pods": len(inputs.pods), "local_pods": local, "namespaces": len(inputs.namespaces),
        "policies": len(inputs.policies), "objects": cluster.objects, "nodes": args.nodes, "seed": args.seed,
        "shapes": shape_counts(cluster), "runs": args.runs, "generate_s": gen_s,
        "parse_s": parsed.wall_median, "parse_cpu_s": parsed.cpu_median, "parse_all_s": parsed.wall,
        "plan_s": planned.wall_median, "plan_cpu_s": planned.cpu_median, "plan_all_s": planned.wall,
        "flows": len(plan.flows), "flows_by_table": tables, "conjunctions": len(plan.rules),
        "isolated_local_pods": sum(1 for v in plan.isolated.values() if any(v)),
        "replan_s": replanned.wall_median, "replan_cpu_s": replanned.cpu_median, "replan_all_s": replanned.wall,
        "replan_policy": which_key,
        "replan_flows_added": added, "replan_flows_removed": removed,
        "ratios": {"plan_over_parse": planned.wall_median / parsed.wall_median,
                   "plan_over_parse_cpu": planned.cpu_median / parsed.cpu_median,
                   "replan_over_parse": replanned.wall_median / parsed.wall_median,
                   "plan_over_budget": planned.wall_median / PLAN_BUDGET_S,
                   "plan_cpu_over_budget": planned.cpu_median / PLAN_BUDGET_S},
        "loadavg": os.getloadavg(),
    }
    if args.profile == "always" or args.profile == "auto" and planned.cpu_median > PLAN_BUDGET_S:
        log("profiling one plan (cProfile)")
        out["profile"] = profile_plan(inputs)
    rss = measure_rss(args)
    log(f"RSS: inputs {rss['inputs_rss_mb']:.0f} MB, peak with a plan {rss['peak_rss_mb']:.0f} MB")
    out["rss"] = rss
    out["ratios"]["peak_rss_over_budget"] = rss["peak_rss_mb"] / RSS_BUDGET_MB
    return out


# ------------------------------------------------------------------------------------------
# Data plane: one Node, a real bridge, Pods plugged by the plugin.

# after every generated namespace in the planner's order; OTHER_NS has no policy
SERVER_NS, CLIENT_NS, OTHER_NS = "zz-server", "zz-client", "zz-other"


def pair_policies(client_labels: dict[str, str], server_labels: dict[str, str],
                  ports: tuple[int, ...]) -> list[dict[str, Any]]:
    """The pair's three policies: the server's namespace denies ingress, the client's isolates
    egress but to the server, and ``zz-allow-client`` (last in the planner's order) lets the
    client in on ``ports``."""
    port_list = [{"protocol": "TCP", "port": p} for p in ports]
    client_peer = {"namespaceSelector": _labels(**{"kubernetes.io/metadata.name": CLIENT_NS}),
                   "podSelector": _labels(**client_labels)}
    server_peer = {"namespaceSelector": _labels(**{"kubernetes.io/metadata.name": SERVER_NS}),
                   "podSelector": _labels(**server_labels)}
    return [
        {"metadata": {"namespace": SERVER_NS, "name": "default-deny-ingress"},
         "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}},
        {"metadata": {"namespace": CLIENT_NS, "name": "egress-to-server"},
         "spec": {"podSelector": _labels(**client_labels), "policyTypes": ["Egress"],
                  "egress": [{"to": [server_peer], "ports": port_list}]}},
        {"metadata": {"namespace": SERVER_NS, "name": "zz-allow-client"},
         "spec": {"podSelector": _labels(**server_labels), "policyTypes": ["Ingress"],
                  "ingress": [{"from": [client_peer], "ports": port_list}]}},
    ]


def _api_pod(ns: str, name: str, labels: dict[str, str], ips: tuple[str, ...]) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name, "labels": labels}, "spec": {"nodeName": LOCAL},
            "status": {"phase": "Running", "podIPs": [{"ip": ip} for ip in ips]}}


def dataplane_cluster(base: Cluster, pods: Mapping[str, tuple[str, dict[str, str], tuple[str, ...]]],
                      ports: tuple[int, ...]) -> Cluster:
    """``base`` with the real Pods (name -> namespace, labels, addresses) and their namespaces
    added, its last policies replaced by :func:`pair_policies` (the count stays the same)."""
    extra = pair_policies(pods["client"][1], pods["server"][1], ports)
    nss = base.namespaces + [{"metadata": {"name": n, "labels": {"kubernetes.io/metadata.name": n}}}
                             for n in (SERVER_NS, CLIENT_NS, OTHER_NS)]
    api_pods = base.pods + [_api_pod(ns, name, labels, ips) for name, (ns, labels, ips) in pods.items()]
    return Cluster(nss, api_pods, base.policies[: max(0, len(base.policies) - len(extra))] + extra)


def bridge_flow_count(node: Any) -> int:
    return len(node.flows())


def megaflow_count(node: Any) -> int | None:
    try:
        out = node.ovs.appctl("dpctl/dump-flows")
    except RuntimeError:
        return None
    return sum(1 for line in out.splitlines() if line.strip() and not line.startswith("flow-dump"))


@dataclass(frozen=True)
class IperfEnd:
    """A podnode Pod as bench_dataplane's ``iperf_once`` sees a lab Pod: netns, ipv4, exec(argv)."""

    pod: Any

    @property
    def netns(self) -> str:
        return str(self.pod.netns)

    @property
    def ipv4(self) -> str:
        return str(self.pod.ip(4))

    def exec(self, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.netns, *argv], capture_output=True, text=True,
                              check=False, timeout=timeout)


@dataclass
class Case:
    key: str
    gbps: list[float]
    flows: list[int]
    megaflows: list[int | None]
    install_s: list[float]
    cpu_s_per_gbit: list[float]  # ovs-vswitchd + both iperf3 CPU seconds per Gbit received


def interleaved_cases(rep: int) -> tuple[str, str]:
    """Repetition ``rep``'s order: "none" first on even repetitions, "policy" first on odd ones."""
    return ("none", "policy") if rep % 2 == 0 else ("policy", "none")


@contextmanager
def one_node(tag: str, cni_bin: str) -> Iterator[Any]:
    """A podnode Node (netns ``tag`` with its own OVS, netdev bridge, the plugin's conflist), as
    tests/support/podnode.py's fixture builds it; its Pods, OVS and netns removed on exit."""
    from tests.support.ovs_instance import OvsInstance, netns
    from tests.support.podnode import Node, remove_pods

    with tempfile.TemporaryDirectory(prefix=f"{tag}-") as work, netns(tag) as ns, \
            OvsInstance(tag, netns=ns) as ovs:
        node = Node(name=ns, ovs=ovs, dir=Path(work), cni_bin=cni_bin)
        node.write_conflist()
        try:
            yield node
        finally:
            remove_pods(node)


def measure_dataplane(args: argparse.Namespace, cni_bin: str) -> dict[str, Any]:
    with one_node(f"{PREFIX}{secrets.token_hex(3)}", cni_bin) as node:
        return pair_on(node, args)


def pair_on(node: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The interleaved runs on ``node``: Pods plugged, policy flows installed and removed."""
    from bench.bench_dataplane import IPERF_PORT, iperf_once
    from cni.ovs.openflow.bridge import OpenFlow
    from cni.pipeline.tables import Cookie, Owner
    from routesync.policy import plan as pp

    servers: list[subprocess.Popen[str]] = []
    try:
        client, server, other = (node.add_pod(n) for n in ("client", "server", "other"))
        labels = {"client": {"app": "bench-client"}, "server": {"app": "bench-server"},
                  "other": {"app": "bench-client"}}  # other: the client's labels, in a namespace without policy
        where = {"client": CLIENT_NS, "server": SERVER_NS, "other": OTHER_NS}
        real: dict[str, tuple[str, dict[str, str], tuple[str, ...]]] = {
            p.name: (where[p.name], labels[p.name], (p.ip(4), p.ip(6))) for p in (client, server, other)}
        base = generate(args.pods, args.namespaces, args.policies, args.nodes, args.seed)
        inputs = parse(dataplane_cluster(base, real, (IPERF_PORT, ECHO_PORT)))
        plan = pp.plan(inputs, pp.NodeFacts(LOCAL, (server.gateway(4), server.gateway(6))))
        last = plan.rules[-1]
        if f"{SERVER_NS}/server" not in last.pods or last.policy != f"{SERVER_NS}/zz-allow-client":
            raise RuntimeError(f"the last conjunction is not the pair's: {last}")
        log(f"data plane: {len(plan.flows):,} policy flows, {len(plan.rules):,} conjunctions; "
            f"the last ({last.policy}) allows the client")
        of = OpenFlow(node.bridge, node.ovs.dir, timeout=120.0)
        policy_match = Cookie.owner_match(Owner.POLICY)

        def install(case: str) -> float:
            t = time.perf_counter()
            of.del_flows(policy_match)
            if case == "policy":
                of.add_flows(plan.flows)
            return time.perf_counter() - t

        servers.append(server.serve(ECHO_PORT))

        def reach(src: Any) -> bool:
            return bool(src.connect(server.ip(4), ECHO_PORT, 2.0)["ok"])

        verdicts: dict[str, dict[str, bool]] = {}
        for case in ("none", "policy"):
            install(case)
            verdicts[case] = {"client": reach(client), "other": reach(other)}
        log(f"verdicts: {verdicts}")
        if verdicts != {"none": {"client": True, "other": True}, "policy": {"client": True, "other": False}}:
            raise RuntimeError(f"the policy does not do what it says: {verdicts}")
        vswitchd = (int(Path(node.ovs.dir, "ovs-vswitchd.pid").read_text().strip()),)
        cases = {k: Case(k, [], [], [], [], []) for k in ("none", "policy")}
        for rep in range(args.reps):
            for key in interleaved_cases(rep):
                c = cases[key]
                c.install_s.append(install(key))
                c.flows.append(bridge_flow_count(node))
                run = iperf_once(IperfEnd(client), IperfEnd(server), args.seconds, vswitchd)
                c.megaflows.append(megaflow_count(node))
                c.gbps.append(run.gbps)
                c.cpu_s_per_gbit.append(run.cpu_s_per_gbit)
                log(f"rep {rep + 1} {key}: {run.gbps:.3f} Gbit/s, {run.cpu_s_per_gbit:.2f} CPU s/Gbit, "
                    f"{c.flows[-1]:,} flows, {c.megaflows[-1]} megaflows, installed in {c.install_s[-1]:.2f} s")
        res: dict[str, Any] = {"seconds": args.seconds, "reps": args.reps, "verdicts": verdicts,
                               "policy_flows": len(plan.flows), "conjunctions": len(plan.rules),
                               "policies": len(inputs.policies), "last_rule": last.policy}
        for key, c in cases.items():
            res[key] = {"gbps": c.gbps, "gbps_median": statistics.median(c.gbps), "gbps_min": min(c.gbps),
                        "gbps_max": max(c.gbps), "bridge_flows": statistics.median(c.flows),
                        "megaflows": [m for m in c.megaflows if m is not None], "install_s": c.install_s,
                        "cpu_s_per_gbit": c.cpu_s_per_gbit,
                        "cpu_s_per_gbit_median": statistics.median(c.cpu_s_per_gbit)}
        paired = [p / n for p, n in zip(cases["policy"].gbps, cases["none"].gbps, strict=True) if n]
        res["ratio"] = res["policy"]["gbps_median"] / res["none"]["gbps_median"] if res["none"]["gbps_median"] else None
        res["ratio_per_repetition"] = [round(x, 3) for x in paired]
        res["cpu_cost_ratio"] = (res["policy"]["cpu_s_per_gbit_median"] / res["none"]["cpu_s_per_gbit_median"]
                                 if res["none"]["cpu_s_per_gbit_median"] else None)
        return res
    finally:
        for s in servers:
            s.kill()
            s.wait()


# ------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--namespaces", type=int, default=100)
    ap.add_argument("--policies", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--runs", type=int, default=5, help="plan/parse runs (median)")
    ap.add_argument("--seconds", type=float, default=10.0, help="iperf3 -t per repetition")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions of each data-plane case")
    ap.add_argument("--no-dataplane", action="store_true", help="planning figures only (no root needed)")
    ap.add_argument("--no-planning", action="store_true", help="data-plane figures only")
    ap.add_argument("--profile", choices=("auto", "always", "never"), default="auto",
                    help=f"cProfile one plan (auto: when slower than {PLAN_BUDGET_S:g} s)")
    ap.add_argument("--quick", action="store_true",
                    help="1,000 Pods, 20 namespaces, 100 policies, 3 runs, 2 s x 2 iperf3")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--cni-bin", help="CNI_PATH directory with ferry (default: build/cni-bin or written)")
    ap.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    if args.rss_child:
        print(json.dumps(rss_child(args)))
        return 0
    if args.quick:
        args.pods, args.namespaces, args.policies, args.runs, args.seconds, args.reps = 1000, 20, 100, 3, 2.0, 2
    t0 = time.monotonic()
    res: dict[str, Any] = {"benchmark": "policy", "quick": args.quick,
                           "budgets": {"plan_s": PLAN_BUDGET_S, "rss_mb": RSS_BUDGET_MB,
                                       "throughput_ratio": THROUGHPUT_GOAL},
                           "planning": {} if args.no_planning else measure_planning(args)}
    failed = False
    if not args.no_dataplane:
        if os.geteuid() != 0:
            print("bench_policy's data plane needs root (netns, OVS); --no-dataplane skips it", file=sys.stderr)
            return 2
        from lab.api import default_cni_bin, ensure_cni_bin

        cni_bin = ensure_cni_bin(os.path.abspath(args.cni_bin or default_cni_bin()))
        try:
            res["dataplane"] = measure_dataplane(args, cni_bin)
        except Exception as e:  # noqa: BLE001 - the planning figures stand; report why
            res["dataplane"] = {"error": f"{type(e).__name__}: {e}"}
            failed = True
            log(f"data plane FAILED: {e}")
    res["elapsed_s"] = round(time.monotonic() - t0, 1)
    res["loadavg"] = os.getloadavg()
    p = res["planning"]
    if p:
        print(f"{p['objects']:,} objects ({p['pods']:,} Pods, {p['policies']:,} policies), "
              f"node-1: {p['local_pods']:,} Pods")
        print(f"parse {p['parse_s']:.3f} s, plan {p['plan_s']:.3f} s ({p['ratios']['plan_over_parse']:.2f}x parse), "
              f"replan {p['replan_s']:.3f} s; {p['flows']:,} flows; RSS inputs {p['rss']['inputs_rss_mb']:.0f} MB, "
              f"peak {p['rss']['peak_rss_mb']:.0f} MB")
    for r in p.get("profile", [])[:10]:
        print(f"  {r['tottime_s']:>7.3f} s {r['share']:>6.1%} {r['ncalls']:>9} {r['function']}")
    d = res.get("dataplane") or {}
    if d.get("ratio") is not None:
        print(f"throughput with policy / without: {d['ratio']:.2f} ({d['policy']['gbps_median']:.2f} / "
              f"{d['none']['gbps_median']:.2f} Gbit/s), flows {d['policy']['bridge_flows']:,} / "
              f"{d['none']['bridge_flows']:,}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
