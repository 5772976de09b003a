"""Result encoding per spec version, and that each shape reads back through ``cni.spec.result.decode``."""

from __future__ import annotations

import json

import pytest

from cni.spec.result import DNS, Interface, IPConfig, Result, Route, decode
from tests.cni.spec.helpers import sample_result

VERSIONS = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]


def full_result() -> Result:
    r = sample_result()
    r.dns = DNS(nameservers=["10.96.0.10"], domain="cluster.local", search=["default.svc.cluster.local"],
                options=["ndots:5"])
    return r


@pytest.mark.parametrize("version", VERSIONS)
def test_shape_per_version(version: str) -> None:
    doc = json.loads(json.dumps(full_result().encode(version)))  # through real JSON text
    assert doc["cniVersion"] == version
    pre_1 = version.startswith("0.")
    assert [ip.get("version") for ip in doc["ips"]] == (["4", "6"] if pre_1 else [None, None])
    assert doc["interfaces"][0].get("mtu") == (1450 if version == "1.1.0" else None)
    assert doc["ips"][0]["interface"] == 0 and doc["ips"][0]["gateway"] == "10.244.1.1"
    assert doc["dns"]["search"] == ["default.svc.cluster.local"]


@pytest.mark.parametrize("version", VERSIONS)
def test_round_trip(version: str) -> None:
    expected = full_result()
    if version != "1.1.0":
        expected.interfaces[0].mtu = 0  # not representable before 1.1.0
    assert decode(json.loads(json.dumps(full_result().encode(version)))) == expected


def test_route_mtu_round_trips_in_1_1_0() -> None:
    r = Result(interfaces=[Interface(name="eth0")], ips=[IPConfig(address="10.0.0.2/24", interface=0)],
               routes=[Route(dst="10.0.0.0/8", gw="10.0.0.1", mtu=1400)])
    assert decode(r.encode("1.1.0")) == r


@pytest.mark.parametrize("version", VERSIONS)
def test_left_out_names_what_the_version_drops(version: str) -> None:
    r = Result(interfaces=[Interface(name="fry1"), Interface(name="eth0", sandbox="/run/netns/x", mtu=1450)],
               ips=[IPConfig(address="10.0.0.2/24", interface=1)],
               routes=[Route(dst="0.0.0.0/0", gw="10.0.0.1"), Route(dst="10.0.0.0/8", gw="10.0.0.1", mtu=1400)])
    dropped = r.left_out(version)
    doc = r.encode(version)
    if version == "1.1.0":
        assert dropped == [] and doc["interfaces"][1]["mtu"] == 1450 and doc["routes"][1]["mtu"] == 1400
    else:
        assert dropped == ["interface eth0 mtu 1450", "route 10.0.0.0/8 mtu 1400"]
        assert "mtu" not in json.dumps(doc)
    assert Result(interfaces=[Interface(name="eth0")]).left_out(version) == []  # nothing to drop


def test_decode_reads_other_plugins_results() -> None:
    """A 0.4.0 result as Debian's bridge plugin prints it (tagged IPs, host + sandbox interfaces)."""
    doc = {"cniVersion": "0.4.0",
           "interfaces": [{"name": "cni0", "mac": "aa:bb:cc:00:00:01"},
                          {"name": "vethfp", "mac": "aa:bb:cc:00:00:02"},
                          {"name": "eth0", "mac": "aa:bb:cc:00:00:03", "sandbox": "/var/run/netns/fp-x"}],
           "ips": [{"version": "4", "interface": 2, "address": "10.1.0.5/16", "gateway": "10.1.0.1"}],
           "routes": [{"dst": "0.0.0.0/0"}], "dns": {}}
    r = decode(doc)
    assert r.ips[0] == IPConfig(address="10.1.0.5/16", gateway="10.1.0.1", interface=2)
    assert r.interfaces[2].sandbox == "/var/run/netns/fp-x"
    assert r.encode("0.4.0") == doc
