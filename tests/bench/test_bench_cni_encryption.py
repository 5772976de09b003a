"""bench_cni's encryption phase (issue 30, ADD unchanged), the pure parts: the two state files are
one Node's, in clear and encrypted, as the plugin reads them and differing only where encryption
differs; they give different routes (so the phase compares real work); the calls take turns with
the order alternating; the ratios and the target's verdict."""

from __future__ import annotations

import pytest

from bench import cni_encryption as enc
from cni.lean.record import as_dict
from cni.node import nodestate

MAC = "02:00:00:aa:bb:cc"


def _states() -> dict[str, nodestate.NodeState]:
    return {side: enc.node_state(side, MAC, 2, "unix:/tmp/x/db.sock", "/tmp/x") for side in enc.SIDES}


def test_the_state_files_are_one_node_in_clear_and_encrypted() -> None:
    states = _states()
    read = {side: nodestate.parse(s.to_json()) for side, s in states.items()}  # what the plugin reads
    clear, wg = read["none"], read["wireguard"]
    assert (clear.encryption, wg.encryption) == ("none", "wireguard")
    assert clear.mode == wg.mode == "noEncap" and clear.transportMTU == wg.transportMTU == 1500
    assert (clear.mtu, wg.mtu) == (1500, 1440)  # route-sync's: WireGuard's 60 bytes over IPv4
    assert ([p.path for p in clear.peers], [p.path for p in wg.peers]) == (["route"], ["wireguard"])
    assert clear.gateway == wg.gateway and clear.gateway.mac == MAC and clear.gateway.ofport == 2
    same = {k: v for k, v in as_dict(clear).items() if k not in ("mtu", "encryption", "peers")}
    assert same == {k: v for k, v in as_dict(wg).items() if k not in ("mtu", "encryption", "peers")}


def test_encryption_changes_the_routes_a_pod_gets() -> None:
    routes = {side: enc.expected_routes(s) for side, s in _states().items()}
    assert routes["none"] == {("0.0.0.0/0", "10.245.0.1", 1500)}
    assert routes["wireguard"] == {("0.0.0.0/0", "10.245.0.1", 1500), ("10.245.0.0/16", "10.245.0.1", 1440)}


def test_kernel_routes_reads_ip_json_gateway_routes_only() -> None:
    out = [{"dst": "default", "gateway": "10.245.0.1", "dev": "eth0", "metrics": [{"mtu": 1500}]},
           {"dst": "10.245.0.0/21", "dev": "eth0", "protocol": "kernel", "scope": "link", "prefsrc": "10.245.0.7"},
           {"dst": "10.245.0.0/16", "gateway": "10.245.0.1", "dev": "eth0", "metrics": [{"mtu": 1440}]},
           {"dst": "10.9.9.9", "gateway": "10.245.0.1", "dev": "eth0"}]
    assert enc.kernel_routes(out) == {("0.0.0.0/0", "10.245.0.1", 1500), ("10.245.0.0/16", "10.245.0.1", 1440),
                                      ("10.9.9.9/32", "10.245.0.1", 0)}


def test_the_sides_take_turns_and_neither_always_goes_first() -> None:
    calls = enc.order(4)
    assert calls == [("none", 0), ("wireguard", 0), ("wireguard", 1), ("none", 1),
                     ("none", 2), ("wireguard", 2), ("wireguard", 3), ("none", 3)]
    samples = [10.0, 20.0, 21.0, 11.0, 12.0, 22.0, 23.0, 13.0]
    assert enc.by_side(samples, calls) == {"none": [10.0, 11.0, 12.0, 13.0], "wireguard": [20.0, 21.0, 22.0, 23.0]}


def test_ratios_are_encrypted_over_clear_with_the_issue_target() -> None:
    ms = {"add": {"none": [40.0, 50.0, 60.0], "wireguard": [42.0, 52.0, 66.0]},
          "del": {"none": [30.0, 30.0, 30.0], "wireguard": [33.0, 33.0, 33.0]}}
    r = enc.ratios(ms)
    assert r["ADD p50"] == pytest.approx(52 / 50) and r["pass"] is True and r["target"] == "ADD p50 <= 1.05x"
    assert r["ADD p99"] == pytest.approx(66 / 60) and r["DEL p50"] == pytest.approx(1.1)
    assert r["ADD per pair, median"] == pytest.approx(1.05)
    ms["add"]["wireguard"] = [45.0, 55.0, 66.0]
    assert enc.ratios(ms)["pass"] is False  # 1.10x
