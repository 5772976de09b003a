"""routesync.wireguard.wgtool's pure parts: the ``wg set`` command line of a change (the private
key only on stdin) and the parser of ``wg show NAME dump`` (literal dumps as wg 1.0.20210914
prints them, taken from a wireguard-go device)."""

from __future__ import annotations

import pytest

from routesync.wireguard.model import KERNEL, PeerChange, WgChange, WgDeviceState, WgPeerState
from routesync.wireguard.wgtool import WgTool, parse_dump, set_argv, show_argv
from tests.routesync.wireguard.keypairs import keypair, public_keys

PRIV, PUB = keypair()
A, B, C = public_keys(3)


def test_private_key_and_port_go_to_stdin_and_argv() -> None:
    argv, stdin = set_argv("ferry-wg0", WgChange(private_key=PRIV, listen_port=51820))
    assert argv == ["wg", "set", "ferry-wg0", "private-key", "/dev/stdin", "listen-port", "51820"]
    assert stdin == PRIV.encode() + b"\n"
    assert not any(PRIV in a for a in argv)


def test_no_private_key_no_stdin() -> None:
    argv, stdin = set_argv("wg1", WgChange(listen_port=0))
    assert (argv, stdin) == (["wg", "set", "wg1", "listen-port", "0"], b"")


def test_peers_in_the_change_s_order_with_every_value() -> None:
    change = WgChange(peers=(
        PeerChange(A, remove=True),
        PeerChange(B, endpoint="192.168.77.12:51820", allowed_ips=("10.244.1.0/24", "fd00:10:244:1::/64"),
                   keepalive=25),
        PeerChange(C, endpoint="[fd00:77::13]:51820", allowed_ips=("10.244.2.0/24",)),
    ))
    argv, stdin = set_argv("wg0", change, wg=("ip", "netns", "exec", "n1", "wg"))
    assert stdin == b""
    assert argv == ["ip", "netns", "exec", "n1", "wg", "set", "wg0",
                    "peer", A, "remove",
                    "peer", B, "endpoint", "192.168.77.12:51820",
                    "allowed-ips", "10.244.1.0/24,fd00:10:244:1::/64", "persistent-keepalive", "25",
                    "peer", C, "endpoint", "[fd00:77::13]:51820",
                    "allowed-ips", "10.244.2.0/24", "persistent-keepalive", "off"]


def test_empty_allowed_ips_is_an_empty_word_and_no_endpoint_keeps_it() -> None:
    """wg set replaces a peer's allowed IPs when given: none at all is given as the empty word."""
    argv, _ = set_argv("wg0", WgChange(peers=(PeerChange(A),)))
    assert argv == ["wg", "set", "wg0", "peer", A, "allowed-ips", "", "persistent-keepalive", "off"]


def test_an_empty_change_is_a_bare_set() -> None:
    assert set_argv("wg0", WgChange()) == (["wg", "set", "wg0"], b"")


@pytest.mark.parametrize(("change", "field"), [
    (WgChange(private_key="short"), "private_key"),
    (WgChange(listen_port=70000), "listen_port"),
    (WgChange(listen_port=True), "listen_port"),  # type: ignore[arg-type]
    (WgChange(peers=(PeerChange("remove"),)), "peers[0].public_key"),
    (WgChange(peers=(PeerChange(A), PeerChange(B, endpoint="node-b:51820"))), "peers[1].endpoint"),
    (WgChange(peers=(PeerChange(A, endpoint="fd00::1:51820"),)), "peers[0].endpoint"),  # v6 without []
    (WgChange(peers=(PeerChange(A, endpoint="[10.0.0.1]:51820"),)), "peers[0].endpoint"),
    (WgChange(peers=(PeerChange(A, endpoint="10.0.0.1:65536"),)), "peers[0].endpoint"),
    (WgChange(peers=(PeerChange(A, endpoint="10.0.0.1"),)), "peers[0].endpoint"),
    (WgChange(peers=(PeerChange(A, allowed_ips=("10.0.0.0/24", "10.1.0.1/24")),)), "peers[0].allowed_ips[1]"),
    (WgChange(peers=(PeerChange(A, allowed_ips=("10.0.0.1",)),)), "peers[0].allowed_ips[0]"),
    (WgChange(peers=(PeerChange(A, allowed_ips=("fd00:0::/64",)),)), "peers[0].allowed_ips[0]"),
    (WgChange(peers=(PeerChange(A, allowed_ips=("10.0.0.0/24,10.1.0.0/24",)),)), "peers[0].allowed_ips[0]"),
    (WgChange(peers=(PeerChange(A, keepalive=-1),)), "peers[0].keepalive"),
    (WgChange(peers=(PeerChange(A), PeerChange(A))), "peers[1].public_key"),
    (WgChange(peers=(PeerChange(A, remove=True), PeerChange(A, remove=True))), "peers[1].public_key"),
])
def test_bad_input_names_the_field(change: WgChange, field: str) -> None:
    with pytest.raises(ValueError) as e:
        set_argv("wg0", change)
    assert str(e.value).startswith(f"{field}: "), e.value


def test_a_bad_private_key_is_not_echoed() -> None:
    secret = PRIV[:-2] + "!="
    with pytest.raises(ValueError) as e:
        set_argv("wg0", WgChange(private_key=secret))
    assert secret not in str(e.value) and "<hidden>" in str(e.value)


@pytest.mark.parametrize("name", ["", "a-name-longer-than-15", "a b", "a/b"])
def test_bad_device_name(name: str) -> None:
    with pytest.raises(ValueError, match="^device name: "):
        set_argv(name, WgChange())
    with pytest.raises(ValueError, match="^device name: "):
        show_argv(name)


def test_the_backend_is_the_kernel_s() -> None:
    assert WgTool.kind == KERNEL


# ---------------------------------------------------------------- wg show NAME dump

PRIV_D = "cLZwxcS9WCAeXzo0DlQul7rkbdJiExvpMARktbSAX10="
PUB_D = "mofdx1yerEiLa5NBLIm4QE+DNdleBbDKm5UGf3ElJzM="
P1 = "mU5lsYMAi4J9ooGB1UQcL7vvKYOxp24ELoxfP6e4yVs="
P2 = "B5I7Texd/ax12Epd4aUTKN1KqqPuf4ZGKlBAo7hBP04="


def test_a_fresh_device_has_no_keys() -> None:
    state = parse_dump("(none)\t(none)\t46289\toff\n")
    assert state == WgDeviceState(public_key=None, listen_port=46289, peers=(), private_key=None)


def test_peers_with_none_endpoints_ipv6_endpoints_and_keepalive() -> None:
    text = (f"{PRIV_D}\t{PUB_D}\t51820\toff\n"
            f"{P2}\t(none)\t(none)\t(none)\t0\t0\t0\toff\n"
            f"{P1}\t(none)\t[::1]:51821\t10.1.0.0/24,fd00:1::/64,10.0.0.0/24\t1717171717\t1234\t5678\t25\n")
    state = parse_dump(text)
    assert state.private_key == PRIV_D and state.public_key == PUB_D and state.listen_port == 51820
    assert state.peers == (  # sorted by public key; allowed IPs sorted
        WgPeerState(public_key=P2, endpoint=None, allowed_ips=(), keepalive=0, last_handshake=0.0),
        WgPeerState(public_key=P1, endpoint="[::1]:51821", allowed_ips=("10.0.0.0/24", "10.1.0.0/24", "fd00:1::/64"),
                    keepalive=25, last_handshake=1717171717.0, rx_bytes=1234, tx_bytes=5678),
    )
    assert PRIV_D not in repr(state)


def test_an_ipv4_endpoint_and_a_fwmark() -> None:
    state = parse_dump(f"{PRIV_D}\t{PUB_D}\t0\t0x1234\n{P1}\t(none)\t1.2.3.4:5\t10.2.0.0/16\t0\t0\t0\toff\n")
    assert state.listen_port == 0
    assert state.peers[0].endpoint == "1.2.3.4:5" and state.peers[0].allowed_ips == ("10.2.0.0/16",)


@pytest.mark.parametrize(("text", "what"), [
    ("", "empty output"),
    ("(none)\t(none)\t1\n", "the device line has 3 fields"),
    (f"(none)\t(none)\t1\toff\n{P1}\t(none)\t(none)\n", "line 2 has 3 fields"),
    (f"(none)\t(none)\t1\toff\n{P1}\t(none)\t(none)\t(none)\tsoon\t0\t0\toff\n", "line 2 latest-handshake"),
    ("(none)\t(none)\tport\toff\n", "listen-port"),
])
def test_a_malformed_dump_says_where(text: str, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        parse_dump(text)


def test_a_peer_removed_and_made_again_is_two_entries_in_the_one_command() -> None:
    """``plan.rehandshake``: the kernel applies a set's peers in order, so the second is a new peer."""
    argv, _ = set_argv("wg0", WgChange(peers=(PeerChange(A, False, "192.0.2.1:51820", ("10.0.0.0/24",), 0, kick=True),
                                              PeerChange(A, remove=True))))
    assert argv[3:6] == ["peer", A, "remove"] and argv[6:8] == ["peer", A] and "10.0.0.0/24" in argv
