"""routesync.wireguard.node: the rotation period starts a rotation by itself, the plan a pass ahead
is the switch's, the status file show reads (no private key in it)."""

from __future__ import annotations

import json
import os

from routesync.config import from_dict
from routesync.model import NodeRecord
from routesync.wireguard import keys
from routesync.wireguard.model import NEXT_KEY_ANNOTATION, PUBLIC_KEY_ANNOTATION, SWITCH_AT_ANNOTATION
from routesync.wireguard.node import WireGuardNode, status_path

ME = NodeRecord("node-1", ("192.168.77.11",), ("10.244.1.0/24",))
PEER = NodeRecord("node-2", ("192.168.77.12",), ("10.244.2.0/24",),
                  ((PUBLIC_KEY_ANNOTATION, keys.public_of(keys.generate())),))


def node(tmp_path: str, **wg: object) -> WireGuardNode:
    cfg = from_dict({"nodeName": "node-1", "trafficEncryptionMode": "wireguard",
                     "stateFile": os.path.join(tmp_path, "state", "node-state.json"),
                     "wireguard": {"keyDir": os.path.join(tmp_path, "keys"), **wg}})
    return WireGuardNode(cfg)


def test_the_rotation_period_rotates_and_the_switch_is_planned_ahead(tmp_path: str) -> None:
    n = node(tmp_path, rotationPeriod=3600, rotationLead=2)
    now = 1_000_000.0
    first = n.plan_for(ME, [PEER], now)
    key_file = keys.path(n.wg.key_dir, keys.CURRENT)
    assert NEXT_KEY_ANNOTATION not in dict(first.publish) and not n.due(now)
    n.applied(first, "userspace", {})
    os.utime(key_file, (now - 3601, now - 3601))  # the key is older than the period
    assert n.due(now)
    announced = n.plan_for(ME, [PEER], now)
    pub = dict(announced.publish)
    assert pub[SWITCH_AT_ANNOTATION] == f"{now + 2:.3f}" and pub[NEXT_KEY_ANNOTATION] != pub[PUBLIC_KEY_ANNOTATION]
    ahead = n.plan_ahead(ME, [PEER], announced)
    assert ahead is not None and ahead[0] == now + 2
    _, switched = ahead
    assert switched.public_key == pub[NEXT_KEY_ANNOTATION] and switched.promote
    n.applied(switched, "userspace", {})
    assert keys.read(n.wg.key_dir, keys.NEXT) is None  # finished: next.key is current.key now
    assert keys.public_of(keys.read(n.wg.key_dir, keys.CURRENT) or "") == switched.public_key


def test_the_status_file_says_what_show_prints_and_no_private_key(tmp_path: str, caplog) -> None:  # type: ignore[no-untyped-def]
    n = node(tmp_path)
    bad = NodeRecord("node-3", ("192.168.88.13",), ("10.244.3.0/24",), ((PUBLIC_KEY_ANNOTATION, "bm90"),))
    plan = n.plan_for(ME, [PEER, bad, NodeRecord("node-4", ("192.168.88.14",), ("10.244.4.0/24",))], 5.0)
    n.applied(plan, "userspace", {dict(PEER.annotations)[PUBLIC_KEY_ANNOTATION]: "node-2"}, {"node-2": "tunnel"})
    with open(status_path(n.config.state_file)) as f:
        text = f.read()
    doc = json.loads(text)
    assert doc["implementation"] == "userspace" and doc["replaces"] == {"node-2": "tunnel"}
    assert [p["node"] for p in doc["peers"]] == ["node-2"] and doc["waiting"] == ["node-4"]
    assert [r["node"] for r in doc["refused"]] == ["node-3"]
    assert keys.read(n.wg.key_dir, keys.CURRENT) not in text
    # the log names the refused Node (with the key) and the one without a key, once each
    lines = [r.getMessage() for r in caplog.records]
    assert any("peer node-3 refused" in m and "wireguard-public-key" in m for m in lines)
    assert any("peer node-4 has published no public key" in m for m in lines)
    n.applied(plan, "userspace", {})
    assert len([r for r in caplog.records if "node-4" in r.getMessage()]) == 1
