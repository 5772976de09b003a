"""cni.kernel.netns + cni.kernel.netlink against the real kernel, cross-checked with pyroute2."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable

import pytest
from pyroute2 import IPRoute, NetNS

from cni.kernel.netlink import IFA_F_TENTATIVE, Netlink, NetlinkError
from cni.kernel.netns import SELF_NETNS, entered, open_netns
from tests.support.names import uniq
from tests.support.waiting import until

pytestmark = pytest.mark.root


def path(ns: str) -> str:
    return f"/run/netns/{ns}"


def ino(p: str) -> int:
    return os.stat(p).st_ino


def pr_link(ipr: IPRoute | NetNS, name: str) -> dict:
    (link,) = ipr.link("get", ifname=name)
    return {"index": link["index"], "mac": link.get_attr("IFLA_ADDRESS"), "mtu": link.get_attr("IFLA_MTU"),
            "up": bool(link["flags"] & 1)}


@pytest.fixture
def veth(ns: str) -> tuple[str, str]:
    """A veth: host end ``fs-h....`` here, ``eth0`` inside ``ns``."""
    host = uniq("h")
    fd = open_netns(path(ns))
    try:
        with Netlink() as nl:
            nl.create_veth(host, "eth0", fd, mtu=1400, peer_mac="02:fe:00:00:00:01", mac="02:fe:00:00:00:02")
    finally:
        os.close(fd)
    yield host, ns
    with Netlink() as nl:
        nl.link_del(host)


# ------------------------------------------------------------------ netns

def test_open_missing_netns_raises_file_not_found() -> None:
    with pytest.raises(FileNotFoundError):
        open_netns("/run/netns/fs-does-not-exist")
    with pytest.raises(FileNotFoundError):
        Netlink.in_netns("/run/netns/fs-does-not-exist")


def test_entered_switches_thread_netns_and_always_returns(ns: str) -> None:
    before = ino(SELF_NETNS)
    with entered(path(ns)):
        assert ino(SELF_NETNS) == ino(path(ns)) != before
    assert ino(SELF_NETNS) == before
    with pytest.raises(RuntimeError), entered(path(ns)):
        raise RuntimeError("boom")
    assert ino(SELF_NETNS) == before


def test_netlink_socket_stays_in_its_netns(ns: str) -> None:
    with Netlink.in_netns(path(ns)) as nl:
        assert ino(SELF_NETNS) != ino(path(ns))  # we are back home...
        names = {link.name for link in nl.links()}  # ...but the socket sees the other netns
    with NetNS(ns) as pr:
        assert names == {link.get_attr("IFLA_IFNAME") for link in pr.get_links()} == {"lo"}


# ------------------------------------------------------------------ links

def test_create_veth_with_peer_inside_netns(veth: tuple[str, str]) -> None:
    host, ns = veth
    with IPRoute() as ipr:
        h = pr_link(ipr, host)
    with NetNS(ns) as pr:
        p = pr_link(pr, "eth0")
    assert (h["mac"], h["mtu"]) == ("02:fe:00:00:00:02", 1400)
    assert (p["mac"], p["mtu"]) == ("02:fe:00:00:00:01", 1400)
    with Netlink() as nl:
        link = nl.link_get(host)
        assert link is not None
        assert (link.index, link.mac, link.mtu, link.kind, link.up) == (h["index"], h["mac"], 1400, "veth", False)
        assert link.peer_index == p["index"]
        assert nl.link_index(host) == h["index"]
        assert nl.link_get(h["index"]) == link
    with Netlink.in_netns(path(ns)) as nl:
        peer = nl.link_get("eth0")
        assert peer is not None and (peer.index, peer.mac, peer.kind) == (p["index"], p["mac"], "veth")


def test_links_lists_what_pyroute2_lists() -> None:
    with Netlink() as nl:
        mine = {(link.index, link.name, link.mtu) for link in nl.links()}
    with IPRoute() as ipr:
        theirs = {(lk["index"], lk.get_attr("IFLA_IFNAME"), lk.get_attr("IFLA_MTU")) for lk in ipr.get_links()}
    assert mine == theirs


def test_create_veth_errors(veth: tuple[str, str], make_netns: Callable[[str], str]) -> None:
    host, ns = veth
    fd = open_netns(path(ns))
    try:
        with Netlink() as nl:
            with pytest.raises(NetlinkError) as e:  # host name taken
                nl.create_veth(host, "eth1", fd, mtu=1500)
            assert e.value.errno == errno.EEXIST
            other = uniq("h")
            with pytest.raises(NetlinkError) as e:  # peer name taken inside the target netns
                nl.create_veth(other, "eth0", fd, mtu=1500)
            assert e.value.errno == errno.EEXIST
            assert nl.link_get(other) is None  # nothing half-created on the host side
    finally:
        os.close(fd)


def test_link_set_up_mtu_mac(veth: tuple[str, str]) -> None:
    host, _ = veth
    with Netlink() as nl:
        nl.link_set(host, up=True, mtu=1300, mac="02:fe:00:00:00:aa")
        with IPRoute() as ipr:
            assert pr_link(ipr, host) | {"index": 0} == {"index": 0, "mac": "02:fe:00:00:00:aa", "mtu": 1300,
                                                          "up": True}
        index = nl.link_index(host)
        assert index is not None
        nl.link_set(index, up=False)
        with IPRoute() as ipr:
            assert pr_link(ipr, host)["up"] is False
        with pytest.raises(NetlinkError) as e:
            nl.link_set("fs-nonexistent", up=True)
        assert e.value.errno == errno.ENODEV


def test_link_del_is_idempotent_and_takes_the_peer(ns: str) -> None:
    host = uniq("h")
    with Netlink() as nl:
        fd = open_netns(path(ns))
        nl.create_veth(host, "eth0", fd, mtu=1500)
        os.close(fd)
        assert nl.link_del(host) is True
        assert nl.link_del(host) is False
        assert nl.link_get(host) is None
    with NetNS(ns) as pr:
        assert not pr.link_lookup(ifname="eth0")


# ------------------------------------------------------------------ addresses

def addressed_eth0(nl: Netlink) -> int:
    """``eth0`` (in ``nl``'s namespace) up with 10.99.0.5/24 and fd00:99::5/64; its index."""
    idx = nl.link_index("eth0")
    assert idx is not None
    nl.link_set(idx, up=True)
    nl.addr_add(idx, "10.99.0.5/24")
    nl.addr_add(idx, "fd00:99::5/64")
    return idx


def test_addresses_v4_v6_without_dad(veth: tuple[str, str]) -> None:
    host, ns = veth
    with Netlink() as host_nl:
        host_nl.link_set(host, up=True)  # carrier, so the kernel adds a link-local address
    with Netlink.in_netns(path(ns)) as nl:
        idx = addressed_eth0(nl)
        with pytest.raises(NetlinkError) as e:
            nl.addr_add(idx, "10.99.0.5/24")
        assert e.value.errno == errno.EEXIST
        assert sorted(nl.addrs(idx)) == ["10.99.0.5/24", "fd00:99::5/64"]
        assert nl.addrs(idx, socket.AF_INET) == ["10.99.0.5/24"]
        assert nl.addrs(idx, socket.AF_INET6) == ["fd00:99::5/64"]
        def with_link_local() -> dict:
            with NetNS(ns) as pr:
                seen = {(a.get_attr("IFA_ADDRESS"), a["prefixlen"]): a for a in pr.get_addr(index=idx)}
            return seen if any(a.startswith("fe80") for a, _p in seen) else {}

        seen = until(with_link_local, "the kernel's link-local address on eth0")
        assert ("10.99.0.5", 24) in seen and ("fd00:99::5", 64) in seen
        # pyroute2's view: the v6 address is neither tentative nor DAD-pending.
        v6flags = seen[("fd00:99::5", 64)].get_attr("IFA_FLAGS")
        assert not v6flags & IFA_F_TENTATIVE
        link_local = [a for a in seen if a[0].startswith("fe80")]
        assert link_local and all(f"{a}/{p}" not in nl.addrs(idx) for a, p in link_local)
        assert any(x.startswith("fe80") for x in nl.addrs(idx, link_local=True))
        assert nl.addr_del(idx, "10.99.0.5/24") is True
        assert nl.addr_del(idx, "10.99.0.5/24") is False
        assert nl.addrs(idx) == ["fd00:99::5/64"]


# ------------------------------------------------------------------ routes

def test_routes_match_pyroute2(veth: tuple[str, str]) -> None:
    _, ns = veth
    with Netlink.in_netns(path(ns)) as nl:
        idx = addressed_eth0(nl)
        nl.route_add("0.0.0.0/0", "10.99.0.1", idx)
        nl.route_add("10.100.0.0/16", "10.200.0.1", idx, onlink=True)  # gateway off-subnet
        nl.route_add("192.168.50.0/24", None, idx)
        nl.route_add("::/0", "fd00:99::1", idx)
        with pytest.raises(NetlinkError) as e:
            nl.route_add("0.0.0.0/0", "10.99.0.1", idx)
        assert e.value.errno == errno.EEXIST
        v4 = {(r.dst, r.gw, r.index) for r in nl.routes(socket.AF_INET)}
        v6 = {(r.dst, r.gw, r.index) for r in nl.routes(socket.AF_INET6, index=idx)}
        assert {("0.0.0.0/0", "10.99.0.1", idx), ("10.100.0.0/16", "10.200.0.1", idx),
                ("192.168.50.0/24", None, idx), ("10.99.0.0/24", None, idx)} == v4
        assert ("::/0", "fd00:99::1", idx) in v6 and ("fd00:99::/64", None, idx) in v6
        assert {r.proto for r in nl.routes(socket.AF_INET) if r.gw} == {4}
        with NetNS(ns) as pr:
            theirs = set()
            for r in pr.get_routes(family=socket.AF_INET, table=254):
                dst = r.get_attr("RTA_DST") or "0.0.0.0"
                theirs.add((f"{dst}/{r['dst_len']}", r.get_attr("RTA_GATEWAY"), r.get_attr("RTA_OIF")))
            onlink = [r for r in pr.get_routes(family=socket.AF_INET, table=254)
                      if r.get_attr("RTA_DST") == "10.100.0.0"]
        assert theirs == v4
        assert onlink[0]["flags"] & 4  # RTNH_F_ONLINK
        assert nl.route_del("0.0.0.0/0") is True
        assert nl.route_del("0.0.0.0/0") is False
        assert nl.route_del("::/0", "fd00:99::1", idx) is True
        assert ("0.0.0.0/0", "10.99.0.1", idx) not in {(r.dst, r.gw, r.index) for r in nl.routes(socket.AF_INET)}
        assert all(r.dst != "::/0" for r in nl.routes(socket.AF_INET6))
