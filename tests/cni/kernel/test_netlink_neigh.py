"""neigh_del forgets exactly the named neighbour entry (checked with ip neigh)."""

from __future__ import annotations

import subprocess

import pytest

from cni.kernel.netlink import Netlink
from tests.support.ovs_instance import netns

pytestmark = pytest.mark.root


def _ip(ns: str, *argv: str) -> str:
    return subprocess.run(["ip", "-n", ns, *argv], check=True, capture_output=True, text=True).stdout


def test_neigh_del_removes_one_entry_and_reports_absence():
    with netns("fs-neigh") as ns:
        _ip(ns, "link", "add", "name", "a", "type", "veth", "peer", "name", "b")
        _ip(ns, "link", "set", "dev", "a", "up")
        _ip(ns, "neigh", "add", "10.0.0.2", "lladdr", "02:00:00:00:00:02", "dev", "a", "nud", "permanent")
        _ip(ns, "neigh", "add", "10.0.0.3", "lladdr", "02:00:00:00:00:03", "dev", "a", "nud", "permanent")
        _ip(ns, "-6", "neigh", "add", "fd00::2", "lladdr", "02:00:00:00:00:02", "dev", "a", "nud", "permanent")
        index = int(_ip(ns, "-o", "link", "show", "a").split(":")[0])
        with Netlink.in_netns(f"/run/netns/{ns}") as nl:
            assert nl.neigh_del(index, "10.0.0.2") is True
            assert nl.neigh_del(index, "10.0.0.2") is False
            assert nl.neigh_del(index, "fd00::2") is True
        assert "10.0.0.2 " not in _ip(ns, "neigh", "show", "dev", "a")
        assert "10.0.0.3 " in _ip(ns, "neigh", "show", "dev", "a")
        assert "fd00::2 " not in _ip(ns, "-6", "neigh", "show", "dev", "a")
