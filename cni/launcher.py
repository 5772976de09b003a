"""Write a CNI_PATH directory that runs Ferry from this source tree.

``python -m cni.launcher DIR`` writes ``DIR/ferry`` and ``DIR/ferry-ipam``: tiny scripts that
start the interpreter isolated and without ``site`` (``-I -S``: no site-packages scan, no
editable-install finders; ~10 ms instead of ~40), put the source tree first on ``sys.path``
and call the entry point.  The per-Pod path needs only the standard library, so nothing else
is importable there, on purpose.  It also links Debian's reference plugins (``portmap``,
``bandwidth``, ``host-local``, ``ptp``, ``bridge``, ...) when present, for chaining and for
the benchmarks' reference.  The frozen PyInstaller bundle replaces this on real hosts."""

from __future__ import annotations

import os
import sys

ENTRY_POINTS = {"ferry": "cni.plugin", "ferry-ipam": "ipam.plugin"}
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


def write_launchers(directory: str, python: str = sys.executable) -> list[str]:
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
