"""The per-Pod path of this tree against another revision's, same run: ADD and DEL p50/p99 of
both, the calls interleaved, and the ratio this / other.

    python -m bench.bench_trees --ref REV [--pods 100] [--json OUT]

A refactor of the plugin's code (a module moved, a reader merged, a package layered anew) must not
make the per-Pod path slower (a Python start and its imports are most of an ADD): this prices it.
``REV``'s files (``git archive``) go to a temp dir; each tree writes its own source launchers
(``python -m cni.launcher``, the way ``make bin`` does); then ``bench.bench_entry.add_del`` runs
ADD then DEL of ``--pods`` Pods per side on a Node namespace with its own Open vSwitch (netdev),
the sides' calls taking turns, every answer checked.  Needs root."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from bench.bench_entry import add_del
from bench.util import percentile, table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THIS, OTHER = "this", "other"


def export_tree(ref: str, dest: str) -> None:
    """``ref``'s tracked files into ``dest`` (no .git: launchers only need the sources)."""
    os.makedirs(dest)
    archive = subprocess.run(["git", "-C", ROOT, "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)


def launchers(tree: str, dest: str) -> str:
    """The tree's own launchers in ``dest``; the path of its ``ferry``."""
    subprocess.run([sys.executable, "-m", "cni.launcher", dest], cwd=tree, check=True, capture_output=True)
    return os.path.join(dest, "ferry")


def figures(verbs: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for verb, by_side in verbs.items():
        a, b = by_side[THIS], by_side[OTHER]
        out[verb] = {THIS: {"n": len(a), "p50_ms": percentile(a, 50), "p99_ms": percentile(a, 99)},
                     OTHER: {"n": len(b), "p50_ms": percentile(b, 50), "p99_ms": percentile(b, 99)},
                     "p50_ratio": percentile(a, 50) / percentile(b, 50),
                     "p99_ratio": percentile(a, 99) / percentile(b, 99)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ref", required=True, help="the other revision (a commit, tag or branch)")
    ap.add_argument("--pods", type=int, default=100, help="Pods ADDed then DELeted per side")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_trees needs root (network namespaces, OVS)", file=sys.stderr)
        return 2
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", args.ref], check=True, capture_output=True,
                         text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="fbt-") as tmp:
        other_tree = os.path.join(tmp, "tree")
        export_tree(args.ref, other_tree)
        paths = {THIS: launchers(ROOT, os.path.join(tmp, "bin-this")),
                 OTHER: launchers(other_tree, os.path.join(tmp, "bin-other"))}
        verbs = add_del(paths, args.pods, tmp)
    res = {"benchmark": "trees", "other": rev, "pods": args.pods, "verbs": figures(verbs),
           "loadavg": os.getloadavg()}
    rows = []
    for verb, f in res["verbs"].items():
        for side in (THIS, OTHER):
            rows.append([verb, side if side == THIS else f"{side} ({rev})", f[side]["n"],
                         f"{f[side]['p50_ms']:.2f}", f"{f[side]['p99_ms']:.2f}"])
        rows.append([verb, "ratio this/other", "", f"{f['p50_ratio']:.3f}", f"{f['p99_ratio']:.3f}"])
    print(f"# ADD then DEL, {args.pods} Pods per side, interleaved; loadavg {res['loadavg']}")
    print(table(["verb", "side", "n", "p50 ms", "p99 ms"], rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
