"""The Node's WireGuard keys: private keys made here, kept in files of mode 0600 under
``wireguard.keyDir`` (``current.key``; ``next.key`` while a rotation is under way), never sent
anywhere nor logged; public keys derived from them (X25519, RFC 7748, ``cryptography``).

A file is written atomically (a temporary file of mode 0600 in the same directory, then a
rename), so a crash leaves the old key or the new one, never half of one."""

from __future__ import annotations

import base64
import binascii
import os

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from .model import LocalKeys

CURRENT = "current.key"
NEXT = "next.key"
SWITCH_AT = "next.switch-at"  # the announced rotation's switch time (Unix s), written once announced
KEY_BYTES = 32


class InvalidKey(ValueError):
    """A key that is not 32 bytes of base64 (the message says which and why, never the key)."""


def generate() -> str:
    """A new private key, base64 (as ``wg genkey``)."""
    raw = X25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return base64.b64encode(raw).decode()


def decode(key: str, what: str = "key") -> bytes:
    """The 32 bytes of a base64 key; :class:`InvalidKey` naming ``what`` otherwise."""
    try:
        raw = base64.b64decode(key.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidKey(f"{what}: not base64") from None
    if len(raw) != KEY_BYTES:
        raise InvalidKey(f"{what}: {len(raw)} bytes, a WireGuard key has {KEY_BYTES}")
    return raw


def valid_public(key: str | None) -> bool:
    if not key:
        return False
    try:
        decode(key)
    except InvalidKey:
        return False
    return True


def public_of(private: str) -> str:
    """The public key of a base64 private key (as ``wg pubkey``)."""
    priv = X25519PrivateKey.from_private_bytes(decode(private, "private key"))
    return base64.b64encode(priv.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


def hex_of(key: str) -> str:
    """The hex form the UAPI protocol uses."""
    return decode(key).hex()


def b64_of_hex(text: str) -> str:
    return base64.b64encode(bytes.fromhex(text)).decode()


def path(key_dir: str, which: str) -> str:
    return os.path.join(key_dir, which)


def read(key_dir: str, which: str) -> str | None:
    """The private key in ``which`` (CURRENT | NEXT), None when there is none.  A file that is not
    a key raises :class:`InvalidKey` naming the file."""
    p = path(key_dir, which)
    try:
        with open(p, encoding="ascii") as f:
            text = f.read().strip()
    except FileNotFoundError:
        return None
    decode(text, p)
    return text


def write(key_dir: str, which: str, private: str) -> None:
    """Write a private key atomically with mode 0600 (the directory 0700)."""
    decode(private, "private key")
    os.makedirs(key_dir, mode=0o700, exist_ok=True)
    final = path(key_dir, which)
    tmp = f"{final}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (private + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)


def remove(key_dir: str, which: str) -> None:
    try:
        os.unlink(path(key_dir, which))
    except FileNotFoundError:
        pass


def ensure_current(key_dir: str) -> str:
    """The Node's private key: the one on disk, else a new one written there (first start)."""
    key = read(key_dir, CURRENT)
    if key is None:
        key = generate()
        write(key_dir, CURRENT, key)
    return key


def start_rotation(key_dir: str) -> bool:
    """``rotate-key``, or the rotation period over: a ``next.key`` made, unless one is already
    waiting.  Whether one was made."""
    if read(key_dir, NEXT) is not None:
        return False
    ensure_current(key_dir)
    write(key_dir, NEXT, generate())
    return True


def local_keys(key_dir: str, now: float, lead: float) -> LocalKeys:
    """This Node's keys as the plan takes them; a ``next.key`` not announced yet gets its switch
    time now (``now + lead``, kept in ``next.switch-at``: a restart keeps the same instant)."""
    current = ensure_current(key_dir)
    nxt = read(key_dir, NEXT)
    if nxt is None:
        return LocalKeys(current)
    at = _read_switch_at(key_dir)
    if at is None:
        at = now + lead
        tmp = path(key_dir, SWITCH_AT + ".tmp")
        with open(tmp, "w") as f:
            f.write(f"{at:.3f}\n")
        os.replace(tmp, path(key_dir, SWITCH_AT))
    return LocalKeys(current, nxt, at)


def _read_switch_at(key_dir: str) -> float | None:
    try:
        with open(path(key_dir, SWITCH_AT)) as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return None


def finish_rotation(key_dir: str) -> bool:
    """The switch is applied: ``next.key`` becomes ``current.key`` (one rename), the switch time
    goes.  Whether there was a rotation to finish."""
    if read(key_dir, NEXT) is None:
        return False
    os.replace(path(key_dir, NEXT), path(key_dir, CURRENT))
    remove(key_dir, SWITCH_AT)
    return True


def age(key_dir: str, now: float) -> float:
    """Seconds since the current key was written (its file's mtime)."""
    try:
        return now - os.stat(path(key_dir, CURRENT)).st_mtime
    except FileNotFoundError:
        return 0.0
