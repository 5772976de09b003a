"""``python -m bench.bench_osken`` runs end to end at a tiny size, and its equivalence check holds.

No timing is asserted (figures are reported, never tested).  Asserted: the bench exits 0, which
it does only when os-ken's flow-mods and Ferry's encoder installed the same ``dump-flows`` and
the changes left the table equal to a fresh install; every path and figure is in its JSON.  And,
without root: every kind of flow route-sync plans translates into os-ken objects that serialize."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_planned_flow_translates_to_osken() -> None:
    pytest.importorskip("os_ken")
    from bench.bench_osken import OskenCodec, OskenDatapath, flow_spec, planned_flows
    from bench.bench_routesync import synthetic_peers

    flows = planned_flows(synthetic_peers(3))
    codec = OskenCodec(OskenDatapath())
    kinds = set()
    for f in flows:
        msg = codec.flow_mod(flow_spec(f.text()))
        msg.set_xid(1)
        msg.serialize()
        assert len(msg.buf) % 8 == 0 and len(msg.buf) >= 56, f.text()
        kinds.add(f.actions_text().split(",")[0].split(":")[0].split("(")[0])
    assert {"goto_table", "drop", "output", "move", "mod_dl_src", "mod_dl_dst", "ct"} <= kinds
    texts = [f.text() for f in flows]  # the conntrack tables' vocabulary is among them
    for needle in ("ct(commit,", "exec(set_field:", "ct(zone=", "ct_state=", "ct_mark=", "icmp,icmp_type="):
        assert any(needle in t for t in texts), needle


@pytest.mark.root
@pytest.mark.slow
def test_bench_osken_runs_tiny_and_paths_agree(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    pytest.importorskip("os_ken")
    out = tmp_path / "osken.json"
    p = subprocess.run([sys.executable, "-m", "bench.bench_osken", "--peers", "10", "--trials", "2",
                        "--changes", "3", "--no-routesync", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, check=False, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    (size,) = res["sizes"]
    assert size["peers"] == 10 and size["flows"] == 2 * 10 + 39  # base + conntrack and policy tables, two a peer
    assert set(size["full"]) == {"ferry", "osken", "ofctl"}
    assert all(s["n"] == 2 for s in size["full"].values())
    assert set(size["change"]) == {"ferry", "osken"} and all(s["n"] == 3 for s in size["change"].values())
    assert {(r["what"], r["figure"]) for r in res["ratios"]} == \
        {(w, f) for w in ("full", "change") for f in ("encode_ms", "wall_ms", "cpu_ms")}
    assert res["import"]["rss_added_mb"] > 0 and res["import"]["importtime_ms"] > 0
    assert "os-ken / Ferry" in p.stdout
