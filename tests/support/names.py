"""Names of what the plugin's layer tests create (namespaces, OVS instances, links): ``fs-`` + a stem
+ 4 hex digits, short enough for an interface name."""

from __future__ import annotations

import secrets

PREFIX = "fs-"


def uniq(stem: str) -> str:
    """``fs-<stem><4 hex>``, at most 15 bytes (an interface name)."""
    name = f"{PREFIX}{stem}{secrets.token_hex(2)}"
    assert len(name) <= 15, name
    return name
