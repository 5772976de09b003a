"""Incremental NetworkPolicy planning replayed (issue 40): generated event streams through the
incremental planner (``routesync.policy.incremental``) beside today's full planner
(``routesync.policy.plan.plan``), in the same run, for one Node's view.

    python -m bench.bench_policy_replay [--scale 10000:1000:100:91,150000:10000:1000:5000] [--local 110]
                                        [--pod-events 2000] [--policy-events 200] [--full-events 3]
                                        [--rss 30000:3000:300:273] [--diff-events N] [--seed 40] [--json OUT]

Per scale ``PODS:POLICIES:NAMESPACES:NODES`` the cluster is :func:`bench.bench_policy.generate`'s,
with ``--local`` of its Pods on node-1 (the Node planned; addresses in its Pod CIDRs).  Figures,
CPU seconds of this process (``process_time``):

* ``full_plan``: ``plan()`` from scratch, and the incremental planner's ``load()`` of the same
  inputs (route-sync's start, or a resync that found drift);
* per Pod event (a Pod added, deleted, relabelled, moved between Nodes or to/from this one,
  re-addressed: ``--pod-events`` of them, mixed) the incremental planner's CPU, p50 and p99, and
  the flows each changed; per policy change (a port edited, a policy deleted and created again:
  ``--policy-events``) the same; beside them today's cost of the same events: a full ``plan()``
  per event, measured on ``--full-events`` of them (each costs a full plan);
* ``snapshot``: taking the Plan the daemon reads (per pass, not per event), p50/p99;
* RSS (a fresh process per figure, ``--rss`` scale): after building the inputs, after the
  incremental planner's load, after a full plan.

``--tiers PODS:CNPS:NAMESPACES:NODES[,...]``: the same for the ClusterNetworkPolicy tiers
(``routesync.policy.cnp.incremental`` beside ``routesync.policy.cnp.plan.plan``), with
:func:`cluster_policies`' shapes over the same generated cluster: full plan and load CPU, then
per Pod event and per policy change (each with the snapshot the daemon takes) beside a full plan;
exit 1 if the two planners differ after the replay.

``--diff-events N``: also the differential test's replay (tests/routesync/policy/test_incremental.py)
for N events, the incremental planner checked against the full one after every event (``make
bench`` runs 1,000,000).  Nothing is asserted on times: each figure stands beside its reference."""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

from bench.util import cpu, pct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOALS = {"pod_event_p99_ms": 2.0, "policy_change_p99_ms": 20.0, "full_plan_10k_s": 1.0, "rss_30k_mb": 150.0}


def log(msg: str) -> None:
    print(f"[bench_policy_replay] {msg}", file=sys.stderr, flush=True)


def scale_of(text: str) -> tuple[int, int, int, int]:
    pods, policies, namespaces, nodes = (int(x) for x in text.split(":"))
    return pods, policies, namespaces, nodes


def cluster_inputs(pods: int, policies: int, namespaces: int, nodes: int, local: int, seed: int) -> Any:
    """The generated cluster as the planner's inputs, ``local`` of its Pods on node-1."""
    from bench import bench_policy as bp
    from routesync.policy.plan import Inputs

    inputs = bp.parse(bp.generate(pods, namespaces, policies, nodes, seed))
    here = [p for p in inputs.pods if p.node == bp.LOCAL]
    others = [p for p in inputs.pods if p.node != bp.LOCAL]
    rng = random.Random(seed)
    if len(here) < local:
        moved = rng.sample(range(len(others)), local - len(here))
        for j, i in enumerate(moved):
            others[i] = replace(others[i], node=bp.LOCAL, ips=bp.pod_ips(0, len(here) + j))
    elif len(here) > local:
        extra = here[local:]
        here = here[:local]
        others += [replace(p, node=bp.node_name(1)) for p in extra]
    all_pods = sorted([*here, *[p for p in others]], key=lambda p: p.key)
    return Inputs(tuple(all_pods), inputs.namespaces, inputs.policies)


def pod_events(inputs: Any, n: int, rng: random.Random) -> list[tuple[str, Any]]:
    """``n`` Pod events on ``inputs``' cluster as a watch delivers them (applied in order)."""
    from bench import bench_policy as bp

    pods = {p.key: p for p in inputs.pods}
    keys = sorted(pods)
    nss = sorted({p.namespace for p in inputs.pods})
    out: list[tuple[str, Any]] = []
    fresh = 0
    for _ in range(n):
        r = rng.random()
        key = rng.choice(keys)
        p = pods.get(key)
        if p is None or r < 0.15:  # a new Pod (a rollout's), on some Node
            fresh += 1
            ns = rng.choice(nss)
            app = rng.randrange(bp.APPS)
            node = 0 if rng.random() < 0.02 else rng.randrange(1, 5000)
            v4, v6 = bp.pod_ips(node % 190, 60000 + fresh)
            labels = (("app", f"app-{app}"), ("tier", bp.TIERS[app % len(bp.TIERS)]))
            doc = {"metadata": {"namespace": ns, "name": f"new-{fresh}", "labels": dict(labels)},
                   "spec": {"nodeName": bp.node_name(node), "containers": [{"name": "m", "ports": [
                       {"name": "http", "containerPort": 8080, "protocol": "TCP"}]}]},
                   "status": {"phase": "Running", "podIPs": [{"ip": v4}, {"ip": v6}]}}
            p = bp.parse(bp.Cluster([], [doc], [])).pods[0]
            pods[p.key] = p
            keys.append(p.key)
            out.append(("pod", p))
        elif r < 0.3:
            del pods[key]
            out.append(("pod-", key))
        elif r < 0.65:  # relabelled
            labels = dict(p.labels)
            labels["version"] = rng.choice(("v1", "v2", "v3"))
            p = replace(p, labels=tuple(sorted(labels.items())))
            pods[key] = p
            out.append(("pod", p))
        elif r < 0.85:  # moved to another Node (1 in 20 here, or away from here)
            node = bp.LOCAL if rng.random() < 0.05 else bp.node_name(rng.randrange(1, 5000))
            p = replace(p, node=node)
            pods[key] = p
            out.append(("pod", p))
        else:  # re-addressed
            p = replace(p, ips=bp.pod_ips(rng.randrange(1, 190), 70000 + len(out)))
            pods[key] = p
            out.append(("pod", p))
    return out


def policy_events(inputs: Any, n: int, rng: random.Random) -> list[tuple[str, Any]]:
    """``n`` policy changes: a port edited (as bench_policy's replan), or deleted and created again."""
    from bench import bench_policy as bp
    from routesync.policy import model

    out: list[tuple[str, Any]] = []
    for _ in range(n):
        pol = rng.choice(inputs.policies)
        if rng.random() < 0.7:
            spec: dict[str, Any] = {"podSelector": {}, "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": f"app-{rng.randrange(bp.APPS)}"}}}],
                 "ports": [{"protocol": "TCP", "port": rng.choice((80, 81, 443, 8080))}]}]}
            if not pol.pod_selector.everything:
                spec["podSelector"] = {"matchExpressions": [
                    {"key": r.key, "operator": r.operator, **({"values": sorted(r.values)} if r.values else {})}
                    for r in pol.pod_selector.requirements]}
            out.append(("policy", model.policy_from({"metadata": {"namespace": pol.namespace, "name": pol.name},
                                                     "spec": spec})))
        else:
            out.append(("policy-", pol.key))
            out.append(("policy", pol))
    return out


def apply(inc: Any, ev: tuple[str, Any]) -> None:
    kind, obj = ev
    if kind == "pod":
        inc.upsert_pod(obj)
    elif kind == "pod-":
        inc.delete_pod(obj)
    elif kind == "policy":
        inc.upsert_policy(obj)
    else:
        inc.delete_policy(obj)


def inputs_after(inputs: Any, events: list[tuple[str, Any]]) -> Any:
    from routesync.policy.plan import Inputs

    pods = {p.key: p for p in inputs.pods}
    pols = {p.key: p for p in inputs.policies}
    for kind, obj in events:
        if kind == "pod":
            pods[obj.key] = obj
        elif kind == "pod-":
            pods.pop(obj, None)
        elif kind == "policy":
            pols[obj.key] = obj
        else:
            pols.pop(obj, None)
    return Inputs(tuple(sorted(pods.values(), key=lambda p: p.key)), inputs.namespaces,
                  tuple(sorted(pols.values(), key=lambda p: p.key)))


def measure_scale(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    from bench import bench_policy as bp
    from routesync.policy import plan as pp
    from routesync.policy.incremental import IncrementalPlanner

    pods, policies, namespaces, nodes = scale_of(spec)
    rng = random.Random(args.seed)
    t = time.perf_counter()
    inputs = cluster_inputs(pods, policies, namespaces, nodes, args.local, args.seed)
    log(f"{spec}: {len(inputs.pods):,} Pods, {len(inputs.policies):,} policies in {time.perf_counter() - t:.1f} s")
    facts = bp.local_facts()
    full_s, full = cpu(lambda: pp.plan(inputs, facts, pp.ConjIds()))
    log(f"{spec}: full plan {full_s:.2f} s CPU, {len(full.flows):,} flows, {len(full.rules):,} rules, "
        f"{len(full.remote_rules):,} remote rules")
    inc = IncrementalPlanner(facts)
    load_s, _ = cpu(lambda: inc.load(inputs))
    inc.take_delta()
    log(f"{spec}: incremental load {load_s:.2f} s CPU")
    res: dict[str, Any] = {"scale": spec, "pods": len(inputs.pods), "policies": len(inputs.policies),
                           "namespaces": namespaces, "nodes": nodes, "local_pods": args.local,
                           "flows": len(full.flows), "rules": len(full.rules), "remote_rules": len(full.remote_rules),
                           "full_plan_cpu_s": full_s, "incremental_load_cpu_s": load_s}
    for kind, events in (("pod", pod_events(inputs, args.pod_events, rng)),
                         ("policy", policy_events(inputs, args.policy_events, rng))):
        times: list[float] = []
        changed: list[int] = []
        snaps: list[float] = []
        applied: list[tuple[str, Any]] = []
        for i, ev in enumerate(events):
            c = time.process_time()
            apply(inc, ev)
            d = inc.take_delta()
            times.append(time.process_time() - c)
            changed.append(len(d))
            applied.append(ev)
            if i % 20 == 0:
                s, _ = cpu(inc.snapshot)
                snaps.append(s)
        # today's cost of the same events: a full plan after each (measured on a few)
        ref: list[float] = []
        base = inputs
        done: list[tuple[str, Any]] = []
        ids = pp.ConjIds()
        pp.plan(inputs, facts, ids)
        for ev in events[: args.full_events]:
            done.append(ev)
            now = inputs_after(base, done)
            s, _ = cpu(lambda now=now, ids=ids: pp.plan(now, facts, ids))
            ref.append(s)
        inputs = inputs_after(inputs, applied)
        res[kind] = {"events": len(events), "cpu_p50_ms": pct(times, 0.5) * 1e3, "cpu_p99_ms": pct(times, 0.99) * 1e3,
                     "cpu_max_ms": max(times) * 1e3, "cpu_mean_ms": statistics.mean(times) * 1e3,
                     "flows_changed_p50": pct([float(x) for x in changed], 0.5),
                     "flows_changed_max": max(changed),
                     "full_plan_per_event_ms": statistics.median(ref) * 1e3 if ref else None,
                     "full_plan_events": len(ref),
                     "snapshot_p50_ms": pct(snaps, 0.5) * 1e3, "snapshot_p99_ms": pct(snaps, 0.99) * 1e3}
        r = res[kind]
        r["full_over_incremental_p50"] = (r["full_plan_per_event_ms"] / r["cpu_p50_ms"]
                                          if r["full_plan_per_event_ms"] and r["cpu_p50_ms"] else None)
        log(f"{spec}: {kind} events: p50 {r['cpu_p50_ms']:.3f} ms, p99 {r['cpu_p99_ms']:.3f} ms, "
            f"max {r['cpu_max_ms']:.1f} ms CPU; full plan per event {r['full_plan_per_event_ms']} ms; "
            f"snapshot p50 {r['snapshot_p50_ms']:.1f} ms")
    # the state after all of it, held to the full planner once more
    want = pp.plan(inc.inputs(), facts, inc.ids.copy())
    got = inc.snapshot(ordered=True)
    res["equal_to_full_plan_after_replay"] = got == want
    return res


def cluster_policies(n: int, namespaces: int, seed: int) -> list[Any]:
    """``n`` ClusterNetworkPolicies of the shapes administrators write: a tenant's Namespaces
    isolated from the others (Admin Deny from every Namespace but its own, Pass within it), the
    monitoring Namespace accepted into every Pod (Admin Accept, a named port), egress to the
    API server's Nodes and to a block kept (Admin Accept by nodes and networks), and a Baseline
    default deny per environment with an allow from the same team."""
    from routesync.policy.cnp.model import cluster_policy_from

    rng = random.Random(seed)
    out = []
    for i in range(n):
        team = f"team-{rng.randrange(max(1, namespaces))}"
        shape = i % 4
        spec: dict[str, Any] = {"tier": "Admin", "priority": rng.randrange(0, 1000)}
        mine = {"namespaces": {"matchLabels": {"team": team}}}
        if shape == 0:
            spec["subject"] = mine
            spec["ingress"] = [{"action": "Pass", "from": [mine]},
                               {"action": "Deny", "from": [{"namespaces": {}}]}]
        elif shape == 1:
            spec["subject"] = {"pods": {"namespaceSelector": {"matchLabels": {"env": "prod"}},
                                        "podSelector": {"matchLabels": {"app": f"app-{rng.randrange(20)}"}}}}
            spec["ingress"] = [{"action": "Accept", "from": [{"namespaces": {"matchLabels": {"team": "team-0"}}}],
                                "protocols": [{"destinationNamedPort": "http"}]}]
        elif shape == 2:
            spec["subject"] = mine
            spec["egress"] = [{"action": "Accept", "to": [{"nodes": {"matchLabels": {"role": "control-plane"}}}],
                               "protocols": [{"tcp": {"destinationPort": {"number": 6443}}}]},
                              {"action": "Deny", "to": [{"networks": ["10.0.0.0/8", "fd00:10::/32"]}]}]
        else:
            spec = {"tier": "Baseline", "priority": rng.randrange(0, 1000),
                    "subject": {"namespaces": {"matchLabels": {"env": rng.choice(("prod", "staging", "dev"))}}},
                    "ingress": [{"action": "Accept", "from": [mine]},
                                {"action": "Deny", "from": [{"namespaces": {}}]}]}
        out.append(cluster_policy_from({"metadata": {"name": f"cnp-{i:04d}"}, "spec": spec}))
    return out


def measure_tiers(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    """The ClusterNetworkPolicy tiers at ``PODS:CNPS:NAMESPACES:NODES``: a full plan, the
    incremental planner's load, and per Pod and per policy event the incremental planner's CPU
    beside a full plan's (today's cost of the same event before the incremental planner)."""
    from bench import bench_policy as bp
    from routesync.policy.cnp import plan as tp
    from routesync.policy.cnp.incremental import TierPlanner
    from routesync.policy.cnp.model import NodeInfo
    from routesync.policy.plan import ConjIds

    pods, cnps, namespaces, nodes = scale_of(spec)
    rng = random.Random(args.seed)
    base = cluster_inputs(pods, 0, namespaces, nodes, args.local, args.seed)
    node_objs = tuple(NodeInfo(bp.node_name(i), (("role", "control-plane" if i < 3 else "worker"),),
                               (f"192.168.{i // 250}.{i % 250 + 1}",)) for i in range(nodes))
    policies = tuple(cluster_policies(cnps, namespaces, args.seed))
    inputs = tp.Inputs(base.pods, base.namespaces, policies, node_objs)
    facts = tp.Facts(bp.LOCAL, ("10.96.0.0/16",))
    full_s, full = cpu(lambda: tp.plan(inputs, facts, ConjIds(tp.FIRST_CONJ_ID)))
    inc = TierPlanner(facts)
    load_s, _ = cpu(lambda: inc.load(inputs))
    log(f"tiers {spec}: full plan {full_s:.2f} s CPU, {len(full.flows):,} flows, {len(full.rules):,} rules; "
        f"incremental load {load_s:.2f} s")
    res: dict[str, Any] = {"scale": spec, "pods": len(inputs.pods), "policies": len(policies),
                           "flows": len(full.flows), "rules": len(full.rules), "full_plan_cpu_s": full_s,
                           "incremental_load_cpu_s": load_s}
    pod_evs = pod_events(base, args.pod_events, rng)
    pol_evs: list[tuple[str, Any]] = []
    for i in range(args.policy_events):  # a priority moved, or a rule dropped and written again
        p = rng.choice(policies)
        if i % 2:
            pol_evs.append(("cnp", replace(p, priority=(p.priority + 1) % 1001)))
        else:
            pol_evs += [("cnp", replace(p, ingress=p.ingress[:1], egress=p.egress[:1])), ("cnp", p)]
    for kind, events in (("pod", pod_evs), ("policy", pol_evs)):
        times: list[float] = []
        snaps: list[float] = []
        for i, (kind_ev, obj) in enumerate(events):
            c = time.process_time()
            if kind_ev == "pod":
                inc.pod_event(obj.key, obj)
            elif kind_ev == "pod-":
                inc.pod_event(obj, None)
            else:
                inc.policy_event(obj.name, obj)
            times.append(time.process_time() - c)
            if i % 20 == 0:  # the daemon takes one per pass, not per event
                snaps.append(cpu(inc.snapshot)[0])
        ref = [cpu(lambda: tp.plan(inc.inputs(), facts, inc.ids.copy()))[0] for _ in range(args.full_events)]
        r = res[kind] = {"events": len(events), "cpu_p50_ms": pct(times, 0.5) * 1e3,
                         "cpu_p99_ms": pct(times, 0.99) * 1e3,
                         "snapshot_p50_ms": pct(snaps, 0.5) * 1e3,
                         "full_plan_per_event_ms": statistics.median(ref) * 1e3 if ref else None}
        r["full_over_incremental_p50"] = (r["full_plan_per_event_ms"] / r["cpu_p50_ms"]
                                          if r["full_plan_per_event_ms"] and r["cpu_p50_ms"] else None)
        log(f"tiers {spec}: {kind} events: p50 {r['cpu_p50_ms']:.3f} ms, p99 {r['cpu_p99_ms']:.3f} ms CPU, "
            f"snapshot p50 {r['snapshot_p50_ms']:.1f} ms; full plan per event {r['full_plan_per_event_ms']:.1f} ms")
    ids = inc.ids.copy()
    want = tp.plan(inc.inputs(), facts, ids)
    got = inc.snapshot()
    res["equal_to_full_plan_after_replay"] = ({f.key(): f for f in got.flows} == {f.key(): f for f in want.flows}
                                              and got.rules == want.rules and got.host_rules == want.host_rules)
    return res


def rss_child(spec: str, local: int, seed: int, which: str) -> dict[str, float]:
    from bench import bench_policy as bp
    from routesync.policy import plan as pp
    from routesync.policy.incremental import IncrementalPlanner

    pods, policies, namespaces, nodes = scale_of(spec)
    inputs = cluster_inputs(pods, policies, namespaces, nodes, local, seed)
    out = {"inputs_vmrss_mb": bp.vm_rss_kb() / 1024}
    if which == "incremental":
        inc = IncrementalPlanner(bp.local_facts())
        inc.load(inputs)
        inc.take_delta()
        out["vmrss_mb"] = bp.vm_rss_kb() / 1024
        out["flows"] = len(inc.flows())
    else:
        p = pp.plan(inputs, bp.local_facts())
        out["vmrss_mb"] = bp.vm_rss_kb() / 1024
        out["flows"] = len(p.flows)
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def measure_rss(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"scale": args.rss}
    for which in ("incremental", "full"):
        argv = [sys.executable, "-m", "bench.bench_policy_replay", "--rss-child", which, "--rss", args.rss,
                "--local", str(args.local), "--seed", str(args.seed)]
        cp = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False, timeout=3600)
        if cp.returncode != 0:
            raise RuntimeError(f"RSS child failed: {cp.stderr[-800:]}")
        out[which] = json.loads(cp.stdout.strip().splitlines()[-1])
        log(f"RSS {args.rss} {which}: {out[which]}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--scale", default="10000:1000:100:91,150000:10000:1000:5000")
    ap.add_argument("--local", type=int, default=110)
    ap.add_argument("--pod-events", type=int, default=2000)
    ap.add_argument("--policy-events", type=int, default=200)
    ap.add_argument("--full-events", type=int, default=3)
    ap.add_argument("--rss", default="30000:3000:300:273")
    ap.add_argument("--no-rss", action="store_true")
    ap.add_argument("--diff-events", type=int, default=0)
    ap.add_argument("--tiers", default="10000:40:100:91",
                    help="ClusterNetworkPolicy scales PODS:CNPS:NAMESPACES:NODES ('' for none)")
    ap.add_argument("--seed", type=int, default=40)
    ap.add_argument("--json")
    ap.add_argument("--rss-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    if args.rss_child:
        print(json.dumps(rss_child(args.rss, args.local, args.seed, args.rss_child)))
        return 0
    t0 = time.monotonic()
    res: dict[str, Any] = {"benchmark": "policy-replay", "goals": GOALS,
                           "scales": [measure_scale(s, args) for s in args.scale.split(",") if s]}
    res["tiers"] = [measure_tiers(s, args) for s in args.tiers.split(",") if s]
    if not args.no_rss:
        res["rss"] = measure_rss(args)
    if args.diff_events:
        from tests.routesync.policy.test_incremental import PER_SEQUENCE, replay

        t = time.monotonic()
        for seed in range(max(1, args.diff_events // PER_SEQUENCE)):
            replay(10_000 + seed, PER_SEQUENCE)
        res["differential"] = {"events": max(1, args.diff_events // PER_SEQUENCE) * PER_SEQUENCE,
                               "seconds": time.monotonic() - t, "ok": True}
    res["elapsed_s"] = round(time.monotonic() - t0, 1)
    res["loadavg"] = os.getloadavg()
    for prefix, s in [("", s) for s in res["scales"]] + [("tiers ", s) for s in res["tiers"]]:
        print(f"{prefix}{s['scale']}: full plan {s['full_plan_cpu_s']:.2f} s, incremental load "
              f"{s['incremental_load_cpu_s']:.2f} s, {s['flows']:,} flows; "
              f"equal after replay: {s['equal_to_full_plan_after_replay']}")
        for kind in ("pod", "policy"):
            r = s[kind]
            print(f"  {kind} event: p50 {r['cpu_p50_ms']:.3f} ms, p99 {r['cpu_p99_ms']:.3f} ms CPU "
                  f"(full plan per event {r['full_plan_per_event_ms']:.0f} ms, x{r['full_over_incremental_p50']:.0f}); "
                  f"snapshot p50 {r['snapshot_p50_ms']:.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if all(s["equal_to_full_plan_after_replay"] for s in res["tiers"]) else 1


if __name__ == "__main__":
    sys.exit(main())
