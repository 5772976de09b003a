"""WireGuard's plain data, shared by the planner, both backends and ``show``.

Keys are base64 text, as ``wg`` and the Node annotations write them (32 bytes: 44 characters).
A private key is never part of a ``repr`` (logs print records) and never leaves the Node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

# what a Node publishes in its Node object (and the embedded registry's record)
PUBLIC_KEY_ANNOTATION = "ferry.io/wireguard-public-key"
# "<port>": the UDP port of its device; the address is the Node's transport address
PORT_ANNOTATION = "ferry.io/wireguard-port"
# a key rotation under way: the next public key, and when every Node switches to it (Unix time, s)
NEXT_KEY_ANNOTATION = "ferry.io/wireguard-next-public-key"
SWITCH_AT_ANNOTATION = "ferry.io/wireguard-key-switch-at"

KERNEL = "kernel"
USERSPACE = "userspace"


@dataclass(frozen=True)
class LocalKeys:
    """This Node's private keys (:mod:`.keys`) and its rotation's switch time (None: none under way)."""

    current: str = field(repr=False)
    next: str | None = field(default=None, repr=False)
    switch_at: float | None = None


@dataclass(frozen=True)
class WgPeer:
    """One peer as the device should hold it."""

    public_key: str
    endpoint: str | None  # "192.168.77.12:51820", "[fd00:77::12]:51820"; None: learnt from its packets
    allowed_ips: tuple[str, ...] = ()  # canonical CIDRs, sorted
    keepalive: int = 0  # persistent keepalive, seconds (0: off)


@dataclass(frozen=True)
class WgDevice:
    """The desired device: what :meth:`WgBackend.read` must report once synced."""

    name: str
    listen_port: int
    private_key: str = field(repr=False)
    peers: tuple[WgPeer, ...] = ()  # sorted by public key


@dataclass(frozen=True)
class WgPeerState:
    """One peer as the device reports it."""

    public_key: str
    endpoint: str | None
    allowed_ips: tuple[str, ...]
    keepalive: int = 0
    last_handshake: float = 0.0  # Unix time, s (0: never)
    rx_bytes: int = 0
    tx_bytes: int = 0


@dataclass(frozen=True)
class WgDeviceState:
    """What a device holds (read back: ``wg show dump``, UAPI ``get=1``)."""

    public_key: str | None  # None: no private key set
    listen_port: int
    peers: tuple[WgPeerState, ...] = ()
    private_key: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class PeerChange:
    """One peer's part of a :class:`WgChange`: removed, or created/updated with these values
    (its allowed IPs replaced by ``allowed_ips``)."""

    public_key: str
    remove: bool = False
    endpoint: str | None = None
    allowed_ips: tuple[str, ...] = ()
    keepalive: int = 0
    # send a keepalive now (a handshake if there is no session): keepalive set to 0 then to its value
    # in the one transaction, as wg and wireguard-go send one when it goes from 0 to non-zero
    kick: bool = False


@dataclass(frozen=True)
class WgChange:
    """The difference :func:`routesync.wireguard.plan.change` computes between a device's state and
    its desired :class:`WgDevice`, applied in one transaction (UAPI ``set=1``, one ``wg set``).
    Peers are applied in order: removals first, so an allowed IP moves between peers atomically."""

    private_key: str | None = field(default=None, repr=False)  # None: keep
    listen_port: int | None = None  # None: keep
    peers: tuple[PeerChange, ...] = ()
    # peers added at first contact without a kick (the peer leads): their handshake is awaited,
    # confirmed a moment later (:class:`routesync.wireguard.loop.WireGuardLoop`); nothing to apply
    awaited: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return self.private_key is None and self.listen_port is None and not self.peers


class WgBackend(Protocol):
    """One way of reaching a WireGuard device: the kernel's (:mod:`.wgtool`) or a userspace
    implementation's UAPI socket (:mod:`.uapi`)."""

    kind: str  # KERNEL | USERSPACE

    def read(self, name: str) -> WgDeviceState:
        """The device's state; ``LookupError`` when there is no such device."""
        ...

    def configure(self, name: str, change: WgChange) -> None:
        """Apply ``change`` in one transaction; ``LookupError`` when there is no such device."""
        ...


@dataclass(frozen=True)
class WgSpec:
    """What the appliers install for WireGuard (``DesiredState.wireguard``): the device with its
    peers, its addresses (this Node's gateway addresses as host routes' source: the Node's own
    packets to remote Pods, and what kube-proxy masquerades to, leave from an address inside this
    Node's Pod CIDRs, which its peers' cryptokey routing accepts) and its MTU."""

    device: WgDevice
    addresses: tuple[str, ...]  # "10.244.1.1/32", "fd00:10:244:1::1/128"
    mtu: int
