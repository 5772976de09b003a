"""The seam between route-sync's loop and a feature that rides it beside the routes (WireGuard:
``routesync.wireguard.loop.WireGuardLoop``; NetworkPolicy: ``routesync.policy.node.PolicyNode``),
as BGP has its speaker (``routesync.daemon.BgpSpeaker``).  The daemon holds its features in one
tuple and calls each of them, in that order, from its one thread:

* in every pass: :meth:`Feature.own_record` before this Node's record is published,
  :meth:`Feature.desire` once the routes are planned, :meth:`Feature.applied` once the appliers
  installed the desired state (an exception in any of them fails the pass: logged, retried with
  backoff, the retry full);
* between passes: :meth:`Feature.tick` at every look of the loop (``routesync.daemon.OVS_CHECK_INTERVAL``)
  and when :meth:`Feature.wake_in` says so; what it answers (a :class:`Need`) can ask for a pass;
* :meth:`Feature.start` once, when the loop starts, before its first pass.

A feature is built with what it needs of the appliers (its own part of ``routesync.daemon.Appliers``)
and of the observer."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .model import DesiredState, LocalFacts, NodeRecord


class Need(enum.IntEnum):
    """What a feature's tick asks of the loop (the larger of two is what both ask)."""

    NOTHING = 0
    PASS = 1  # a pass (full if one is due anyway); a pending retry keeps its backoff
    FULL = 2  # a full pass, now: what was installed may be gone (a retry's backoff is cut short)


class Feature(Protocol):
    def start(self) -> None:
        """The loop starts: what later ticks compare with (before the first pass)."""
        ...

    def own_record(self, me: NodeRecord, peers: Sequence[NodeRecord]) -> NodeRecord:
        """This pass: this Node's record with what the feature publishes in it (``me`` when nothing)."""
        ...

    def desire(self, desired: DesiredState, facts: LocalFacts) -> None:
        """This pass, its routes planned: the feature's part of ``desired`` (``desired.full``: a
        full pass), before the appliers install it."""
        ...

    def applied(self, me: NodeRecord, peers: Sequence[NodeRecord], desired: DesiredState) -> None:
        """This pass, ``desired`` installed: what follows from it (before the state file is written)."""
        ...

    def tick(self) -> Need:
        """Between passes: at every look of the loop, and once the time :meth:`wake_in` gave has come."""
        ...

    def wake_in(self) -> float | None:
        """Seconds until the feature's next tick must run at the latest (None: the loop's next look
        is soon enough)."""
        ...
