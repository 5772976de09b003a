#!/usr/bin/env python3
"""Re-derive ``routesync/runtimes.py``'s table from the Go module proxy: which libcni each
container runtime release requires, and which CNI result versions that libcni reads.

    tools/runtime-cni-table.py            # print the derived rows (Python, to paste) and the evidence
    tools/runtime-cni-table.py --check    # exit 1 when routesync/runtimes.py disagrees

Needs ``go`` and the Go module proxy; never run by the tests (they must not need the network).

How:

* For each runtime module line (``github.com/containerd/containerd`` 1.3-1.7, ``.../v2`` 2.x,
  ``github.com/cri-o/cri-o``, ``github.com/containers/podman/v3|v4|v5``) every release
  ``vX.Y.Z`` is probed with ``go list -m -json MODULE@vX.Y.Z`` (the proxy's version lists are
  incomplete here, so patch numbers are counted up until four in a row are missing). Its go.mod
  (checked against the checksum database by ``go``) names ``github.com/containernetworking/cni``;
  the version the build selects is the highest of that requirement and the ones of the modules
  that carry the runtime's CNI code (containerd/go-cni, containers/common, cri-o/ocicni): Go's
  minimal version selection. A ``replace`` of the cni module wins.
* For each libcni version so found, ``go mod download`` fetches its source, and the result
  versions it decodes are read from ``pkg/types/*/types.go`` (``supportedVersions`` plus the
  package's ``ImplementedSpecVersion``); the highest one is what the runtime reads.
* Rows are the change points in version order: from ``since`` on (up to the next row of the same
  runtime) a release requires ``libcni`` and reads up to ``reads``."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

CNI = "github.com/containernetworking/cni"
CARRIERS = ("github.com/containerd/go-cni", "github.com/containers/common", "github.com/cri-o/ocicni")
MISSES_TO_STOP = 4  # consecutive missing patch releases that end a minor line
EMPTY_MINORS_TO_STOP = 2  # consecutive minor lines without a release that end a module (0: never)

# (runtime as the kubelet names it, module, first minor to probe, last minor to probe, empty minors
# that end the module). CRI-O: the proxy serves only some of its releases, so every minor is tried.
LINES: tuple[tuple[str, str, tuple[int, int], tuple[int, int], int], ...] = (
    ("containerd", "github.com/containerd/containerd", (1, 3), (1, 7), EMPTY_MINORS_TO_STOP),
    ("containerd", "github.com/containerd/containerd/v2", (2, 0), (2, 99), EMPTY_MINORS_TO_STOP),
    ("cri-o", "github.com/cri-o/cri-o", (1, 20), (1, 36), 0),
    ("podman", "github.com/containers/podman/v3", (3, 0), (3, 99), EMPTY_MINORS_TO_STOP),
    ("podman", "github.com/containers/podman/v4", (4, 0), (4, 99), EMPTY_MINORS_TO_STOP),
    ("podman", "github.com/containers/podman/v5", (5, 0), (5, 99), EMPTY_MINORS_TO_STOP),
)

Version = tuple[int, int, int]


def vstr(v: Version) -> str:
    return ".".join(map(str, v))


class Go:
    def __init__(self, modcache: str | None) -> None:
        self.env = {**os.environ, "GOFLAGS": "-modcacherw", "GO111MODULE": "on"}
        if modcache:
            self.env["GOMODCACHE"] = modcache
        self.cwd = tempfile.mkdtemp(prefix="runtime-cni-table-")  # outside any module

    def _json(self, *args: str) -> dict[str, Any] | None:
        p = subprocess.run(["go", *args], cwd=self.cwd, env=self.env, capture_output=True, text=True,
                           check=False, timeout=300)
        try:
            doc = json.loads(p.stdout)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) and not doc.get("Error") else None

    def gomod(self, module: str, version: str) -> str | None:
        """The text of MODULE@VERSION's go.mod; None when the proxy has no such release."""
        doc = self._json("list", "-m", "-json", f"{module}@{version}")
        path = doc.get("GoMod") if doc else None
        if not path:
            return None
        with open(path, encoding="utf-8") as f:
            return f.read()

    def source(self, module: str, version: str) -> str:
        doc = self._json("mod", "download", "-json", f"{module}@{version}")
        if not doc or not doc.get("Dir"):
            raise SystemExit(f"cannot download {module}@{version}")
        return str(doc["Dir"])


def requirements(gomod: str) -> tuple[dict[str, str], dict[str, str]]:
    """(module -> required version, module -> replacement version) of a go.mod."""
    req: dict[str, str] = {}
    rep: dict[str, str] = {}
    block = ""
    for raw in gomod.splitlines():
        line = raw.split("//", 1)[0].strip()
        if not line:
            continue
        if line.endswith("(") and line.split()[0] in ("require", "replace", "exclude", "retract"):
            block = line.split()[0]
            continue
        if line == ")":
            block = ""
            continue
        words = line.split()
        kind = block
        if words[0] in ("require", "replace"):
            kind, words = words[0], words[1:]
        if kind == "require" and len(words) >= 2:
            req[words[0]] = words[1]
        elif kind == "replace" and "=>" in words:
            i = words.index("=>")
            if words[0] == CNI and len(words) > i + 2:
                rep[words[0]] = f"{words[i + 1]} {words[i + 2]}"
    return req, rep


def semver_key(v: str) -> tuple[int, ...]:
    m = re.match(r"v?(\d+)\.(\d+)\.(\d+)", v)
    return tuple(int(x) for x in m.groups()) if m else (0,)


@dataclass(frozen=True)
class Release:
    runtime: str
    module: str
    version: Version
    libcni: str  # the selected github.com/containernetworking/cni version, "v1.1.2"
    via: str  # where it comes from: "go.mod", "go.mod (via github.com/containers/common v0.50.1)"


def selected_cni(go: Go, gomod: str) -> tuple[str, str] | None:
    req, rep = requirements(gomod)
    if CNI in rep:
        return rep[CNI].split()[-1], f"go.mod replace => {rep[CNI]}"
    found: list[tuple[str, str]] = []
    if CNI in req:
        found.append((req[CNI], "go.mod"))
    for carrier in CARRIERS:
        if carrier in req:
            text = go.gomod(carrier, req[carrier])
            sub = requirements(text)[0] if text else {}
            if CNI in sub:
                found.append((sub[CNI], f"via {carrier} {req[carrier]}"))
    if not found:
        return None
    best = max(semver_key(v) for v, _ in found)
    return next((v, via) for v, via in found if semver_key(v) == best)


def releases(go: Go, log: Any) -> Iterator[Release]:
    for runtime, module, first, last, stop_after in LINES:
        major, minor = first
        empty = 0
        while (major, minor) <= last and not (stop_after and empty >= stop_after):
            patch, misses, hits = 0, 0, 0
            while misses < MISSES_TO_STOP:
                v = f"v{major}.{minor}.{patch}"
                text = go.gomod(module, v)
                if text is None:
                    misses += 1
                else:
                    misses = 0
                    hits += 1
                    sel = selected_cni(go, text)
                    if sel is None:
                        print(f"# {module}@{v}: no {CNI} in its go.mod", file=log)
                    else:
                        yield Release(runtime, module, (major, minor, patch), sel[0], sel[1])
                patch += 1
            print(f"# {module} {major}.{minor}: {hits} releases read", file=log)
            empty = 0 if hits else empty + 1
            minor += 1


_SUPPORTED = re.compile(r"(?i)supportedVersions\s*=\s*\[\]string\{([^}]*)\}")
_IMPLEMENTED = re.compile(r'ImplementedSpecVersion\s+(?:string\s+)?=\s+"([^"]+)"')


def result_versions(go: Go, libcni: str) -> tuple[str, ...]:
    """The result versions libcni@version decodes: pkg/types/*/types.go."""
    root = os.path.join(go.source(CNI, libcni), "pkg", "types")
    out: set[str] = set()
    for sub in sorted(os.listdir(root)):
        path = os.path.join(root, sub, "types.go")
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            src = f.read()
        implemented = _IMPLEMENTED.search(src)
        for m in _SUPPORTED.finditer(src):
            for item in m[1].split(","):
                item = item.strip()
                if item == "ImplementedSpecVersion" and implemented:
                    out.add(implemented[1])
                elif item.startswith('"') and item.strip('"'):
                    out.add(item.strip('"'))
    return tuple(sorted(out, key=semver_key))


def derive(go: Go, log: Any) -> tuple[list[tuple[str, str, str, str, str]], list[Release], dict[str, str]]:
    """(rows, every release read, libcni -> highest result version)."""
    rels = list(releases(go, log))
    reads: dict[str, str] = {}
    for libcni in sorted({r.libcni for r in rels}, key=semver_key):
        vs = result_versions(go, libcni)
        reads[libcni] = vs[-1] if vs else "?"
        print(f"# {CNI}@{libcni} decodes results {', '.join(vs)}", file=log)
    rows: list[tuple[str, str, str, str, str]] = []
    last: dict[str, str] = {}
    for r in sorted(rels, key=lambda r: (r.runtime, r.version)):
        if last.get(r.runtime) == r.libcni:
            continue
        last[r.runtime] = r.libcni
        source = f"{r.module}@v{vstr(r.version)}" + ("" if r.via == "go.mod" else f" {r.via}")
        rows.append((r.runtime, vstr(r.version), r.libcni.lstrip("v"), reads[r.libcni], source))
    return rows, rels, reads


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with routesync/runtimes.py; exit 1 on a difference")
    ap.add_argument("--gomodcache", default=None, help="GOMODCACHE to use (default: go's)")
    ap.add_argument("--json", dest="as_json", action="store_true", help="every release read, as JSON")
    args = ap.parse_args()
    go = Go(args.gomodcache)
    rows, rels, _ = derive(go, sys.stderr)
    if args.as_json:
        print(json.dumps([{"runtime": r.runtime, "module": r.module, "version": vstr(r.version),
                           "libcni": r.libcni, "via": r.via} for r in rels], indent=1))
    else:
        print("ROWS: tuple[Row, ...] = (")
        for runtime, since, libcni, reads, source in rows:
            print(f'    Row("{runtime}", "{since}", "{libcni}", "{reads}",\n        "{source}"),')
        print(")")
    if not args.check:
        return 0
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from routesync import runtimes

    have = [(r.runtime, r.since, r.libcni, r.reads, r.source) for r in runtimes.ROWS]
    if have != rows:
        print("routesync/runtimes.py ROWS differ from what the Go module proxy says:", file=sys.stderr)
        for row in rows:
            if row not in have:
                print(f"  + {row}", file=sys.stderr)
        for row in have:
            if row not in rows:
                print(f"  - {row}", file=sys.stderr)
        return 1
    print("routesync/runtimes.py agrees with the Go module proxy", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
