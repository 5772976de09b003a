"""Shared helpers for the protocol tests: the real ``ferry`` entry point and an in-process run."""

from __future__ import annotations

import io
import json
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from cni.spec import protocol
from cni.spec.request import Request
from cni.spec.result import Interface, IPConfig, Result, Route

PREFIX = "fp-"  # this test area's prefix for anything created on the system


@dataclass
class Outcome:
    rc: int
    stdout: bytes
    stderr: str
    calls: list[Request] = field(default_factory=list)

    def doc(self) -> dict[str, Any]:
        """stdout as exactly one JSON document (fails the test otherwise)."""
        text = self.stdout.decode("ascii")
        assert text.endswith("\n") and text.count("\n") == 1, f"not one line of JSON: {text!r}"
        return json.loads(text)


def sample_result() -> Result:
    return Result(
        interfaces=[Interface(name="eth0", mac="0a:58:0a:f4:01:05", sandbox="/var/run/netns/fp-x", mtu=1450)],
        ips=[IPConfig(address="10.244.1.5/24", gateway="10.244.1.1", interface=0),
             IPConfig(address="fd00:10:244:1::5/64", gateway="fd00:10:244:1::1", interface=0)],
        routes=[Route(dst="0.0.0.0/0", gw="10.244.1.1"), Route(dst="::/0")],
    )


def recording_handlers(calls: list[Request], add_result: Callable[[], Result | None] = sample_result,
                       fail: BaseException | None = None) -> dict[str, Callable[[Request], Result | None]]:
    """Handlers that succeed (or raise ``fail``) and remember each request they were given."""

    def make(cmd: str) -> Callable[[Request], Result | None]:
        def handler(req: Request) -> Result | None:
            calls.append(req)
            if fail is not None:
                raise fail
            return add_result() if cmd == "ADD" else None

        return handler

    return {c: make(c) for c in ("ADD", "DEL", "CHECK", "STATUS", "GC")}


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
