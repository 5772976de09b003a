"""ovs-vswitchd as route-sync's loop watches it between passes: which instance runs (a new one has
lost its flows: the next pass is full), whether its flows are being restored (flow-restore-wait:
that pass waits, at most ``RESTORE_WAIT_MAX``), the uplink's pass-through flows when no pass can
run, and the tunnels' unanswered next hops."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from . import planner
from .feature import Need

if TYPE_CHECKING:
    from .config import Config
    from .model import UplinkSpec

log = logging.getLogger(__name__)

# s a new ovs-vswitchd's full pass waits for its flows to be restored (flow-restore-wait cleared);
# after that route-sync puts its flows back anyway (a restore that hangs must not keep the Node down)
RESTORE_WAIT_MAX = 30.0


class OvsAppliers(Protocol):
    """ovs-vswitchd's part of ``routesync.daemon.Appliers`` (``routesync.apply.NodeAppliers``)."""

    def restore_host_path(self, uplink: UplinkSpec) -> bool:
        """Only the uplink's pass-through flows (the Node's own way out, when its uplink is on the
        bridge), without a pass: when the source cannot list.  Idempotent; whether any were put
        back.  An exception is logged; the pass reports the source's error."""
        ...

    def retry_tunnel_neighbours(self, now: float | None = None) -> list[tuple[str, str]]:
        """Between passes: probe the last apply's unresolved tunnel next hops again (rate-limited
        by the applier; ``now``: a monotonic time, for tests) and write those the kernel now
        knows into OVS's cache; what was written.  Idempotent.  An exception is logged; the next
        full pass tries again."""
        ...

    def ovs_generation(self) -> int:
        """Which ovs-vswitchd instance runs (one number per instance; 0: none): a change means its
        flows are gone and the next pass is full.  An exception is logged and asked again at the
        next look (``routesync.daemon.OVS_CHECK_INTERVAL``)."""
        ...

    def ovs_restoring(self) -> bool:
        """True while ovs-vswitchd's flows are being put back by whoever restarted it
        (``other_config:flow-restore-wait`` set: Ferry's openvswitch container, or the host's
        ``ovs-ctl restart``): a new instance's full pass waits until it is cleared, then finds
        the restored flows and changes only what differs.  Exceptions are taken as False."""
        ...


class OvsWatch:
    def __init__(self, appliers: OvsAppliers, clock: Callable[[], float]) -> None:
        self.appliers = appliers
        self.clock = clock
        self.generation = 0  # the instance the loop's passes are for (0: none yet)
        self._host_path_for: int | None = None  # ovs-vswitchd instance the uplink flows were put back for
        self._restore_seen: tuple[int, float, bool] | None = None  # (instance, since, warned): flow-restore-wait

    def start(self) -> None:
        """The instance running when the loop starts."""
        try:
            gen = self.appliers.ovs_generation()
        except Exception:  # noqa: BLE001
            gen = 0
        if gen and self.restoring(gen):
            # started beside a restore (both containers restarted): the first pass adds what it
            # wants; once the restore is done, the pass of a "new" instance removes what is stale
            gen = 0
        self.generation = gen

    def look(self) -> Need:
        """Between passes: a full pass when a new instance runs (and its flows are not being
        restored); the tunnels' unanswered next hops asked again."""
        try:
            gen = self.appliers.ovs_generation()
        except Exception as e:  # noqa: BLE001
            log.warning("cannot read the ovs-vswitchd generation: %s", e)
            return Need.NOTHING
        need = Need.NOTHING
        if gen != self.generation and not self.restoring(gen):
            log.warning("ovs-vswitchd restarted (generation %s -> %s): re-installing", self.generation, gen)
            self.generation, need = gen, Need.FULL
        self._retry_tunnel_neighbours()
        return need

    def restoring(self, gen: int) -> bool:
        """ovs-vswitchd instance ``gen``'s flows are being restored (flow-restore-wait set), for
        at most RESTORE_WAIT_MAX from when this was first seen of ``gen``."""
        try:
            waiting = bool(self.appliers.ovs_restoring())
        except Exception as e:  # noqa: BLE001
            log.warning("cannot read flow-restore-wait: %s", e)
            waiting = False
        if not waiting:
            if self._restore_seen is not None:
                log.info("ovs-vswitchd's flows restored (flow-restore-wait cleared) after %.0f ms",
                         (self.clock() - self._restore_seen[1]) * 1e3)
                self._restore_seen = None
            return False
        now = self.clock()
        if self._restore_seen is None or self._restore_seen[0] != gen:
            log.info("ovs-vswitchd (generation %s) waits for its flows to be restored (flow-restore-wait): "
                     "holding the full pass", gen)
            self._restore_seen = (gen, now, False)
        _, since, warned = self._restore_seen
        if now - since <= RESTORE_WAIT_MAX:
            return True
        if not warned:
            log.warning("flow-restore-wait still set after %.0f s: re-installing anyway", RESTORE_WAIT_MAX)
            self._restore_seen = (gen, since, True)
        return False

    def restore_host_path(self, config: Config) -> None:
        """The Node's own way out when it runs through the bridge (the uplink moved onto it),
        without a pass: when the source cannot list (the API server not reached) after
        ovs-vswitchd lost its flows, the Node would otherwise never reach the API server that
        a pass needs.  Once per ovs-vswitchd instance."""
        spec = planner.uplink_spec(config)
        if spec is None:
            return
        try:
            gen = self.appliers.ovs_generation()
            if gen == self._host_path_for:
                return
            if self.appliers.restore_host_path(spec):
                log.warning("source not listed yet: the uplink's pass-through flows put back so the Node "
                            "reaches its API server")
            self._host_path_for = gen
        except Exception as e:  # noqa: BLE001 - the pass reports the source's error; this one is logged
            log.warning("cannot restore the uplink's pass-through flows: %s", e)

    def _retry_tunnel_neighbours(self) -> None:
        """Tunnel next hops that did not answer (a peer not up yet; on a tagged underlay, one
        whose route-sync does not tag yet) are asked again between passes, not only at the next
        full one: OVS learns no IPv6 next hop itself, so until then that tunnel is dark."""
        try:
            self.appliers.retry_tunnel_neighbours()
        except Exception as e:  # noqa: BLE001 - the next full pass tries again
            log.info("tunnel neighbours not retried: %s", e)
