"""route-sync's NetworkPolicy pass per Pod event, host judge written included (issues 40 and 46).

    python -m bench.bench_policy_pass [--scale 30000:3000:300:1000] [--local 110] [--events 200]
                                      [--seed 40] [--json OUT]

One Node's view of :func:`bench.bench_policy_replay.cluster_inputs`' cluster.  Each generated Pod
event (:func:`bench.bench_policy_replay.pod_events`) goes through what a route-sync pass does with
it: ``routesync.policy.node.PolicyNode.step`` (the incremental planner, its snapshot, the policy
report, the host judge rendered) and ``NftApplier.sync_policy`` of the judge on a real nftables
table in a namespace of its own, as a pass between full ones (``verify=False``).  Two sides, fed
the same events in the same run, alternating per event:

* ``element``: today's applier, which changes the judge's sets by element when only they moved;
* ``whole``: the same applier with ``policy_by_element=False``, which writes the judge whole
  whenever it changed (the applier's behaviour before the element updates).

Printed per side: CPU per event (this process: the planner, the render and libnftables all run
in it), p50/p99, and the share the judge's write took; the judge's size in bytes.  Nothing is
asserted on times: the two sides stand beside each other (and after the run both tables are
compared, set by set and chain by chain: they must list the same)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import time
from contextlib import ExitStack
from typing import Any

from bench.bench_policy_replay import cluster_inputs, pod_events, scale_of
from bench.util import pct
from routesync.heap import HeapSettler
from tests.support import nftlisting

SIDES = ("element", "whole")


def log(msg: str) -> None:
    print(f"[bench_policy_pass] {msg}", file=sys.stderr, flush=True)


class GcPauses:
    """The cyclic collector's wall time since :meth:`start` (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._t0 = 0.0

    def start(self) -> None:
        self.total = 0.0

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._t0


class EventSource:
    """``routesync.policy.node.PolicyInputs`` over generated inputs and one pending change at a
    time (the watches' journal of one event)."""

    def __init__(self, inputs: Any) -> None:
        from routesync.policy.incremental import Changes

        self._inputs = inputs
        self.gen = (1, 1, 1)
        self.pending = Changes()

    def generation(self) -> tuple[int, int, int]:
        return self.gen

    def inputs(self) -> tuple[tuple[int, int, int], Any]:
        return self.gen, self._inputs

    def service_cidrs(self, configured: tuple[str, ...]) -> tuple[str, ...]:
        return ("10.96.0.0/12",)

    def changes(self) -> tuple[tuple[int, int, int], Any]:
        from routesync.policy.incremental import Changes

        out, self.pending = self.pending, Changes()
        return self.gen, out

    def event(self, kind: str, obj: Any) -> None:
        from routesync.policy.incremental import Changes

        self.pending = Changes(pods={obj.key: obj}) if kind == "pod" else Changes(pods={obj: None})
        self.gen = (self.gen[0] + 1, 1, 1)


class NoPods:
    """``PolicyAppliers`` without OVS: nothing pending to release, no counters to read."""

    def release_pending(self, pods: Any, full: bool) -> int:
        return 0

    def policy_flows(self) -> list[Any]:
        return []


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from routesync.apply.nft import NftApplier
    from routesync.config import Config
    from routesync.model import LocalFacts
    from routesync.policy.node import PolicyNode
    from tests.support.ovs_instance import netns

    pods, policies, namespaces, nodes = scale_of(args.scale)
    t = time.perf_counter()
    inputs = cluster_inputs(pods, policies, namespaces, nodes, args.local, args.seed)
    events = pod_events(inputs, args.events, random.Random(args.seed))
    log(f"{args.scale}: {len(inputs.pods):,} Pods, {len(inputs.policies):,} policies, {len(events)} events "
        f"in {time.perf_counter() - t:.1f} s")
    facts = LocalFacts(gateway_ofport=2, gateway_mac="02:00:00:00:00:01", tunnel_ofport=1, uplink_name="eth0",
                       uplink_addresses=("192.168.1.1/24",), transport_mtu=1500,
                       node_addresses=("192.168.1.1/24",))
    gateway = ("10.1.0.1/24",)
    tag = f"fbpp{random.randrange(1000, 9999)}"
    out: dict[str, Any] = {"scale": args.scale, "pods": len(inputs.pods), "policies": len(inputs.policies),
                           "local_pods": args.local, "events": len(events)}
    with ExitStack() as stack:
        work = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"{tag}-"))
        sides: dict[str, tuple[EventSource, PolicyNode, NftApplier, str]] = {}
        for side in SIDES:
            ns = stack.enter_context(netns(f"{tag}-{side[0]}"))
            cfg = Config(node_name="node-1", mode="encap", tunnel_type="vxlan",
                         state_file=os.path.join(work, f"{side}.json"), pod_cidrs=("10.1.0.0/24",),
                         cluster_cidrs=("10.0.0.0/8",))
            source = EventSource(inputs)
            node = PolicyNode(cfg, source, NoPods())  # type: ignore[arg-type]
            applier = NftApplier(netns=ns, policy_by_element=side == "element")
            stack.callback(applier.close)
            c = time.process_time()
            step = node.step(gateway, facts, True)
            applier.sync_policy(step.nft)
            out[f"{side}_first_pass_cpu_s"] = time.process_time() - c
            out["judge_bytes"] = len(step.nft.text)
            sides[side] = (source, node, applier, ns)
        log(f"first passes done; the judge is {out['judge_bytes']:,} bytes")
        if args.settle:  # as the daemon does after a full pass (routesync/heap.py)
            HeapSettler().settle()
        pauses = GcPauses()
        gc.callbacks.append(pauses.callback)
        cpu: dict[str, list[float]] = {s: [] for s in SIDES}
        write: dict[str, list[float]] = {s: [] for s in SIDES}
        gc_ms: dict[str, list[float]] = {s: [] for s in SIDES}  # the cyclic collector's pauses per event
        for i, (kind, obj) in enumerate(events):
            for side in (SIDES if i % 2 == 0 else SIDES[::-1]):
                source, node, applier, _ns = sides[side]
                source.event(kind, obj)
                c = time.process_time()
                pauses.start()
                step = node.step(gateway, facts, False)
                w = time.process_time()
                applier.sync_policy(step.nft, verify=False)
                end = time.process_time()
                cpu[side].append((end - c) * 1e3)
                write[side].append((end - w) * 1e3)
                gc_ms[side].append(pauses.total * 1e3)
        gc.callbacks.remove(pauses.callback)
        for side in SIDES:
            out[side] = {"cpu_p50_ms": pct(cpu[side], 0.5), "cpu_p99_ms": pct(cpu[side], 0.99),
                         "cpu_mean_ms": sum(cpu[side]) / len(cpu[side]),
                         "judge_write_p50_ms": pct(write[side], 0.5), "judge_write_p99_ms": pct(write[side], 0.99),
                         "gc_p99_ms": pct(gc_ms[side], 0.99), "gc_max_ms": max(gc_ms[side])}
        e, w = (nftlisting.table(sides[s][3], "inet", "ferry_policy") for s in SIDES)
        out["tables_equal"] = e == w
        if e != w:
            names = sorted(n for n in e.sets.keys() | w.sets.keys() if e.sets.get(n) != w.sets.get(n))
            log(f"the tables differ: sets {names[:10]}, chains equal: {e.chains == w.chains}")
    out["whole_over_element_p50"] = out["whole"]["cpu_p50_ms"] / out["element"]["cpu_p50_ms"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", default="30000:3000:300:1000")
    ap.add_argument("--local", type=int, default=110)
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--seed", type=int, default=40)
    ap.add_argument("--json")
    ap.add_argument("--no-settle", dest="settle", action="store_false",
                    help="leave the heap as the first passes built it (the daemon settles it after a full pass)")
    args = ap.parse_args()
    res = measure(args)
    for side in SIDES:
        r = res[side]
        print(f"{side:8s} CPU per Pod event p50 {r['cpu_p50_ms']:.1f} ms, p99 {r['cpu_p99_ms']:.1f} ms; "
              f"the judge's write p50 {r['judge_write_p50_ms']:.1f} ms, p99 {r['judge_write_p99_ms']:.1f} ms; "
              f"the collector's pauses in an event p99 {r['gc_p99_ms']:.1f} ms, max {r['gc_max_ms']:.1f} ms")
    print(f"judge {res['judge_bytes']:,} bytes; whole / element at p50: x{res['whole_over_element_p50']:.1f}; "
          f"tables equal after the run: {res['tables_equal']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if res["tables_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
