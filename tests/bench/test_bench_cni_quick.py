"""The CNI ADD/DEL benchmark keeps working: ``python -m bench.bench_cni --quick`` end to end.

No timing is asserted (the ratios are reported, never tested).  What is asserted: the run
completes with every plugin's figures for every Pod (Ferry's launcher and frozen bundle, ovs-cni,
Debian's and upstream's bridge; a peer that could not be built is named with its reason), its own
verification ran, each concurrent phase has its CPU split, and nothing it created (namespaces,
OVS daemons, temp dirs, ovs-cni cache files) survives a run, a failed run or a Ctrl-C.  Plus the
pure parts: /proc parsing, the CPU split, go.mod versions, and a missing peer reported as such.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench import bench_cni, cpu, peers
from tests.support.waiting import until

ROOT = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, "-m", "bench.bench_cni"]


def _tag() -> str:
    return f"fbn-t{secrets.token_hex(3)}"


def _leftovers(tag: str) -> list[str]:
    """Everything carrying ``tag``: namespaces, /tmp entries, live processes."""
    left = [f"netns {n}" for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                                   check=True).stdout.split() if n.startswith(tag)]
    left += [f"/tmp/{p.name}" for p in Path("/tmp").iterdir() if tag in p.name]
    cache = Path(bench_cni.OVS_CNI_CACHE)
    left += [str(p) for p in cache.iterdir() if tag in p.name] if cache.is_dir() else []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if tag in cmdline:
            left.append(f"pid {proc.name}: {cmdline[:120]}")
    return left


def _assert_clean(tag: str) -> None:
    # killed plugins may take a moment to be reaped; only a leak keeps this from holding
    try:
        until(lambda: not _leftovers(tag), "nothing left behind by the benchmark")
    except AssertionError:
        raise AssertionError(f"left behind by the benchmark: {_leftovers(tag)}") from None


@pytest.mark.root
def test_quick_run_reports_every_plugin_and_leaves_nothing(tmp_path: Path) -> None:
    tag, out = _tag(), tmp_path / "cni.json"
    p = subprocess.run([*BENCH, "--quick", "--tag", tag, "--json", str(out)], cwd=ROOT, capture_output=True,
                       check=False, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    pods = res["meta"]["pods"]
    assert pods == 10 and res["meta"]["conc"] == 2
    # every plugin ran, or is named with the reason it could not be built
    assert set(res["plugins"]) | set(res["not_built"]) == set(bench_cni.KEYS)
    assert {"ferry", "bridge"} <= set(res["plugins"]) and all(res["not_built"].values())
    for key, fig in res["plugins"].items():
        assert fig["version"] and fig["label"]
        modes = (("sequential", "concurrent", "cnitool") if key in bench_cni.CNITOOL_KEYS
                 else ("sequential", "concurrent"))
        for mode in modes:
            for op in ("add", "del"):
                s = fig[mode][op]
                assert s["n"] == pods == len(s["samples_ms"]), (key, mode, op)
                assert 0 < s["p50"] <= s["p90"] <= s["p99"] <= s["max"], (key, mode, op, s)
                assert s["cpu"]["wall_s"] > 0 and s["cpu"]["plugins_user_s"] + s["cpu"]["plugins_sys_s"] > 0, s["cpu"]
        assert fig["concurrent"]["add"]["workers"] == 2 and fig["concurrent"]["add"]["pods_per_s"] > 0
        if key in bench_cni.OVS_KEYS:  # the OVS daemons' CPU was read for the OVS plugins' phases
            assert {"ovs-vswitchd_user_s", "ovsdb-server_sys_s"} <= set(fig["concurrent"]["add"]["cpu"])
        # The benchmark's own verification ran after every ADD and DEL phase.
        for mode in ("warm-up", *modes):
            n = 1 if mode == "warm-up" else pods
            assert f"{key} {mode}: {n} ADDs verified" in res["checks"]
            assert f"{key} {mode}: {n} DELs left nothing" in res["checks"]
    # The encryption phase (issue 30): both state files' sides measured, every ADD verified, every Pod's
    # routes its state file's (the encrypted side's own), nothing left.
    e = res["encryption"]
    for op in ("add", "del"):
        assert [e[op][side]["n"] for side in ("none", "wireguard")] == [pods, pods], (op, e[op])
    assert e["routes"]["none"] != e["routes"]["wireguard"]
    assert e["ratios"]["ADD p50"] > 0 and isinstance(e["ratios"]["pass"], bool)
    for line in ("ADDs verified", "Pods hold their state file's routes", "DELs left nothing"):
        assert f"ferry-encryption encryption: {2 * pods} {line}" in res["checks"], line
    assert "wireguard / clear (issue 30)" in p.stdout
    # The policy phase (issue 27): both state files' sides measured, every ADD verified, the pending drops
    # on the bridge for the Pods of the side whose state file lists their namespace only, none left after DEL.
    pol = res["policy"]
    for op in ("add", "del"):
        assert [pol[op][side]["n"] for side in ("none", "policy")] == [pods, pods], (op, pol[op])
    assert pol["policyNamespaces"] == {"none": [], "policy": [pol["namespace"]]}
    assert pol["pending_drops"] == {"none": 0, "policy": 2 * pods}  # one IPv4 address each: from and to it
    assert pol["ratios"]["ADD p50"] > 0 and isinstance(pol["ratios"]["pass"], bool)
    for line in (f"{2 * pods} ADDs verified", f"{pods} Pods hold their pending drops, {pods} none",
                 f"{2 * pods} DELs left nothing", "no pending drop left"):
        assert f"ferry-policy policy: {line}" in res["checks"], line
    assert "policy / none (issue 27)" in p.stdout
    figures = {c["figure"]: c for c in res["comparisons"]}
    assert len(figures) == len(bench_cni.COMPARISONS)
    assert all(c.get("ratio", 0) > 0 or c.get("not_built") for c in figures.values())
    assert res["floor"]["n"] == pods
    # The floors: start-up (VERSION) for both, and Ferry's interpreter with every per-Pod import.
    floors = res["floors"]
    assert {"ferry VERSION (start-up floor)", "bridge VERSION (start-up floor)",
            "ferry start + every per-Pod import, no work"} <= set(floors)
    assert {f"{key} VERSION (start-up floor)" for key in res["plugins"]} <= set(floors)
    assert all(f["n"] == pods and f["p50"] > 0 for f in floors.values())
    assert [r["figure"] for r in res["ratios"]] == ["ADD p50", "ADD p99", "DEL p50", "concurrent ADD throughput"]
    assert all(r["ratio"] > 0 and isinstance(r["pass"], bool) for r in res["ratios"])
    assert "ferry / Debian bridge" in p.stdout and "harness floor" in p.stdout and "CPU ms per Pod" in p.stdout
    assert not Path(res["meta"]["work_dir"]).exists() and not Path(res["meta"]["ovs_dir"]).exists()
    _assert_clean(tag)


@pytest.mark.root
def test_a_plugin_that_skips_del_is_caught_and_cleaned_up(tmp_path: Path) -> None:
    """A ``ferry`` whose DEL answers success without doing anything: the leak check must fail the
    run (a plugin that skips work cannot look fast), and the clean-up still removes everything."""
    real = tmp_path / "real"
    subprocess.run([sys.executable, "-m", "cni.launcher", str(real)], cwd=ROOT, check=True, capture_output=True)
    lazy = tmp_path / "lazy"
    lazy.mkdir()
    (lazy / "ferry").write_text(f'#!/bin/sh\n[ "$CNI_COMMAND" = DEL ] && exit 0\nexec {real / "ferry"} "$@"\n')
    (lazy / "ferry").chmod(0o755)
    (lazy / "ferry-ipam").symlink_to(real / "ferry-ipam")
    tag = _tag()
    p = subprocess.run([*BENCH, "--quick", "--tag", tag, "--cni-bin", str(lazy)], cwd=ROOT, check=False,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr[-3000:]
    assert "ferry warm-up: leaked after DEL" in p.stderr and "fry" in p.stderr, p.stderr[-3000:]
    _assert_clean(tag)


def _as_in_a_terminal() -> None:
    """SIGINT at its default, as for a command in a terminal's foreground: a suite started in the
    background of a non-interactive shell inherits SIGINT ignored, and Python keeps ignoring it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.root
def test_ctrl_c_mid_run_cleans_up(tmp_path: Path) -> None:
    tag = _tag()
    p = subprocess.Popen([*BENCH, "--quick", "--tag", tag], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=_as_in_a_terminal)  # noqa: PLW1509 - one signal() call, no import, no lock
    try:
        assert p.stderr is not None
        seen = []
        for line in p.stderr:
            seen.append(line)
            if "ferry sequential ADD" in line:
                break
        else:
            pytest.fail(f"the run never reached Ferry's sequential ADDs: {''.join(seen)[-3000:]}")
        # the phase has begun (its line is printed when it starts); interrupting now, not after a
        # guessed 0.3 s that a fast machine could spend finishing the whole run
        assert _leftovers(tag), "nothing to clean up: the interrupt would prove nothing"
        p.send_signal(signal.SIGINT)
        rest = p.stderr.read()
        assert p.wait(timeout=60) == 130, rest
        assert "interrupted; cleaned up" in rest
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    _assert_clean(tag)


# ------------------------------------------------------------------------------------------
# The pure parts.

PROC_STAT = "cpu  100 5 200 1000 10 3 7 0 0 0\ncpu0 50 2 100 500 5 1 3 0 0 0\nintr 1\n"


def test_proc_stat_and_pid_stat_are_parsed() -> None:
    assert cpu.parse_proc_stat(PROC_STAT) == {"user": 100, "nice": 5, "system": 200, "idle": 1000,
                                               "iowait": 10, "irq": 3, "softirq": 7, "steal": 0}
    # a command name with spaces and parentheses: fields count from the last ")"
    line = "4242 (ovs (vswitchd) x) S 1 4242 4242 0 -1 4194560 10 0 0 0 731 215 0 0 10 -10 3 0 99 1 2\n"
    assert cpu.parse_pid_stat(line) == (731, 215)


def test_cpu_split_attributes_each_consumer_and_leaves_the_rest_to_kernel_and_others() -> None:
    before = cpu.Snapshot({"user": 0, "nice": 0, "system": 0, "idle": 0, "iowait": 0, "irq": 0, "softirq": 0,
                           "steal": 0}, {"ovs-vswitchd": (10, 10), "ovsdb-server": (0, 0)})
    after = cpu.Snapshot({"user": 300, "nice": 0, "system": 250, "idle": 50, "iowait": 0, "irq": 10, "softirq": 40,
                          "steal": 0}, {"ovs-vswitchd": (60, 40), "ovsdb-server": (20, 10)})
    out = cpu.split(before, after, {"user_s": 1.5, "sys_s": 1.0}, wall_s=2.0, hz=100, ncpu=2)
    assert out["ovs-vswitchd_user_s"] == 0.5 and out["ovs-vswitchd_sys_s"] == 0.3
    assert out["ovsdb-server_user_s"] == 0.2 and out["ovsdb-server_sys_s"] == 0.1
    # kernel 2.5 + 0.1 + 0.4 = 3.0 s, less plugins' 1.0 and the daemons' 0.4
    assert out["kernel_other_s"] == pytest.approx(1.6)
    # user 3.0 s, less plugins' 1.5 and the daemons' 0.7
    assert out["user_other_s"] == pytest.approx(0.8)
    assert out["machine_busy_s"] == pytest.approx(6.0) and out["capacity_s"] == 4.0
    assert cpu.shares(out) == pytest.approx({"plugin processes": 2.5, "ovs-vswitchd": 0.8, "ovsdb-server": 0.3,
                                             "kernel, other": 1.6, "user, other": 0.8})


def test_go_mod_versions_are_read_in_either_require_form() -> None:
    assert peers.go_mod_version("module x\n\nrequire github.com/a/b v1.10.0\n", "github.com/a/b") == "v1.10.0"
    assert peers.go_mod_version("require (\n\tgithub.com/a/b v0.39.0\n\tgithub.com/a/bc v9\n)\n",
                                "github.com/a/b") == "v0.39.0"
    assert peers.go_mod_version("require github.com/a/bc v1.0.0\n", "github.com/a/b") is None
    # the committed pins
    for name, (module, _) in peers.GO_SETS.items():
        assert peers.go_mod_version((ROOT / "tools" / name / "go.mod").read_text(), module), name


def test_a_missing_peer_is_not_built_with_its_reason(tmp_path: Path) -> None:
    frozen = peers.frozen_bundle(str(tmp_path / "dist"))
    assert not frozen.built and "make dist" in frozen.reason
    debian = peers.debian_plugins(str(tmp_path))
    assert not debian.built and "containernetworking-plugins" in debian.reason
    # a comparison with a side that is not there says so instead of a ratio
    seq = {"sequential": {"add": {"p50": 2.0, "p99": 3.0}, "del": {"p50": 2.0}},
           "concurrent": {"add": {"pods_per_s": 10.0, "n": 10, "cpu": {}}}}
    floors = {"ferry VERSION (start-up floor)": {"p50": 1.0}, "ferry-frozen VERSION (start-up floor)": {"p50": 1.1}}
    rows = {r["figure"]: r for r in bench_cni.comparisons({"ferry": seq, "ferry-frozen": seq}, floors,
                                                          {"ovs-cni": "no go"})}
    assert rows["frozen / launcher: VERSION p50"]["ratio"] == pytest.approx(1.1)
    assert rows["frozen / launcher: VERSION p50"]["pass"] is True
    assert rows["ferry (frozen) / ovs-cni: ADD p50"]["not_built"] == "ovs-cni: no go"
    assert "ratio" not in rows["ferry (frozen) / ovs-cni: ADD p50"]
    assert rows["upstream / Debian bridge: ADD p50"]["not_built"].startswith("bridge-upstream: not run")
