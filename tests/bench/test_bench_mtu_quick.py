"""``python -m bench.bench_mtu --quick`` runs end to end and reports its figures (none asserted:
numbers are printed, never tested; what is asserted is that it ran, measured what it says and
left no lab behind)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.root
@pytest.mark.slow
def test_bench_mtu_quick(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    out = tmp_path / "mtu.json"
    p = subprocess.run([sys.executable, "-m", "bench.bench_mtu", "--quick", "--json", str(out)], cwd=ROOT,
                       capture_output=True, text=True, check=False, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(out.read_text())
    (upd,) = data["pod_updates"]
    assert upd["pods"] == 10 and len(upd["ms"]) == upd["switches"] == 2
    add = data["add"]
    assert add["routes"] == {"per-path routes": 6, "one route per family": 2}  # dual-stack hybrid
    assert add["ratio_p50"] > 0
    assert "ADD with per-path routes / one route per family" in p.stdout
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert data["tag"] not in left
