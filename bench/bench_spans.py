"""A Node receives what concerns it (issue 46): the spans controller's index
(``routesync.policy.spanindex.SpanIndex``) event by event, beside the full recompute
(``routesync.policy.relevance.spans``) in the same run, and what the spans save, for both values
of route-sync's ``policyPeers`` (:data:`PEER_MODES`): ``cluster``, whose planners judge a remote
client's egress at the destination too, and ``peerSlices``, whose planners judge egress at its
source only (``docs/design/scale.md``), on the same cluster with the same events.

    python -m bench.bench_spans [--scale 30000:3000:300:1000] [--cnps 0] [--egress-named 10]
                                [--pod-events 2000] [--policy-events 200] [--full-events 3]
                                [--seed 46] [--quick] [--json OUT]

The cluster is :func:`bench.bench_policy.generate`'s at ``PODS:POLICIES:NAMESPACES:NODES`` (Pods
spread evenly over the Nodes; most namespaces' first policy a default deny of ingress, then
allows from Pods by label, from namespaces by label, both, matchExpressions, named ports, egress
to DNS and a database tier, egress default deny), plus ``--egress-named`` policies whose egress
rule has no ``to`` and a named port (every Pod with that port is read where they select), and
``--cnps`` ClusterNetworkPolicies of :func:`bench.bench_policy_replay.cluster_policies`' shapes
(none by default: their Baseline "Deny from every namespace" reads every Pod wherever it has a
subject, so with them every Node reads nearly every Pod).
Figures, CPU seconds of this process (``process_time``):

* ``load``: the index fed every object, one upsert at a time (the controller's start), beside one
  full ``relevance.spans`` (the reference: what each event costs without the index);
* per event, the index's CPU (the upsert or delete and the ``take_changes`` that follows), p50
  and p99, and how many Pods' spans each changed: Pod added, deleted, relabelled (its ``app``
  or ``version``), moved to another Node; policy created, deleted, edited (another shape under
  the same name), its port edited (no span moves);
* per event, the PeerSlice writes ferry-controller makes of it (:class:`controller.slices.SliceBook`,
  slices per group a policy names), mean and max, and the KB of JSON they send, for each way the
  slices reach the Nodes (:data:`DELIVERIES`: labelled with their audience, or asked for by group
  name), beside the Pods whose span changed (what a slice per audience moved: the first version's
  grouping, each such Pod rewritten in two slices);
* ``pairs``: the (Pod, Node) pairs the spans hold, a remote Pod counted on each Node that reads
  it, beside every Pod on every other Node (what each Node receives today), and how many Pods
  are read everywhere or wherever there is a Pod.

At the end the index is held to ``relevance.spans`` of the same objects once more (exit 1 if
they differ).  Nothing is asserted on times: each figure stands beside its reference."""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import replace
from typing import Any

from bench.util import cpu, pct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = {"scale": "2000:200:20:200", "egress_named": 2, "pod_events": 300, "policy_events": 40,
         "full_events": 2}


def log(msg: str) -> None:
    print(f"[bench_spans] {msg}", file=sys.stderr, flush=True)


class State:
    """The objects delivered so far (the reference's inputs)."""

    def __init__(self, inputs: Any, cnps: list[Any]) -> None:
        self.pods = {p.key: p for p in inputs.pods}
        self.namespaces = dict(inputs.namespaces)
        self.policies = {p.key: p for p in inputs.policies}
        self.cnps = {c.name: c for c in cnps}

    def inputs(self) -> Any:
        from routesync.policy.plan import Inputs

        return Inputs(tuple(self.pods.values()), self.namespaces, tuple(self.policies.values()))

    def tiers(self) -> tuple[Any, ...]:
        return tuple(self.cnps.values())

    def apply(self, idx: Any, ev: tuple[str, Any]) -> None:
        kind, obj = ev
        if kind == "pod":
            self.pods[obj.key] = obj
            idx.upsert_pod(obj)
        elif kind == "pod-":
            self.pods.pop(obj, None)
            idx.delete_pod(obj)
        elif kind == "policy":
            self.policies[obj.key] = obj
            idx.upsert_policy(obj)
        elif kind == "policy-":
            self.policies.pop(obj, None)
            idx.delete_policy(obj)
        else:
            raise ValueError(kind)


def egress_named(n: int, namespaces: list[str], rng: random.Random) -> list[Any]:
    """Policies whose egress rule names a port and no peer: the Pods with that port are its peers."""
    from bench import bench_policy as bp
    from routesync.policy.model import policy_from

    return [policy_from({"metadata": {"namespace": rng.choice(namespaces), "name": f"egress-http-{i:03d}"},
                         "spec": {"podSelector": {"matchLabels": {"app": f"app-{rng.randrange(bp.APPS)}"}},
                                  "policyTypes": ["Egress"],
                                  "egress": [{"ports": [{"port": "http"}]},
                                             {"ports": [{"port": 53, "protocol": "UDP"}]}]}})
            for i in range(n)]


def pod_events(state: State, n: int, nodes: int, rng: random.Random) -> list[tuple[str, tuple[str, Any]]]:
    """``n`` Pod events, (kind, event), applied in order: added, deleted, relabelled, moved."""
    from bench import bench_policy as bp
    from routesync.policy.model import NamedPort

    pods = dict(state.pods)
    keys = sorted(pods)
    nss = sorted({p.namespace for p in pods.values()})
    out: list[tuple[str, tuple[str, Any]]] = []
    fresh = 0
    for i in range(n):
        kind = ("pod-add", "pod-delete", "pod-relabel", "pod-move")[i % 4]
        if kind == "pod-add":
            fresh += 1
            app = rng.randrange(bp.APPS)
            node = rng.randrange(nodes)
            p = next(iter(pods.values()))
            p = replace(p, namespace=rng.choice(nss), name=f"new-{fresh}", node=bp.node_name(node),
                        labels=(("app", f"app-{app}"), ("tier", bp.TIERS[app % len(bp.TIERS)])),
                        ips=bp.pod_ips(node % 190, 60000 + fresh), ports=(NamedPort("http", "TCP", 8080),))
            pods[p.key] = p
            keys.append(p.key)
            out.append((kind, ("pod", p)))
            continue
        key = rng.choice(keys)
        while key not in pods:
            key = rng.choice(keys)
        p = pods[key]
        if kind == "pod-delete":
            del pods[key]
            out.append((kind, ("pod-", key)))
            continue
        if kind == "pod-relabel":
            labels = dict(p.labels)
            if rng.random() < 0.5:
                labels["version"] = rng.choice(("v1", "v2", "v3"))
            else:
                labels["app"] = f"app-{rng.randrange(bp.APPS)}"
            p = replace(p, labels=tuple(sorted(labels.items())))
        else:
            p = replace(p, node=bp.node_name(rng.randrange(nodes)))
        pods[key] = p
        out.append((kind, ("pod", p)))
    return out


def policy_events(state: State, pool: list[Any], n: int, rng: random.Random) -> list[tuple[str, tuple[str, Any]]]:
    """``n`` policy events: created (a shape of ``pool``), deleted, edited into another shape,
    a port edited."""
    from routesync.policy.model import PortMatch, Rule

    pols = dict(state.policies)
    keys = sorted(pols)
    out: list[tuple[str, tuple[str, Any]]] = []
    for i in range(n):
        kind = ("policy-create", "policy-delete", "policy-edit", "policy-port")[i % 4]
        if kind == "policy-create":
            p = replace(rng.choice(pool), name=f"new-{i:05d}")
            pols[p.key] = p
            keys.append(p.key)
            out.append((kind, ("policy", p)))
            continue
        key = rng.choice(keys)
        while key not in pols:
            key = rng.choice(keys)
        p = pols[key]
        if kind == "policy-delete":
            del pols[key]
            out.append((kind, ("policy-", key)))
            continue
        if kind == "policy-edit":
            p = replace(rng.choice(pool), namespace=p.namespace, name=p.name)
        else:
            p = replace(p, ingress=tuple(Rule(r.peers, (PortMatch("TCP", rng.choice((80, 81, 443))),))
                                         for r in p.ingress))
        pols[key] = p
        out.append((kind, ("policy", p)))
    return out


def pairs(spans: dict[str, Any], pods: dict[str, Any], all_nodes: set[str]) -> dict[str, int]:
    """(Pod, Node) pairs the spans hold, against every Pod on every other Node."""
    populated = {p.node for p in pods.values()}
    known = all_nodes | populated
    held = everywhere = populated_n = 0
    for key, s in spans.items():
        own = pods[key].node
        if s.everywhere:
            held += len(known) - (own in known)
            everywhere += 1
            continue
        if s.populated:
            populated_n += 1
            extra = s.nodes - populated
            held += len(populated) + len(extra) - (own in populated)
            continue
        held += len(s.nodes)
    today = sum(len(known) - (p.node in known) for p in pods.values())
    return {"pairs": held, "pairs_today": today, "pods_read": len(spans), "pods": len(pods),
            "nodes": len(known), "pods_everywhere": everywhere, "pods_populated": populated_n}


# route-sync's policyPeers and the planners' flag it sets (routesync.config.Config.remote_egress):
# a remote client's egress judged at the destination too (cluster), or at its source only (peerSlices)
PEER_MODES = (("cluster", True), ("peerSlices", False))
# how the controller's slices reach the Nodes (controller/slices.py): labelled with their audience,
# or asked for by group name (routesync/policy/subscription.py); both books take the same changes
DELIVERIES = ("labels", "subscription")


def writes_objects(w: Any) -> list[dict[str, Any]]:
    """The object bodies a book's writes send (a delete sends none)."""
    return [*w.create, *w.update]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The cluster generated once, then one :func:`run` per :data:`PEER_MODES` on it, each with the
    same event streams."""
    from bench import bench_policy as bp
    from bench.bench_policy_replay import cluster_policies, scale_of
    from routesync.policy.model import policy_from

    pods, policies, namespaces, nodes = scale_of(args.scale)
    rng = random.Random(args.seed)
    t = time.perf_counter()
    inputs = bp.parse(bp.generate(pods, namespaces, policies, nodes, args.seed))
    extra = egress_named(args.egress_named, sorted(inputs.namespaces), rng)
    inputs = replace(inputs, policies=inputs.policies + tuple(extra))
    cnps = cluster_policies(args.cnps, namespaces, args.seed)
    pool = [policy_from(d) for d in bp.generate(0, namespaces, max(40, policies // 10), nodes, args.seed + 1).policies]
    log(f"{args.scale}: {len(inputs.pods):,} Pods, {len(inputs.policies):,} policies, {len(cnps)} cluster "
        f"policies in {time.perf_counter() - t:.1f} s")
    res: dict[str, Any] = {"benchmark": "spans", "scale": args.scale, "pods": len(inputs.pods),
                           "policies": len(inputs.policies), "cluster_policies": len(cnps), "namespaces": namespaces,
                           "nodes": nodes, "runs": {}}
    for peers, remote_egress in PEER_MODES:
        log(f"policyPeers: {peers} (remote_egress {remote_egress})")
        res["runs"][peers] = run(args, inputs, cnps, pool, nodes, remote_egress)
    res["equal_after_replay"] = all(r["equal_after_replay"] for r in res["runs"].values())
    return res


def run(args: argparse.Namespace, inputs: Any, cnps: list[Any], pool: list[Any], nodes: int,
        remote_egress: bool) -> dict[str, Any]:
    """Everything the module names, for the spans of planners with ``remote_egress``."""
    from bench import bench_policy as bp
    from controller.slices import SliceBook
    from routesync.policy import relevance
    from routesync.policy.peerslice import group_name
    from routesync.policy.spanindex import SpanIndex

    rng = random.Random(args.seed + 2)  # the same events in every mode
    state = State(inputs, cnps)
    all_nodes = {bp.node_name(i) for i in range(nodes)}
    full_s, want = cpu(lambda: relevance.spans(state.inputs(), state.tiers(), remote_egress))
    idx = SpanIndex(remote_egress)

    def load() -> None:
        for ns, labels in inputs.namespaces.items():
            idx.upsert_namespace(ns, labels)
        for p in inputs.pods:
            idx.upsert_pod(p)
        for pol in inputs.policies:
            idx.upsert_policy(pol)
        for c in cnps:
            idx.upsert_cluster_policy(c)
        idx.take_changes()

    load_s, _ = cpu(load)
    books = {delivery: SliceBook(by_subscription=delivery == "subscription") for delivery in DELIVERIES}
    first = {group_name(g): v for g, v in idx.take_group_changes().items()}
    for delivery, book in books.items():
        objects = [json.dumps(o) for o in writes_objects(book.apply(dict(state.pods), first))]
        log(f"slices by {delivery}: {len(objects):,} objects, {sum(map(len, objects)) / 1e6:.1f} MB")
    loaded_equal = idx.spans() == want
    log(f"full relevance.spans {full_s:.2f} s CPU; index load {load_s:.2f} s CPU; equal {loaded_equal}")
    res: dict[str, Any] = {"remote_egress": remote_egress, "full_spans_cpu_s": full_s, "index_load_cpu_s": load_s,
                           "pairs": pairs(want, state.pods, all_nodes), "events": {}}
    if cnps:  # the same without the tiers: what NetworkPolicy alone asks of a Node
        res["pairs_networkpolicy_only"] = pairs(relevance.spans(state.inputs(), (), remote_egress), state.pods,
                                                all_nodes)
    pr = res["pairs"]
    log(f"pairs: {pr['pairs']:,} (Pod, Node) pairs read of {pr['pairs_today']:,} today "
        f"({pr['pairs'] / max(1, pr['pairs_today']):.2%}); {pr['pods_read']:,} of {pr['pods']:,} Pods read remotely, "
        f"{pr['pods_everywhere']:,} everywhere, {pr['pods_populated']:,} wherever a Pod is")
    streams = (pod_events(state, args.pod_events, nodes, rng), None)
    for stream in streams:
        events = stream if stream is not None else policy_events(state, pool, args.policy_events, rng)
        times: dict[str, list[float]] = {}
        changed: dict[str, list[int]] = {}
        writes: dict[str, dict[str, list[int]]] = {d: {} for d in DELIVERIES}
        written: dict[str, dict[str, list[float]]] = {d: {} for d in DELIVERIES}
        for kind, ev in events:
            c = time.process_time()
            state.apply(idx, ev)
            n = len(idx.take_changes())
            times.setdefault(kind, []).append(time.process_time() - c)
            changed.setdefault(kind, []).append(n)
            key = ev[1].key if ev[0] == "pod" else ev[1] if ev[0] == "pod-" else None
            record = {key: state.pods.get(key)} if key is not None else {}
            gc = {group_name(g): v for g, v in idx.take_group_changes().items()}
            for delivery, book in books.items():
                w = book.apply(record, gc)
                writes[delivery].setdefault(kind, []).append(w.count)
                written[delivery].setdefault(kind, []).append(
                    sum(len(json.dumps(o)) for o in writes_objects(w)) / 1000)
        for kind, ts in times.items():
            res["events"][kind] = {"n": len(ts), "cpu_p50_ms": pct(ts, 0.5) * 1e3, "cpu_p99_ms": pct(ts, 0.99) * 1e3,
                                   "cpu_max_ms": max(ts) * 1e3, "cpu_mean_ms": statistics.mean(ts) * 1e3,
                                   "changed_p50": pct([float(x) for x in changed[kind]], 0.5),
                                   "changed_mean": statistics.mean(changed[kind]), "changed_max": max(changed[kind]),
                                   **{f"slice_{k}_{delivery}_{stat}": f(d[delivery][kind])
                                      for delivery in DELIVERIES
                                      for k, d in (("writes", writes), ("kb", written))
                                      for stat, f in (("mean", statistics.mean), ("max", max))}}
    ref = [cpu(lambda: relevance.spans(state.inputs(), state.tiers(), remote_egress))[0]
           for _ in range(args.full_events)]
    res["full_spans_per_event_ms"] = statistics.median(ref) * 1e3 if ref else full_s * 1e3
    for kind, r in res["events"].items():
        r["full_over_index_p50"] = res["full_spans_per_event_ms"] / r["cpu_p50_ms"] if r["cpu_p50_ms"] else None
        log(f"{kind}: p50 {r['cpu_p50_ms']:.3f} ms, p99 {r['cpu_p99_ms']:.3f} ms, max {r['cpu_max_ms']:.1f} ms CPU; "
            f"spans changed p50 {r['changed_p50']:.0f}, mean {r['changed_mean']:.1f}, max {r['changed_max']}; "
            + "; ".join(f"by {d}: slice writes mean {r[f'slice_writes_{d}_mean']:.1f}, max "
                        f"{r[f'slice_writes_{d}_max']}, KB mean {r[f'slice_kb_{d}_mean']:.1f}, max "
                        f"{r[f'slice_kb_{d}_max']:.0f}" for d in DELIVERIES))
    after = relevance.spans(state.inputs(), state.tiers(), remote_egress)
    res["equal_after_replay"] = loaded_equal and idx.spans() == after
    res["pairs_after"] = pairs(after, state.pods, all_nodes)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--scale", default="30000:3000:300:1000", help="PODS:POLICIES:NAMESPACES:NODES")
    ap.add_argument("--cnps", type=int, default=0, help="ClusterNetworkPolicies too (their pairs beside "
                    "NetworkPolicy's alone)")
    ap.add_argument("--egress-named", type=int, default=10)
    ap.add_argument("--pod-events", type=int, default=2000)
    ap.add_argument("--policy-events", type=int, default=200)
    ap.add_argument("--full-events", type=int, default=3)
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--quick", action="store_true", help=f"a small cluster: {QUICK}")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    t0 = time.monotonic()
    res = measure(args)
    res["quick"] = args.quick
    res["elapsed_s"] = round(time.monotonic() - t0, 1)
    res["loadavg"] = os.getloadavg()
    print(f"{res['scale']} (+{res['cluster_policies']} cluster policies); equal after replay: "
          f"{res['equal_after_replay']}")
    for peers, r in res["runs"].items():
        pr = r["pairs"]
        print(f"  policyPeers: {peers}: full relevance.spans {r['full_spans_cpu_s'] * 1e3:.0f} ms CPU, index load "
              f"{r['index_load_cpu_s'] * 1e3:.0f} ms; (Pod, Node) pairs read: {pr['pairs']:,} of "
              f"{pr['pairs_today']:,} today ({pr['pairs'] / max(1, pr['pairs_today']):.2%}); {pr['pods_read']:,} "
              f"of {pr['pods']:,} Pods read remotely ({pr['pods_everywhere']:,} everywhere, "
              f"{pr['pods_populated']:,} wherever a Pod is)")
        np_only = r.get("pairs_networkpolicy_only")
        if np_only:
            print(f"    without the cluster policies: {np_only['pairs']:,} pairs "
                  f"({np_only['pairs'] / max(1, np_only['pairs_today']):.2%}), "
                  f"{np_only['pods_read']:,} Pods read remotely, "
                  f"{np_only['pods_populated']:,} wherever a Pod is")
        for kind, e in r["events"].items():
            print(f"    {kind:13s} p50 {e['cpu_p50_ms']:.3f} ms, p99 {e['cpu_p99_ms']:.3f} ms CPU "
                  f"(full recompute {r['full_spans_per_event_ms']:.0f} ms, x{e['full_over_index_p50']:.0f}); "
                  f"spans changed p50 {e['changed_p50']:.0f}, max {e['changed_max']}")
            print(f"    {'':13s} slice writes, mean/max per event and KB sent: " + "; ".join(
                  f"by {d} {e[f'slice_writes_{d}_mean']:.1f}/{e[f'slice_writes_{d}_max']}, "
                  f"{e[f'slice_kb_{d}_mean']:.1f}/{e[f'slice_kb_{d}_max']:.0f} KB" for d in DELIVERIES))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if res["equal_after_replay"] else 1


if __name__ == "__main__":
    sys.exit(main())
