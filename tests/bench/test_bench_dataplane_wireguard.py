"""bench_dataplane's WireGuard path end to end (issue 30), at the smallest size: ``--paths
vxlan,wg-vxlan``, one repetition.  No figure is asserted (they are reported, never tested).
Asserted: the encrypted path was the one measured (node-1's WireGuard device carried at least
what iperf3 delivered, there is no tunnel port), both Nodes' wireguard-go were found and their
CPU counted, the round trips were timed on both paths, the pair's ratios are there, and both labs
are gone afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.bench_dataplane import PREFIX, wireguard_missing
from lab.layout import DEFAULT_ROOT
from tests.support.labs import can_run

ROOT = Path(__file__).resolve().parents[2]


def _labs() -> set[str]:
    return {n for n in os.listdir(DEFAULT_ROOT) if n.startswith(PREFIX)} if os.path.isdir(DEFAULT_ROOT) else set()


@pytest.mark.root
@pytest.mark.slow
def test_the_encrypted_path_is_measured_through_wireguard_beside_its_clear_one(tmp_path: Path, cni_bin: str) -> None:
    reason = can_run() or wireguard_missing()
    if reason:
        pytest.skip(reason)
    before, out = _labs(), tmp_path / "dp.json"
    p = subprocess.run([sys.executable, "-m", "bench.bench_dataplane", "--quick", "--reps", "1", "--rtts", "50",
                        "--paths", "vxlan,wg-vxlan", "--cni-bin", cni_bin, "--json", str(out)], cwd=ROOT,
                       capture_output=True, text=True, check=False, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    paths = {x["path"]: x for x in res["paths"]}
    wg, clear = paths["wg-vxlan"], paths["vxlan"]
    assert wg["encrypted"] and not clear["encrypted"]
    delivered = wg["median"] * res["seconds"] * 1e9 / 8 * 0.9  # iperf3's figure is its rate over ~the run
    assert wg["wireguard_bytes"] >= delivered and wg["counter_packets"] is None, wg["path_check"]
    assert clear["counter_packets"] > 1000, clear["path_check"]
    assert wg["wireguard_processes"] == 2 and all(c > 0 for c in wg["wireguard_cpu_s"])
    assert all(c > w for c, w in zip(wg["cpu_s"], wg["wireguard_cpu_s"], strict=True))  # + vswitchd, iperf3
    assert wg["latency_us"]["n"] == clear["latency_us"]["n"] == 50
    r = res["ratios"]["wg-vxlan/vxlan"]
    assert r["median"] > 0 and r["cpu_per_gbit"] > 0 and r["latency_p50"] > 0 and r["latency_p99"] > 0
    assert "wg-vxlan/vxlan: throughput" in p.stdout
    assert _labs() <= before  # both labs down
