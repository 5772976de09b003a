"""``python -m bench --quick`` (what ``make bench`` runs, small) keeps working end to end.

No timing is asserted (figures are reported, never tested).  Asserted: every benchmark ran and
left its section in results.json, report.md has a row for every goal of the other issues, and
the three plots exist as real PNG images of a sensible size.  Plus the pure parts of the report:
a goal's verdict follows its bound, and a failed benchmark makes its goals "not run"."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("startup", "cni", "ipam", "routesync", "dataplane", "services", "policy", "policy-replay",
            "policy-pass", "spans", "system")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.root
@pytest.mark.slow
def test_quick_bench_writes_every_section_goal_and_plot(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    out = tmp_path / "results"
    env = {**os.environ, "BENCH_QUICK": "1"}
    cni_bin = os.environ.get("FERRY_CNI_BIN")
    extra = ["--cni-bin", cni_bin] if cni_bin and os.access(os.path.join(cni_bin, "ferry"), os.X_OK) else []
    p = subprocess.run([sys.executable, "-m", "bench", "--out", str(out), *extra], cwd=ROOT, env=env,
                       capture_output=True, text=True, check=False, timeout=1200)
    results = json.loads((out / "results.json").read_text())
    assert results["meta"]["quick"] is True
    statuses = {k: v["status"] for k, v in results["benchmarks"].items()}
    assert set(statuses) == set(SECTIONS)
    errors = {k: v.get("error", "")[-1500:] for k, v in results["benchmarks"].items() if v["status"] != "ok"}
    assert p.returncode == 0, f"{statuses}\n{errors}\n{p.stderr[-3000:]}"
    assert all(s == "ok" for s in statuses.values()), statuses
    data = {k: v["data"] for k, v in results["benchmarks"].items()}
    assert {s["plugin"] for s in data["startup"]["series"]} >= {"ferry", "bridge"}
    assert data["cni"]["plugins"]["ferry"]["sequential"]["add"]["n"] == 10
    # Ferry's launcher and frozen bundle, ovs-cni, Debian's and upstream's bridge: measured, or not built with a reason
    assert set(data["cni"]["plugins"]) | set(data["cni"]["not_built"]) == \
        {"ferry", "ferry-frozen", "ovs-cni", "ovs-cni-poll10", "bridge", "bridge-upstream"}
    assert {s["fill"] for s in data["ipam"]["series"]} == {0, 50, 99}
    assert [s["peers"] for s in data["routesync"]["sizes"]] == [100]
    assert data["routesync"]["sizes"][0]["routes"] == 100 and data["routesync"]["change"]["n"] > 0
    paths = {x["path"]: x for x in data["dataplane"]["paths"]}
    assert set(paths) == {"vxlan", "geneve", "gre", "gateway", "fast", "wg-vxlan", "wg-gateway"}
    for key in ("vxlan", "geneve", "gre", "gateway", "wg-vxlan", "wg-gateway"):
        assert len(paths[key]["gbps"]) >= 3 and paths[key]["median"] > 0, paths[key]
        assert paths[key]["latency_us"]["n"] == 3 * 300 and paths[key]["latency_us"]["p50"] > 0, paths[key]
    assert {"wg-vxlan/vxlan", "wg-gateway/gateway"} <= set(data["dataplane"]["ratios"])
    assert data["cni"]["encryption"]["add"]["wireguard"]["n"] == 10
    assert data["dataplane"]["seconds"] == 2
    encap = data["services"]["modes"]["encap"]  # a Kubernetes cluster with kube-proxy: both targets measured
    assert encap["pod"]["gbps_median"] > 0 and encap["service"]["gbps_median"] > 0, encap
    assert encap["ratios"]["throughput_service_over_pod"] > 0
    policy = data["policy"]  # the quick cluster: 1,000 Pods, 100 policies; both cases of the pair measured
    assert policy["planning"]["pods"] == 1000 and policy["planning"]["flows"] > 0
    assert policy["dataplane"]["verdicts"]["policy"] == {"client": True, "other": False}
    assert policy["dataplane"]["policy"]["bridge_flows"] > policy["dataplane"]["none"]["bridge_flows"]
    assert {r["n"] for r in data["system"]["operations"]} == {5}
    replay = data["policy-replay"]  # the incremental planner's replay, held to the full one
    assert [s["equal_to_full_plan_after_replay"] for s in replay["scales"]] == [True]
    assert replay["differential"]["ok"] and replay["differential"]["events"] >= 2000
    judged = data["policy-pass"]  # both sides fed the same events: their judges list the same
    assert judged["tables_equal"] and judged["events"] == 40 and judged["element"]["cpu_p50_ms"] > 0
    spans = data["spans"]  # the spans index's replay, held to relevance.spans; every event kind measured
    assert spans["equal_after_replay"] and spans["pods"] == 2000
    assert set(spans["runs"]) == {"cluster", "peerSlices"}  # both policyPeers, on the same cluster
    for run in spans["runs"].values():
        assert set(run["events"]) == {"pod-add", "pod-delete", "pod-relabel", "pod-move",
                                      "policy-create", "policy-delete", "policy-edit", "policy-port"}

    md = (out / "report.md").read_text()
    for g in report.GOALS:
        assert f"| {g.issue} | {g.figure} |" in md, f"goal row missing: {g.figure}"
    # the quick run measures these goals, so they carry a verdict (not "not run")
    rows = {r.figure: r for r in report.goal_rows(results)}
    for fig in ("ADD p50", "DEL p50", "VERSION p50", "peak RSS (largest size)", "one Node change → applied, p99",
                "policy plan() for one Node, CPU", "Pod → Pod throughput, the generated policies in force / none"):
        assert rows[fig].verdict != "not run" and rows[fig].ratio is not None, rows[fig]
    for png in report.PLOTS:
        assert f"({png})" in md
        w, h = _png_size(out / png)
        assert 300 <= w <= 2000 and 200 <= h <= 2000
        assert (out / png).stat().st_size < 200_000


def _results(**benchmarks: object) -> dict:
    return {"meta": {}, "benchmarks": benchmarks}


def test_goal_verdicts_follow_bounds_and_failures() -> None:
    cni = {"ratios": [{"figure": "ADD p50", "ferry": 3.0, "reference": 2.0},
                      {"figure": "DEL p50", "ferry": 3.0, "reference": 2.0},
                      {"figure": "concurrent ADD throughput", "ferry": 30.0, "reference": 20.0}]}
    rs = {"sizes": [{"peers": 1000, "reconcile_s": 0.5, "noop_reconcile_s": 0.1, "peak_rss_mb": 200.0}],
          "change": {"p99_ms": 150.0}}
    rows = {r.figure: r for r in report.goal_rows(_results(
        cni={"status": "ok", "data": cni}, routesync={"status": "ok", "data": rs},
        dataplane={"status": "failed", "data": None, "error": "boom"}))}
    assert rows["ADD p50"].verdict == "pass" and rows["ADD p50"].ratio == pytest.approx(1.5)
    assert rows["DEL p50"].verdict == "short"  # 1.5x > 1.2x
    assert rows["8-concurrent ADD throughput"].verdict == "pass"  # 1.5x >= 1x
    assert rows["ADD p99"].verdict == "not run"  # absent from the data
    assert rows["full reconcile, 1,000 peers"].verdict == "pass"
    assert rows["full reconcile, 5,000 peers"].verdict == "not run"
    assert rows["peak RSS (largest size)"].verdict == "short"
    assert rows["one Node change → applied, p99"].verdict == "short"
    assert rows["fast path / gateway path"].verdict == "not run"
    # issue 18: a peer that could not be built is named, with its reason, in the goal table
    cmp_data = {"meta": {"versions": {"ovs_cni": "v0.39.0", "debian_plugins": "1.1.1"}},
                "comparisons": [{"figure": "ferry (frozen) / ovs-cni: ADD p50", "target": "<= 1.0x",
                                 "not_built": "ovs-cni: tools/build-go-tools.sh ovs-cni: no 'go' on PATH"},
                                {"figure": "frozen / launcher: ADD p50", "ours": 11.0, "reference": 10.0,
                                 "ratio": 1.1, "target": "<= 1.1x", "pass": True}]}
    rows = {r.figure: r for r in report.goal_rows(_results(cni={"status": "ok", "data": cmp_data}))}
    assert rows["ferry (frozen) / ovs-cni: ADD p50"].verdict == \
        "not built: ovs-cni: tools/build-go-tools.sh ovs-cni: no 'go' on PATH"
    assert rows["ferry (frozen) / ovs-cni: ADD p50"].reference_name == "ovs-cni v0.39.0"
    assert rows["frozen / launcher: ADD p50"].verdict == "pass"
    assert rows["ADD p50"].reference_name == "Debian bridge + host-local 1.1.1"
    md = report.render(_results(dataplane={"status": "failed", "data": None, "error": "boom"}))
    assert "## Failed benchmarks" in md and "**dataplane**: boom" in md


def test_the_routesync_section_shows_a_change_s_cpu_and_flow_mods() -> None:
    rs = {"mode": "encap/vxlan, netdev",
          "sizes": [{"peers": 5000, "reconcile_s": 2.3, "noop_reconcile_s": 0.5, "peak_rss_mb": 97.0}],
          "change": {"peers": 5000, "n": 50, "p50_ms": 36.5, "p99_ms": 87.7, "max_ms": 87.7,
                     "cpu_p50_ms": 5.99, "cpu_p99_ms": 11.22, "flow_mods_p50": 3.0, "flow_mods_max": 3}}
    md = report.render(_results(routesync={"status": "ok", "data": rs}))
    assert "route-sync CPU per change p50 5.99 ms, p99 11.22 ms; flow-mods per change p50 3, max 3." in md
    del rs["change"]["cpu_p50_ms"]  # a result of a bench before the figure: the rest still renders
    assert "p99 87.7 ms" in report.render(_results(routesync={"status": "ok", "data": rs}))
