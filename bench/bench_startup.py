"""Start-up cost of the plugin: VERSION and a malformed-config ADD, ``ferry`` vs Debian's Go ``bridge``.

Both calls do no system work, so they measure what every CNI call pays before it starts: process
start, imports, reading the environment and stdin, answering.  podman calls VERSION before every
ADD/DEL; an early error is the cheapest path through the protocol core.  Calls of the two plugins
are interleaved so that machine noise hits both alike; each answer is checked, so a broken plugin
cannot look fast.

    python -m bench.bench_startup [--runs 100] [--cni-bin DIR] [--reference /usr/lib/cni/bridge] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable

from bench.util import Call, percentile, table, timed_exec

BASE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
ADD_ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "fp-bench", "CNI_NETNS": "/var/run/netns/fp-bench-none",
           "CNI_IFNAME": "eth0", "CNI_PATH": "/usr/lib/cni"}
VERSION_STDIN = b'{"cniVersion":"1.0.0"}'
MALFORMED_STDIN = b'{"cniVersion": "1.0.0", "name": "fp-bench", "type": '


def _version_ok(c: Call) -> bool:
    return c.rc == 0 and "1.0.0" in json.loads(c.stdout).get("supportedVersions", [])


def _malformed_ok(c: Call) -> bool:
    return c.rc != 0 and json.loads(c.stdout).get("code") == 6


CALLS: dict[str, tuple[dict[str, str], bytes, Callable[[Call], bool]]] = {
    "VERSION": ({"CNI_COMMAND": "VERSION"}, VERSION_STDIN, _version_ok),
    "malformed config (ADD)": (ADD_ENV, MALFORMED_STDIN, _malformed_ok),
}


def measure(plugins: dict[str, str], runs: int, warmup: int = 3) -> dict[tuple[str, str], list[float]]:
    samples: dict[tuple[str, str], list[float]] = {}
    for call, (env, stdin, ok) in CALLS.items():
        for i in range(warmup + runs):
            for name, path in plugins.items():
                c = timed_exec([path], {**BASE_ENV, **env}, stdin)
                if not ok(c):
                    raise SystemExit(f"{name} {call}: unexpected answer rc={c.rc} {c.stdout[:200]!r}")
                if i >= warmup:
                    samples.setdefault((call, name), []).append(c.ms)
    floor = [timed_exec(["/bin/true"], BASE_ENV, b"").ms for _ in range(runs)]
    samples[("harness floor", "/bin/true")] = floor
    return samples


def report(samples: dict[tuple[str, str], list[float]], ours: str, ref: str) -> str:
    rows: list[list[object]] = []
    for (call, name), ms in samples.items():
        rows.append([call, name, len(ms), percentile(ms, 50), percentile(ms, 99), sum(ms) / len(ms)])
    ratios: list[list[object]] = []
    for call in CALLS:
        a, b = samples[(call, ours)], samples[(call, ref)]
        ratios.append([call, percentile(a, 50) / percentile(b, 50), percentile(a, 99) / percentile(b, 99)])
    return (table(["call", "plugin", "n", "p50 ms", "p99 ms", "mean ms"], rows) + "\n\n"
            + table([f"ratio {ours}/{ref}", "", "p50", "p99"], [[r[0], "", r[1], r[2]] for r in ratios]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--cni-bin", help="a directory with the ferry launcher (default: written to a temp dir)")
    ap.add_argument("--reference", default="/usr/lib/cni/bridge")
    ap.add_argument("--json", help="write the figures (and the raw samples) to this file")
    args = ap.parse_args(argv)
    if not os.access(args.reference, os.X_OK):
        print(f"reference plugin {args.reference} not found", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="fp-bench-") as tmp:
        cni_bin = args.cni_bin
        if cni_bin is None:
            from cni.launcher import write_launchers

            write_launchers(tmp)
            cni_bin = tmp
        plugins = {"ferry": os.path.join(cni_bin, "ferry"), "bridge": args.reference}
        samples = measure(plugins, args.runs)
    print(f"# plugin start-up, {args.runs} runs each, wall time of fork+exec+run+exit (nearest-rank)")
    print(f"# ferry: {plugins['ferry']}   reference: {args.reference}   loadavg: {os.getloadavg()}")
    print(report(samples, "ferry", "bridge"))
    if args.json:
        write_json(args.json, samples, args.runs, plugins)
    return 0


def write_json(path: str, samples: dict[tuple[str, str], list[float]], runs: int, plugins: dict[str, str]) -> None:
    """Every (call, plugin) series with p50/p99/mean and its samples, as ``bench`` collects them."""
    series = [{"call": call, "plugin": name, "n": len(ms), "p50": percentile(ms, 50), "p99": percentile(ms, 99),
               "mean": sum(ms) / len(ms), "samples_ms": ms} for (call, name), ms in samples.items()]
    with open(path, "w") as f:
        json.dump({"benchmark": "startup", "runs": runs, "plugins": plugins, "loadavg": os.getloadavg(),
                   "series": series}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
