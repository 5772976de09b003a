"""What the BGP speaker reports: per peer the session state, the prefixes advertised and the
last error; written by route-sync as ``<bgp run dir>/status.json`` (atomic rename) for
``ferry-route-sync show`` and ``ferry-lab show``.  Plain data and its text; no I/O but
``write``/``read``."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

STATUS_FILE = "status.json"
COLUMNS = ("BGP PEER", "ASN", "LOCAL", "STATE", "SINCE", "ADVERTISED", "FLAPS", "LAST ERROR")


@dataclass
class PeerStatus:
    address: str
    asn: int
    local_address: str | None = None
    state: str = "idle"  # idle (not configured yet) | connect | established
    since: float | None = None  # wall clock of the last state change
    advertised: list[str] = field(default_factory=list)  # prefixes announced on the established session
    last_error: str | None = None
    last_error_at: float | None = None
    errors: int = 0
    established_count: int = 0  # how often the session came up (flaps = this - 1)


@dataclass
class BgpStatus:
    local_asn: int
    router_id: str | None = None
    speaker: str = "starting"  # starting | running | restarting | stopped | failed
    speaker_pid: int | None = None
    speaker_restarts: int = 0
    routes: list[str] = field(default_factory=list)  # "10.244.1.0/24 via 192.168.77.11"
    problems: list[str] = field(default_factory=list)  # what the Node cannot advertise, and why
    peers: list[PeerStatus] = field(default_factory=list)

    def peer(self, address: str) -> PeerStatus | None:
        return next((p for p in self.peers if p.address == address), None)


def to_dict(status: BgpStatus) -> dict[str, Any]:
    return asdict(status)


def from_dict(d: dict[str, Any]) -> BgpStatus:
    peers = [PeerStatus(**p) for p in d.get("peers", [])]
    return BgpStatus(**{**{k: v for k, v in d.items() if k != "peers"}, "peers": peers})


def write(status: BgpStatus, run_dir: str) -> None:
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, STATUS_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(to_dict(status), f, indent=2)
        f.write("\n")
    os.rename(tmp, path)


def read(run_dir: str) -> BgpStatus | None:
    """The status route-sync last wrote, or None (no BGP, or not written yet)."""
    try:
        with open(os.path.join(run_dir, STATUS_FILE)) as f:
            return from_dict(json.load(f))
    except (OSError, ValueError, TypeError):
        return None


def _age(since: float | None, now: float) -> str:
    if since is None:
        return "-"
    s = max(0, int(now - since))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


def as_table(status: BgpStatus, now: float) -> str:
    head = (f"bgp: AS {status.local_asn}  router-id {status.router_id or '-'}  ExaBGP {status.speaker}"
            f"{f' (pid {status.speaker_pid})' if status.speaker_pid else ''}"
            f"{f', {status.speaker_restarts} restarts' if status.speaker_restarts else ''}\n"
            f"routes: {', '.join(status.routes) or '(none)'}\n")
    head += "".join(f"not advertised: {p}\n" for p in status.problems)
    cells = [COLUMNS] + [(p.address, str(p.asn), p.local_address or "-", p.state, _age(p.since, now),
                          ",".join(p.advertised) or "-", str(max(0, p.established_count - 1)),
                          p.last_error or "-") for p in status.peers]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return head + "\n".join(lines) + "\n"
