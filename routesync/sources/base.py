"""The Node source interface every source implements, and the record check they share (a module
of its own so that the implementations import it without importing the package that picks one)."""

from __future__ import annotations

import abc
import ipaddress

from ..model import NodeRecord


class SourceError(Exception):
    """The source cannot give the Nodes now (not synced yet, unreachable)."""


class NodeSource(abc.ABC):
    @abc.abstractmethod
    def list(self) -> list[NodeRecord]:
        """Every Node the source currently knows, this Node included, each name once (a
        Kubernetes object's name; a registry file's, which its record must carry); raises
        SourceError when it has not synced yet.  A list whose records are mostly the very
        objects of the last one (an unchanged Node's record handed over again) lets route-sync
        find what changed without a pass over every Node (``routesync.recordlist``); a
        ``recordlist.NodeList`` (the Kubernetes source's) says what changed itself."""

    @abc.abstractmethod
    def wait_for_change(self, timeout: float) -> bool:
        """Block until the Nodes may have changed since the last :meth:`list` (True) or until
        ``timeout`` seconds pass (False)."""

    @abc.abstractmethod
    def publish_self(self, record: NodeRecord) -> None:
        """Write this Node's record (registry) or patch its annotations (Kubernetes); a no-op
        when nothing changed."""

    def start(self) -> None:
        """Begin watching (background threads, if the source needs any)."""

    def reconnect(self) -> None:
        """Open the watches again (the Node's uplink just moved onto the bridge: connections
        opened before may stall).  Sources that hold no connection ignore it."""

    def wake(self) -> None:
        """Make a :meth:`wait_for_change` return now: another of the daemon's inputs changed
        (the NetworkPolicy watches).  Sources that poll may ignore it."""

    def close(self) -> None:
        """Stop watching and release connections."""


def validate_record(rec: NodeRecord) -> NodeRecord:
    """Normalise addresses and CIDRs; ValueError names what is wrong."""
    if not rec.name or "/" in rec.name or rec.name.startswith("."):
        raise ValueError(f"bad Node name {rec.name!r}")
    addrs = tuple(str(ipaddress.ip_interface(a).ip) for a in rec.transport_addresses)
    cidrs = tuple(str(ipaddress.ip_network(c, strict=True)) for c in rec.pod_cidrs)
    for k, v in rec.annotations:
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f"annotation {k!r} is not a string pair")  # noqa: TRY004
    return NodeRecord(rec.name, addrs, cidrs, tuple(sorted(rec.annotations)))
