"""cni.lean.addr agrees with the standard ipaddress module on everything the per-Pod path asks of it."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni.lean import addr

v4 = st.integers(0, 2**32 - 1).map(lambda v: ipaddress.IPv4Address(v))
v6 = st.integers(0, 2**128 - 1).map(lambda v: ipaddress.IPv6Address(v))


@settings(max_examples=400, deadline=None)
@given(st.one_of(v4, v6))
def test_parse_and_format_round_trip(ip):
    value, bits = addr.parse_ip(str(ip))
    assert (value, bits) == (int(ip), ip.max_prefixlen)
    text = addr.format_ip(value, bits)
    assert text == str(ip)


@settings(max_examples=400, deadline=None)
@given(st.one_of(v4.flatmap(lambda ip: st.tuples(st.just(ip), st.integers(0, 32))),
                 v6.flatmap(lambda ip: st.tuples(st.just(ip), st.integers(0, 128)))))
def test_prefix_arithmetic(pair):
    ip, plen = pair
    net = ipaddress.ip_network(f"{ip}/{plen}", strict=False)
    text = f"{ip}/{plen}"
    assert addr.canonical_network(text) == str(net)
    value, p, bits = addr.parse_cidr(text)
    assert addr.network(value, p, bits) == int(net.network_address)
    assert addr.last(value, p, bits) == int(net.broadcast_address)
    assert addr.family(text) == ip.version
    assert addr.host(text) == str(ip)


@pytest.mark.parametrize("bad", ["", "10.0.0", "10.0.0.256", "010.0.0.1", "10.0.0.1/33", "fd00::1/129", "fd00::g",
                                 "10.0.0.1/", "/24", "10.0.0.1/24/1", "10.0.0.1/-1", "fe80::1%eth0", " 10.0.0.1"])
def test_rejects_what_is_not_an_address_or_cidr(bad):
    with pytest.raises(ValueError):
        addr.parse_interface(bad)


def test_first_host_and_same_ip():
    assert addr.first_host_cidr("10.244.1.0/24") == "10.244.1.1/24"
    assert addr.first_host_cidr("fd00:10:244:1::/64") == "fd00:10:244:1::1/64"
    assert addr.same_ip("fd00::01", "fd00::1") and not addr.same_ip("fd00::1", "junk")
    assert [addr.format_ip(int(ipaddress.IPv6Address(t)), 128)
            for t in ("::", "::1", "1::", "1:0:0:2::3", "::ffff:1.2.3.4")] \
        == ["::", "::1", "1::", "1:0:0:2::3", "::ffff:102:304"]
