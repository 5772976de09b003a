"""One CNI invocation as plain data: what the protocol core hands to a command handler."""

from __future__ import annotations

from cni.lean.record import Factory, record
from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

from cni.spec.result import Result


@record
class Request:
    command: str  # ADD | DEL | CHECK | VERSION | STATUS | GC
    cni_version: str = ""  # the config's cniVersion ("" for VERSION without a config)
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: dict[str, str] = Factory(dict)  # CNI_ARGS, "K=V;K2=V2" parsed
    path: list[str] = Factory(list)  # CNI_PATH split on ":"
    config: dict[str, Any] = Factory(dict)  # the network config from stdin
    prev_result: Result | None = None  # parsed prevResult (CHECK, DEL, chained ADD)
    log: Any = None  # the invocation's cni.spec.log.Log, set by the protocol core (None: silent)

    def logger(self) -> Any:
        return self.log if self.log is not None else _SILENT


class _Silent:
    """Stands in for a Log when a handler runs without the protocol core (tests, benchmarks)."""

    def debug(self, msg: str) -> None: ...
    def info(self, msg: str) -> None: ...
    def warning(self, msg: str) -> None: ...
    def error(self, msg: str) -> None: ...


_SILENT = _Silent()


# A command handler: ADD returns the Result to print; the others return None on success.
# Any failure is raised as cni.spec.errors.CniError.
if TYPE_CHECKING:  # aliases for annotations only (collections.abc is not imported at run time)
    Handler = Callable[[Request], Result | None]
    Handlers = Mapping[str, Handler]
