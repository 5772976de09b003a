"""What bench_cni measures Ferry against, found or built, each with its version or the reason it is
not there.

* Ferry's frozen bundle: ``dist/ferry`` (``make dist``);
* ovs-cni's plugin (type ``ovs``) and upstream's ``bridge`` + ``host-local``: built from their
  pinned Go modules (``tools/ovs-cni``, ``tools/cni-plugins``) by ``tools/build-go-tools.sh``,
  which links a cached build at once; called here, so a run on a machine where
  ``.ci/install.sh`` skipped them still builds them, or says why it could not;
* Debian's ``bridge`` + ``host-local`` (package containernetworking-plugins).

A peer that is not there is reported "not built: <reason>", never silently left out."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "build", "tools")
GO_SETS = {"ovs-cni": ("github.com/k8snetworkplumbingwg/ovs-cni", ("ovs",)),
           "cni-plugins": ("github.com/containernetworking/plugins", ("bridge", "host-local"))}


@dataclass(frozen=True)
class Peer:
    name: str
    version: str
    directory: str | None  # holds the executables; None: not built
    reason: str = ""  # why it is not built

    @property
    def built(self) -> bool:
        return self.directory is not None


def go_mod_version(gomod: str, module: str) -> str | None:
    """The version ``gomod`` (a go.mod's text) requires of ``module``, in either require form."""
    m = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", gomod, re.MULTILINE)
    return m.group(1) if m else None


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def go_peer(name: str, build: bool = True) -> Peer:
    """One Go tool set of ``tools/build-go-tools.sh``: built (or linked from the cache) now."""
    module, exes = GO_SETS[name]
    try:
        with open(os.path.join(ROOT, "tools", name, "go.mod")) as f:
            version = go_mod_version(f.read(), module) or "?"
    except OSError as e:
        return Peer(name, "?", None, f"tools/{name}/go.mod: {e.strerror}")
    directory = os.path.join(TOOLS, name)
    if build:
        env = dict(os.environ)
        env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":/usr/local/go/bin"
        try:
            p = subprocess.run(["bash", os.path.join(ROOT, "tools", "build-go-tools.sh"), name], env=env,
                               capture_output=True, text=True, check=False, timeout=1800)
        except subprocess.TimeoutExpired:
            return Peer(name, version, None, "tools/build-go-tools.sh timed out")
        if p.returncode != 0:
            return Peer(name, version, None, f"tools/build-go-tools.sh {name}: {_last_line(p.stderr)}")
    missing = [e for e in exes if not os.access(os.path.join(directory, e), os.X_OK)]
    if missing:
        return Peer(name, version, None, f"no {', '.join(missing)} in {directory} (tools/build-go-tools.sh {name})")
    return Peer(name, version, directory)


def debian_plugins(reference_dir: str) -> Peer:
    p = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "containernetworking-plugins"], capture_output=True,
                       text=True, check=False)
    version = p.stdout.strip() or "?"
    if not all(os.access(os.path.join(reference_dir, e), os.X_OK) for e in ("bridge", "host-local")):
        return Peer("debian", version, None, f"no bridge/host-local in {reference_dir} "
                                             "(apt package containernetworking-plugins)")
    return Peer("debian", version, reference_dir)


def frozen_bundle(dist_dir: str) -> Peer:
    if not all(os.access(os.path.join(dist_dir, e), os.X_OK) for e in ("ferry", "ferry-ipam")):
        return Peer("frozen", "?", None, f"no {dist_dir}/ferry (make dist builds it)")
    return Peer("frozen", "PyInstaller onedir", dist_dir)
