"""WireGuard in route-sync's loop: the daemon's seam to it (``routesync.feature.Feature``), as BGP
has its speaker.  In each pass the keys and the time decide the device (:class:`.node.WireGuardNode`):
this Node's record publishes its keys, the desired state carries the device
(``DesiredState.wireguard``), and once it is applied a rotation's switch is finished on disk and
the device of the rotation's next instant is planned ahead.  Between passes it owns the rotation's
timing: at that instant (wall-clock: every Node switches within a millisecond or two of it, not a
pass later) only the device's difference is applied (:meth:`WireGuardAppliers.switch_wireguard`)
and a pass follows; a pass is also asked for when :meth:`.node.WireGuardNode.due`, and a full one
when the device was made again (its generation)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from routesync.feature import Need

from .model import PUBLIC_KEY_ANNOTATION
from .node import WireGuardNode
from .plan import annotate

if TYPE_CHECKING:
    from routesync.config import Config
    from routesync.model import DesiredState, LocalFacts, NodeRecord

    from .model import WgSpec
    from .plan import WgPlan

log = logging.getLogger(__name__)


class WireGuardAppliers(Protocol):
    """WireGuard's part of ``routesync.daemon.Appliers`` (``routesync.apply.NodeAppliers``)."""

    def wireguard_generation(self) -> int:
        """The WireGuard device's generation (its ifindex; 0: none, or no encryption): a new one
        (the device made again) makes the next pass full."""
        ...

    def wireguard_implementation(self) -> str | None:
        """kernel | userspace (None: no encryption)."""
        ...

    def switch_wireguard(self, spec: WgSpec) -> None:
        """Between passes, at a key rotation's switch time: the WireGuard device to ``spec`` (its
        difference from what the last pass applied), nothing else."""
        ...


class WireGuardLoop:
    """``trafficEncryptionMode: wireguard``: the keys, each pass's plan, the rotation's switch."""

    def __init__(self, config: Config, appliers: WireGuardAppliers,
                 wall: Callable[[], float] = time.time) -> None:
        self.node = WireGuardNode(config)
        self.appliers = appliers
        self.wall = wall  # the key rotation's switch times are wall-clock
        self._pass: WgPlan | None = None  # the plan of the pass under way (own_record)
        self._ahead: tuple[float, WgSpec] | None = None  # (switch time, the device then)
        self._generation = 0  # the device's, at the last look

    def start(self) -> None:
        self._generation = self._device_generation()

    def own_record(self, me: NodeRecord, peers: Sequence[NodeRecord]) -> NodeRecord:
        wg = self._pass = self.node.plan_for(me, peers, self.wall())
        return replace(me, annotations=annotate(dict(me.annotations), wg), retracted=me.retracted | set(wg.unpublish))

    def desire(self, desired: DesiredState, facts: LocalFacts) -> None:
        if self._pass is not None:
            desired.wireguard = self.node.spec(self._pass, desired.gateway_addresses, desired.mtu)

    def applied(self, me: NodeRecord, peers: Sequence[NodeRecord], desired: DesiredState) -> None:
        wg = self._pass
        if wg is None:
            return
        names = {dict(n.annotations).get(PUBLIC_KEY_ANNOTATION, ""): n.name for n in peers}
        replaced = {p.peer: p.fallback for p in desired.peers if p.fallback is not None}
        self.node.applied(wg, self.appliers.wireguard_implementation(), names, replaced)
        ahead = self.node.plan_ahead(me, peers, wg)
        self._ahead = None if ahead is None else (
            ahead[0], self.node.spec(ahead[1], desired.gateway_addresses, desired.mtu))

    def tick(self) -> Need:
        need = Need.NOTHING
        if self._ahead is not None and self.wall() >= self._ahead[0]:
            self._switch(self._ahead)
            need = Need.PASS  # the pass of the new instant: publish, finish the rotation
        if self.node.due(self.wall()):
            need = Need.PASS
        now = self._device_generation()
        if now != self._generation:
            if self._generation:
                log.warning("WireGuard device gone or made again (ifindex %s -> %s): re-installing",
                            self._generation, now)
            self._generation, need = now, Need.FULL
        return need

    def wake_in(self) -> float | None:
        """A key rotation's switch: on time, not at the loop's next look."""
        return None if self._ahead is None else max(0.0, self._ahead[0] - self.wall())

    def _switch(self, ahead: tuple[float, WgSpec]) -> None:
        """A key rotation's switch time: the device as the last pass planned it for that instant."""
        at, spec = ahead
        self._ahead = None
        try:
            self.appliers.switch_wireguard(spec)
            log.info("WireGuard: switched at the rotation's instant (%.1f ms after it)", (self.wall() - at) * 1e3)
        except Exception as e:  # noqa: BLE001 - the pass right after applies it again
            log.warning("WireGuard: the rotation's switch not applied ahead of the pass: %s", e)

    def _device_generation(self) -> int:
        try:
            return self.appliers.wireguard_generation()
        except Exception as e:  # noqa: BLE001 - the next look tries again
            log.warning("cannot read the WireGuard device's generation: %s", e)
            return 0
