"""What the shipping tests share: the frozen bundle (built once, cached by a hash of its sources),
a CNI bin dir as a host has it, and ``run``.

Names this area creates start with "sp8" (namespaces, OVS dirs, labs)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


PREFIX = "sp8"


CACHE = ROOT / "build" / "ship"


SOURCES = ("cni", "routesync", "controller", "conflist")


REFERENCE_PLUGINS = "/usr/lib/cni"


def dist_python() -> str:
    """The interpreter ``make dist`` builds with: the bundle's venv on the distribution's CPython
    (.ci/install.sh); ``FERRY_DIST_VENV`` as there."""
    venv = os.environ.get("FERRY_DIST_VENV") or str(ROOT / ".venv-dist")
    return os.path.join(venv, "bin", "python")


def source_key() -> str:
    """Hash of everything that goes into the bundle: the spec, the packages, the templates, and
    the building Python and PyInstaller versions."""
    p = subprocess.run([dist_python(), "-c", "import sys, PyInstaller; print(sys.version, PyInstaller.__version__)"],
                       check=False, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise AssertionError(f"no bundle venv at {dist_python()} (run .ci/install.sh): {p.stderr[-2000:]}")
    h = hashlib.sha256(p.stdout.encode())
    files = [ROOT / "build.spec"]
    for d in SOURCES:
        files += sorted(p for p in (ROOT / d).rglob("*") if p.is_file() and p.suffix in (".py", ".json"))
    for p in files:
        h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def build_bundle() -> tuple[Path, float]:
    """``(bundle dir, seconds the build took; 0 when cached)``; one build at a time (a lock)."""
    key = source_key()
    base = CACHE / key
    bundle = base / "dist" / "ferry"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (base / "complete").exists():
            return bundle, 0.0
        for old in CACHE.iterdir():  # one cached bundle is enough
            if old.is_dir() and old.name != key:
                shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
        t0 = time.monotonic()
        p = subprocess.run([dist_python(), "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN",
                            "--distpath", str(base / "dist"), "--workpath", str(base / "work"),
                            str(ROOT / "build.spec")], check=False, cwd=ROOT, capture_output=True, text=True,
                           timeout=900)
        took = time.monotonic() - t0
        if p.returncode != 0:
            raise AssertionError(f"PyInstaller failed ({p.returncode}):\n{p.stderr[-4000:]}")
        (base / "build-seconds").write_text(f"{took:.1f}\n")
        (base / "complete").write_text(key + "\n")
        return bundle, took


def host_bin_dir(path: Path) -> Path:
    """A CNI bin dir as a host has it: Debian's reference plugins (portmap, bandwidth, ...)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.path.isdir(REFERENCE_PLUGINS):
        for name in os.listdir(REFERENCE_PLUGINS):
            if not (path / name).exists():
                (path / name).symlink_to(os.path.join(REFERENCE_PLUGINS, name))
    return path


def run(argv: list[str], check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{argv} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p
