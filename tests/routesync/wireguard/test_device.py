"""routesync.wireguard.device against the real userspace implementation (wireguard-go) in a
namespace of its own: made, configured, read back; a second Node's device of the same name in
another namespace beside it (its own socket directory); killed, seen by its generation and made
again; the process outlives the object (and so route-sync) that started it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from routesync.apply.routes import RouteApplier
from routesync.config import WireGuardConfig
from routesync.wireguard import keys
from routesync.wireguard.device import WireGuardDevice, userspace_argv
from routesync.wireguard.model import WgDevice, WgPeer, WgSpec
from routesync.wireguard.uapi import Uapi
from tests.support import wireguard_go
from tests.support.ovs_instance import netns
from tests.support.waiting import until

pytestmark = pytest.mark.root


def make(ns: str, run_dir: str) -> tuple[WireGuardDevice, RouteApplier]:
    exe = wireguard_go.binary()
    assert exe, "no build/tools/wireguard-go: run tools/build-go-tools.sh wireguard-go"
    routes = RouteApplier(netns=ns)
    cfg = WireGuardConfig(userspace_command=exe, run_dir=run_dir, key_dir=run_dir, implementation="userspace")
    return WireGuardDevice(cfg, routes.index, run_dir, netns=ns), routes


@pytest.fixture
def two_nodes(tmp_path: str) -> Iterator[list[tuple[WireGuardDevice, RouteApplier, str]]]:
    with netns(f"wgd-a{os.getpid()}") as a, netns(f"wgd-b{os.getpid()}") as b:
        made = []
        try:
            for ns in (a, b):
                d, r = make(ns, os.path.join(tmp_path, ns))
                made.append((d, r, ns))
            yield made
        finally:
            for d, r, _ in made:
                d.delete()
                r.close()


def spec(private: str, peer_key: str) -> WgSpec:
    return WgSpec(WgDevice("ferry-wg0", 51820, private,
                           (WgPeer(peer_key, "192.0.2.2:51820", ("10.244.2.0/24", "fd00:10:244:2::/64")),)),
                  ("10.244.1.1/32",), 1440)


def test_two_nodes_devices_are_made_synced_and_read_back(two_nodes) -> None:  # type: ignore[no-untyped-def]
    (a, _, _), (b, _, _) = two_nodes
    assert a.ensure() and b.ensure()  # the same interface name, each its own socket
    assert a.generation() and b.generation() and not a.ensure()
    ka, kb = keys.generate(), keys.generate()
    first = a.sync(spec(ka, keys.public_of(kb)))
    assert first.private_key == ka and len(first.peers) == 1
    st = a.read()
    assert st is not None and st.public_key == keys.public_of(ka) and st.listen_port == 51820
    assert [(p.public_key, p.allowed_ips) for p in st.peers] == [
        (keys.public_of(kb), ("10.244.2.0/24", "fd00:10:244:2::/64"))]
    assert a.sync(spec(ka, keys.public_of(kb))).empty  # read back: nothing to do
    assert b.read() is not None and b.read().peers == ()  # type: ignore[union-attr]


def test_a_killed_device_is_a_new_generation_made_and_configured_again(two_nodes) -> None:  # type: ignore[no-untyped-def]
    (a, _, _), _ = two_nodes
    a.ensure()
    k, peer = keys.generate(), keys.public_of(keys.generate())
    a.sync(spec(k, peer))
    gen, pid = a.generation(), a.pid
    # the process runs in a session of its own: route-sync's exit leaves it running
    assert pid and os.getsid(pid) != os.getsid(0)
    os.kill(pid, signal.SIGKILL)
    until(lambda: a.generation() != gen, "the killed device's link gone")
    assert a.generation() == 0 and a.read() is None
    assert a.ensure()
    assert a.generation() not in (0, gen)
    assert a.sync(spec(k, peer)).private_key == k  # a fresh device: everything again
    assert a.read().peers[0].public_key == peer  # type: ignore[union-attr]


def test_a_started_device_outlives_the_object_that_started_it(tmp_path: str) -> None:
    with netns(f"wgd-c{os.getpid()}") as ns:
        d, r = make(ns, os.path.join(tmp_path, "c"))
        d.ensure()
        gen = d.generation()
        d2, r2 = make(ns, os.path.join(tmp_path, "c"))  # as a restarted route-sync
        assert not d2.ensure() and d2.generation() == gen  # the next route-sync finds it
        d2.delete()
        until(lambda: not Uapi(os.path.join(tmp_path, "c")).alive("ferry-wg0"), "wireguard-go gone with its link")
        r.close()
        r2.close()


def test_the_command_line_mounts_another_socket_directory() -> None:
    default = WireGuardConfig(userspace_command="/x/wireguard-go")
    assert userspace_argv(default) == ["/x/wireguard-go", "-f", "ferry-wg0"]
    other = userspace_argv(WireGuardConfig(userspace_command="/x/wireguard-go", run_dir="/lab/n1/wg"))
    assert other[:4] == ["unshare", "--mount", "--propagation", "private"]
    assert other[-1] == "mount --bind /lab/n1/wg /var/run/wireguard && exec /x/wireguard-go -f ferry-wg0"
