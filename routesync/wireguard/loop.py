"""WireGuard in route-sync's loop: the daemon's seam to it (``routesync.feature.Feature``), as BGP
has its speaker.  In each pass the keys and the time decide the device (:class:`.node.WireGuardNode`):
this Node's record publishes its keys, the desired state carries the device
(``DesiredState.wireguard``), and once it is applied a rotation's switch is finished on disk and
the device of the rotation's next instant is planned ahead.  Between passes it owns the rotation's
timing: at that instant (wall-clock: every Node switches within a millisecond or two of it, not a
pass later) only the device's difference is applied (:meth:`WireGuardAppliers.switch_wireguard`)
and a pass follows; a pass is also asked for when :meth:`.node.WireGuardNode.due`, and a full one
when the device was made again (its generation).

After this Node's own key switched, it confirms the new sessions: a peer with no handshake since
the switch :data:`CONFIRM_AFTER` later is made again on the device (its handshake sent at once,
:func:`.plan.rehandshake` says why a kick cannot), and again every :data:`CONFIRM_EVERY` until
WireGuard's own retry (REKEY_TIMEOUT) would come.  Only the rotating Node does it: its peers'
new initiations, made at the same instant, could cross its own again.

At first contact only the pair's leader kicks (:func:`.plan.change`); the follower confirms: a
peer it added without a kick and has no handshake with :data:`CONFIRM_AFTER` later is kicked,
once (the leader's initiation came before the follower had the entry and was dropped; the leader
would try again only after REKEY_TIMEOUT)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from routesync.feature import Need

from .model import NEXT_KEY_ANNOTATION, PUBLIC_KEY_ANNOTATION
from .node import WireGuardNode
from .plan import annotate

if TYPE_CHECKING:
    from routesync.config import Config
    from routesync.model import DesiredState, LocalFacts, NodeRecord

    from .model import WgDevice, WgSpec
    from .plan import WgPlan

log = logging.getLogger(__name__)

CONFIRM_AFTER = 0.25  # s after this Node's key switch: a peer without a handshake by then is made again
CONFIRM_EVERY = 0.5  # s between later looks, while one is still missing
REKEY_TIMEOUT = 5.0  # s: WireGuard's own retry of a handshake; the confirmation stops there


@dataclass
class Confirm:
    """This Node's key switch, whose new sessions are being confirmed; or first contacts this Node
    left to the peer's handshake."""

    since: float  # Unix time the new key was set (a handshake after it is the new key's)
    peers: tuple[str, ...]  # public keys of the peers with allowed IPs then
    next_at: float  # the next look
    first_contact: bool = False  # peers added without a kick (this Node follows): one look, a kick


class WireGuardAppliers(Protocol):
    """WireGuard's part of ``routesync.daemon.Appliers`` (``routesync.apply.NodeAppliers``)."""

    def wireguard_generation(self) -> int:
        """The WireGuard device's generation (its ifindex; 0: none, or no encryption): a new one
        (the device made again) makes the next pass full."""
        ...

    def wireguard_implementation(self) -> str | None:
        """kernel | userspace (None: no encryption)."""
        ...

    def wireguard_awaited(self) -> tuple[tuple[float, tuple[str, ...]], ...]:
        """The peers the device's syncs since the last call added at first contact without a kick
        (this Node follows): (Unix time before the sync, their public keys)."""
        ...

    def kick_wireguard(self, since: float, among: Collection[str]) -> tuple[str, ...]:
        """The device's peers of ``among`` with allowed IPs and no handshake since ``since`` (Unix
        time) kicked; their public keys."""
        ...

    def switch_wireguard(self, spec: WgSpec) -> None:
        """Between passes, at a key rotation's switch time: the WireGuard device to ``spec`` (its
        difference from what the last pass applied), nothing else."""
        ...

    def rehandshake_wireguard(self, since: float, among: Collection[str] | None = None) -> tuple[str, ...]:
        """The device's peers (of ``among``) with allowed IPs and no handshake since ``since``
        (Unix time) made again, each sending its handshake at once; their public keys."""
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
        self._private: str | None = None  # the private key last applied (None: none yet)
        self._pass_at = 0.0  # when the pass under way planned
        self._confirms: list[Confirm] = []
        self._names: dict[str, str] = {}  # public key -> Node, as of the last pass

    def start(self) -> None:
        self._generation = self._device_generation()

    def own_record(self, me: NodeRecord, peers: Sequence[NodeRecord]) -> NodeRecord:
        self._pass_at = self.wall()
        wg = self._pass = self.node.plan_for(me, peers, self._pass_at)
        return replace(me, annotations=annotate(dict(me.annotations), wg), retracted=me.retracted | set(wg.unpublish))

    def desire(self, desired: DesiredState, facts: LocalFacts) -> None:
        if self._pass is not None:
            desired.wireguard = self.node.spec(self._pass, desired.gateway_addresses, desired.mtu)

    def applied(self, me: NodeRecord, peers: Sequence[NodeRecord], desired: DesiredState) -> None:
        wg = self._pass
        if wg is None:
            return
        names = {dict(n.annotations).get(PUBLIC_KEY_ANNOTATION, ""): n.name for n in peers}
        self._names = {**{dict(n.annotations).get(NEXT_KEY_ANNOTATION, ""): n.name for n in peers}, **names}
        self._key_set(wg.device, self._pass_at)
        self._await_first_contacts()
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
        for c in [c for c in self._confirms if self.wall() >= c.next_at]:
            if c.first_contact:
                self._confirm_first_contacts(c)
            else:
                self._confirm_sessions(c)
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
        """A key rotation's switch, a look at its new sessions: on time, not at the loop's next look."""
        at = [c.next_at for c in self._confirms] + ([self._ahead[0]] if self._ahead else [])
        return max(0.0, min(at) - self.wall()) if at else None

    def _switch(self, ahead: tuple[float, WgSpec]) -> None:
        """A key rotation's switch time: the device as the last pass planned it for that instant."""
        at, spec = ahead
        self._ahead = None
        try:
            t0 = self.wall()
            self.appliers.switch_wireguard(spec)
            self._key_set(spec.device, t0)
            log.info("WireGuard: the device as planned for the rotation's instant, applied %.1f ms after it",
                     (self.wall() - at) * 1e3)
        except Exception as e:  # noqa: BLE001 - the pass right after applies it again
            log.warning("WireGuard: the rotation's switch not applied ahead of the pass: %s", e)

    def _key_set(self, device: WgDevice, at: float) -> None:
        """``device`` applied from ``at`` on: when its private key is a new one (not the first this
        process applies), its new sessions are confirmed."""
        before, self._private = self._private, device.private_key
        if before is None or before == device.private_key:
            return
        peers = tuple(p.public_key for p in device.peers if p.allowed_ips)
        self._confirms = [c for c in self._confirms if c.first_contact]  # a previous switch's: superseded
        if peers:
            self._confirms.append(Confirm(since=at, peers=peers, next_at=at + CONFIRM_AFTER))

    def _await_first_contacts(self) -> None:
        """The peers the pass added at first contact without a kick: looked at once, CONFIRM_AFTER on."""
        try:
            awaited = self.appliers.wireguard_awaited()
        except Exception as e:  # noqa: BLE001 - the leader's retry still comes
            log.warning("WireGuard: cannot read the first contacts left to the peers' handshakes: %s", e)
            return
        self._confirms += [Confirm(since=at, peers=peers, next_at=at + CONFIRM_AFTER, first_contact=True)
                           for at, peers in awaited if peers]

    def _confirm_first_contacts(self, c: Confirm) -> None:
        """A peer this Node follows with no handshake yet is kicked (this module's doc)."""
        self._confirms.remove(c)
        try:
            kicked = self.appliers.kick_wireguard(c.since, c.peers)
        except Exception as e:  # noqa: BLE001 - the leader's retry still comes
            log.warning("WireGuard: cannot look at the first contacts' sessions: %s", e)
            return
        if kicked:
            log.info("WireGuard: no handshake from %s %.0f ms after this Node added it (the peer makes it at first "
                     "contact; its initiation came before the entry, or not yet): kicked",
                     ", ".join(sorted(self._names.get(k, k) for k in kicked)), (self.wall() - c.since) * 1e3)

    def _confirm_sessions(self, c: Confirm) -> None:
        """A peer without a handshake since this Node's switch is made again (this module's doc)."""
        try:
            redone = self.appliers.rehandshake_wireguard(c.since, c.peers)
        except Exception as e:  # noqa: BLE001 - WireGuard's own retry still comes
            log.warning("WireGuard: cannot look at the new key's sessions: %s", e)
            redone = ()
        now = self.wall()
        if redone:
            log.warning("WireGuard: no handshake with %s %.0f ms after this Node's key switch (initiations that "
                        "crossed wait 5 s for WireGuard's retry): made again on the device, its handshake sent",
                        ", ".join(sorted(self._names.get(k, k) for k in redone)), (now - c.since) * 1e3)
        if not redone or now + CONFIRM_EVERY > c.since + REKEY_TIMEOUT:
            self._confirms.remove(c)
        else:
            c.next_at = now + CONFIRM_EVERY

    def _device_generation(self) -> int:
        try:
            return self.appliers.wireguard_generation()
        except Exception as e:  # noqa: BLE001 - the next look tries again
            log.warning("cannot read the WireGuard device's generation: %s", e)
            return 0
