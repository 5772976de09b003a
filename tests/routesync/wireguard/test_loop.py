"""routesync.wireguard.loop, the daemon's seam to WireGuard, without a device: a pass publishes
the keys and carries the device, a rotation's switch is applied at its instant (its tick, woken
for it) and asks for the pass of the new instant, a device made again asks for a full pass."""

from __future__ import annotations

import os

from routesync import planner
from routesync.config import from_dict
from routesync.feature import Need
from routesync.model import NodeRecord
from routesync.wireguard import keys
from routesync.wireguard.loop import WireGuardLoop
from routesync.wireguard.model import NEXT_KEY_ANNOTATION, PUBLIC_KEY_ANNOTATION, WgSpec
from tests.routesync.standins import RecordingAppliers

ME = NodeRecord("node-1", ("192.168.77.11",), ("10.244.1.0/24",))
PEER = NodeRecord("node-2", ("192.168.77.12",), ("10.244.2.0/24",),
                  ((PUBLIC_KEY_ANNOTATION, keys.public_of(keys.generate())),))


class DeviceAppliers(RecordingAppliers):
    def __init__(self) -> None:
        super().__init__()
        self.device = 0  # the device's generation (ifindex)
        self.switched: list[WgSpec] = []

    def wireguard_generation(self) -> int:
        return self.device

    def wireguard_implementation(self) -> str | None:
        return "userspace"

    def switch_wireguard(self, spec: WgSpec) -> None:
        self.switched.append(spec)


def test_a_rotation_switches_at_its_instant_and_a_new_device_asks_for_a_full_pass(tmp_path: str) -> None:
    cfg = from_dict({"nodeName": "node-1", "podCIDRs": ["10.244.1.0/24"], "trafficEncryptionMode": "wireguard",
                     "stateFile": os.path.join(tmp_path, "state", "node-state.json"),
                     "wireguard": {"keyDir": os.path.join(tmp_path, "keys"), "rotationLead": 2}})
    now = [1_000_000.0]
    apl = DeviceAppliers()
    wg = WireGuardLoop(cfg, apl, wall=lambda: now[0])
    wg.start()
    facts = apl.prepare(cfg, planner.tunnel_spec(cfg), None, ())

    def one_pass() -> NodeRecord:
        me = wg.own_record(planner.self_record(cfg, ME, facts), [PEER])
        desired = planner.plan(cfg, me, [PEER], facts)
        wg.desire(desired, facts)
        assert desired.wireguard is not None and len(desired.wireguard.device.peers) == 1
        wg.applied(me, [PEER], desired)
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
    assert wg.wake_in() is None
    one_pass()
    assert wg.tick() == Need.NOTHING and len(apl.switched) == 1
    apl.device = 7  # the device made (again)
    assert wg.tick() == Need.FULL
    assert wg.tick() == Need.NOTHING
