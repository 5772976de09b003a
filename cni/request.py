"""One CNI invocation as plain data: what the protocol core hands to a command handler."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cni.result import Result


@dataclass
class Request:
    command: str  # ADD | DEL | CHECK | VERSION | STATUS | GC
    cni_version: str = ""  # the config's cniVersion ("" for VERSION without a config)
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: dict[str, str] = field(default_factory=dict)  # CNI_ARGS, "K=V;K2=V2" parsed
    path: list[str] = field(default_factory=list)  # CNI_PATH split on ":"
    config: dict[str, Any] = field(default_factory=dict)  # the network config from stdin
    prev_result: Result | None = None  # parsed prevResult (CHECK, DEL, chained ADD)


# A command handler: ADD returns the Result to print; the others return None on success.
# Any failure is raised as cni.errors.CniError.
Handler = Callable[[Request], Result | None]
Handlers = Mapping[str, Handler]
