"""routesync.wireguard.uapi's requests and answers, as text (the protocol of wireguard.com/xplatform)."""

from __future__ import annotations

import base64

from routesync.wireguard import keys, uapi
from routesync.wireguard.model import PeerChange, WgChange

K1 = base64.b64encode(bytes(range(32))).decode()
K2 = base64.b64encode(bytes(range(32, 64))).decode()


def test_a_set_request_removes_first_replaces_allowed_ips_and_hexes_keys() -> None:
    req = uapi.set_request(WgChange(private_key=K1, listen_port=51820, peers=(
        PeerChange(K2, False, "192.0.2.1:51820", ("10.244.2.0/24",), 0),
        PeerChange(K1, remove=True))))
    assert req == ("set=1\n"
                   f"private_key={bytes(range(32)).hex()}\nlisten_port=51820\n"
                   f"public_key={bytes(range(32)).hex()}\nremove=true\n"
                   f"public_key={bytes(range(32, 64)).hex()}\nendpoint=192.0.2.1:51820\n"
                   "persistent_keepalive_interval=0\nreplace_allowed_ips=true\nallowed_ip=10.244.2.0/24\n\n")


def test_a_kick_turns_the_keepalive_on_from_zero_and_back_off() -> None:
    req = uapi.set_request(WgChange(peers=(PeerChange(K2, False, None, (), 0, kick=True),)))
    lines = req.splitlines()
    assert lines[:4] == ["set=1", f"public_key={keys.hex_of(K2)}", "persistent_keepalive_interval=0",
                         f"persistent_keepalive_interval={uapi.KICK}"]
    assert lines[-3:] == [f"public_key={keys.hex_of(K2)}", "persistent_keepalive_interval=0", ""]
    kept = uapi.set_request(WgChange(peers=(PeerChange(K2, False, None, (), 25, kick=True),))).splitlines()
    assert kept.count(f"public_key={keys.hex_of(K2)}") == 1 and "persistent_keepalive_interval=25" in kept


def test_a_get_answer_parses_into_the_devices_state() -> None:
    text = (f"private_key={bytes(range(32)).hex()}\nlisten_port=51820\n"
            f"public_key={bytes(range(32, 64)).hex()}\nendpoint=[fd00::1]:51820\nlast_handshake_time_sec=100\n"
            "last_handshake_time_nsec=500000000\ntx_bytes=7\nrx_bytes=9\npersistent_keepalive_interval=25\n"
            "allowed_ip=fd00:10:244:2::/64\nallowed_ip=10.244.2.0/24\nprotocol_version=1\nerrno=0\n\n")
    st = uapi.parse_get(text)
    assert st.private_key == K1 and st.public_key == keys.public_of(K1) and st.listen_port == 51820
    (p,) = st.peers
    assert (p.public_key, p.endpoint, p.allowed_ips, p.keepalive, p.last_handshake, p.rx_bytes, p.tx_bytes) == \
        (K2, "[fd00::1]:51820", ("10.244.2.0/24", "fd00:10:244:2::/64"), 25, 100.5, 9, 7)
    assert K1 not in repr(st)


def test_an_empty_device_has_no_key() -> None:
    st = uapi.parse_get("listen_port=0\nerrno=0\n\n")
    assert st.public_key is None and st.peers == ()


def test_a_peer_removed_and_made_again_is_removed_first_then_kicked() -> None:
    """``plan.rehandshake``'s change: one transaction, the removal first, so the peer that follows
    is a new one (no handshake in its past)."""
    req = uapi.set_request(WgChange(peers=(PeerChange(K2, False, "192.0.2.1:51820", ("10.244.2.0/24",), 0, kick=True),
                                           PeerChange(K2, remove=True)))).splitlines()
    k = f"public_key={keys.hex_of(K2)}"
    assert req[1:3] == [k, "remove=true"] and req[3] == k and req.index("endpoint=192.0.2.1:51820") > 3
    assert f"persistent_keepalive_interval={uapi.KICK}" in req
