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
  key sends its handshake as it is added, so that at the switch only the rotating side's goes."""

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
from routesync.wireguard.model import WgDevice, WgPeer, WgSpec
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
    record: list[tuple[float, str, int]] = field(default_factory=list)  # (monotonic, from side, type) as received
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        with entered(netns_path(self.ns)):
            self.socks = {side: socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for side in SEEN_AT}
        for side, s in self.socks.items():
            s.bind((LO, SEEN_AT[side]))
        self.held: dict[str, bytes] = {}
        self.holding = INITIATION
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        sides = {s.fileno(): side for side, s in self.socks.items()}
        while not self.stop.is_set():
            ready, _, _ = select.select(list(self.socks.values()), [], [], 0.1)
            for s in ready:
                data, _ = s.recvfrom(65536)
                # a datagram to the socket side X is seen at comes from the other device, for X
                to = sides[s.fileno()]
                frm = "b" if to == "a" else "a"
                with self.lock:  # when it came (a held one goes later)
                    self.record.append((time.monotonic(), frm, data[0]))
                if self.cross and data[0] == self.holding and frm not in self.held:
                    self.held[frm] = data
                    if len(self.held) == 2:  # both sent: each now meets the other's
                        for f, d in sorted(self.held.items()):
                            self._forward(f, d)
                        self.held = {}
                        self.cross = self.holding == INITIATION
                        self.holding = RESPONSE
                    continue
                self._forward(frm, data)

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
def pair(tmp_path: str, cross: bool) -> Iterator[Pair]:
    exe = wireguard_go.binary()
    assert exe, "no build/tools/wireguard-go: run tools/build-go-tools.sh wireguard-go"
    private = {side: keys.generate() for side in PORTS}
    with netns(f"wgx{os.getpid()}") as ns:
        routes = RouteApplier(netns=ns)
        relay = Relay(ns, cross=cross)
        devices: dict[str, WireGuardDevice] = {}
        try:
            for side, port in PORTS.items():
                run_dir = os.path.join(tmp_path, side)
                cfg = WireGuardConfig(userspace_command=exe, run_dir=run_dir, key_dir=run_dir,
                                      implementation="userspace", interface=f"ferry-wx{side}", port=port)
                devices[side] = WireGuardDevice(cfg, routes.index, run_dir, netns=ns)
                devices[side].ensure()
            for side, d in devices.items():  # a new device's peers are kicked: a's initiation, then b's
                other = "b" if side == "a" else "a"
                d.sync(spec(d, side, private[side], (peer_entry(keys.public_of(private[other]), other),)))
            if cross:
                until(lambda: len(relay.seen(kind=RESPONSE)) == 2, "both initiations answered")
                first = [(f, k) for _, f, k in relay.record[:4]]
                assert sorted(first[:2]) == [("a", INITIATION), ("b", INITIATION)], first
                assert sorted(first[2:]) == [("a", RESPONSE), ("b", RESPONSE)], first
            yield Pair(devices, relay, private)
        finally:
            relay.close()
            for d in devices.values():
                d.delete()
            routes.close()


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
