"""routesync.wireguard.keys: key files (mode, atomicity, rotation's files) and the X25519 public key."""

from __future__ import annotations

import base64
import os
import stat

import pytest

from routesync.wireguard import keys

# RFC 7748 section 6.1: Alice's private and public keys
ALICE_PRIVATE = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
ALICE_PUBLIC = bytes.fromhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_the_public_key_is_rfc_7748s() -> None:
    assert keys.public_of(b64(ALICE_PRIVATE)) == b64(ALICE_PUBLIC)


def test_generated_keys_are_32_bytes_and_differ() -> None:
    a, b = keys.generate(), keys.generate()
    assert a != b and len(keys.decode(a)) == 32 and keys.valid_public(keys.public_of(a))


@pytest.mark.parametrize("bad", ["", "not base64!", b64(b"x" * 31), b64(b"x" * 33)])
def test_a_malformed_key_is_refused_without_echoing_it(bad: str) -> None:
    assert not keys.valid_public(bad)
    with pytest.raises(keys.InvalidKey) as e:
        keys.decode(bad, "the peer's key")
    assert "the peer's key" in str(e.value) and (not bad or bad not in str(e.value))


def test_the_private_key_file_is_0600_and_survives(tmp_path: str) -> None:
    d = os.path.join(tmp_path, "wg")
    first = keys.ensure_current(d)
    mode = stat.S_IMODE(os.stat(keys.path(d, keys.CURRENT)).st_mode)
    assert mode == 0o600 and stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert keys.ensure_current(d) == first  # a restart keeps the key
    assert [n for n in os.listdir(d)] == [keys.CURRENT]  # no temporary file left


def test_a_file_that_is_not_a_key_names_itself(tmp_path: str) -> None:
    with open(os.path.join(tmp_path, keys.CURRENT), "w") as f:
        f.write("garbage\n")
    with pytest.raises(keys.InvalidKey, match=keys.CURRENT):
        keys.read(str(tmp_path), keys.CURRENT)


def test_a_rotation_announces_once_and_finishes_with_one_rename(tmp_path: str) -> None:
    d = str(tmp_path)
    current = keys.ensure_current(d)
    assert keys.local_keys(d, 1000.0, 2.0).next is None
    assert keys.start_rotation(d) and not keys.start_rotation(d)  # one at a time
    lk = keys.local_keys(d, 1000.0, 2.0)
    assert lk.current == current and lk.next is not None and lk.switch_at == 1002.0
    assert keys.local_keys(d, 1500.0, 2.0).switch_at == 1002.0  # a restart keeps the instant
    assert lk.current not in repr(lk) and lk.next not in repr(lk)
    assert keys.finish_rotation(d)
    after = keys.local_keys(d, 1500.0, 2.0)
    assert after.current == lk.next and after.next is None and after.switch_at is None
    assert not keys.finish_rotation(d)
    assert sorted(os.listdir(d)) == [keys.CURRENT]
