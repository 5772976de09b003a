"""Handshakes that cross, on the real userspace implementation (wireguard-go): the cause of a 5 s
blackout across a key switch, and what ends it (:func:`routesync.wireguard.plan.rehandshake`).

Two devices in one namespace reach each other through a UDP relay of the test's (loopback), which
can hold each side's first handshake initiation until it has the other's and then deliver both:
two initiations crossing on the wire, as when the rotating Node and its peer kick each other at
the switch's instant.  The relay records every WireGuard message it forwards (its type, which
way, when): the assertions read that record and the devices' own handshake times, never a sleep.

* WireGuard alone: each side consumes the other's initiation and answers it, drops the answer to
  its own, and no session exists until an initiation sent again after REKEY_TIMEOUT (5 s);
* the peer made again on one side (``WireGuardDevice.rehandshake``): its initiation goes at once,
  and both sides have a session without any initiation sent again by WireGuard itself;
* a key rotation as route-sync plans it (``plan.change``): the peer's staged entry for the next
  key sends its handshake as it is added, so that at the switch only the rotating side's goes;
* first contact as route-sync plans it: two sides that add each other at one instant send one
  initiation, the leader's (``plan.leads``), and a follower that added the leader only after the
  leader's initiation was dropped makes the session with its confirmation's kick
  (``WireGuardDevice.kick``), not WireGuard's retry 5 s later."""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from cni.kernel.netns import entered
from routesync.apply.routes import RouteApplier
from routesync.config import WireGuardConfig
from routesync.wireguard import keys
from routesync.wireguard.device import WireGuardDevice
from routesync.wireguard.model import PeerChange, WgChange, WgDevice, WgPeer, WgSpec
from routesync.wireguard.plan import leads
from tests.support import wireguard_go
from tests.support.ovs_instance import netns, netns_path
from tests.support.waiting import until

pytestmark = pytest.mark.root

INITIATION, RESPONSE, TRANSPORT = 1, 2, 4  # WireGuard's message types (the first byte)
REKEY_TIMEOUT = 5.0
LO = "127.0.0.1"
PORTS = {"a": 51830, "b": 51831}  # the devices'
SEEN_AT = {"a": 41830, "b": 41831}  # the relay's socket each device is seen at by the other


@dataclass
class Relay:
    """Forwards each side's datagrams to the other, from the socket the other knows it by.
    ``cross``: each side's first initiation is held until the other's is there, then both go, and
    so are the two answers: each side has consumed the other's initiation before it sees the
    answer to its own (on the wire only the first half needs luck; the second makes it certain)."""

    ns: str
    cross: bool = True
    hold_for: float | None = None  # s a held message waits for the other side's, then goes alone (None: ever)
    record: list[tuple[float, str, int]] = field(default_factory=list)  # (monotonic, from side, type) as received
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        with entered(netns_path(self.ns)):
            self.socks = {side: socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for side in SEEN_AT}
        for side, s in self.socks.items():
            s.bind((LO, SEEN_AT[side]))
        self.held: dict[str, bytes] = {}
        self.held_at = 0.0
        self.holding = INITIATION
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        sides = {s.fileno(): side for side, s in self.socks.items()}
        while not self.stop.is_set():
            ready, _, _ = select.select(list(self.socks.values()), [], [], 0.01 if self.held else 0.1)
            self._release_alone()
            for s in ready:
                data, _ = s.recvfrom(65536)
                # a datagram to the socket side X is seen at comes from the other device, for X
                to = sides[s.fileno()]
                frm = "b" if to == "a" else "a"
                with self.lock:  # when it came (a held one goes later)
                    self.record.append((time.monotonic(), frm, data[0]))
                if self.cross and data[0] == self.holding and frm not in self.held:
                    self.held[frm] = data
                    self.held_at = time.monotonic()
                    if len(self.held) == 2:  # both sent: each now meets the other's
                        for f, d in sorted(self.held.items()):
                            self._forward(f, d)
                        self.held = {}
                        self.cross = self.holding == INITIATION
                        self.holding = RESPONSE
                    continue
                self._forward(frm, data)

    def _release_alone(self) -> None:
        """A held message the other side did not match within ``hold_for``: sent alone, and no
        more are held (nothing crossed)."""
        if self.held and self.hold_for is not None and time.monotonic() - self.held_at >= self.hold_for:
            for f, d in self.held.items():
                self._forward(f, d)
            self.held, self.cross = {}, False

    def _forward(self, frm: str, data: bytes) -> None:
        to = "b" if frm == "a" else "a"
        self.socks[frm].sendto(data, (LO, PORTS[to]))

    def seen(self, frm: str | None = None, kind: int | None = None) -> list[float]:
        with self.lock:
            return [t for t, f, k in self.record if (frm is None or f == frm) and (kind is None or k == kind)]

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for s in self.socks.values():
            s.close()


@dataclass
class Pair:
    devices: dict[str, WireGuardDevice]
    relay: Relay
    private: dict[str, str]  # each side's private key


def session(d: WireGuardDevice, after: float = 0.0) -> bool:
    st = d.read()
    return st is not None and any(p.last_handshake > after for p in st.peers)


POD_CIDR = {"a": "10.99.1.0/24", "b": "10.99.2.0/24"}


def spec(d: WireGuardDevice, side: str, private: str, peers: tuple[WgPeer, ...]) -> WgSpec:
    return WgSpec(WgDevice(d.name, PORTS[side], private, tuple(sorted(peers, key=lambda p: p.public_key))), (), 1420)


def peer_entry(public: str, side: str, routed: bool = True) -> WgPeer:
    """The device entry for ``side``'s key ``public`` (``routed``: with its Pods' allowed IPs)."""
    return WgPeer(public, f"{LO}:{SEEN_AT[side]}", (POD_CIDR[side],) if routed else ())


@pytest.fixture
def crossed(tmp_path: str) -> Iterator[Pair]:
    """Two devices whose first handshakes crossed (asserted on the relay's record)."""
    with pair(tmp_path, cross=True) as p:
        yield p


@contextmanager
def pair(tmp_path: str, cross: bool, introduced: bool = True, hold_for: float | None = None) -> Iterator[Pair]:
    """Two devices; ``introduced``: each made with the other as its peer (a new device kicks
    every peer: both initiate), else each with its key and no peer yet."""
    exe = wireguard_go.binary()
    assert exe, "no build/tools/wireguard-go: run tools/build-go-tools.sh wireguard-go"
    private = {side: keys.generate() for side in PORTS}
    with netns(f"wgx{os.getpid()}") as ns:
        # a netlink socket per device: two threads syncing at one instant on one socket each read
        # the other's reply (one then waits for its own for ever)
        routes = {side: RouteApplier(netns=ns) for side in PORTS}
        relay = Relay(ns, cross=cross, hold_for=hold_for)
        devices: dict[str, WireGuardDevice] = {}
        try:
            for side, port in PORTS.items():
                run_dir = os.path.join(tmp_path, side)
                cfg = WireGuardConfig(userspace_command=exe, run_dir=run_dir, key_dir=run_dir,
                                      implementation="userspace", interface=f"ferry-wx{side}", port=port)
                devices[side] = WireGuardDevice(cfg, routes[side].index, run_dir, netns=ns)
                devices[side].ensure()
            for side, d in devices.items():  # a new device's peers are kicked: a's initiation, then b's
                other = "b" if side == "a" else "a"
                peers = (peer_entry(keys.public_of(private[other]), other),) if introduced else ()
                d.sync(spec(d, side, private[side], peers))
            if cross and introduced:
                until(lambda: len(relay.seen(kind=RESPONSE)) == 2, "both initiations answered")
                first = [(f, k) for _, f, k in relay.record[:4]]
                assert sorted(first[:2]) == [("a", INITIATION), ("b", INITIATION)], first
                assert sorted(first[2:]) == [("a", RESPONSE), ("b", RESPONSE)], first
            yield Pair(devices, relay, private)
        finally:
            relay.close()
            for d in devices.values():
                d.delete()
            for r in routes.values():
                r.close()


def test_crossed_initiations_leave_no_session_until_wireguard_sends_one_again(crossed: Pair) -> None:
    relay = crossed.relay
    sent = {f: t for t, f, k in relay.record[:2][::-1]}  # each side's first initiation, when it came
    until(lambda: all(session(d) for d in crossed.devices.values()), "a session on both sides",
          timeout=3 * REKEY_TIMEOUT)
    retries = [(t, f) for t, f, k in relay.record[2:] if k == INITIATION]
    first_data = min(relay.seen(kind=TRANSPORT))
    assert retries, "a session without an initiation sent again"
    waited = retries[0][0] - sent[retries[0][1]]
    print(f"\ncrossed initiations: {retries[0][1]} sent one again {waited:.3f} s after its first; "
          f"the first data {first_data - max(sent.values()):.3f} s after the crossing")
    # both answers were dropped: nothing but an initiation sent again, WireGuard's retry
    # (REKEY_TIMEOUT after the first; a margin for the relay's own scheduling) made the session
    # that carries the first data packet
    assert waited >= REKEY_TIMEOUT - 0.5
    assert first_data > retries[0][0]


def test_the_peer_made_again_on_one_side_makes_the_session_at_once(crossed: Pair) -> None:
    relay = crossed.relay
    a, b = crossed.devices["a"], crossed.devices["b"]
    crossed_at = max(relay.seen(kind=INITIATION))
    # not within WireGuard's 20 ms (HandshakeInitationRate) of b's last initiation consumed: a
    # protocol's rate, not a wait for the machine (route-sync looks 250 ms after its switch)
    until(lambda: time.monotonic() - crossed_at > 0.05, "WireGuard's handshake flood window past")
    since = time.time()
    assert not session(a) and not session(b)
    redone = a.rehandshake(since)
    assert len(redone) == 1  # b's key: a has no session with it
    until(lambda: session(a, since) and session(b, since), "a session on both sides")
    again = [(t, f) for t, f, k in relay.record if k == INITIATION and t > crossed_at]
    took = max(relay.seen(kind=TRANSPORT)) - again[0][0]
    print(f"\nthe peer made again on {again[0][1]}: the last data {took:.3f} s after its initiation")
    # one new initiation, a's, and no initiation of WireGuard's own retry before the session
    assert [f for _, f in again] == ["a"]
    assert a.rehandshake(since) == ()  # a session since: nothing made again


def test_a_staged_next_key_holds_the_peer_back_so_only_the_rotating_side_makes_the_handshake(
        tmp_path: str) -> None:
    """a rotates its key.  b stages a's next key (no allowed IPs): as it is added, its handshake
    goes to a key a does not hold yet (dropped there), and WireGuard holds b back from another for
    5 s.  b switches first (the allowed IPs to the next key, kicked: a packet would wait for a
    session), then a (its new private key, its peers kicked): the session is a's handshake alone."""
    with pair(tmp_path, cross=False) as p:
        a, b = p.devices["a"], p.devices["b"]
        until(lambda: session(a) and session(b), "the first sessions")
        a_next = keys.generate()
        now_a, next_a = keys.public_of(p.private["a"]), keys.public_of(a_next)
        b_peers = (peer_entry(now_a, "a"), peer_entry(next_a, "a", routed=False))
        staged_at = len(p.relay.record)
        b.sync(spec(b, "b", p.private["b"], b_peers), full=False)
        until(lambda: ("b", INITIATION) in [(f, k) for _, f, k in p.relay.record[staged_at:]],
              "the staged key's own handshake")
        since = time.time()
        switched_at = len(p.relay.record)
        b.sync(spec(b, "b", p.private["b"], (peer_entry(next_a, "a"),)), full=False)
        a.sync(spec(a, "a", a_next, (peer_entry(keys.public_of(p.private["b"]), "b"),)), full=False)
        until(lambda: session(a, since) and session(b, since), "a session with a's next key")
        made = [f for _, f, k in p.relay.record[switched_at:] if k == INITIATION]
        print(f"\ninitiations at the switch: {made}")
        assert made == ["a"]


def roles(p: Pair) -> tuple[str, str]:
    """(leader, follower): the side whose key is lower makes the handshake at first contact."""
    return ("a", "b") if leads(keys.public_of(p.private["a"]), keys.public_of(p.private["b"])) else ("b", "a")


def other_side(side: str) -> str:
    return "b" if side == "a" else "a"


def introduce(p: Pair, side: str) -> WgChange:
    """``side``'s device gets the other's key with its Pods, as route-sync's pass applies it."""
    d, other = p.devices[side], other_side(side)
    return d.sync(spec(d, side, p.private[side], (peer_entry(keys.public_of(p.private[other]), other),)), full=False)


def read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def received(d: WireGuardDevice) -> int:
    st = d.read()
    assert st is not None and len(st.peers) == 1
    return st.peers[0].rx_bytes


def data_crosses_from(p: Pair, side: str) -> None:
    """A keepalive from ``side`` on its session (a transport message) is decrypted by the other
    side: its bytes received from ``side`` grow."""
    other = p.devices[other_side(side)]
    before = received(other)
    entry = peer_entry(keys.public_of(p.private[other_side(side)]), other_side(side))
    p.devices[side].backend.configure(p.devices[side].name, WgChange(peers=(
        PeerChange(entry.public_key, False, entry.endpoint, entry.allowed_ips, 0, kick=True),)))
    until(lambda: received(other) > before, f"{side}'s keepalive decrypted by {other_side(side)}")


def test_at_first_contact_only_the_leader_initiates_and_data_crosses_both_ways(tmp_path: str) -> None:
    """Both sides add each other at one instant (route-sync's plan.change through the device's
    sync), the relay holding a first initiation up to 1 s for the other's: had both sides kicked,
    the two would cross (the first test).  One initiation goes, the leader's; the follower awaits."""
    with pair(tmp_path, cross=True, introduced=False, hold_for=1.0) as p:
        leader, follower = roles(p)
        start = threading.Barrier(2)
        changes: dict[str, WgChange] = {}

        def add(side: str) -> None:
            start.wait()
            changes[side] = introduce(p, side)

        threads = [threading.Thread(target=add, args=(side,)) for side in PORTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)  # a bound on a hang, not on speed: a sync is a few round trips
        assert not any(t.is_alive() for t in threads), "a device's sync never returned"
        assert [c.kick for c in changes[leader].peers] == [True] and changes[leader].awaited == ()
        assert [c.kick for c in changes[follower].peers] == [False]
        assert changes[follower].awaited == (keys.public_of(p.private[leader]),)
        until(lambda: session(p.devices["a"]) and session(p.devices["b"]), "a session on both sides")
        data_crosses_from(p, follower)
        data_crosses_from(p, leader)
        made = [f for _, f, k in p.relay.record if k == INITIATION]
        print(f"\nfirst contact: initiations {made}; leader {leader}")
        # the follower sent none (a retry of the leader's, on a machine slow past WireGuard's 5 s,
        # would be the leader's again: not what this test is about)
        assert made and set(made) == {leader}, made
        assert p.relay.seen(follower, TRANSPORT) and p.relay.seen(leader, TRANSPORT)


def test_a_follower_that_adds_the_leader_after_its_initiation_was_dropped_kicks_it(
        tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader adds the follower first; its initiation reaches a device without its entry and is
    dropped (wireguard-go's own log says so), and WireGuard would send it again only after 5 s.
    The follower's pass adds the leader without a kick, and its confirmation (what
    ``WireGuardLoop`` calls CONFIRM_AFTER later: ``WireGuardDevice.kick``) makes the session: the
    initiation answered is the follower's, before any retry of the leader's."""
    monkeypatch.setenv("FERRY_WG_LOG_LEVEL", "verbose")
    with pair(tmp_path, cross=False, introduced=False) as p:
        leader, follower = roles(p)
        assert [c.kick for c in introduce(p, leader).peers] == [True]
        log = os.path.join(tmp_path, follower, f"ferry-wx{follower}.log")
        until(lambda: "Received invalid initiation message" in read_text(log),
              "the leader's initiation dropped by the follower")
        since = time.time()
        change = introduce(p, follower)
        assert change.awaited == (keys.public_of(p.private[leader]),)
        assert p.devices[follower].kick(since, change.awaited) == change.awaited
        until(lambda: session(p.devices["a"]) and session(p.devices["b"]), "a session on both sides")
        handshake = [(f, k) for _, f, k in p.relay.record if k in (INITIATION, RESPONSE)]
        took = min(p.relay.seen(leader, RESPONSE)) - min(p.relay.seen(leader, INITIATION))
        print(f"\nfirst contact, the leader's initiation dropped: {handshake}; "
              f"the session {took:.3f} s after the leader's first initiation")
        assert handshake[:3] == [(leader, INITIATION), (follower, INITIATION), (leader, RESPONSE)]
        assert p.devices[follower].kick(since, change.awaited) == ()  # a handshake since: nothing to kick
        data_crosses_from(p, follower)
