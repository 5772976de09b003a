"""Pod CIDR conflicts as route-sync reports them (``routesync.planclaims`` decides them): one line
of text each (the daemon's log and ``ferry-route-sync show``), and the status file ``show`` reads,
``pod-cidr-conflicts.json`` beside the node state file, written by the daemon when the set changes."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from .model import CidrConflict

FILE = "pod-cidr-conflicts.json"


def path(state_file: str) -> str:
    return os.path.join(os.path.dirname(state_file) or ".", FILE)


def describe(c: CidrConflict, local: str) -> str:
    """``Pod CIDR 10.244.2.0/24 of node-c overlaps 10.244.2.0/24 of node-b: node-b's stands, ...``."""
    head = f"Pod CIDR {c.cidr} of {c.node} overlaps {c.owner_cidr} of {c.owner}: {c.owner}'s stands"
    if c.node == local:
        return f"{head} elsewhere; this Node keeps it for its own Pods but does not advertise it over BGP"
    if c.owner == local:
        return f"{head} here (this Node's own); {c.node}'s is not planned"
    return f"{head} (its name sorts first); {c.node}'s is not planned"


def write(state_file: str, found: Iterable[CidrConflict]) -> None:
    from cni.node.atomicfile import write_atomic

    rows = [{"node": c.node, "cidr": c.cidr, "owner": c.owner, "ownerCIDR": c.owner_cidr} for c in found]
    write_atomic(path(state_file), json.dumps(rows, sort_keys=True).encode())


def read(state_file: str) -> tuple[CidrConflict, ...]:
    """The conflicts the daemon wrote last; none when it wrote no file.  ValueError when malformed."""
    try:
        with open(path(state_file), encoding="utf-8") as f:
            rows = json.load(f)
    except FileNotFoundError:
        return ()
    if not isinstance(rows, list):
        raise ValueError(f"{path(state_file)}: not a list")  # noqa: TRY004 - a bad file, as json's own
    try:
        return tuple(CidrConflict(str(r["node"]), str(r["cidr"]), str(r["owner"]), str(r["ownerCIDR"])) for r in rows)
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path(state_file)}: a row lacks {e}") from None
