"""An encrypted lab's WireGuard processes (``encryption: wireguard``): route-sync starts the
userspace WireGuard in its Node's namespace and it outlives route-sync, so nothing in the lab's
manifest names it; the lab finds it by its namespace (``down`` kills every process of the lab's
namespaces) and by its command name (``show``, the tests)."""

from __future__ import annotations

import os

from lab import tools
from lab.sh import pids_named

COMM_LEN = 15  # the kernel keeps a command name's first 15 bytes


def command_names() -> tuple[str, ...]:
    """What ``/proc/PID/comm`` says for the userspace WireGuard: the configured binary's name
    (``build/tools/wireguard-go``, or ``$FERRY_WIREGUARD_GO``'s: ``go install`` names it ``wireguard``)."""
    names = {"wireguard-go", os.path.basename(tools.wireguard_go())[:COMM_LEN]}
    return tuple(sorted(names))


def pids(netns: str) -> list[int]:
    """The userspace WireGuard processes in ``netns``."""
    return sorted({p for comm in command_names() for p in pids_named(netns, comm)})
