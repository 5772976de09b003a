"""What a pass finds wrong in the cluster's records, told when it starts and when it ends (not every
pass): a peer's MAC annotation and its neighbour entry disagreeing (fast path, ``macSource:
both``; counted for the metrics), and Pod CIDRs two Nodes claim (``routesync.planclaims``; the
status file ``show`` reads, written when the set changes)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from . import conflicts as conflicts_mod

if TYPE_CHECKING:
    from .config import Config
    from .model import CidrConflict, DesiredState, MacDisagreement

log = logging.getLogger(__name__)


class MacObserver(Protocol):
    """The findings' part of ``routesync.daemon.DaemonObserver``."""

    def mac_disagreement(self, peer: str) -> None:
        """Fast path, macSource both: ``peer``'s annotation and neighbour MAC started to differ."""
        ...


class Findings:
    def __init__(self, config: Config, observer: MacObserver | None = None) -> None:
        self.config = config
        self.observer = observer
        self.mac_disagreements = 0  # (peer, family, annotation MAC, neighbour MAC) seen starting
        self._disagreeing: set[MacDisagreement] = set()
        self._conflicts: tuple[CidrConflict, ...] | None = None  # the Pod CIDR conflicts last reported

    def report(self, desired: DesiredState) -> None:
        self._count_disagreements(desired)
        self._report_conflicts(desired.cidr_conflicts)

    def _count_disagreements(self, desired: DesiredState) -> None:
        now = set(desired.mac_disagreements)
        for d in sorted(now - self._disagreeing, key=repr):
            log.warning("next-hop MAC of %s (IPv%d): annotation says %s, the neighbour table %s; "
                        "using the annotation", d.peer, d.family, d.annotation, d.neighbor)
            self.mac_disagreements += 1
            if self.observer is not None:
                self.observer.mac_disagreement(d.peer)
        self._disagreeing = now

    def _report_conflicts(self, found: tuple[CidrConflict, ...]) -> None:
        """A log line when a conflict starts and when it ends, and the status file ``show`` reads,
        written when the set changes (and on the first pass, so an earlier run's does not linger)."""
        before = self._conflicts
        if found == before:
            return
        name = self.config.node_name
        for c in sorted(set(found) - set(before or ()), key=repr):
            log.warning("%s", conflicts_mod.describe(c, name))
        for c in sorted(set(before or ()) - set(found), key=repr):
            log.info("Pod CIDR conflict over: %s of %s no longer overlaps %s of %s", c.cidr, c.node, c.owner_cidr,
                     c.owner)
        try:
            conflicts_mod.write(self.config.state_file, found)
        except OSError as e:
            log.warning("Pod CIDR conflicts not written for show: %s", e)
        self._conflicts = found
