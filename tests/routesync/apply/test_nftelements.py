"""routesync.apply.nftelements against nft itself: random sequences of set contents (addresses,
prefixes that collapse into and out of each other, the top of each family's space, concatenated
pairs; both families; interval and plain sets) reached by element changes over netlink in one
namespace and written whole by nft in another list the same after every step, and a change the
kernel refuses applies nothing of its transaction."""

from __future__ import annotations

import ipaddress
import random
import re
import subprocess
from collections.abc import Iterator

import pytest

from cni.kernel.netlink import NetlinkError
from routesync.apply.nftelements import SetElements, keys
from routesync.nftbody import NftBody, NftChain, NftSet, SetChange, kept_set_changes
from tests.support.ovs_instance import netns

pytestmark = pytest.mark.root

V4 = [f"10.0.0.{i}" for i in range(16)] + ["255.255.255.255", "255.255.255.254"]
V6 = [f"fd00::{i:x}" for i in range(16)] + ["ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"]


def disjoint(rng: random.Random, pool: list[str], width: int) -> tuple[str, ...]:
    """A few addresses and prefixes of ``pool``, collapsed as the host judge's peer sets are."""
    nets = [ipaddress.ip_network(f"{a}/{rng.choice((width, width, width - 1, width - 2, width - 3))}", strict=False)
            for a in rng.sample(pool, rng.randrange(0, 7))]
    out = ipaddress.collapse_addresses(nets)  # type: ignore[type-var]
    return tuple(str(n.network_address) if n.prefixlen == width else str(n) for n in out)


def body(rng: random.Random) -> NftBody:
    pairs = tuple(f"{a} . {a}" for a in rng.sample(V4, rng.randrange(0, 5)))
    return NftBody((
        NftSet("p4", "ipv4_addr", True, disjoint(rng, V4, 32)),
        NftSet("p6", "ipv6_addr", True, disjoint(rng, V6, 128)),
        NftSet("h4", "ipv4_addr", False, tuple(rng.sample(V4, rng.randrange(0, 5)))),
        NftSet("h6", "ipv6_addr", False, tuple(rng.sample(V6, rng.randrange(0, 5)))),
        NftSet("self4", "ipv4_addr . ipv4_addr", False, pairs),
    ), (NftChain("c", "", ("ip saddr @p4 ip daddr @h4 accept", "ip6 saddr @p6 ip6 daddr @h6 accept")),))


def write(ns: str, b: NftBody) -> None:
    text = f"table inet t {{}}\ndelete table inet t\ntable inet t {{\n{b.text}}}\n"
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=text, text=True, check=True)


def listing(ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "table", "inet", "t"],
                          capture_output=True, text=True, check=True).stdout


@pytest.fixture
def two() -> Iterator[tuple[str, str]]:
    with netns("fb-nfe1") as a, netns("fb-nfe2") as b:
        yield a, b


@pytest.mark.parametrize("seed", range(4))
def test_kept_set_changes_list_as_nft_writes_the_same_sets(two: tuple[str, str], seed: int) -> None:
    by_elements, whole = two
    rng = random.Random(seed)
    last = body(rng)
    write(by_elements, last)
    sock = SetElements(by_elements)
    try:
        for _ in range(25):
            now = body(rng)
            sock.apply("inet", "t", kept_set_changes(last, now))
            write(whole, now)
            assert listing(by_elements) == listing(whole), now.text
            last = now
    finally:
        sock.close()


def test_a_refused_change_applies_nothing_of_its_transaction(two: tuple[str, str]) -> None:
    ns = two[0]
    write(ns, NftBody((NftSet("p4", "ipv4_addr", True, ("10.0.0.0/30",)),
                       NftSet("h4", "ipv4_addr", False, ("10.0.0.9",))), ()))
    before = listing(ns)
    sock = SetElements(ns)
    try:
        with pytest.raises(NetlinkError):  # 10.0.0.7 is not in h4: the kernel refuses the deletion
            sock.apply("inet", "t", [SetChange("p4", "ipv4_addr", True, ("10.0.0.0/30",), ("10.0.0.4/30",)),
                                     SetChange("h4", "ipv4_addr", False, ("10.0.0.7",), ())])
        assert listing(ns) == before
        assert re.search(r"elements = \{ 10\.0\.0\.0/30 \}", before)
        sock.apply("inet", "t", [SetChange("h4", "ipv4_addr", False, ("10.0.0.9",), ("10.0.0.7",))])  # usable after
        assert "10.0.0.7" in listing(ns) and "10.0.0.9" not in listing(ns)
    finally:
        sock.close()


def test_keys_are_nfts_encoding() -> None:
    assert keys("ipv4_addr", True, "10.0.0.0/30") == [(bytes([10, 0, 0, 0]), 0), (bytes([10, 0, 0, 4]), 1)]
    assert keys("ipv4_addr", True, "255.255.255.255") == [(bytes([255] * 4), 0)]  # no end past the top
    assert keys("ipv4_addr . ipv4_addr", False, "10.0.0.1 . 10.0.0.2") == [(bytes([10, 0, 0, 1, 10, 0, 0, 2]), 0)]
    with pytest.raises(ValueError, match="not of type"):
        keys("ipv4_addr", False, "fd00::1")
