"""Fixtures for the protocol tests: the real ``ferry`` entry point and an in-process run."""

from __future__ import annotations

import io
import os
import subprocess
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from cni.spec import protocol
from cni.spec.request import Request
from tests.cni.spec.helpers import Outcome, recording_handlers


@pytest.fixture
def log_file(tmp_path: Any) -> str:
    return str(tmp_path / "cni.log")


@pytest.fixture
def run_inproc(log_file: str) -> Callable[..., Outcome]:
    def run(env: Mapping[str, str], stdin: bytes, handlers: Mapping[str, Any] | None = None,
            fail: BaseException | None = None) -> Outcome:
        calls: list[Request] = []
        out, err = io.BytesIO(), io.StringIO()
        rc = protocol.run(handlers if handlers is not None else recording_handlers(calls, fail=fail),
                          env, stdin, out, err, log_file=log_file)
        return Outcome(rc, out.getvalue(), err.getvalue(), calls)

    return run


@pytest.fixture
def run_ferry(cni_bin: str) -> Callable[..., Outcome]:
    """Exec the real plugin as a runtime would: only the CNI variables in the environment."""

    def run(env: Mapping[str, str], stdin: bytes) -> Outcome:
        p = subprocess.run([os.path.join(cni_bin, "ferry")], check=False, input=stdin, capture_output=True,
                           env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **env}, timeout=30)
        return Outcome(p.returncode, p.stdout, p.stderr.decode("utf-8", "replace"))

    return run
