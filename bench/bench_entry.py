"""What the CNI bin dir's entry points cost: ``<bin>/ferry`` (install-cni's relative symlink into
``.ferry-bundle/<digest>/``) against exec'ing the copy's ``ferry`` directly, same run.

    python -m bench.bench_entry [--dist dist/ferry] [--runs 200] [--pods 40]

install-cni installs the bundle into a temp bin dir; then, interleaved (``bench.util.ab_order``,
so machine noise hits both sides alike): VERSION and a malformed-config ADD (start-up only,
``bench.bench_startup.measure``), and ADD then DEL of ``--pods`` Pods on a Node namespace with its
own Open vSwitch (netdev), the link side with ``CNI_PATH`` the bin dir (ferry-ipam through its link
too), the direct side with ``CNI_PATH`` the copy.  Every answer is checked.  Needs root for the ADD
phase (without it only the start-up phase runs)."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from bench.bench_startup import measure, report
from bench.util import ab_by_side, ab_order, percentile, table, timed_exec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDES = ("link", "direct")


def install(dist: str, tmp: str) -> tuple[str, str]:
    """(bin dir with the links, the copy they point into), by install-cni itself."""
    from routesync import install as inst

    bin_dir = os.path.join(tmp, "bin")
    inst.install_cni(bin_dir, os.path.join(tmp, "net.d"), dist, "1.0.0", log=lambda _s: None, local=list)
    return bin_dir, os.path.dirname(os.path.realpath(os.path.join(bin_dir, "ferry")))


def add_del(paths: dict[str, str], pods: int, tmp: str) -> dict[str, dict[str, list[float]]]:
    """ADD then DEL of ``pods`` Pods per side (``paths``: side -> its ``ferry``, in the order the
    sides take turns), the sides' calls taking turns; ms per verb and side.  Each side makes one
    ADD and DEL first (the bridge and base flows, and its own bytecode caches)."""
    from tests.support.ovs_instance import OvsInstance, netns

    name = f"fbe-{secrets.token_hex(3)}"
    out: dict[str, dict[str, list[float]]] = {"ADD": {}, "DEL": {}}
    with netns(name) as ns, OvsInstance(name, netns=ns) as ovs:
        conf = json.dumps({
            "cniVersion": "1.0.0", "name": "fbe", "type": "ferry", "bridge": "br-int", "ovsdb": ovs.db,
            "ovsRunDir": ovs.run_dir, "datapath": "netdev", "stateFile": os.path.join(tmp, "state.json"),
            "logFile": os.path.join(tmp, "cni.log"),
            "ipam": {"type": "ferry-ipam", "dataDir": os.path.join(tmp, "ipam"),
                     "ranges": [[{"subnet": "10.244.1.0/24"}]]}}).encode()
        sides = tuple(paths)
        order = ab_order(sides, pods)
        pod_ns = {(side, i): f"{ns}-{sides.index(side)}{i}" for side, i in order}
        warm = {side: f"{ns}-w{k}" for k, side in enumerate(sides)}
        names = [*warm.values(), *pod_ns.values()]

        def call(verb: str, side: str, cid: str, netns_name: str) -> float:
            env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND": verb, "CNI_CONTAINERID": cid,
                   "CNI_NETNS": f"/run/netns/{netns_name}", "CNI_IFNAME": "eth0",
                   "CNI_PATH": os.path.dirname(paths[side]), "CNI_ARGS": ""}
            c = timed_exec(["ip", "netns", "exec", ns, paths[side]], env, conf)
            if c.rc != 0 or (verb == "ADD" and "ips" not in json.loads(c.stdout)):
                raise SystemExit(f"{side} {verb} {cid}: rc={c.rc} {c.stdout[:300]!r}")
            return c.ms

        try:
            for p in names:
                subprocess.run(["ip", "netns", "add", p], check=True)
            for k, side in enumerate(sides):
                call("ADD", side, f"fbe-warm{k}", warm[side])
                call("DEL", side, f"fbe-warm{k}", warm[side])
            for verb in ("ADD", "DEL"):
                ms = [call(verb, side, f"fbe-{side}{i}", pod_ns[(side, i)]) for side, i in order]
                out[verb] = ab_by_side(ms, order, sides)
        finally:
            for p in names:
                subprocess.run(["ip", "netns", "del", p], check=False, capture_output=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dist", default=os.path.join(ROOT, "dist", "ferry"), help="the frozen bundle (make dist)")
    ap.add_argument("--runs", type=int, default=200, help="VERSION and malformed-ADD calls per side")
    ap.add_argument("--pods", type=int, default=40, help="Pods ADDed then DELeted per side (root)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fbe-") as tmp:
        bin_dir, copy = install(args.dist, tmp)
        paths = {"link": os.path.join(bin_dir, "ferry"), "direct": os.path.join(copy, "ferry")}
        print(f"# link: {paths['link']} -> {os.readlink(paths['link'])}", file=sys.stderr)
        samples = measure(paths, args.runs)
        print(f"# start-up, {args.runs} runs per side, interleaved; loadavg {os.getloadavg()}")
        print(report(samples, "link", "direct"))
        if os.geteuid() == 0 and args.pods > 0:
            verbs = add_del(paths, args.pods, tmp)
            rows: list[list[Any]] = []
            for verb, by_side in verbs.items():
                for side in SIDES:
                    ms = by_side[side]
                    rows.append([verb, side, len(ms), percentile(ms, 50), percentile(ms, 99), sum(ms) / len(ms)])
                a, b = by_side["link"], by_side["direct"]
                rows.append([verb, "ratio link/direct", "", percentile(a, 50) / percentile(b, 50),
                             percentile(a, 99) / percentile(b, 99), (sum(a) / len(a)) / (sum(b) / len(b)),
                             statistics.median(x / y for x, y in zip(a, b, strict=True))])
            print(f"\n# ADD then DEL, {args.pods} Pods per side, sequential, interleaved; loadavg {os.getloadavg()}")
            print(table(["verb", "side", "n", "p50 ms", "p99 ms", "mean ms", "pair median"],
                        [r + [""] * (7 - len(r)) for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
