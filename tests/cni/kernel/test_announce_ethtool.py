"""cni.kernel.ethtool vs ``ethtool -k``; cni.kernel.announce frames checked on the wire and by the receiving kernel."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import time

import pytest
from pyroute2 import NetNS

from cni.kernel.announce import checksum, garp_frame, na_frame
from cni.kernel.ethtool import get_tx_checksum, set_tx_checksum
from cni.kernel.netlink import Netlink
from cni.kernel.netns import entered, open_netns
from tests.support.waiting import HANG, until

pytestmark = pytest.mark.root
MAC_A, MAC_B = "02:fe:00:00:0a:01", "02:fe:00:00:0b:01"


@pytest.fixture
def pair(make_netns):  # type: ignore[no-untyped-def]
    """Two namespaces joined by a veth: ``eth0`` in each, up, with v4/v6 addresses."""
    a, b = make_netns("a"), make_netns("b")
    fd = open_netns(f"/run/netns/{b}")
    with Netlink.in_netns(f"/run/netns/{a}") as nl:
        nl.create_veth("eth0", "eth0", fd, mtu=1500, mac=MAC_A, peer_mac=MAC_B)
    os.close(fd)
    for ns, n in ((a, 1), (b, 2)):
        with Netlink.in_netns(f"/run/netns/{ns}") as nl:
            idx = nl.link_index("eth0")
            assert idx is not None
            nl.link_set(idx, up=True)
            nl.addr_add(idx, f"10.77.0.{n}/24")
            nl.addr_add(idx, f"fd00:77::{n}/64")
    return a, b


def ethtool_tx(ns: str) -> str:
    out = subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-k", "eth0"], capture_output=True,
                         text=True, check=True).stdout
    return next(line.split(":")[1].split()[0] for line in out.splitlines() if line.startswith("tx-checksumming:"))


def test_tx_checksum_off_and_on_as_ethtool_sees_it(pair) -> None:  # type: ignore[no-untyped-def]
    a, _ = pair
    with entered(f"/run/netns/{a}"):
        assert get_tx_checksum("eth0") is True
        set_tx_checksum("eth0", False)
        assert get_tx_checksum("eth0") is False
    assert ethtool_tx(a) == "off"
    with entered(f"/run/netns/{a}"):
        set_tx_checksum("eth0", True)
        assert get_tx_checksum("eth0") is True
        with pytest.raises(OSError):
            get_tx_checksum("fs-nonexistent")
    assert ethtool_tx(a) == "on"


def neigh(ns: str, ip: str) -> str | None:
    with NetNS(ns) as pr:
        for n in pr.get_neighbours():
            if n.get_attr("NDA_DST") == ip:
                return n.get_attr("NDA_LLADDR")
    return None


def stale_entry(ns: str, ip: str) -> None:
    subprocess.run(["ip", "-n", ns, "neigh", "replace", ip, "lladdr", "02:00:de:ad:be:ef", "dev", "eth0",
                    "nud", "stale"], check=True)


def capture(ns: str, ethertype: int) -> socket.socket:
    with entered(f"/run/netns/{ns}"):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ethertype))
        s.bind(("eth0", 0))
    s.settimeout(HANG)
    return s


def recv_matching(s: socket.socket, pred) -> bytes:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + HANG  # the frame is already queued: this bounds a hang only
    while time.monotonic() < deadline:
        frame = s.recv(2048)
        if pred(frame):
            return frame
    raise AssertionError("frame not seen")



def send(ifname: str, frame: bytes) -> None:
    """One frame out of ``ifname`` (the calling thread's netns), as ADD's child sends it."""
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
        s.bind((ifname, 0))
        s.send(frame)

def test_gratuitous_arp_updates_the_neighbour(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    stale_entry(b, "10.77.0.1")
    with capture(b, 0x0806) as s:
        with entered(f"/run/netns/{a}"):
            send("eth0", garp_frame(MAC_A, "10.77.0.1"))
        f = recv_matching(s, lambda fr: fr[28:32] == socket.inet_aton("10.77.0.1"))
    assert f[0:6] == b"\xff" * 6 and f[6:12] == bytes.fromhex(MAC_A.replace(":", ""))
    htype, ptype, hlen, plen, op = struct.unpack("!HHBBH", f[14:22])
    assert (htype, ptype, hlen, plen, op) == (1, 0x0800, 6, 4, 1)
    assert f[22:28] == f[6:12] and f[28:32] == f[38:42]  # sha = source MAC, spa = tpa
    until(lambda: neigh(b, "10.77.0.1") == MAC_A, "the neighbour entry to take the announced MAC")


def test_unsolicited_na_fields_and_kernel_accepts_it(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    stale_entry(b, "fd00:77::1")
    target = socket.inet_pton(socket.AF_INET6, "fd00:77::1")
    with capture(b, 0x86DD) as s:
        with entered(f"/run/netns/{a}"):
            send("eth0", na_frame(MAC_A, "fd00:77::1"))
        f = recv_matching(s, lambda fr: fr[20] == 58 and fr[54] == 136 and fr[62:78] == target)
    assert f[0:6] == bytes.fromhex("333300000001")
    ip6 = f[14:54]
    assert ip6[7] == 255  # hop limit
    assert ip6[24:40] == socket.inet_pton(socket.AF_INET6, "ff02::1")
    icmp = f[54:54 + struct.unpack("!H", ip6[4:6])[0]]
    pseudo = ip6[8:24] + ip6[24:40] + struct.pack("!I3xB", len(icmp), 58)
    assert checksum(pseudo + icmp) == 0  # the checksum verifies
    flags = struct.unpack("!I", icmp[4:8])[0]
    assert flags & 0x20000000 and not flags & 0xC0000000  # override; not router, not solicited
    assert icmp[24:26] == b"\x02\x01" and icmp[26:32] == bytes.fromhex(MAC_A.replace(":", ""))
    # the kernel (which drops bad checksums / hop limits) took the new MAC
    until(lambda: neigh(b, "fd00:77::1") == MAC_A, "the neighbour entry to take the announced MAC")
