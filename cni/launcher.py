"""Write a CNI_PATH directory that runs Ferry from this source tree.

``python -m cni.launcher DIR`` writes ``DIR/ferry`` and ``DIR/ferry-ipam``: tiny scripts that
start the interpreter isolated and without ``site`` (``-I -S``: no site-packages scan, no
editable-install finders; ~10 ms instead of ~40), put the source tree first on ``sys.path``
and call the entry point.  The interpreter is the distribution's optimised build of the same
Python version when there is one (:func:`per_pod_python`).  The per-Pod path needs only the
standard library, so nothing else is importable there, on purpose.  It also links Debian's
reference plugins (``portmap``, ``bandwidth``, ``host-local``, ``ptp``, ``bridge``, ...) when
present, for chaining and for the benchmarks' reference.  The frozen PyInstaller bundle replaces
this on real hosts."""

from __future__ import annotations

import os
import sys

ENTRY_POINTS = {"ferry": "cni.plugin", "ferry-ipam": "cni.ipam.plugin"}
# Every module an ADD, DEL or CHECK imports (the verbs' modules pull in the rest lazily): what the
# lean-imports test and bench_cni's import floor load.
PER_POD_MODULES = ("cni.plugin", "cni.spec.protocol", "cni.commands.add", "cni.commands.delete",
                   "cni.commands.check", "cni.kernel.netlink",
                   "cni.ovs.ovsdb", "cni.ovs.openflow.bridge", "cni.ovs.openflow.ofctl", "cni.pipeline.flows",
                   "cni.node.locks", "cni.kernel.netns", "cni.kernel.ethtool", "cni.kernel.announce",
                   "cni.ipam.api")
REFERENCE_PLUGIN_DIR = "/usr/lib/cni"

TEMPLATE = """#!{python} -IS
# Written by `python -m cni.launcher`; runs Ferry from {root}.
import sys
sys.path.insert(0, {root!r})
from {module} import main
from cni.plugin import leave
leave(main())
"""


def source_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def per_pod_python(current: str = sys.executable) -> str:
    """The interpreter for the per-Pod launchers: the distribution's ``/usr/bin/python3.X`` when it
    is this same minor version, else ``current``.

    The per-Pod path needs only the standard library, so any CPython of the same minor version
    runs it (same bytecode, same stdlib API).  Distribution builds are PGO+LTO-optimised and link
    ``_socket``, ``_struct``, ``fcntl`` into the executable; a pyenv or venv build is neither:
    measured here, ``-IS -c pass`` 12.6 vs 19.3 ms and a VERSION call 14.6 vs 22.9 ms (p50).
    ``FERRY_PYTHON`` overrides the choice."""
    forced = os.environ.get("FERRY_PYTHON")
    if forced:
        return forced
    candidate = f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"
    if os.path.realpath(candidate) != os.path.realpath(current) and os.access(candidate, os.X_OK):
        return candidate
    return current


def write_launchers(directory: str, python: str | None = None) -> list[str]:
    """Write the launchers into ``directory``; ``python`` defaults to :func:`per_pod_python`."""
    python = python or per_pod_python()
    os.makedirs(directory, exist_ok=True)
    written = []
    for name, module in ENTRY_POINTS.items():
        path = os.path.join(directory, name)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(TEMPLATE.format(python=python, root=source_root(), module=module))
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
        written.append(path)
    if os.path.isdir(REFERENCE_PLUGIN_DIR):
        for name in sorted(os.listdir(REFERENCE_PLUGIN_DIR)):
            link = os.path.join(directory, name)
            if name in ENTRY_POINTS or os.path.lexists(link):
                continue
            os.symlink(os.path.join(REFERENCE_PLUGIN_DIR, name), link)
            written.append(link)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m cni.launcher DIR", file=sys.stderr)
        return 2
    for path in write_launchers(args[0]):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
