"""WireGuard key pairs for tests (X25519, as ``wg genkey | wg pubkey`` makes them), base64 text."""

from __future__ import annotations

import base64

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat


def keypair() -> tuple[str, str]:
    """(private, public)."""
    k = X25519PrivateKey.generate()
    private = k.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    public = k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(private).decode(), base64.b64encode(public).decode()


def public_keys(n: int) -> list[str]:
    """``n`` peers' public keys, sorted (as a device's peers are)."""
    return sorted(keypair()[1] for _ in range(n))
