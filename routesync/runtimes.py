"""Which CNI result versions a container runtime reads: the table ``install-cni --cni-version auto``
chooses from, and the parsing of the runtime versions it is given.

A runtime hands the plugin's answer to the libcni (``github.com/containernetworking/cni``) it was
built with; a result whose ``cniVersion`` that libcni does not decode is refused ("unsupported CNI
result version"), the runtime calls DEL and the Pod never starts. So the conflist must not name a
version above the one the runtime's libcni reads.

Evidence (derived by ``tools/runtime-cni-table.py``, which re-reads it from the Go module proxy and
``--check``s this module; the tests never need the network):

* libcni -> result versions, from ``pkg/types/*/types.go`` of each release
  (``supportedVersions`` and ``ImplementedSpecVersion``):
  cni v0.8.0, v0.8.1 decode up to 0.4.0; v1.0.1, v1.1.0, v1.1.1, v1.1.2 up to 1.0.0
  (``pkg/types/100``: ``supportedVersions = []string{ImplementedSpecVersion}``, "1.0.0");
  v1.2.3, v1.3.0, v1.3.1 up to 1.1.0 (``supportedVersions = []string{"1.0.0", "1.1.0"}``).
* runtime release -> libcni: the ``github.com/containernetworking/cni`` requirement of the
  release's go.mod (``go list -m -json MODULE@VERSION``, checksum-verified), or of the module that
  carries its CNI code when the go.mod predates complete requirement lists (Go < 1.17): each row's
  ``source``. Rows are change points: a row holds from ``since`` up to the next row of the same
  runtime, and every release read in between requires the same libcni. Boundaries that matter:

  - containerd: 1.7.36 (last 1.7 read) requires cni v1.1.2; 2.0.0 is the first release on
    cni 1.2 (v1.2.3). Every 1.6.x (1.6.0-1.6.38) is on cni 1.0.1-1.1.1.
  - podman: 5.1.2 requires cni v1.1.2, 5.2.0 is the first on cni 1.2 (v1.2.3). Podman 5 reads CNI
    configs only when built with the ``cni`` tag (containers/common v0.58.0
    ``libnetwork/cni/network.go``: ``//go:build (linux || freebsd) && cni``); netavark otherwise.
  - CRI-O: the proxy here serves only a few releases' go.mod (1.23.0: cni v1.0.1; 1.34.0, 1.35.2,
    1.36.1-1.36.3: cni v1.3.0). CRI-O 1.24-1.33 are therefore given 1.0.0, which they read; whether
    some of them read 1.1.0 is not proven here.
  - containerd before 1.5 and podman 3.0 declare no dependencies in their go.mod (vendor.conf era)
    or are not served; they are taken to read no more than the oldest row (0.4.0).

* Distribution builds link the distribution's libcni, not the vendored one; Debian 12's containerd
  1.6.20~ds1 and podman 4.3.1 are Built-Using golang-github-appc-cni 1.1.2 (reads up to 1.0.0),
  the same answer as the table's.

A runtime not in the table (``docker://`` through cri-dockerd, anything else) is unknown:
:data:`FALLBACK` (1.0.0), which every runtime with libcni >= 1.0 reads."""

from __future__ import annotations

import re
from dataclasses import dataclass

Version = tuple[int, int, int]

FALLBACK = "1.0.0"  # for a runtime the table does not know


@dataclass(frozen=True)
class Row:
    runtime: str  # as the kubelet reports it: containerd, cri-o, podman
    since: str  # first release from which the row holds
    libcni: str  # github.com/containernetworking/cni version its build selects
    reads: str  # highest CNI result version that libcni decodes
    source: str  # the go.mod this row was read from


ROWS: tuple[Row, ...] = (
    Row("containerd", "1.5.0", "0.8.0", "0.4.0",
        "github.com/containerd/containerd@v1.5.0 via github.com/containerd/go-cni v1.0.2"),
    Row("containerd", "1.5.11", "0.8.1", "0.4.0",
        "github.com/containerd/containerd@v1.5.11"),
    Row("containerd", "1.6.0", "1.0.1", "1.0.0",
        "github.com/containerd/containerd@v1.6.0 via github.com/containerd/go-cni v1.1.3"),
    Row("containerd", "1.6.4", "1.1.0", "1.0.0",
        "github.com/containerd/containerd@v1.6.4"),
    Row("containerd", "1.6.5", "1.1.1", "1.0.0",
        "github.com/containerd/containerd@v1.6.5"),
    Row("containerd", "1.7.0", "1.1.2", "1.0.0",
        "github.com/containerd/containerd@v1.7.0"),
    Row("containerd", "2.0.0", "1.2.3", "1.1.0",
        "github.com/containerd/containerd/v2@v2.0.0"),
    Row("containerd", "2.1.0", "1.3.0", "1.1.0",
        "github.com/containerd/containerd/v2@v2.1.0"),
    Row("containerd", "2.4.0", "1.3.1", "1.1.0",
        "github.com/containerd/containerd/v2@v2.4.0"),
    Row("cri-o", "1.23.0", "1.0.1", "1.0.0",
        "github.com/cri-o/cri-o@v1.23.0"),
    Row("cri-o", "1.34.0", "1.3.0", "1.1.0",
        "github.com/cri-o/cri-o@v1.34.0"),
    Row("podman", "3.1.0", "0.8.1", "0.4.0",
        "github.com/containers/podman/v3@v3.1.0"),
    Row("podman", "4.0.0", "1.0.1", "1.0.0",
        "github.com/containers/podman/v4@v4.0.0"),
    Row("podman", "4.1.0", "1.1.0", "1.0.0",
        "github.com/containers/podman/v4@v4.1.0"),
    Row("podman", "4.2.0", "1.1.2", "1.0.0",
        "github.com/containers/podman/v4@v4.2.0"),
    Row("podman", "5.2.0", "1.2.3", "1.1.0",
        "github.com/containers/podman/v5@v5.2.0"),
    Row("podman", "5.5.0", "1.3.0", "1.1.0",
        "github.com/containers/podman/v5@v5.5.0"),
)

RUNTIMES = tuple(sorted({r.runtime for r in ROWS}))
ALIASES = {"crio": "cri-o"}  # the binary's name; the kubelet says cri-o://


def version_tuple(text: str) -> Version:
    """``1.7.24`` -> (1, 7, 24); ValueError otherwise."""
    parts = text.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a version: {text!r}")
    return (int(parts[0]), int(parts[1]), int(parts[2]))


@dataclass(frozen=True)
class RuntimeVersion:
    runtime: str  # lower case: containerd, cri-o, podman, docker, ...
    version: Version
    text: str  # as given

    def __str__(self) -> str:
        return f"{self.runtime}://{'.'.join(map(str, self.version))}"


# The release at the start of what a runtime reports: "1.7.24", "v2.0.0", "1.6.20~ds1",
# "1.7.23-k3s2", "1.30.4"; a missing patch number counts as 0.
_RELEASE = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_runtime_version(text: str) -> RuntimeVersion:
    """``NAME://VERSION`` as in a Node's ``status.nodeInfo.containerRuntimeVersion``
    (``containerd://1.7.24``, ``cri-o://1.30.4``) or given by hand (``podman://4.3.1``).
    ValueError naming what is wrong."""
    name, sep, rest = text.strip().partition("://")
    if not sep or not name:
        raise ValueError(f"{text!r} is not NAME://VERSION (like containerd://1.7.24)")
    m = _RELEASE.match(rest)
    if not m:
        raise ValueError(f"{text!r}: {rest!r} does not start with a version like 1.7.24")
    runtime = name.lower()
    return RuntimeVersion(ALIASES.get(runtime, runtime), (int(m[1]), int(m[2]), int(m[3] or 0)), text)


@dataclass(frozen=True)
class Reading:
    """What the table says about one runtime release."""

    runtime: RuntimeVersion
    reads: str  # highest result version it reads (FALLBACK when unknown)
    row: Row | None  # None: the runtime is not in the table
    note: str  # why, for a log line

    @property
    def known(self) -> bool:
        return self.row is not None


def rows_of(runtime: str) -> list[Row]:
    return sorted((r for r in ROWS if r.runtime == runtime), key=lambda r: version_tuple(r.since))


def reading(rv: RuntimeVersion) -> Reading:
    """The row that holds for ``rv``: the last one whose ``since`` is not after it; a release older
    than every row gets the oldest row (libcni only ever learns versions, so it reads no more);
    an unknown runtime gets :data:`FALLBACK`."""
    rows = rows_of(rv.runtime)
    if not rows:
        return Reading(rv, FALLBACK, None,
                       f"{rv.runtime} is not in the table (routesync/runtimes.py): assuming it reads "
                       f"results up to {FALLBACK}")
    held = [r for r in rows if version_tuple(r.since) <= rv.version]
    row = held[-1] if held else rows[0]
    which = (f"table row {rv.runtime} {row.since}" if held else
             f"older than every {rv.runtime} release in the table, so no more than its oldest row {row.since}")
    return Reading(rv, row.reads, row, f"{rv} reads results up to {row.reads} ({which}: libcni {row.libcni} "
                                       f"per the go.mod of {row.source})")


# --- asking a runtime on this host -------------------------------------------------------------

# (runtime, binary, pattern of its ``--version`` output whose group 1 is the release):
#   containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3
#   containerd github.com/containerd/containerd/v2 v2.0.0 207ad711eabd375a01713109a8a197d197ff6542
#   crio version 1.20.0            (older)      Version:        1.30.4     (newer, among other lines)
#   podman version 4.3.1
LOCAL: tuple[tuple[str, str, str], ...] = (
    ("containerd", "containerd", r"^containerd\s+\S+\s+(v?\d+\.\d+(?:\.\d+)?)"),
    ("cri-o", "crio", r"(?im)^(?:crio\s+version|version:)\s+(v?\d+\.\d+(?:\.\d+)?)"),
    ("podman", "podman", r"^podman\s+version\s+(v?\d+\.\d+(?:\.\d+)?)"),
)


def parse_version_output(runtime: str, output: str) -> RuntimeVersion | None:
    """The release in ``<binary> --version`` output of ``runtime``; None when it has none."""
    for name, _binary, pattern in LOCAL:
        if name == runtime:
            m = re.search(pattern, output.strip())
            return parse_runtime_version(f"{runtime}://{m[1]}") if m else None
    raise ValueError(f"no --version parser for {runtime!r}")


def local_runtimes(path: str | None = None, timeout: float = 10.0) -> list[tuple[RuntimeVersion, str]]:
    """The runtimes installed on this host (``containerd``, ``crio``, ``podman`` on ``path``, by
    default ``$PATH``), each with where its version came from. A conf dir is read by every runtime
    on the host, so all of them count."""
    import shutil
    import subprocess

    found = []
    for runtime, binary, _pattern in LOCAL:
        exe = shutil.which(binary, path=path)
        if exe is None:
            continue
        try:
            p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        rv = parse_version_output(runtime, p.stdout or p.stderr)
        if rv is not None:
            found.append((rv, f"`{exe} --version`"))
    return found
