"""WgTool against a real device: ``wg`` drives a userspace device when its UAPI socket exists, so
wireguard-go in a fresh namespace stands in for the kernel's WireGuard (this kernel has none).
Each change is one ``wg set``; the device is read back with ``wg show dump`` and must hold
exactly the desired state."""

from __future__ import annotations

import logging
import secrets
import shutil
from collections.abc import Iterator

import pytest

from routesync.wireguard.model import PeerChange, WgChange, WgDevice, WgDeviceState, WgPeer
from routesync.wireguard.wgtool import WgTool
from tests.routesync.wireguard.keypairs import keypair, public_keys
from tests.support import wireguard_go
from tests.support.names import uniq
from tests.support.ovs_instance import netns

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("wg") is None, reason="no wg (apt-get install wireguard-tools)"),
    pytest.mark.skipif(wireguard_go.binary() is None, reason="no build/tools/wireguard-go "
                                                             "(tools/build-go-tools.sh wireguard-go)"),
]


@pytest.fixture
def dev() -> Iterator[str]:
    """A running wireguard-go device in its own namespace: its name."""
    with netns(uniq("wgns")) as ns:
        name = uniq("wg")
        with wireguard_go.device(ns, name):
            yield name


def held(state: WgDeviceState) -> WgDevice:
    """What a device holds, in the desired device's terms."""
    assert state.private_key is not None
    return WgDevice(name="", listen_port=state.listen_port, private_key=state.private_key,
                    peers=tuple(WgPeer(p.public_key, p.endpoint, p.allowed_ips, p.keepalive) for p in state.peers))


def desired(private_key: str, port: int, *peers: WgPeer) -> WgDevice:
    return WgDevice(name="", listen_port=port, private_key=private_key,
                    peers=tuple(sorted(peers, key=lambda p: p.public_key)))


def change_to(want: WgDevice, remove: tuple[str, ...] = ()) -> WgChange:
    return WgChange(private_key=want.private_key, listen_port=want.listen_port,
                    peers=tuple(PeerChange(k, remove=True) for k in remove) + tuple(
                        PeerChange(p.public_key, endpoint=p.endpoint, allowed_ips=p.allowed_ips, keepalive=p.keepalive)
                        for p in want.peers))


def test_configure_add_move_remove_reads_back_as_desired(dev: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    wg = WgTool()
    private, public = keypair()
    a, b, c = public_keys(3)
    port = 40000 + secrets.randbelow(20000)

    # a fresh device: no key, a random port
    assert wg.read(dev).public_key is None

    # 1. key, port and three peers: IPv4 and IPv6 endpoints, keepalive, one with nothing
    want = desired(private, port,
                   WgPeer(a, "192.168.77.12:51820", ("10.244.1.0/24", "fd00:10:244:1::/64"), 25),
                   WgPeer(b, "[fd00:77::13]:51820", ("10.244.2.0/24",)),
                   WgPeer(c, None, ()))
    wg.configure(dev, change_to(want))
    state = wg.read(dev)
    assert state.public_key == public  # derived by the device from the private key given on stdin
    assert held(state) == want

    # 2. in one change: a's IPv4 Pod CIDR moves to b, c is removed, a's endpoint and keepalive change
    want = desired(private, port,
                   WgPeer(a, "192.168.88.12:51821", ("fd00:10:244:1::/64",), 0),
                   WgPeer(b, "[fd00:77::13]:51820", ("10.244.1.0/24", "10.244.2.0/24")))
    wg.configure(dev, WgChange(peers=(
        PeerChange(c, remove=True),
        PeerChange(a, endpoint="192.168.88.12:51821", allowed_ips=("fd00:10:244:1::/64",)),
        PeerChange(b, endpoint="[fd00:77::13]:51820", allowed_ips=("10.244.1.0/24", "10.244.2.0/24")))))
    assert held(wg.read(dev)) == want

    # 3. the last peers go; the key and port stay
    wg.configure(dev, WgChange(peers=(PeerChange(a, remove=True), PeerChange(b, remove=True))))
    assert held(wg.read(dev)) == desired(private, port)

    # removing a peer the device does not have is no error (a repeated change is harmless)
    wg.configure(dev, WgChange(peers=(PeerChange(a, remove=True),)))

    # the private key was on no command line and in no log line
    assert caplog.records, "WgTool logs each wg call"
    assert not any(private in r.getMessage() for r in caplog.records)


def test_a_missing_device_is_a_lookup_error(dev: str) -> None:
    wg = WgTool()
    gone = uniq("wg")
    with pytest.raises(LookupError, match=gone):
        wg.read(gone)
    with pytest.raises(LookupError, match=gone):
        wg.configure(gone, WgChange(listen_port=1))
    assert wg.read(dev).peers == ()  # the running one answers all along
