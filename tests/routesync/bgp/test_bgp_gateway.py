"""``bgp.peers[i].address: defaultGateway``: validated naming the key, resolved from the Node's
routes (the lowest-metric default route with a global gateway of the peer's family)."""

from __future__ import annotations

import socket

import pytest

from cni.kernel.netlink import RouteEntry
from routesync.bgp import gateway
from routesync.config import DEFAULT_GATEWAY, ConfigError, from_dict

GW4 = {"address": "defaultGateway", "asn": 65000, "holdTime": 3}


def cfg(*peers: dict):  # type: ignore[no-untyped-def]
    return from_dict({"nodeName": "n1", "trafficEncapMode": "noEncap",
                      "bgp": {"localASN": 64512, "peers": list(peers)}})


def route(dst: str, gw: str | None, metric: int | None = None) -> RouteEntry:
    return RouteEntry(dst=dst, gw=gw, index=2, proto=3, table=254, metric=metric)


def test_parsed_with_its_family() -> None:
    p = cfg(GW4, {**GW4, "addressFamily": "ipv6"}).bgp.peers
    assert [(x.address, x.address_family, x.default_gateway) for x in p] == [
        (DEFAULT_GATEWAY, 4, True), (DEFAULT_GATEWAY, 6, True)]
    assert cfg({"address": "192.168.77.1", "asn": 65000}).bgp.peers[0].address_family is None


@pytest.mark.parametrize("peers,key", [
    ([{**GW4, "addressFamily": "inet"}], "bgp.peers[0].addressFamily"),
    ([{**GW4, "addressFamily": 4}], "bgp.peers[0].addressFamily"),
    ([{"address": "192.168.77.1", "asn": 1, "addressFamily": "ipv4"}], "bgp.peers[0].addressFamily"),
    ([GW4, GW4], "bgp.peers[1].address"),
    ([{**GW4, "address": "defaultgateway"}], "bgp.peers[0].address"),
])
def test_bad_values_name_the_key(peers: list, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        cfg(*peers)
    assert e.value.key == key


def test_default_gateway_lowest_metric_global() -> None:
    routes = [route("10.0.0.0/8", "192.168.1.1"), route("0.0.0.0/0", "192.168.77.9", 200),
              route("0.0.0.0/0", "192.168.77.1", 100), route("0.0.0.0/0", None)]
    assert gateway.default_gateway(routes, 4) == "192.168.77.1"
    assert gateway.default_gateway([route("::/0", "fe80::1"), route("::/0", "fd00:77::1", 1024)], 6) == "fd00:77::1"
    assert gateway.default_gateway([route("::/0", "fe80::1")], 6) is None
    assert gateway.default_gateway([], 4) is None


def test_resolve_replaces_only_default_gateway_peers() -> None:
    tables = {socket.AF_INET: [route("0.0.0.0/0", "192.168.88.1")], socket.AF_INET6: [route("::/0", "fd00:88::1")]}
    asked: list[int] = []

    def routes_of(af: int) -> list[RouteEntry]:
        asked.append(af)
        return tables[af]

    c = gateway.resolve(cfg(GW4, {**GW4, "addressFamily": "ipv6"}, {"address": "192.168.99.1", "asn": 65001}),
                        routes_of)
    assert [(p.address, p.asn, p.hold_time) for p in c.bgp.peers] == [
        ("192.168.88.1", 65000, 3), ("fd00:88::1", 65000, 3), ("192.168.99.1", 65001, 90)]
    assert sorted(asked) == [socket.AF_INET, socket.AF_INET6]
    plain = cfg({"address": "192.168.99.1", "asn": 65001})
    assert gateway.resolve(plain, lambda af: pytest.fail("no lookup without defaultGateway")) is plain


def test_resolve_fails_naming_the_peer() -> None:
    with pytest.raises(ConfigError) as e:
        gateway.resolve(cfg({"address": "192.168.99.1", "asn": 1}, GW4), lambda af: [route("::/0", "fd00::1")])
    assert e.value.key == "bgp.peers[1].address" and "no IPv4 default route" in str(e.value)
    with pytest.raises(ConfigError) as e:
        gateway.resolve(cfg({"address": "192.168.77.1", "asn": 1}, GW4),
                        lambda af: [route("0.0.0.0/0", "192.168.77.1")])
    assert e.value.key == "bgp.peers[1].address" and "listed twice" in str(e.value)
