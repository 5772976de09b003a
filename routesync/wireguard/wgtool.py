"""The kernel's WireGuard through ``wg`` (wireguard-tools): one ``wg set`` per change, ``wg show
NAME dump`` to read a device back.

``wg`` speaks the kernel's generic netlink family, or a userspace implementation's UAPI socket
when ``/var/run/wireguard/NAME.sock`` exists: the same command lines drive both (the tests run
them against wireguard-go, this machine's kernel having no WireGuard).

Pure parts: :func:`set_argv` (a :class:`~.model.WgChange` → argv and stdin; bad input raises
``ValueError`` naming the field) and :func:`parse_dump`.  The private key goes to ``wg`` on its
stdin (``private-key /dev/stdin``): never on a command line (``/proc/PID/cmdline`` is world
readable) nor in a log line.  ``wg`` runs with ``LC_ALL=C`` so that its errors (``strerror``) can
be told apart."""

from __future__ import annotations

import ipaddress
import logging
import os
import subprocess
import time
from collections.abc import Sequence

from cni.pipeline.tables import MAX_IFNAME
from routesync.wireguard import keys
from routesync.wireguard.model import KERNEL, PeerChange, WgChange, WgDeviceState, WgPeerState

LOG = logging.getLogger(__name__)

KICK = 25  # s: the keepalive a kick turns on (uapi.KICK's twin, for the kernel)
NONE = "(none)"  # wg's word for an unset key, endpoint or allowed-IPs list
OFF = "off"  # wg's word for keepalive 0 and for no fwmark
# wg's errors (strerror, LC_ALL=C) meaning that the device is not there: no such link; no
# WireGuard generic netlink family at all (a kernel without the module: no kernel device can
# exist); a userspace device's socket whose process is gone (wg then removes the socket)
NO_DEVICE = ("No such device", "Protocol not supported", "Connection refused")


class WgToolError(RuntimeError):
    """``wg`` failed for another reason than a missing device (its stderr, which never holds a key)."""


# ---------------------------------------------------------------- checks (pure)

def check_name(name: str) -> str:
    if not name or len(name.encode()) > MAX_IFNAME or "/" in name or any(c.isspace() for c in name):
        raise ValueError(f"device name: not a valid interface name: {name!r}")
    return name


def check_key(field: str, key: str) -> str:
    """A WireGuard key as ``wg`` writes it: base64 of 32 bytes (44 characters; :mod:`.keys`)."""
    if not isinstance(key, str) or len(key) != 44 or not keys.valid_public(key):
        # a private key's text never goes into the message
        shown = "<hidden>" if field == "private_key" else repr(key)
        raise ValueError(f"{field}: not a WireGuard key (base64 of 32 bytes): {shown}")
    return key


def check_port(field: str, port: int) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"{field}: expected a UDP port in [0, 65535], got {port!r}")
    return port


def check_endpoint(field: str, endpoint: str) -> str:
    """``A.B.C.D:PORT`` or ``[V6]:PORT`` (an address, not a name: ``wg`` would resolve a name)."""
    host, sep, port = endpoint.rpartition(":")
    v6 = host.startswith("[") and host.endswith("]")
    try:
        if not sep or not port.isdigit():
            raise ValueError(endpoint)
        address = ipaddress.ip_address(host[1:-1] if v6 else host)
        if (address.version == 6) != v6:
            raise ValueError(endpoint)
        check_port(field, int(port))
    except ValueError:
        raise ValueError(f"{field}: expected ADDRESS:PORT or [IPV6]:PORT, got {endpoint!r}") from None
    return endpoint


def check_cidr(field: str, cidr: str) -> str:
    """A canonical CIDR (``10.1.0.0/24``, not ``10.1.0.1/24``): what the device reports back."""
    try:
        if "/" not in cidr:
            raise ValueError(cidr)
        net = ipaddress.ip_network(cidr, strict=True)
    except ValueError:
        raise ValueError(f"{field}: expected a canonical CIDR (ADDRESS/PREFIX, no host bits), "
                         f"got {cidr!r}") from None
    if str(net) != cidr:
        raise ValueError(f"{field}: expected the canonical spelling {str(net)!r}, got {cidr!r}")
    return cidr


def check_keepalive(field: str, seconds: int) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 0 <= seconds <= 65535:
        raise ValueError(f"{field}: expected seconds in [0, 65535] (0: off), got {seconds!r}")
    return seconds


# ---------------------------------------------------------------- the command line (pure)

def _peer_args(i: int, p: PeerChange) -> list[str]:
    field = f"peers[{i}]"
    args = ["peer", check_key(f"{field}.public_key", p.public_key)]
    if p.remove:
        return [*args, "remove"]
    if p.endpoint is not None:
        args += ["endpoint", check_endpoint(f"{field}.endpoint", p.endpoint)]
    # given, allowed-ips REPLACES the peer's list; an empty list must be given as an empty word
    ips = [check_cidr(f"{field}.allowed_ips[{j}]", c) for j, c in enumerate(p.allowed_ips)]
    keepalive = check_keepalive(f"{field}.keepalive", p.keepalive)
    if not p.kick:
        return [*args, "allowed-ips", ",".join(ips), "persistent-keepalive", str(keepalive) if keepalive else OFF]
    # a kick: off, then on (the kernel sends a keepalive, a handshake first, when it goes from 0 to
    # non-zero), then back off if the peer's own is off; the same key in three blocks of one command
    out = [*args, "persistent-keepalive", OFF, *args, "allowed-ips", ",".join(ips),
           "persistent-keepalive", str(keepalive or KICK)]
    return out if keepalive else [*out, *args, "persistent-keepalive", OFF]


def set_argv(name: str, change: WgChange, wg: Sequence[str] = ("wg",)) -> tuple[list[str], bytes]:
    """The one ``wg set`` that applies ``change`` to device ``name``, and the bytes for its stdin
    (the private key, when the change sets one; else empty).  Peers in the change's order
    (removals first: an allowed IP moves between peers in the one command)."""
    argv = [*wg, "set", check_name(name)]
    stdin = b""
    if change.private_key is not None:
        stdin = check_key("private_key", change.private_key).encode() + b"\n"
        argv += ["private-key", "/dev/stdin"]
    if change.listen_port is not None:
        argv += ["listen-port", str(check_port("listen_port", change.listen_port))]
    seen: set[tuple[str, bool]] = set()  # a peer removed and made again (``plan.rehandshake``): twice
    ordered = [p for p in change.peers if p.remove] + [p for p in change.peers if not p.remove]
    for i, p in enumerate(ordered):
        if (p.public_key, p.remove) in seen:
            raise ValueError(f"peers[{i}].public_key: {p.public_key!r} is in the change twice")
        seen.add((p.public_key, p.remove))
        argv += _peer_args(i, p)
    return argv, stdin


def show_argv(name: str, wg: Sequence[str] = ("wg",)) -> list[str]:
    return [*wg, "show", check_name(name), "dump"]


# ---------------------------------------------------------------- the dump (pure)

def _opt(word: str) -> str | None:
    return None if word == NONE else word


def _int(word: str, what: str) -> int:
    if word == OFF:
        return 0
    try:
        return int(word)
    except ValueError:
        raise ValueError(f"wg show dump: {what}: not a number: {word!r}") from None


def parse_dump(text: str) -> WgDeviceState:
    """``wg show NAME dump``: a line ``private-key public-key listen-port fwmark``, then per peer
    ``public-key preshared-key endpoint allowed-ips latest-handshake rx tx keepalive``, tab
    separated; ``(none)`` for what is unset, ``off`` for keepalive 0.  Peers sorted by public key,
    each one's allowed IPs sorted (as :class:`~.model.WgDevice` holds them)."""
    lines = [line for line in text.splitlines() if line]
    if not lines:
        raise ValueError("wg show dump: empty output")
    head = lines[0].split("\t")
    if len(head) != 4:
        raise ValueError(f"wg show dump: the device line has {len(head)} fields, not 4")
    peers = []
    for n, line in enumerate(lines[1:], start=2):
        f = line.split("\t")
        if len(f) != 8:
            raise ValueError(f"wg show dump: line {n} has {len(f)} fields, not 8")
        ips = () if f[3] == NONE else tuple(sorted(c for c in f[3].split(",") if c))
        peers.append(WgPeerState(
            public_key=f[0], endpoint=_opt(f[2]), allowed_ips=ips,
            keepalive=_int(f[7], f"line {n} persistent-keepalive"),
            last_handshake=float(_int(f[4], f"line {n} latest-handshake")),
            rx_bytes=_int(f[5], f"line {n} transfer-rx"), tx_bytes=_int(f[6], f"line {n} transfer-tx")))
    return WgDeviceState(public_key=_opt(head[1]), listen_port=_int(head[2], "listen-port"),
                         peers=tuple(sorted(peers, key=lambda p: p.public_key)), private_key=_opt(head[0]))


# ---------------------------------------------------------------- the applier

class WgTool:
    """:class:`~.model.WgBackend` through ``wg``.  ``wg``: the command, e.g.
    ``("ip", "netns", "exec", "node-a", "wg")`` for a device in another namespace."""

    kind = KERNEL

    def __init__(self, wg: Sequence[str] = ("wg",), timeout: float = 30.0) -> None:
        self.wg = tuple(wg)
        self.timeout = timeout

    def _run(self, argv: list[str], stdin: bytes, name: str, what: str) -> str:
        env = {**os.environ, "LC_ALL": "C"}
        t0 = time.monotonic()
        try:
            cp = subprocess.run(argv, input=stdin, capture_output=True, env=env, timeout=self.timeout, check=False)
        except FileNotFoundError:
            raise WgToolError(f"{what} {name}: {argv[0]!r} not found (wireguard-tools)") from None
        except subprocess.TimeoutExpired:
            raise WgToolError(f"{what} {name}: no answer within {self.timeout:g} s") from None
        err = cp.stderr.decode(errors="replace").strip()
        LOG.debug("wireguard: %s %s: %s argument(s), exit %d in %.1f ms", what, name, len(argv),
                  cp.returncode, (time.monotonic() - t0) * 1000)
        if cp.returncode != 0:
            if any(word in err for word in NO_DEVICE):
                raise LookupError(f"no WireGuard device {name} ({err})")
            raise WgToolError(f"{what} {name}: wg exited {cp.returncode}: {err}")
        return cp.stdout.decode()

    def read(self, name: str) -> WgDeviceState:
        return parse_dump(self._run(show_argv(name, self.wg), b"", name, "wg show"))

    def configure(self, name: str, change: WgChange) -> None:
        argv, stdin = set_argv(name, change, self.wg)
        self._run(argv, stdin, name, "wg set")
