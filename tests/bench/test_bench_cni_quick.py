"""The CNI ADD/DEL benchmark keeps working: ``python -m bench.bench_cni --quick`` end to end.

No timing is asserted (the ratios are reported, never tested).  What is asserted: the run
completes with both plugins' figures for every Pod, its own verification ran, and nothing it
created (namespaces, OVS daemons, temp dirs) survives a run, a failed run or a Ctrl-C.
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

from tests.waiting import until

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, "-m", "bench.bench_cni"]


def _tag() -> str:
    return f"fbn-t{secrets.token_hex(3)}"


def _leftovers(tag: str) -> list[str]:
    """Everything carrying ``tag``: namespaces, /tmp entries, live processes."""
    left = [f"netns {n}" for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                                   check=True).stdout.split() if n.startswith(tag)]
    left += [f"/tmp/{p.name}" for p in Path("/tmp").iterdir() if tag in p.name]
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


def test_quick_run_reports_both_plugins_and_leaves_nothing(tmp_path: Path) -> None:
    tag, out = _tag(), tmp_path / "cni.json"
    p = subprocess.run([*BENCH, "--quick", "--tag", tag, "--json", str(out)], cwd=ROOT, capture_output=True, check=False,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    pods = res["meta"]["pods"]
    assert pods == 10 and res["meta"]["conc"] == 2
    for key in ("ferry", "bridge"):
        fig = res["plugins"][key]
        for mode in ("sequential", "concurrent", "cnitool"):
            for op in ("add", "del"):
                s = fig[mode][op]
                assert s["n"] == pods == len(s["samples_ms"]), (key, mode, op)
                assert 0 < s["p50"] <= s["p90"] <= s["p99"] <= s["max"], (key, mode, op, s)
        assert fig["concurrent"]["add"]["workers"] == 2 and fig["concurrent"]["add"]["pods_per_s"] > 0
        # The benchmark's own verification ran after every ADD and DEL phase.
        for mode in ("warm-up", "sequential", "cnitool", "concurrent"):
            n = 1 if mode == "warm-up" else pods
            assert f"{key} {mode}: {n} ADDs verified" in res["checks"]
            assert f"{key} {mode}: {n} DELs left nothing" in res["checks"]
    assert res["floor"]["n"] == pods
    # The floors: start-up (VERSION) for both, and Ferry's interpreter with every per-Pod import.
    floors = res["floors"]
    assert {"ferry VERSION (start-up floor)", "bridge VERSION (start-up floor)",
            "ferry start + every per-Pod import, no work"} <= set(floors)
    assert all(f["n"] == pods and f["p50"] > 0 for f in floors.values())
    assert [r["figure"] for r in res["ratios"]] == ["ADD p50", "ADD p99", "DEL p50", "concurrent ADD throughput"]
    assert all(r["ratio"] > 0 and isinstance(r["pass"], bool) for r in res["ratios"])
    assert "ferry / reference" in p.stdout and "harness floor" in p.stdout
    assert not Path(res["meta"]["work_dir"]).exists() and not Path(res["meta"]["ovs_dir"]).exists()
    _assert_clean(tag)


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
