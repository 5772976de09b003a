"""Per-path MTU (issue 17): what it costs route-sync to update running Pods after a mode change,
and what the per-path routes add to an ADD.

    python -m bench.bench_mtu [--pods 10,100] [--switches 4] [--adds 30] [--quick] [--json OUT]
                              [--cni-bin DIR]

* **Pods updated after a mode change** (per N in ``--pods``): a ferry-lab (two Nodes on one
  segment, encap/vxlan) with N Pods on node-1, plugged by the real plugin through cnitool.
  route-sync on node-1 is restarted with the other mode (``Lab.reconfigure_route_sync``:
  encap -> noEncap -> encap ...); every switch changes every Pod's routes (encap: default + the
  cluster prefix at the tunnel MTU per family; noEncap: the default route only).  The time is
  route-sync's own, from its log line ``Pods to the paths' MTUs in X ms: N updated`` (one pass of
  ``routesync.apply.pods``: per Pod the attachment lock, entering the netns, MTU and routes);
  checked afterwards: every Pod holds what ``cni.pipeline.podnet`` wants for the new mode.
* **ADD with per-path routes vs one route per family** (same run, interleaved): a hybrid lab of
  three Nodes (node-1: a routed peer node-2, a tunnelled node-3: 3 routes per family with their
  MTUs); the plugin is exec'd directly in node-1's namespace (``bench.bench_cni``'s driver, wall
  time of each exec) with the lab's configuration, and with the same configuration plus
  ``"mtu": 1430`` (the conf's MTU forces one MTU: one default route per family, no route MTU,
  what every ADD did before).  ADD and DEL alternate, the two variants in alternating rounds.

Every lab carries the ``fbm`` prefix and is torn down at the end, also on failure."""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.util import percentile, table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.bench_cni import run_driver
from lab import build
from lab.api import Lab, ensure_cni_bin

LINE = re.compile(r"Pods to the paths' MTUs in ([0-9.]+) ms: (\d+) updated")


def log(msg: str) -> None:
    print(f"[bench_mtu] {msg}", file=sys.stderr, flush=True)


def topology(mode: str, nodes: int) -> dict[str, Any]:
    segs = {"a": {"ipv4": "192.168.77.0/24", "ipv6": "fd00:77::/64"},
            "b": {"ipv4": "192.168.88.0/24", "ipv6": "fd00:88::/64"}}
    return {"datapath": "netdev", "clusterCIDRs": ["10.244.0.0/16", "fd00:10:244::/48"], "segments": segs,
            "router": {"routePodCIDRs": False},
            "nodes": [{"name": f"node-{i + 1}", "segment": "a" if i < 2 else "b"} for i in range(nodes)],
            "routeSync": {"trafficEncapMode": mode, "tunnelType": "vxlan"}}


def _log_lines(path: str) -> list[tuple[float, int]]:
    try:
        with open(path) as f:
            return [(float(m.group(1)), int(m.group(2))) for m in LINE.finditer(f.read())]
    except FileNotFoundError:
        return []


def _pods_hold(lab: Lab, n: int) -> bool:
    """Every Pod on node-1 holds what the state file wants (cni.pipeline.podnet)."""
    from cni.node import nodestate
    from cni.pipeline import podnet

    state = nodestate.read(lab.node("node-1").paths.state_file)
    for pod in lab.node("node-1").pods()[:n]:
        want = podnet.for_state(state, podnet.gateways_of(state, pod.ips))
        out = pod.exec(["ip", "-o", "link", "show", "eth0"], check=True).stdout
        if f" mtu {want.mtu} " not in out:
            return False
        routes = pod.exec(["ip", "-4", "route", "show"], check=True).stdout + \
            pod.exec(["ip", "-6", "route", "show"], check=True).stdout
        if sum(1 for line in routes.splitlines() if " via " in line) != len(want.routes):
            return False
    return True


def pod_updates(n: int, switches: int, cni_bin: str, tag: str) -> dict[str, Any]:
    name = f"{tag}p{n}"[:12]
    lab = Lab.up(topology("encap", 2), name=name, cni_bin=cni_bin)
    try:
        t0 = time.monotonic()
        for i in range(n):
            lab.add_pod("node-1", f"p{i}")
        log(f"{n} Pods plugged in {time.monotonic() - t0:.1f} s")
        logfile = lab.node("node-1").paths.route_sync_log
        samples: list[float] = []
        mode = "encap"
        for _ in range(switches):
            mode = "noEncap" if mode == "encap" else "encap"
            seen = len(_log_lines(logfile))
            lab.reconfigure_route_sync("node-1", trafficEncapMode=mode)
            deadline = time.monotonic() + 120
            while True:
                lines = _log_lines(logfile)
                if len(lines) > seen and lines[-1][1] == n:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"route-sync did not report {n} Pods updated ({lines[seen:]})")
                time.sleep(0.05)
            samples.append(lines[-1][0])
            if not _pods_hold(lab, n):
                raise RuntimeError(f"after the switch to {mode} a Pod does not hold its MTUs")
            log(f"N={n}: -> {mode}: {lines[-1][0]:.1f} ms")
        return {"pods": n, "switches": switches, "ms": samples, "p50_ms": percentile(samples, 50),
                "max_ms": max(samples), "per_pod_ms": percentile(samples, 50) / n}
    finally:
        lab.down()


def _calls(lab: Lab, cni_bin: str, conf: dict[str, Any], pods: list[str], tag: str) -> list[dict[str, Any]]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_PATH": cni_bin, "CNI_IFNAME": "eth0"}
    calls = []
    for pod in pods:
        base = {**env, "CNI_CONTAINERID": f"{tag}-{pod}", "CNI_NETNS": f"/run/netns/{pod}",
                "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAME={pod}"}
        for op in ("ADD", "DEL"):
            calls.append({"argv": [os.path.join(cni_bin, "ferry")], "env": {**base, "CNI_COMMAND": op},
                          "stdin": json.dumps(conf)})
    return calls


def add_cost(adds: int, rounds: int, cni_bin: str, tag: str) -> dict[str, Any]:
    lab = Lab.up(topology("hybrid", 3), name=f"{tag}add"[:12], cni_bin=cni_bin)
    netns = [f"{tag}-a{i}" for i in range(adds)]
    try:
        node = lab.node("node-1")
        with open(node.paths.conflist) as f:
            conflist = json.load(f)
        plugin = dict(conflist["plugins"][0])
        per_path = {"cniVersion": "1.1.0", "name": conflist["name"], **plugin}
        single = {**per_path, "mtu": 1430}
        for ns in netns:
            subprocess.run(["ip", "netns", "add", ns], check=True)
        samples: dict[str, list[float]] = {"per-path routes": [], "one route per family": []}
        routes: dict[str, int] = {}
        per_round = max(1, adds // rounds)
        for r in range(rounds * 2):
            key = "per-path routes" if r % 2 == 0 else "one route per family"
            conf = per_path if key == "per-path routes" else single
            chunk = netns[(r // 2 % rounds) * per_round:][:per_round]
            res = run_driver(node.netns, _calls(lab, cni_bin, conf, chunk, tag))
            for i, c in enumerate(res["results"]):
                if c["rc"] != 0:
                    raise RuntimeError(f"{key}: {'ADD' if i % 2 == 0 else 'DEL'} failed: {c['stdout']} {c['stderr']}")
                if i % 2 == 0:
                    samples[key].append(c["ms"])
                    routes[key] = len(json.loads(c["stdout"]).get("routes", []))
        p = {k: percentile(v, 50) for k, v in samples.items()}
        return {"adds": {k: len(v) for k, v in samples.items()}, "routes": routes,
                "p50_ms": p, "p90_ms": {k: percentile(v, 90) for k, v in samples.items()},
                "ratio_p50": p["per-path routes"] / p["one route per family"]}
    finally:
        for ns in netns:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        lab.down()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", default="10,100")
    ap.add_argument("--switches", type=int, default=4)
    ap.add_argument("--adds", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="N=10 only, 2 switches, 10 ADDs")
    ap.add_argument("--json")
    ap.add_argument("--cni-bin")
    args = ap.parse_args(argv)
    if args.quick:
        args.pods, args.switches, args.adds, args.rounds = "10", 2, 10, 2
    if build.route_sync_command() is None:
        log("ferry-route-sync is not installed (bash .ci/install.sh)")
        return 2
    own_bin = None if args.cni_bin else tempfile.mkdtemp(prefix="fbm-cni-bin-")
    try:
        return _run(args, ensure_cni_bin(args.cni_bin or own_bin or ""))
    finally:
        if own_bin:
            shutil.rmtree(own_bin, ignore_errors=True)


def _run(args: argparse.Namespace, cni_bin: str) -> int:
    tag = f"fbm{secrets.token_hex(2)}"
    with open("/proc/loadavg") as f:
        out: dict[str, Any] = {"tag": tag, "loadavg": f.read().split()[:3]}
    out["add"] = add_cost(args.adds, args.rounds, cni_bin, tag)
    out["pod_updates"] = [pod_updates(int(n), args.switches, cni_bin, tag) for n in args.pods.split(",")]
    print(table(["Pods", "switches", "p50 ms", "max ms", "ms per Pod"],
                [[u["pods"], u["switches"], u["p50_ms"], u["max_ms"], u["per_pod_ms"]] for u in out["pod_updates"]]))
    a = out["add"]
    print(table(["ADD variant", "routes", "ADDs", "p50 ms", "p90 ms"],
                [[k, a["routes"].get(k, 0), a["adds"][k], a["p50_ms"][k], a["p90_ms"][k]] for k in a["p50_ms"]]))
    print(f"ADD with per-path routes / one route per family, p50: {a['ratio_p50']:.3f}  "
          f"(load {' '.join(out['loadavg'])})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
