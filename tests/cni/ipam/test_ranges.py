"""Ranges and the pure allocator: host-local's defaults, every config error with code 7 and its
field named, the walk order after a cursor, and what is never handed out."""

from __future__ import annotations

import ipaddress

import pytest

from cni.ipam.allocator import match_requested, parse_cursor, pick_free
from cni.ipam.ranges import fmt, iter_from, parse_range, parse_range_sets, range_sets_from_cidrs
from cni.spec.errors import INVALID_CONFIG, IPAM_EXHAUSTED, CniError


def ip(text: str) -> int:
    return int(ipaddress.ip_address(text))


def test_defaults_follow_host_local() -> None:
    r = parse_range({"subnet": "10.1.0.0/24"}, "r")
    assert (fmt(r.start, 32), fmt(r.end, 32), fmt(r.gateway, 32)) == ("10.1.0.1", "10.1.0.254", "10.1.0.1")
    assert r.capacity() == 253  # .1 is the gateway, .0 and .255 never in the pool
    r6 = parse_range({"subnet": "fd00::/120"}, "r")
    assert (fmt(r6.start, 128), fmt(r6.end, 128), fmt(r6.gateway, 128)) == ("fd00::1", "fd00::ff", "fd00::1")
    assert r6.capacity() == 254


def test_usable_excludes_gateway_network_broadcast() -> None:
    r = parse_range({"subnet": "10.1.0.0/29", "rangeStart": "10.1.0.0", "rangeEnd": "10.1.0.7",
                     "gateway": "10.1.0.3"}, "r")
    usable = [fmt(a, 32) for _, a in iter_from((r,), None)]
    assert usable == ["10.1.0.1", "10.1.0.2", "10.1.0.4", "10.1.0.5", "10.1.0.6"]
    assert r.capacity() == len(usable)
    # IPv6 has no broadcast: the last address is usable, the subnet-router anycast (::0) is not
    # in the default pool.
    r6 = parse_range({"subnet": "fd00::/125"}, "r")
    assert [fmt(a, 128) for _, a in iter_from((r6,), None)] == [f"fd00::{i}" for i in range(2, 8)]


def test_walk_starts_after_cursor_and_wraps_across_ranges() -> None:
    (rs,) = parse_range_sets([[{"subnet": "10.1.0.0/29"}, {"subnet": "10.2.0.0/29"}]])
    order = [fmt(a, 32) for _, a in iter_from(rs, ip("10.2.0.3"))]
    assert order == ["10.2.0.4", "10.2.0.5", "10.2.0.6",
                     "10.1.0.2", "10.1.0.3", "10.1.0.4", "10.1.0.5", "10.1.0.6",
                     "10.2.0.2", "10.2.0.3"]
    # A cursor outside the set (config changed) starts from the beginning.
    assert next(fmt(a, 32) for _, a in iter_from(rs, ip("192.168.0.1"))) == "10.1.0.2"


@pytest.mark.parametrize(("ranges", "field", "words"), [
    ([[{"subnet": "10.0.0.0/24", "gateway": "10.0.1.1"}]], "ipam.ranges[0][0].gateway", "outside the subnet"),
    ([[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.1"}]], "ipam.ranges[0][0].rangeStart", "outside"),
    ([[{"subnet": "10.0.0.0/24", "rangeEnd": "10.0.1.1"}]], "ipam.ranges[0][0].rangeEnd", "outside"),
    ([[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.9", "rangeEnd": "10.0.0.5"}]],
     "ipam.ranges[0][0].rangeStart", "after rangeEnd"),
    ([[{"subnet": "10.0.0.0/24", "gateway": "fd00::1"}]], "ipam.ranges[0][0].gateway", "family"),
    ([[{"subnet": "10.0.0.0/24", "gateway": "nope"}]], "ipam.ranges[0][0].gateway", "not an IP"),
    ([[{"subnet": "10.0.0.5/24"}]], "ipam.ranges[0][0].subnet", "host bits"),
    ([[{"subnet": "10.0.0.0/31"}]], "ipam.ranges[0][0].subnet", "too small"),
    ([[{"subnet": "10.0.0.0"}]], "ipam.ranges[0][0].subnet", "not a CIDR"),
    ([[{"rangeStart": "10.0.0.1"}]], "ipam.ranges[0][0].subnet", "missing"),
    ([[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.128/25"}]], "ipam.ranges[0][1]", "overlaps ipam.ranges[0][0]"),
    ([[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.0.0/16"}]], "ipam.ranges[1][0]", "overlaps ipam.ranges[0][0]"),
    ([[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]], "ipam.ranges[0][1].subnet", "mixes"),
    ([[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.1.0.0/24"}]], "ipam.ranges[1]", "second IPv4"),
    ([[]], "ipam.ranges[0]", "non-empty"),
    ([], "ipam.ranges", "non-empty"),
    ("10.0.0.0/24", "ipam.ranges", "non-empty"),
])
def test_config_errors_are_7_and_name_the_field(ranges: object, field: str, words: str) -> None:
    with pytest.raises(CniError) as e:
        parse_range_sets(ranges, "ipam.ranges")
    assert e.value.code == INVALID_CONFIG
    assert e.value.msg.startswith(field) and words in e.value.msg, e.value.msg


def test_disjoint_ranges_in_one_set_and_dual_stack_accepted() -> None:
    sets = parse_range_sets([[{"subnet": "10.0.0.0/25"}, {"subnet": "10.0.0.128/25"}], [{"subnet": "fd00::/64"}]])
    assert [len(s) for s in sets] == [2, 1]
    assert [s[0].version for s in range_sets_from_cidrs(["10.244.1.0/24", "fd00:10:244:1::/64"])] == [4, 6]


def test_pick_free_uses_cursor_skips_taken_and_reports_exhaustion() -> None:
    (rs,) = parse_range_sets([[{"subnet": "10.0.0.0/29"}]])
    taken = {ip("10.0.0.4"), ip("10.0.0.5")}
    p = pick_free(0, rs, ip("10.0.0.3"), lambda a, b: a in taken)
    assert p.text == "10.0.0.6"  # after the cursor, skipping the two taken
    p = pick_free(0, rs, ip("10.0.0.6"), lambda a, b: a in taken)
    assert p.text == "10.0.0.2"  # wrapped; .1 is the gateway
    seen: list[int] = []
    with pytest.raises(CniError) as e:
        pick_free(0, rs, None, lambda a, b: seen.append(a) or True)
    assert e.value.code == IPAM_EXHAUSTED and "10.0.0.0/29" in e.value.msg
    assert len(seen) == 5  # each usable address tried exactly once


def test_pick_free_cost_does_not_grow_with_fill() -> None:
    (rs,) = parse_range_sets([[{"subnet": "10.0.0.0/16"}]])
    taken = set(range(ip("10.0.0.2"), ip("10.0.250.0")))  # ~98 % full, cursor at the edge
    calls: list[int] = []

    def probe(a: int, b: int) -> bool:
        calls.append(a)
        return a in taken

    p = pick_free(0, rs, ip("10.0.249.255"), probe)
    assert p.text == "10.0.250.0" and len(calls) == 1


def test_requested_matching() -> None:
    sets = parse_range_sets([[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64"}]])
    got = match_requested(sets, ["fd00::9", "10.0.0.7/24"])
    assert {i: p.text for i, p in got.items()} == {0: "10.0.0.7", 1: "fd00::9"}
    for bad, words in (("10.9.9.9", "outside every configured range"), ("10.0.0.1", "gateway"),
                       ("10.0.0.255", "outside"), ("banana", "not an IP address")):
        with pytest.raises(CniError) as e:
            match_requested(sets, [bad])
        assert e.value.code == INVALID_CONFIG and words in e.value.msg
    with pytest.raises(CniError) as e:
        match_requested(sets, ["10.0.0.7", "10.0.0.8"])
    assert e.value.code == INVALID_CONFIG and "both fall in range set 0" in e.value.msg


def test_parse_cursor_tolerates_garbage() -> None:
    (rs,) = parse_range_sets([[{"subnet": "10.0.0.0/24"}]])
    assert parse_cursor("10.0.0.9\n", rs) == ip("10.0.0.9")
    assert parse_cursor("fd00::1", rs) is None
    assert parse_cursor("\x00garbage", rs) is None
    assert parse_cursor(None, rs) is None
