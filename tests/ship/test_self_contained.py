"""A bare clone sets itself up (issue 14): no tracked file reaches outside the clone for its tools,
and the cnitool the suite runs is the one pinned in tools/cnitool/go.mod (it has the STATUS and GC
verbs), with no older cnitool on PATH that a test could pick up by mistake.  No root needed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lab.tools import cnitool

ROOT = Path(__file__).resolve().parents[2]
# Built from parts, so that this file does not name them itself.
FORBIDDEN = ("../" + "shared", "/opt/" + "cni-tools")
CNI_MODULE = "github.com/containernetworking/cni"


def tracked_files() -> list[Path]:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git clone")
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True,
                         timeout=60).stdout
    return [ROOT / p for p in out.decode().split("\0") if p]


def test_no_tracked_file_refers_outside_the_clone_for_tools() -> None:
    files = tracked_files()
    assert files
    hits = []
    for f in files:
        if f.is_symlink():
            target = os.readlink(f)
            hits += [f"{f.relative_to(ROOT)} -> {target}" for n in FORBIDDEN if n in target]
            continue
        try:
            data = f.read_bytes()
        except FileNotFoundError:  # deleted in the work tree, not yet committed
            continue
        hits += [f"{f.relative_to(ROOT)}: {n}" for n in FORBIDDEN if n.encode() in data]
    assert hits == [], "tracked files refer to paths outside the clone:\n" + "\n".join(hits)


def pinned_cni_version() -> str:
    gomod = (ROOT / "tools" / "cnitool" / "go.mod").read_text()
    m = re.search(rf"^require\s+{re.escape(CNI_MODULE)}\s+(v\S+)", gomod, re.MULTILINE)
    assert m, f"tools/cnitool/go.mod requires no {CNI_MODULE}"
    return m.group(1)


def built_module_version(binary: str) -> str | None:
    """The containernetworking/cni version recorded in a Go binary's build info (``go version -m``
    prints the same lines: ``mod``/``dep`` TAB module TAB version)."""
    with open(binary, "rb") as f:
        data = f.read()
    m = re.search(rb"(?:mod|dep)\t" + re.escape(CNI_MODULE.encode()) + rb"\t(v[0-9A-Za-z.+-]+)", data)
    return m.group(1).decode() if m else None


def usage(binary: str) -> str:
    p = subprocess.run([binary], capture_output=True, text=True, timeout=30, check=False,
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    return p.stdout + p.stderr


def test_the_suites_cnitool_is_the_pinned_one() -> None:
    tool = cnitool()
    if not os.access(tool, os.X_OK):
        pytest.fail(f"no cnitool at {tool}: run .ci/install.sh (tools/build-go-tools.sh builds it)")
    text = usage(tool)
    verbs = set(re.findall(r"^\s+\S*cnitool\s+(\w+)\s+<net>", text, re.MULTILINE))
    assert {"add", "check", "del", "status", "gc"} <= verbs, text
    assert built_module_version(tool) == pinned_cni_version()


def test_no_older_cnitool_on_path() -> None:
    """``shutil.which("cnitool")`` is None or the pinned one; so is every other cnitool on PATH."""
    pinned = os.path.realpath(cnitool())
    found = [os.path.join(d, "cnitool") for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    found = [f for f in found if os.path.isfile(f) and os.access(f, os.X_OK)]
    first = shutil.which("cnitool")
    assert first is None or os.path.realpath(first) == pinned, f"{first} is not the pinned cnitool {pinned}"
    others = [f for f in found if os.path.realpath(f) != pinned]
    stale = [f"{f} ({built_module_version(f) or 'unknown version'})" for f in others
             if built_module_version(f) != pinned_cni_version()]
    assert stale == [], f"cnitools on PATH other than the pinned {pinned}: {stale}"
