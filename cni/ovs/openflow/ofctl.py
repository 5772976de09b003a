"""The ``ovs-ofctl`` binary, for what has no message in :mod:`cni.ovs.openflow.codec`: dumping a
bridge's flows (and parsing the dump) and deleting by a ``cookie=V/M`` text.  One exec per call,
argv lists only (no shell), target ``unix:<run_dir>/<bridge>.mgmt`` (works with a private
OVS_RUNDIR).  No ``-O``: ovs-ofctl then speaks OpenFlow 1.0 with Nicira extensions, 2-3x faster
per exec than forcing OpenFlow 1.3.  Never on the per-Pod ADD/DEL path (only CHECK dumps)."""

from __future__ import annotations

from cni.lean import spawn
from cni.lean.record import record
from cni.lean.typecheck import TYPE_CHECKING
from cni.ovs.openflow.codec import OpenFlowError

if TYPE_CHECKING:
    from collections.abc import Sequence

PROTOCOLS = ""  # let ovs-ofctl choose (OpenFlow 1.0 + NXM): fastest
_STAT_KEYS = frozenset({"cookie", "duration", "table", "n_packets", "n_bytes", "idle_timeout",
                        "hard_timeout", "idle_age", "hard_age", "importance"})
_FLAG_WORDS = frozenset({"send_flow_rem", "check_overlap", "reset_counts", "no_packet_counts",
                         "no_byte_counts"})
# A flow's priority when none is given (OpenFlow's OFP_DEFAULT_PRIORITY); dumps leave it out.
DEFAULT_PRIORITY = 32768


class OfctlError(OpenFlowError):
    """ovs-ofctl failed; the message carries its stderr."""


@record(frozen=True)
class DumpedFlow:
    """One flow as ``ovs-ofctl dump-flows`` prints it (OVS's canonical text), with its counters."""

    table: int
    priority: int
    cookie: int
    match: str
    actions: str
    n_packets: int
    n_bytes: int
    duration: float = 0.0  # seconds since the flow was installed (or last reset)

    def canon(self) -> tuple[int, int, str, str]:
        """What makes it the same flow: (table, priority, match, actions)."""
        return (self.table, self.priority, self.match, self.actions)


def parse_dump(text: str) -> list[DumpedFlow]:
    """Every flow of ``ovs-ofctl --no-names dump-flows`` output (any OpenFlow version)."""
    return [f for f in map(parse_flow_line, text.splitlines()) if f is not None]


def parse_flow_line(line: str) -> DumpedFlow | None:
    """One line of ``ovs-ofctl dump-flows`` output; None for headers and blank lines."""
    import re  # dump path only: the per-Pod ADD/DEL path never parses flows

    line = line.strip()
    if " actions=" not in line and not line.startswith("actions="):
        return None
    head, _, actions = line.partition("actions=")
    fields: dict[str, str] = {}
    match_parts: list[str] = []
    for item in re.split(r",\s*|\s+", head.strip().rstrip(",")):
        if not item or item in _FLAG_WORDS:
            continue
        key, eq, value = item.partition("=")
        if eq and key in _STAT_KEYS and key not in fields and not match_parts:
            fields[key] = value
        elif eq and key == "priority" and "priority" not in fields:
            fields["priority"] = value
        else:
            match_parts.append(item)
    return DumpedFlow(
        table=int(fields.get("table", "0")),
        priority=int(fields.get("priority", DEFAULT_PRIORITY)),
        cookie=int(fields.get("cookie", "0"), 0),
        match=",".join(match_parts),
        actions=actions.strip(),
        n_packets=int(fields.get("n_packets", "0")),
        n_bytes=int(fields.get("n_bytes", "0")),
        duration=float(fields.get("duration", "0s").rstrip("s")),
    )


class Ofctl:
    """``ovs-ofctl <command> unix:<run_dir>/<bridge>.mgmt ...``."""

    def __init__(self, bridge: str, run_dir: str, protocols: str = PROTOCOLS,
                 binary: str = "ovs-ofctl", timeout: float = 10.0) -> None:
        self.bridge = bridge
        self.target = f"unix:{run_dir.rstrip('/')}/{bridge}.mgmt"
        self.protocols = protocols
        self.binary = binary
        self.timeout = timeout

    def run(self, args: list[str], stdin: str | None = None, options: Sequence[str] = ()) -> str:
        argv = [self.binary, *(["-O", self.protocols] if self.protocols else []), *options, args[0], self.target,
                *args[1:]]
        try:
            code, out, err = spawn.run(argv, (stdin or "").encode(), self.timeout)
        except OSError as e:
            raise OfctlError(f"{args[0]} on {self.bridge}: {e}") from e
        if code != 0:
            raise OfctlError(f"{args[0]} on {self.bridge}: {err.decode(errors='replace').strip() or f'exit {code}'}")
        return out.decode(errors="replace")

    def dump_flows(self, selector: str = "") -> list[DumpedFlow]:
        """``dump-flows`` of the flows ``selector`` (``cookie=V/M,table=T``) picks, all without one."""
        return parse_dump(self.run(["dump-flows", *([selector] if selector else [])], options=["--no-names"]))

    def del_flows(self, selector: str) -> None:
        self.run(["del-flows", selector])
