"""routesync.wireguard.loop, the daemon's seam to WireGuard, without a device: a pass publishes
the keys and carries the device, a rotation's switch is applied at its instant (its tick, woken
for it) and asks for the pass of the new instant, a device made again asks for a full pass."""

from __future__ import annotations

import os
from collections.abc import Collection

import pytest

from routesync import planner
from routesync.config import from_dict
from routesync.feature import Need
from routesync.model import DesiredState, NodeRecord
from routesync.wireguard import keys
from routesync.wireguard.loop import CONFIRM_AFTER, CONFIRM_EVERY, REKEY_TIMEOUT, WireGuardLoop
from routesync.wireguard.model import NEXT_KEY_ANNOTATION, PUBLIC_KEY_ANNOTATION, SWITCH_AT_ANNOTATION, WgSpec
from tests.routesync.standins import RecordingAppliers

ME = NodeRecord("node-1", ("192.168.77.11",), ("10.244.1.0/24",))
PEER = NodeRecord("node-2", ("192.168.77.12",), ("10.244.2.0/24",),
                  ((PUBLIC_KEY_ANNOTATION, keys.public_of(keys.generate())),))


class DeviceAppliers(RecordingAppliers):
    def __init__(self) -> None:
        super().__init__()
        self.device = 0  # the device's generation (ifindex)
        self.switched: list[WgSpec] = []
        self.looked: list[tuple[float, tuple[str, ...]]] = []  # rehandshake_wireguard's calls
        self.stale: list[tuple[str, ...]] = []  # what its next calls answer
        self.awaited: list[tuple[float, tuple[str, ...]]] = []  # first contacts its next sync leaves to the peer
        self.kicked: list[tuple[float, tuple[str, ...]]] = []  # kick_wireguard's calls

    def wireguard_generation(self) -> int:
        return self.device

    def wireguard_implementation(self) -> str | None:
        return "userspace"

    def switch_wireguard(self, spec: WgSpec) -> None:
        self.switched.append(spec)

    def rehandshake_wireguard(self, since: float, among: Collection[str] | None = None) -> tuple[str, ...]:
        self.looked.append((since, tuple(among or ())))
        return self.stale.pop(0) if self.stale else ()

    def wireguard_awaited(self) -> tuple[tuple[float, tuple[str, ...]], ...]:
        out, self.awaited = tuple(self.awaited), []
        return out

    def kick_wireguard(self, since: float, among: Collection[str]) -> tuple[str, ...]:
        self.kicked.append((since, tuple(among)))
        return tuple(among)


class Rig:
    """A :class:`WireGuardLoop` for node-1 over :class:`DeviceAppliers`, on a wall clock the test
    moves (``now[0]``), and one pass of route-sync through it."""

    def __init__(self, tmp_path: str) -> None:
        self.cfg = from_dict({"nodeName": "node-1", "podCIDRs": ["10.244.1.0/24"], "trafficEncryptionMode": "wireguard",
                              "stateFile": os.path.join(tmp_path, "state", "node-state.json"),
                              "wireguard": {"keyDir": os.path.join(tmp_path, "keys"), "rotationLead": 2}})
        self.now = [1_000_000.0]
        self.apl = DeviceAppliers()
        self.wg = WireGuardLoop(self.cfg, self.apl, wall=lambda: self.now[0])
        self.wg.start()
        self.facts = self.apl.prepare(self.cfg, planner.tunnel_spec(self.cfg), None, ())

    def one_pass(self, peers: list[NodeRecord] | None = None) -> tuple[NodeRecord, DesiredState]:
        """A pass with ``peers`` (None: PEER): this Node's record and what it desired."""
        peers = [PEER] if peers is None else peers
        me = self.wg.own_record(planner.self_record(self.cfg, ME, self.facts), peers)
        desired = planner.plan(self.cfg, me, peers, self.facts)
        self.wg.desire(desired, self.facts)
        self.wg.applied(me, peers, desired)
        return me, desired


def test_a_rotation_switches_at_its_instant_and_a_new_device_asks_for_a_full_pass(tmp_path: str) -> None:
    rig = Rig(tmp_path)
    now, apl, wg = rig.now, rig.apl, rig.wg

    def one_pass() -> NodeRecord:
        me, desired = rig.one_pass()
        assert desired.wireguard is not None and len(desired.wireguard.device.peers) == 1
        return me

    me = one_pass()
    assert dict(me.annotations)[PUBLIC_KEY_ANNOTATION] and wg.wake_in() is None
    assert wg.tick() == Need.NOTHING
    keys.start_rotation(wg.node.wg.key_dir)  # rotate-key
    assert wg.tick() == Need.PASS  # to be announced
    me = one_pass()
    announced = dict(me.annotations)[NEXT_KEY_ANNOTATION]
    assert wg.wake_in() == 2.0
    now[0] += 1.0
    assert wg.tick() == Need.NOTHING and not apl.switched and wg.wake_in() == 1.0
    now[0] += 1.0
    assert wg.tick() == Need.PASS  # the pass of the new instant follows the switch
    assert [keys.public_of(s.device.private_key) for s in apl.switched] == [announced]
    assert wg.wake_in() == CONFIRM_AFTER  # a look at the new key's sessions
    one_pass()
    assert wg.tick() == Need.NOTHING and len(apl.switched) == 1
    apl.device = 7  # the device made (again)
    assert wg.tick() == Need.FULL
    assert wg.tick() == Need.NOTHING


def test_after_its_own_switch_a_node_makes_again_each_peer_without_a_handshake_until_wireguards_retry(
        tmp_path: str) -> None:
    """Initiations that crossed at the switch leave both sides without a session for 5 s
    (tests/routesync/wireguard/test_crossed_handshakes.py): the rotating Node looks
    CONFIRM_AFTER after its switch and makes again each peer still without a handshake, every
    CONFIRM_EVERY while one is missing, not past WireGuard's own retry.  A peer's switch, or the
    first key a process applies, is not looked at."""
    rig = Rig(tmp_path)
    now, apl, wg = rig.now, rig.apl, rig.wg
    peer_key = dict(PEER.annotations)[PUBLIC_KEY_ANNOTATION]

    one_pass = rig.one_pass
    one_pass([PEER])
    assert wg.wake_in() is None  # the first key this process applies: nothing to confirm
    # a peer's own rotation, switched at its instant here: not this Node's key, not looked at
    nxt = keys.public_of(keys.generate())
    rotating = NodeRecord(PEER.name, PEER.transport_addresses, PEER.pod_cidrs, tuple(sorted(
        ((PUBLIC_KEY_ANNOTATION, peer_key), (NEXT_KEY_ANNOTATION, nxt),
         (SWITCH_AT_ANNOTATION, f"{now[0] + 1:.3f}")))))
    one_pass([rotating])
    now[0] += 1.0
    assert wg.tick() == Need.PASS and len(apl.switched) == 1 and wg.wake_in() is None
    one_pass([rotating])
    now[0] += 10.0
    assert wg.tick() == Need.NOTHING and not apl.looked
    # this Node's rotation
    keys.start_rotation(wg.node.wg.key_dir)
    assert wg.tick() == Need.PASS
    one_pass([rotating])
    now[0] += 2.0
    switched_at = now[0]
    assert wg.tick() == Need.PASS and len(apl.switched) == 2
    assert wg.wake_in() == CONFIRM_AFTER
    apl.stale = [(nxt,), (nxt,)]  # no handshake at the first two looks, one at the third
    now[0] += CONFIRM_AFTER - 0.01
    wg.tick()
    assert not apl.looked
    looks = []
    while wg.wake_in() is not None:
        now[0] += wg.wake_in() or 0.0
        wg.tick()
        looks.append(round(now[0] - switched_at, 3))
    assert looks == [CONFIRM_AFTER, CONFIRM_AFTER + CONFIRM_EVERY, CONFIRM_AFTER + 2 * CONFIRM_EVERY]
    assert apl.looked == [(switched_at, (nxt,))] * 3
    one_pass([rotating])  # the rotation finished
    # a peer that never answers: looked at until WireGuard's own retry, no longer
    assert keys.start_rotation(wg.node.wg.key_dir)
    wg.tick()
    one_pass([rotating])
    now[0] += 2.0
    assert wg.tick() == Need.PASS and len(apl.switched) == 3
    apl.looked.clear()
    apl.stale = [(nxt,)] * 100
    while wg.wake_in() is not None:
        now[0] += wg.wake_in() or 0.0
        wg.tick()
    assert 1 < len(apl.looked) <= REKEY_TIMEOUT / CONFIRM_EVERY


def test_a_first_contact_this_node_follows_is_kicked_once_if_no_handshake_came(tmp_path: str) -> None:
    """At first contact only the pair's leader kicks (plan.change); the follower's device reports
    the peers it added without a kick, and the loop kicks them CONFIRM_AFTER later, once (the
    device kicks only those still without a handshake: kick_wireguard), beside a key switch's
    confirmation."""
    rig = Rig(tmp_path)
    now, apl, wg = rig.now, rig.apl, rig.wg
    peer_key = dict(PEER.annotations)[PUBLIC_KEY_ANNOTATION]

    one_pass = rig.one_pass
    one_pass()
    assert wg.wake_in() is None  # nothing left to the peer
    added_at = now[0] - 0.01  # the sync, before the pass's end
    apl.awaited = [(added_at, (peer_key,))]
    one_pass()
    assert wg.wake_in() == pytest.approx(CONFIRM_AFTER - 0.01)
    now[0] += CONFIRM_AFTER - 0.02
    assert wg.tick() == Need.NOTHING and not apl.kicked
    now[0] += wg.wake_in() or 0.0
    assert wg.tick() == Need.NOTHING
    assert apl.kicked == [(added_at, (peer_key,))] and not apl.looked  # a kick, not the peer made again
    assert wg.wake_in() is None  # once: the leader's own handshake, or its retry, does the rest
    # beside this Node's own key switch: each confirmed its own way
    keys.start_rotation(wg.node.wg.key_dir)
    wg.tick()
    one_pass()
    now[0] += 2.0
    apl.awaited = [(now[0], (peer_key,))]
    assert wg.tick() == Need.PASS
    one_pass()
    while wg.wake_in() is not None:
        now[0] += wg.wake_in() or 0.0
        wg.tick()
    assert len(apl.kicked) == 2 and len(apl.looked) == 1
