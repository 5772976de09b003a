"""Helpers for the protocol tests: what a run returns, a sample result, handlers that record calls."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
