"""routesync.wireguard.kernel against the running kernel, in fresh namespaces.

This machine's kernel has no WireGuard (no module, none to load): the probe must say so, and
what it reads is the kernel's real answer (EOPNOTSUPP, "Unknown device type", what
``ip link add ... type wireguard`` prints too) to a message the kernel otherwise accepts (the
same request of kind ``bridge`` makes a link).  On a kernel with WireGuard that test is skipped
and a real link is created and deleted instead."""

from __future__ import annotations

import errno
import glob
import os
import subprocess
from collections.abc import Iterator

import pytest

from cni.kernel.netlink import Netlink, NetlinkError
from routesync.wireguard import kernel
from tests.support.names import uniq
from tests.support.ovs_instance import netns

pytestmark = pytest.mark.root


def kernel_has_wireguard() -> bool:
    """Loaded or built in (/sys/module/wireguard), or a module the kernel can load."""
    release = os.uname().release
    return os.path.exists("/sys/module/wireguard") or bool(
        glob.glob(f"/lib/modules/{release}/**/wireguard.ko*", recursive=True))


HAS_WG = kernel_has_wireguard()


@pytest.fixture
def ns() -> Iterator[str]:
    with netns(uniq("wgk")) as name:
        yield name


def link_names(ns: str) -> list[str]:
    with Netlink.in_netns(f"/run/netns/{ns}") as nl:
        return sorted(link.name for link in nl.links())


def test_the_request_is_one_the_kernel_takes(ns: str) -> None:
    """The positive control: the same builder, a kind this kernel has."""
    with Netlink.in_netns(f"/run/netns/{ns}") as nl:
        nl.link_add("br-probe", "bridge")
        link = nl.link_get("br-probe")
        assert link is not None and link.kind == "bridge" and not link.up
        with pytest.raises(NetlinkError) as e:
            nl.link_add("br-probe", "bridge")
        assert e.value.errno == errno.EEXIST


@pytest.mark.skipif(HAS_WG, reason="this kernel has WireGuard: test_a_real_link_is_created_and_deleted runs instead")
def test_no_wireguard_here_is_the_kernel_s_answer(ns: str) -> None:
    assert kernel.kernel_supported(ns) is False
    assert kernel.kernel_supported(f"/run/netns/{ns}") is False  # a path works as well as a name
    with pytest.raises(NetlinkError) as e:
        kernel.create_link("ferry-wg0", ns)
    assert e.value.errno == errno.EOPNOTSUPP
    assert "Unknown device type" in str(e.value)  # the kernel's extended ack
    ip = subprocess.run(["ip", "-n", ns, "link", "add", "ferry-wg0", "type", "wireguard"],
                        capture_output=True, text=True, check=False)
    assert ip.returncode != 0 and "Unknown device type" in ip.stderr  # iproute2 hears the same
    assert link_names(ns) == ["lo"]  # no probe left behind
    assert kernel.delete_link("ferry-wg0", ns) is False  # nothing to delete is no error


@pytest.mark.skipif(not HAS_WG, reason="this kernel has no WireGuard module: "
                                       "test_no_wireguard_here_is_the_kernel_s_answer runs instead")
def test_a_real_link_is_created_and_deleted(ns: str) -> None:
    assert kernel.kernel_supported(ns) is True
    assert link_names(ns) == ["lo"]  # the probe is gone
    assert kernel.create_link("ferry-wg0", ns) is True
    assert kernel.create_link("ferry-wg0", ns) is False  # there already
    with Netlink.in_netns(f"/run/netns/{ns}") as nl:
        link = nl.link_get("ferry-wg0")
    assert link is not None and link.kind == kernel.KIND
    assert kernel.delete_link("ferry-wg0", ns) is True
    assert kernel.delete_link("ferry-wg0", ns) is False
    assert link_names(ns) == ["lo"]


def test_links_of_another_kind_are_not_taken_or_deleted(ns: str) -> None:
    with Netlink.in_netns(f"/run/netns/{ns}") as nl:
        nl.link_add("ferry-wg0", "bridge")
    with pytest.raises(ValueError, match="it is a bridge link, not deleted"):
        kernel.delete_link("ferry-wg0", ns)
    with pytest.raises(NetlinkError, match="taken by a bridge link"):  # the kernel checks the name first
        kernel.create_link("ferry-wg0", ns)
    assert link_names(ns) == ["ferry-wg0", "lo"]


def test_bad_names() -> None:
    for bad in ("", "sixteen-chars-xx", "a b"):
        with pytest.raises(ValueError, match="WireGuard link name"):
            kernel.create_link(bad)
        with pytest.raises(ValueError, match="WireGuard link name"):
            kernel.delete_link(bad)
