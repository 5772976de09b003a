"""``python -m bench.bench_system`` (the plugin's netlink, OVSDB and OpenFlow calls against
pyroute2, ovsdbapp and ovs-vsctl) runs end to end at a small size and its report section shows
every operation.  No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report

ROOT = Path(__file__).resolve().parents[2]
IMPLEMENTATIONS = {"lean", "pyroute2", "lean OVSDB", "ovs-vsctl (waits for vswitchd)", "ovsdbapp", "native",
                   "ovs-ofctl"}


@pytest.mark.root
def test_bench_system_times_every_operation(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    out = tmp_path / "system.json"
    p = subprocess.run([sys.executable, "-m", "bench.bench_system", "--n", "2", "--json", str(out)], cwd=ROOT,
                       capture_output=True, text=True, check=False, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(out.read_text())
    ops = data["operations"]
    assert {r["implementation"] for r in ops} == IMPLEMENTATIONS
    assert len(ops) == 19 and all(r["n"] == 2 and 0 < r["min_ms"] <= r["median_ms"] for r in ops)
    assert set(data["import_ms"]) == {"ferry", "pyroute2", "ovsdbapp"} and all(data["import_ms"].values())
    section = report.SECTIONS["system"][1](data)
    assert all(f"| {r['operation']} | {r['implementation']} |" in section for r in ops)
    assert "ovsdbapp's connect" in section


def test_the_section_renders_without_figures() -> None:
    text = report.SECTIONS["system"][1]({"operations": [], "import_ms": {}})
    assert "| operation | implementation |" in text
