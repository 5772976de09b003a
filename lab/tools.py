"""Where the Go programs built by ``tools/build-go-tools.sh`` are: ``build/tools/<name>`` in this
clone (links into the build cache), unless the environment names another one.

One place for these paths, so that nothing runs Debian's cnitool 1.1.x (no STATUS or GC verb, reads
results only up to 1.0.0) by mistake."""

from __future__ import annotations

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS_DIR = os.path.join(REPO, "build", "tools")


def tool(name: str) -> str:
    """``build/tools/<name>``, or ``$FERRY_TOOLS_DIR/<name>`` when that is set."""
    return os.path.join(os.environ.get("FERRY_TOOLS_DIR") or TOOLS_DIR, name)


def cnitool() -> str:
    """The pinned cnitool (``tools/cnitool/go.mod``); ``$CNITOOL`` overrides."""
    return os.environ.get("CNITOOL") or tool("cnitool")


WIREGUARD_GO_ENV = "FERRY_WIREGUARD_GO"


def wireguard_go() -> str:
    """The userspace WireGuard route-sync runs on an encrypted lab's Nodes (``wireguard.userspaceCommand``):
    ``$FERRY_WIREGUARD_GO``, else ``build/tools/wireguard-go`` (``tools/build-go-tools.sh wireguard-go``)."""
    return os.path.abspath(os.environ.get(WIREGUARD_GO_ENV) or tool("wireguard-go"))
