"""WireGuard's plan: pure.  Node records + this Node's keys + the time → the device's desired
state, what this Node publishes, and which peers are refused or still without a key.

**Peers.**  Every peer with a valid public key (``ferry.io/wireguard-public-key``) is one device
peer: its endpoint is its transport address and ``ferry.io/wireguard-port``, its allowed IPs its
Pod CIDRs (the cryptokey routing: a packet from it whose inner source is not in them is dropped,
so no Node can speak for another's Pods).  A peer with no key yet, or a malformed one, is not on
the device at all: the host routes still send its Pod CIDRs into the device, which drops what has
no peer, so nothing ever goes out in clear (fail closed); :attr:`WgPlan.refused` and
:attr:`WgPlan.waiting` say why, for ``show`` and the log.

**Rotation without loss** (``ferry-route-sync rotate-key``, ``wireguard.rotationPeriod``).  A
WireGuard device holds one private key, and a peer is known by one public key; a Node that
simply changed its key would be unknown to its peers until each had read its new record.  So a
rotation is announced first and switched everywhere at one instant:

1. the rotating Node makes ``next.key`` and publishes its public key as
   ``ferry.io/wireguard-next-public-key`` with ``ferry.io/wireguard-key-switch-at`` = now +
   ``rotationLead`` (Unix time; Nodes' clocks are NTP-synchronised);
2. every peer adds the next key as a second device peer *without* allowed IPs (at most
   :data:`STAGE_AHEAD` before the switch time): a handshake made with it is answered, no packet
   is routed to it yet.  Its creation sends a handshake initiation that the rotating Node cannot
   read yet (it is made for the next key): after it, WireGuard starts no other handshake with that
   peer for REKEY_TIMEOUT (5 s), past the switch time;
3. at the switch time, the rotating Node sets its next private key (its sessions end, it makes new
   handshakes at once) and every peer moves the allowed IPs to the next key's peer and removes
   the old one, in one transaction; the rotating Node then publishes the next key as its key.
   Only the rotating Node's handshakes go at that instant, so no two cross: two initiations
   that cross leave both sides without a session until WireGuard tries again 5 s later, or
   (wireguard-go, when the answer to one and the other initiation are handled at once) one
   direction dead for 15 s (tests/routesync/wireguard/test_crossed_handshakes.py).

A peer that reads the announcement only after the switch time moves at once (its loss is its
lateness).  Everything is a function of ``now``: :attr:`WgPlan.wake_at` is the next instant the
plan changes by itself."""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from routesync.model import NodeRecord

from . import keys
from .model import (
    NEXT_KEY_ANNOTATION,
    PORT_ANNOTATION,
    PUBLIC_KEY_ANNOTATION,
    SWITCH_AT_ANNOTATION,
    LocalKeys,
    PeerChange,
    WgChange,
    WgDevice,
    WgDeviceState,
    WgPeer,
    WgPeerState,
)

# s before a peer's switch time that its next key is staged on the device (step 2): under
# REKEY_TIMEOUT (5 s), so that the staged peer's own first handshake still holds it back then
STAGE_AHEAD = 4.0
OVERHEAD_IPV4 = 60  # outer IPv4 20 + UDP 8 + WireGuard data header 16 + its tag 16
OVERHEAD_IPV6 = 80  # outer IPv6 40 instead of 20


@dataclass(frozen=True)
class Refused:
    peer: str
    reason: str


@dataclass(frozen=True)
class WgPlan:
    device: WgDevice
    public_key: str  # the key this Node's device uses now
    publish: tuple[tuple[str, str], ...]  # annotations this Node's record must carry (sorted)
    unpublish: tuple[str, ...]  # annotations it must not carry
    promote: bool  # the switch time is past: next.key becomes current.key
    refused: tuple[Refused, ...] = ()  # a malformed key: refused, with the reason
    waiting: tuple[str, ...] = ()  # no key published yet
    wake_at: float | None = None  # the next instant this plan changes by itself (Unix time)


def overhead(ipv6_underlay: bool) -> int:
    return OVERHEAD_IPV6 if ipv6_underlay else OVERHEAD_IPV4


def endpoint(addresses: Sequence[str], port: int, prefer: int = 4) -> str | None:
    """``ip:port`` of the first transport address of family ``prefer``, else of the other."""
    hosts = [ipaddress.ip_address(a.split("/")[0]) for a in addresses]
    for want in (prefer, 10 - prefer):
        for h in hosts:
            if h.version == want:
                return f"{h}:{port}" if h.version == 4 else f"[{h}]:{port}"
    return None


def _port_of(record: NodeRecord, default: int) -> int | None:
    raw = record.annotation(PORT_ANNOTATION)
    if raw is None:
        return default
    text = raw.strip()
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        return None
    return int(text)


def _switch_at(record: NodeRecord) -> float | None:
    raw = record.annotation(SWITCH_AT_ANNOTATION)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        return None


def peer_entries(record: NodeRecord, default_port: int, now: float, keepalive: int, prefer: int = 4
                 ) -> tuple[list[WgPeer], Refused | None, bool, float | None]:
    """One peer's device entries, (refusal), (waiting: no key yet), (the next instant its entries
    change by themselves: the staging of its next key, or its switch time)."""
    key = record.annotation(PUBLIC_KEY_ANNOTATION)
    if key is None:
        return [], None, True, None
    if not keys.valid_public(key):
        return [], Refused(record.name, f"annotation {PUBLIC_KEY_ANNOTATION} is not a WireGuard public key "
                                        f"(32 bytes, base64)"), False, None
    port = _port_of(record, default_port)
    if port is None:
        return [], Refused(record.name, f"annotation {PORT_ANNOTATION}={record.annotation(PORT_ANNOTATION)!r} "
                                        f"is not a UDP port"), False, None
    ep = endpoint(record.transport_addresses, port, prefer)
    cidrs = tuple(sorted(str(ipaddress.ip_network(c, strict=False)) for c in record.pod_cidrs))
    nxt = record.annotation(NEXT_KEY_ANNOTATION)
    at = _switch_at(record)
    if nxt is None or not keys.valid_public(nxt) or nxt == key or at is None:
        return [WgPeer(key, ep, cidrs, keepalive)], None, False, None
    if now >= at:  # switched: the next key carries its Pods
        return [WgPeer(nxt, ep, cidrs, keepalive)], None, False, None
    if now < at - STAGE_AHEAD:  # announced, staged later
        return [WgPeer(key, ep, cidrs, keepalive)], None, False, at - STAGE_AHEAD
    # announced: its next key is known to the device, without allowed IPs until the switch
    return [WgPeer(key, ep, cidrs, keepalive), WgPeer(nxt, ep, (), keepalive)], None, False, at


def plan(name: str, listen_port: int, local: NodeRecord, peers: Sequence[NodeRecord], local_keys: LocalKeys,
         now: float, keepalive: int = 0) -> WgPlan:
    """The device ``name`` of the Node ``local``; ``peers`` the other Nodes' records."""
    prefer = 4 if any(ipaddress.ip_address(a.split("/")[0]).version == 4 for a in local.transport_addresses) else 6
    entries: dict[str, WgPeer] = {}
    refused: list[Refused] = []
    waiting: list[str] = []
    wake: list[float] = []
    for rec in sorted(peers, key=lambda r: r.name):
        if rec.name == local.name:
            continue
        got, ref, wait, at = peer_entries(rec, listen_port, now, keepalive, prefer)
        if ref is not None:
            refused.append(ref)
        if wait:
            waiting.append(rec.name)
        if at is not None:
            wake.append(at)
        for e in got:
            if e.public_key in entries:  # two Nodes with one key: neither is trusted with it
                refused.append(Refused(rec.name, "its public key is another Node's too"))
                entries.pop(e.public_key)
                continue
            entries[e.public_key] = e
    switched = local_keys.next is not None and local_keys.switch_at is not None and now >= local_keys.switch_at
    private = local_keys.next if switched and local_keys.next else local_keys.current
    public = keys.public_of(private)
    publish = {PUBLIC_KEY_ANNOTATION: public, PORT_ANNOTATION: str(listen_port)}
    unpublish = [NEXT_KEY_ANNOTATION, SWITCH_AT_ANNOTATION]
    if local_keys.next is not None and local_keys.switch_at is not None and not switched:
        publish[NEXT_KEY_ANNOTATION] = keys.public_of(local_keys.next)
        publish[SWITCH_AT_ANNOTATION] = f"{local_keys.switch_at:.3f}"
        unpublish = []
        wake.append(local_keys.switch_at)
    own = {public} | ({keys.public_of(local_keys.next)} if local_keys.next else set())
    device_peers = tuple(sorted((e for k, e in entries.items() if k not in own), key=lambda e: e.public_key))
    return WgPlan(
        device=WgDevice(name, listen_port, private, device_peers),
        public_key=public,
        publish=tuple(sorted(publish.items())),
        unpublish=tuple(unpublish),
        promote=switched,
        refused=tuple(refused),
        waiting=tuple(waiting),
        wake_at=min((w for w in wake if w > now), default=None),
    )


def annotate(annotations: Mapping[str, str], wg: WgPlan) -> tuple[tuple[str, str], ...]:
    """A record's annotations with ``wg``'s published and without its unpublished ones."""
    out = {k: v for k, v in annotations.items() if k not in wg.unpublish}
    out.update(dict(wg.publish))
    return tuple(sorted(out.items()))


def change(have: WgDeviceState | None, want: WgDevice, kick: Sequence[str] = ()) -> WgChange:
    """What turns ``have`` (None: a new, empty device) into ``want``: the private key and port when
    they differ, each peer that is missing or differs (its allowed IPs replaced), each peer that
    is not wanted removed.  An endpoint that is right already is not set again (a set endpoint
    would undo what the device learnt from a roaming peer only if it differed).  ``kick``: peers
    (public keys) that must send a keepalive now, changed or not.  A new private key, or a new
    device (a killed userspace implementation made again), kicks every peer: its sessions ended,
    and a peer that still sends on them would only notice after WireGuard's 15 s without an
    answer; a handshake made at once tells it.  A peer that gets its Pods' allowed IPs now (new
    on the device, or staged without them) is kicked too: when this Node read a peer's key
    switch late, the peer's own handshake at its instant found no entry here and is retried only
    after WireGuard's 5 s (REKEY_TIMEOUT), a blackout that this Node's handshake ends at once.
    A peer staged without allowed IPs (a key announced) is kicked when it is added: its handshake,
    which the rotating Node cannot read yet, keeps this device from starting another one at the
    switch time (this module's doc, step 2).

    First contact (a peer new on an existing device, with allowed IPs no entry held: not a key
    switch) is kicked only when this Node :func:`leads` the pair: two Nodes that read each other's
    keys at the same instant would otherwise both send an initiation, and initiations that cross
    lose the session (:func:`rehandshake`).  The follower's are :attr:`WgChange.awaited`: if the
    leader's initiation came before the follower had the entry, it was dropped, and the follower
    kicks them once a moment later (:class:`.loop.WireGuardLoop`)."""
    peers: list[PeerChange] = []
    kicked = set(kick)
    if have is None or have.private_key != want.private_key:
        kicked |= {p.public_key for p in want.peers}
    if have is None:
        return WgChange(private_key=want.private_key, listen_port=want.listen_port,
                        peers=tuple(PeerChange(p.public_key, False, p.endpoint, p.allowed_ips, p.keepalive,
                                               p.public_key in kicked) for p in want.peers))
    present = {p.public_key: p for p in have.peers}
    wanted = {p.public_key: p for p in want.peers}
    first = first_contacts(have, want)
    kicked |= {k for k, p in wanted.items() if p.allowed_ips and k not in first
               and (k not in present or not present[k].allowed_ips)}
    kicked |= {k for k, p in wanted.items() if not p.allowed_ips and k not in present}  # staged: its handshake now
    if first:
        own = keys.public_of(want.private_key)
        kicked |= {k for k in first if leads(own, k)}
    for k in sorted(set(present) - set(wanted)):
        peers.append(PeerChange(k, remove=True))
    for k, p in sorted(wanted.items()):
        h = present.get(k)
        if (h is None or tuple(sorted(h.allowed_ips)) != tuple(sorted(p.allowed_ips)) or h.keepalive != p.keepalive
                or (p.endpoint is not None and h.endpoint != p.endpoint) or k in kicked):
            peers.append(PeerChange(k, False, p.endpoint, p.allowed_ips, p.keepalive, k in kicked))
    return WgChange(
        private_key=want.private_key if have.private_key != want.private_key else None,
        listen_port=want.listen_port if have.listen_port != want.listen_port else None,
        peers=tuple(peers),
        awaited=tuple(sorted(first - kicked)),
    )


def leads(own: str, peer: str) -> bool:
    """Whether this Node (public key ``own``) makes the handshake at first contact with ``peer``:
    the pair's lower key, a rule both Nodes compute alike."""
    return own < peer


def first_contacts(have: WgDeviceState, want: WgDevice) -> frozenset[str]:
    """Peers of ``want`` new on the device with allowed IPs that no entry of ``have`` holds: first
    contact, not a key switch (the Pods' allowed IPs moving to a Node's next key)."""
    present = {p.public_key for p in have.peers}
    held = {a for p in have.peers for a in p.allowed_ips}
    return frozenset(p.public_key for p in want.peers
                     if p.allowed_ips and p.public_key not in present and not held & set(p.allowed_ips))


def rehandshake(have: WgDeviceState, since: float, among: Collection[str] | None = None) -> WgChange:
    """Each peer with allowed IPs (of ``among``, None: all) whose last handshake is before
    ``since``: removed and made again in the one transaction, kicked, with what the device holds
    for it (its endpoint as learnt, its allowed IPs, its keepalive).

    Why remove it: a handshake that crossed another is lost for 5 s.  When two devices send
    their initiations at the same instant (a key switch: the rotating Node kicks its peers while
    each peer moves its allowed IPs to the new key and kicks it, every Node on the same clock),
    each consumes the other's initiation and answers it; the consumed initiation replaces the
    device's own handshake state, so each drops the answer to its own, and both wait as
    responders for a first data packet the other never sends.  Neither may start another
    handshake before REKEY_TIMEOUT (5 s) after its last one (wireguard-go's
    ``SendHandshakeInitiation``, the kernel's ``wg_packet_send_handshake_initiation``), so a kick
    does nothing; a peer made again has no such past and sends its initiation at once.  Only one
    side must do it (:class:`.loop.WireGuardLoop` does it on the Node whose key switched), or the
    two new initiations could cross again."""
    peers: list[PeerChange] = []
    stale = _without_handshake(have, since, among)
    for p in stale:
        peers.append(PeerChange(p.public_key, remove=True))
    for p in stale:
        peers.append(PeerChange(p.public_key, False, p.endpoint, p.allowed_ips, p.keepalive, kick=True))
    return WgChange(peers=tuple(peers))


def kick(have: WgDeviceState, since: float, among: Collection[str]) -> WgChange:
    """Each peer of ``among`` with allowed IPs and no handshake since ``since`` kicked, with what
    the device holds for it: the follower's confirmation at first contact (:func:`change`).  A
    kick is enough there, unlike after crossed initiations (:func:`rehandshake`): the follower has
    sent none, so WireGuard does not hold it back, and a session half made meanwhile is kept."""
    return WgChange(peers=tuple(PeerChange(p.public_key, False, p.endpoint, p.allowed_ips, p.keepalive, kick=True)
                                for p in _without_handshake(have, since, among)))


def _without_handshake(have: WgDeviceState, since: float, among: Collection[str] | None) -> list[WgPeerState]:
    return [p for p in have.peers if p.allowed_ips and p.last_handshake < since
            and (among is None or p.public_key in among)]
