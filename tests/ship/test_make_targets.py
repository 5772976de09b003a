"""Which install each make target runs (``make -n``: nothing is run): ``make demo`` installs only what
the embedded-registry demo runs (.ci/install.sh's four switches at 0: no Kubernetes or benchmark
peer Go builds, no dev venv, no bundle venv), every other target that installs gets everything."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.ship.helpers import ROOT

SWITCHES = ("FERRY_KUBERNETES=0", "FERRY_BENCH_PEERS=0", "FERRY_DEV=0", "FERRY_DIST=0")


def planned(*args: str) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("no make")
    out = subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=60, env={"PATH": "/usr/bin:/bin", "VENV": "/nonexistent"})
    return [line for line in out.stdout.splitlines() if ".ci/install.sh" in line]


def test_demo_installs_only_what_it_runs() -> None:
    lines = planned("demo")
    assert len(lines) == 1 and all(s in lines[0] for s in SWITCHES), lines


@pytest.mark.parametrize("target", ["test", "demo-k8s", "bench", "dist", "image", "bin", "test-unit"])
def test_other_targets_install_everything(target: str) -> None:
    lines = planned(target)
    assert lines == ["bash .ci/install.sh"], lines


def test_a_kubernetes_demo_gets_what_demo_k8s_gets() -> None:
    assert planned("demo", "DEMO=--kubernetes --family 4") == ["bash .ci/install.sh"]

