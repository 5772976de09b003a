"""routesync.wireguard.plan (pure): the device's peers from Node records, refusals, the key
rotation's phases, and the change that turns a device's state into the desired one."""

from __future__ import annotations

from routesync.model import NodeRecord
from routesync.wireguard import keys
from routesync.wireguard import plan as wgplan
from routesync.wireguard.model import (
    NEXT_KEY_ANNOTATION,
    PORT_ANNOTATION,
    PUBLIC_KEY_ANNOTATION,
    SWITCH_AT_ANNOTATION,
    LocalKeys,
    WgDevice,
    WgDeviceState,
    WgPeer,
    WgPeerState,
)

ME = NodeRecord("node-1", ("192.168.77.11", "fd00:77::b"), ("10.244.1.0/24",))
PRIV = {n: keys.generate() for n in ("node-1", "node-2", "node-3", "next-2", "next-1")}
PUB = {n: keys.public_of(k) for n, k in PRIV.items()}


def peer(name: str, addrs: tuple[str, ...], cidrs: tuple[str, ...], **ann: str) -> NodeRecord:
    return NodeRecord(name, addrs, cidrs, tuple(sorted(ann.items())))


def node2(**extra: str) -> NodeRecord:
    return peer("node-2", ("192.168.77.12", "fd00:77::c"), ("fd00:10:244:2::/64", "10.244.2.0/24"),
                **{PUBLIC_KEY_ANNOTATION: PUB["node-2"], **extra})


def run(peers: list[NodeRecord], now: float = 100.0, local: LocalKeys | None = None) -> wgplan.WgPlan:
    return wgplan.plan("ferry-wg0", 51820, ME, peers, local or LocalKeys(PRIV["node-1"]), now)


def test_a_peer_is_its_key_its_endpoint_and_its_pod_cidrs() -> None:
    p = run([node2(), peer("node-3", ("fd00:88::d",), ("10.244.3.0/24",),
                           **{PUBLIC_KEY_ANNOTATION: PUB["node-3"], PORT_ANNOTATION: "51999"})])
    by_key = {e.public_key: e for e in p.device.peers}
    assert by_key[PUB["node-2"]] == WgPeer(PUB["node-2"], "192.168.77.12:51820",
                                           ("10.244.2.0/24", "fd00:10:244:2::/64"))
    assert by_key[PUB["node-3"]].endpoint == "[fd00:88::d]:51999"  # no IPv4 transport: IPv6, its own port
    assert p.public_key == PUB["node-1"] and p.device.private_key == PRIV["node-1"]
    assert dict(p.publish) == {PUBLIC_KEY_ANNOTATION: PUB["node-1"], PORT_ANNOTATION: "51820"}
    assert not p.refused and not p.waiting and not p.promote and p.wake_at is None
    assert PRIV["node-1"] not in repr(p)  # no private key in a log line


def test_no_key_yet_waits_and_a_bad_key_or_port_is_refused_naming_it() -> None:
    p = run([peer("node-3", ("192.168.88.13",), ("10.244.3.0/24",)),
             node2(**{PUBLIC_KEY_ANNOTATION: "bm90IGEga2V5"}),
             peer("node-4", ("192.168.88.14",), ("10.244.4.0/24",),
                  **{PUBLIC_KEY_ANNOTATION: PUB["node-3"], PORT_ANNOTATION: "http"})])
    assert p.device.peers == ()  # fail closed: none of them is on the device
    assert p.waiting == ("node-3",)
    reasons = {r.peer: r.reason for r in p.refused}
    assert PUBLIC_KEY_ANNOTATION in reasons["node-2"] and PORT_ANNOTATION in reasons["node-4"]


def test_two_nodes_with_one_key_are_both_refused() -> None:
    twin = peer("node-3", ("192.168.88.13",), ("10.244.3.0/24",), **{PUBLIC_KEY_ANNOTATION: PUB["node-2"]})
    p = run([node2(), twin])
    assert p.device.peers == () and {r.peer for r in p.refused} == {"node-3"}


def test_a_peers_rotation_is_staged_then_switched_at_its_instant() -> None:
    announced = node2(**{NEXT_KEY_ANNOTATION: PUB["next-2"], SWITCH_AT_ANNOTATION: "102.500"})
    before = run([announced], now=101.0)
    entries = {e.public_key: e.allowed_ips for e in before.device.peers}
    assert entries == {PUB["node-2"]: ("10.244.2.0/24", "fd00:10:244:2::/64"), PUB["next-2"]: ()}
    assert before.wake_at == 102.5
    after = run([announced], now=102.5)
    assert [(e.public_key, e.allowed_ips) for e in after.device.peers] == \
        [(PUB["next-2"], ("10.244.2.0/24", "fd00:10:244:2::/64"))]
    assert after.wake_at is None
    # the switch as one transaction: the old key removed first, the allowed IPs replaced on the new
    ch = wgplan.change(state_of(before.device), after.device)
    assert [(c.public_key, c.remove, c.allowed_ips) for c in ch.peers] == [
        (PUB["node-2"], True, ()), (PUB["next-2"], False, ("10.244.2.0/24", "fd00:10:244:2::/64"))]
    # the new key's entry, given the Pods now, makes a handshake at once (its own at the instant
    # may have come before this Node knew the key)
    assert [c.kick for c in ch.peers] == [False, True]


def test_a_switch_read_late_kicks_the_new_key_and_an_unchanged_peer_is_not_kicked() -> None:
    announced = node2(**{NEXT_KEY_ANNOTATION: PUB["next-2"], SWITCH_AT_ANNOTATION: "102.500"})
    before = run([node2()], now=101.0)  # the announcement not read before the instant
    late = run([announced], now=103.0)
    ch = wgplan.change(state_of(before.device), late.device)
    assert [(c.public_key, c.remove, c.kick) for c in ch.peers] == [(PUB["node-2"], True, False),
                                                                   (PUB["next-2"], False, True)]
    # staged without allowed IPs: kicked as it is added, a handshake its Node cannot read yet, so
    # that this device starts none at the instant, when the rotating Node's own goes (no crossing)
    staged = run([announced], now=101.0)
    ch = wgplan.change(state_of(before.device), staged.device)
    assert [(c.public_key, c.kick) for c in ch.peers] == [(PUB["next-2"], True)]
    assert wgplan.change(state_of(staged.device), staged.device).empty  # once only
    # an endpoint that moved: set again, not kicked
    moved = run([peer("node-2", ("192.168.77.99",), ("10.244.2.0/24",), **{PUBLIC_KEY_ANNOTATION: PUB["node-2"]})])
    ch = wgplan.change(state_of(before.device), moved.device)
    assert [(c.public_key, c.kick) for c in ch.peers] == [(PUB["node-2"], False)]


def test_this_nodes_rotation_is_published_then_switched_and_kicks_every_peer() -> None:
    lk = LocalKeys(PRIV["node-1"], PRIV["next-1"], 105.0)
    before = run([node2()], now=103.0, local=lk)
    assert dict(before.publish)[NEXT_KEY_ANNOTATION] == PUB["next-1"]
    assert dict(before.publish)[SWITCH_AT_ANNOTATION] == "105.000"
    assert before.device.private_key == PRIV["node-1"] and not before.promote and before.wake_at == 105.0
    after = run([node2()], now=105.0, local=lk)
    assert after.device.private_key == PRIV["next-1"] and after.promote and after.public_key == PUB["next-1"]
    assert dict(after.publish)[PUBLIC_KEY_ANNOTATION] == PUB["next-1"]
    assert set(after.unpublish) == {NEXT_KEY_ANNOTATION, SWITCH_AT_ANNOTATION}
    ch = wgplan.change(state_of(before.device), after.device)
    assert ch.private_key == PRIV["next-1"] and [c.kick for c in ch.peers] == [True]
    rec = dict(wgplan.annotate({"other": "x", **dict(before.publish)}, after))
    assert NEXT_KEY_ANNOTATION not in rec and rec["other"] == "x" and rec[PUBLIC_KEY_ANNOTATION] == PUB["next-1"]


def test_a_synced_device_needs_no_change_and_a_drifted_one_is_repaired() -> None:
    want = run([node2()]).device
    assert wgplan.change(state_of(want), want).empty
    drifted = WgDeviceState(keys.public_of(want.private_key), 51820,
                            (WgPeerState(PUB["node-3"], None, ("10.244.2.0/24",)),), private_key=want.private_key)
    ch = wgplan.change(drifted, want)
    assert [(c.public_key, c.remove) for c in ch.peers] == [(PUB["node-3"], True), (PUB["node-2"], False)]
    assert ch.private_key is None and ch.listen_port is None
    fresh = wgplan.change(None, want)
    # a new device (made again after its process was killed): every peer kicked into a handshake
    assert fresh.private_key == want.private_key and fresh.listen_port == 51820 and all(c.kick for c in fresh.peers)
    empty = WgDeviceState(None, 0)
    assert all(c.kick for c in wgplan.change(empty, want).peers)


def state_of(d: WgDevice) -> WgDeviceState:
    return WgDeviceState(keys.public_of(d.private_key), d.listen_port,
                         tuple(WgPeerState(p.public_key, p.endpoint, p.allowed_ips, p.keepalive) for p in d.peers),
                         private_key=d.private_key)


def test_the_overheads() -> None:
    assert (wgplan.overhead(False), wgplan.overhead(True)) == (60, 80)


def test_a_peer_without_a_handshake_since_the_switch_is_removed_and_made_again_kicked() -> None:
    since = 1000.0
    have = WgDeviceState(PUB["node-1"], 51820, (
        WgPeerState(PUB["node-2"], "192.168.77.12:51820", ("10.244.2.0/24",), 25, last_handshake=999.0),
        WgPeerState(PUB["node-3"], "192.168.88.13:51821", ("10.244.3.0/24",), 0, last_handshake=1000.5),
        WgPeerState(PUB["next-2"], "192.168.77.12:51820", (), 0, last_handshake=0.0),  # staged: no traffic
    ), PRIV["node-1"])
    ch = wgplan.rehandshake(have, since)
    assert [(p.public_key, p.remove) for p in ch.peers] == [(PUB["node-2"], True), (PUB["node-2"], False)]
    again = ch.peers[1]
    assert (again.endpoint, again.allowed_ips, again.keepalive, again.kick) == \
        ("192.168.77.12:51820", ("10.244.2.0/24",), 25, True)
    assert ch.private_key is None and ch.listen_port is None
    assert wgplan.rehandshake(have, since, among=[PUB["node-3"]]).empty  # node-3 has had its handshake
    assert wgplan.rehandshake(have, 998.0).empty


def test_a_peers_next_key_is_staged_only_within_stage_ahead_of_its_instant() -> None:
    """WireGuard holds a peer back from a handshake for REKEY_TIMEOUT after its last: a staged
    key's first handshake (its kick) covers the switch time only when it is made less than that
    before it, so a long lead stages later, at a wake of its own."""
    at = 200.0
    announced = node2(**{NEXT_KEY_ANNOTATION: PUB["next-2"], SWITCH_AT_ANNOTATION: f"{at:.3f}"})
    early = run([announced], now=at - 30)
    assert [e.public_key for e in early.device.peers] == [PUB["node-2"]]
    assert early.wake_at == at - wgplan.STAGE_AHEAD < at
    staged = run([announced], now=at - wgplan.STAGE_AHEAD)
    assert {e.public_key for e in staged.device.peers} == {PUB["node-2"], PUB["next-2"]}
    assert staged.wake_at == at
    assert wgplan.STAGE_AHEAD < 5.0  # WireGuard's REKEY_TIMEOUT


def side(me: str, other: str, routed: bool = True) -> WgDevice:
    """``me``'s device with ``other``'s key as its one peer (``routed``: with its Pods)."""
    cidrs = ("10.244.1.0/24",) if other == "node-1" else ("10.244.2.0/24",)
    return WgDevice("ferry-wg0", 51820, PRIV[me], (WgPeer(PUB[other], "192.168.77.1:51820", cidrs if routed else ()),))


def alone(me: str) -> WgDeviceState:
    """``me``'s device as it exists, with no peer yet."""
    return WgDeviceState(PUB[me], 51820, (), private_key=PRIV[me])


def test_at_first_contact_only_the_lower_key_kicks_and_the_other_awaits_its_handshake() -> None:
    """Two Nodes that read each other's keys at one instant: if both kicked, their initiations
    could cross and lose the session (test_crossed_handshakes.py); the leader's alone goes."""
    leader, follower = sorted(("node-1", "node-2"), key=lambda n: PUB[n])
    assert wgplan.leads(PUB[leader], PUB[follower]) and not wgplan.leads(PUB[follower], PUB[leader])
    led = wgplan.change(alone(leader), side(leader, follower))
    followed = wgplan.change(alone(follower), side(follower, leader))
    assert [(c.public_key, c.kick) for c in led.peers] == [(PUB[follower], True)] and led.awaited == ()
    assert [(c.public_key, c.kick) for c in followed.peers] == [(PUB[leader], False)]
    assert followed.awaited == (PUB[leader],)
    # asked for explicitly, kicked on either side
    assert wgplan.change(alone(follower), side(follower, leader), kick=[PUB[leader]]).peers[0].kick
    # a new device (or a new private key) still kicks every peer: its sessions ended
    fresh = wgplan.change(None, side(follower, leader))
    assert [c.kick for c in fresh.peers] == [True] and fresh.awaited == ()
    rekeyed = WgDeviceState(PUB["next-1"], 51820, (), private_key=PRIV["next-1"])
    assert [c.kick for c in wgplan.change(rekeyed, side(follower, leader)).peers] == [True]


def test_a_key_switch_is_not_first_contact_both_sides_kick() -> None:
    """The Pods' allowed IPs moving to a key (staged without them, or held by the Node's previous
    key: a switch read late) is kicked whichever key is lower: the late reader's handshake."""
    leader, follower = sorted(("node-1", "node-2"), key=lambda n: PUB[n])
    for me, other in ((leader, follower), (follower, leader)):
        staged = wgplan.change(state_of(side(me, other, routed=False)), side(me, other))
        assert [(c.public_key, c.kick) for c in staged.peers] == [(PUB[other], True)] and staged.awaited == ()
        old = WgDevice("ferry-wg0", 51820, PRIV[me], (WgPeer(PUB["next-2"], "192.168.77.1:51820",
                                                              side(me, other).peers[0].allowed_ips),))
        moved = wgplan.change(state_of(old), side(me, other))
        assert [(c.public_key, c.remove, c.kick) for c in moved.peers] == [(PUB["next-2"], True, False),
                                                                          (PUB[other], False, True)]
        assert moved.awaited == ()


def test_a_follower_kicks_a_first_contact_without_a_handshake_since_it_was_added() -> None:
    have = WgDeviceState(PUB["node-1"], 51820, (
        WgPeerState(PUB["node-2"], "192.168.77.12:51820", ("10.244.2.0/24",), 0, last_handshake=0.0),
        WgPeerState(PUB["node-3"], "192.168.88.13:51821", ("10.244.3.0/24",), 0, last_handshake=1000.5),
    ), PRIV["node-1"])
    ch = wgplan.kick(have, 1000.0, [PUB["node-2"], PUB["node-3"]])
    assert [(p.public_key, p.remove, p.kick, p.endpoint, p.allowed_ips) for p in ch.peers] == [
        (PUB["node-2"], False, True, "192.168.77.12:51820", ("10.244.2.0/24",))]  # kicked, not removed
    assert wgplan.kick(have, 1000.0, [PUB["node-3"]]).empty  # its handshake came
