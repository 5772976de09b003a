"""The planner with ``trafficEncryptionMode: wireguard`` (pure): every peer's path is wireguard in
every mode, routed to the device at WireGuard's MTU; no tunnel port, no fast path, no peer flows;
the config refuses what cannot be encrypted; Pods' routes carry the WireGuard MTU."""

from __future__ import annotations

import pytest

from cni.node import nodestate
from cni.pipeline import podnet
from cni.pipeline.tables import Owner
from routesync.config import ConfigError, from_dict
from routesync.model import HostRoute, LocalFacts, NodeRecord
from routesync.planner import node_state, plan, tunnel_spec

FACTS = LocalFacts(gateway_ofport=2, gateway_mac="02:00:00:00:01:01", tunnel_ofport=None, uplink_name="eth0",
                   uplink_addresses=("192.168.77.11/24",), transport_mtu=1500, uplink_mac="02:00:00:00:00:11",
                   uplink_ofport=5, uplink_host_ofport=6)
LOCAL = NodeRecord("node-a", ("192.168.77.11",), ("10.244.1.0/24",))
SAME = NodeRecord("node-b", ("192.168.77.12",), ("10.244.2.0/24",))
OTHER = NodeRecord("node-c", ("192.168.88.13",), ("10.244.3.0/24", "fd00:10:244:3::/64"))
V6ONLY = NodeRecord("node-d", ("fd00:88::14",), ("fd00:10:244:4::/64",))

MODES = [({"trafficEncapMode": "encap", "tunnelType": t}, "tunnel", "tunnel") for t in ("vxlan", "geneve", "gre")] + [
    ({"trafficEncapMode": "hybrid"}, "route", "tunnel"),
    ({"trafficEncapMode": "noEncap"}, "route", "underlay"),
    ({"trafficEncapMode": "noEncap", "fastPath": True}, "route", "underlay"),
    ({"trafficEncapMode": "hybrid", "fastPath": True}, "route", "tunnel"),
]


def cfg(**kw: object):  # type: ignore[no-untyped-def]
    return from_dict({"nodeName": "node-a", "clusterCIDRs": ["10.244.0.0/16"], "trafficEncryptionMode": "wireguard",
                      **kw})


@pytest.mark.parametrize(("mode", "same_path", "other_path"), MODES,
                         ids=lambda v: "-".join(str(x) for x in v.values()) if isinstance(v, dict) else None)
def test_every_mode_sends_every_peer_through_the_device(mode: dict, same_path: str, other_path: str) -> None:
    c = cfg(**mode)
    d = plan(c, LOCAL, [LOCAL, SAME, OTHER], FACTS)
    assert {(p.peer, p.family): (p.path, p.fallback) for p in d.peers} == {
        ("node-b", 4): ("wireguard", same_path), ("node-c", 4): ("wireguard", other_path),
        ("node-c", 6): ("wireguard", "tunnel" if other_path == "tunnel" else "underlay"),
    }
    assert d.tunnel is None and tunnel_spec(c) is None
    assert d.mtu == 1440 and d.transport_mtu == 1500
    assert d.routes == {HostRoute(dst=c_, gw=None, dev="ferry-wg0", mtu=1440)
                        for c_ in ("10.244.2.0/24", "10.244.3.0/24", "fd00:10:244:3::/64")}
    assert not [f for f in d.flows if f.cookie.owner == Owner.PEER]  # nothing leaves OVS but by the gateway
    assert not [p for p in d.peers if p.next_hop_mac]


def test_an_ipv6_underlay_costs_80_bytes() -> None:
    local = NodeRecord("node-a", ("fd00:77::11",), ("fd00:10:244:1::/64",))
    facts = LocalFacts(2, "02:00:00:00:01:01", None, "eth0", ("fd00:77::11/64",), 1500)
    d = plan(cfg(trafficEncapMode="encap", clusterCIDRs=["fd00:10:244::/48"]), local, [local, V6ONLY], facts)
    assert d.mtu == 1420 and {r.dev for r in d.routes} == {"ferry-wg0"}


def test_the_state_file_says_encryption_and_pods_route_other_nodes_at_its_mtu() -> None:
    c = cfg(trafficEncapMode="noEncap")
    d = plan(c, LOCAL, [LOCAL, SAME, OTHER], FACTS)
    state = node_state(c, LOCAL, d, FACTS)
    assert state.encryption == "wireguard"
    back = nodestate.parse(state.to_json())
    assert back.encryption == "wireguard" and {p.path for p in back.peers} == {"wireguard"}
    net = podnet.for_state(back, {4: "10.244.1.1"})
    assert net.mtu == 1500
    assert {(r.dst, r.mtu) for r in net.routes} == {("0.0.0.0/0", 1500), ("10.244.0.0/16", 1440)}
    # the same Node in clear: noEncap routes everything at the full MTU
    clear = from_dict({"nodeName": "node-a", "clusterCIDRs": ["10.244.0.0/16"], "trafficEncapMode": "noEncap"})
    plain = podnet.for_state(node_state(clear, LOCAL, plan(clear, LOCAL, [LOCAL, SAME], FACTS), FACTS),
                             {4: "10.244.1.1"})
    assert {(r.dst, r.mtu) for r in plain.routes} == {("0.0.0.0/0", 1500)}
    assert podnet.pod_inputs(back) != podnet.pod_inputs(nodestate.parse(node_state(clear, LOCAL, plan(
        clear, LOCAL, [LOCAL, SAME, OTHER], FACTS), FACTS).to_json()))


def test_an_unknown_encryption_in_the_state_file_is_refused() -> None:
    d = plan(cfg(), LOCAL, [LOCAL, SAME], FACTS)
    text = node_state(cfg(), LOCAL, d, FACTS).to_json().replace('"encryption":"wireguard"', '"encryption":"ipsec"')
    with pytest.raises(nodestate.StateError, match="encryption"):
        nodestate.parse(text)


@pytest.mark.parametrize(("raw", "key"), [
    ({"trafficEncryptionMode": "ipsec"}, "trafficEncryptionMode"),
    ({"trafficEncryptionMode": "wireguard", "trafficEncapMode": "networkPolicyOnly"}, "trafficEncryptionMode"),
    ({"wireguard": {"port": 51820}}, "wireguard"),
    ({"trafficEncryptionMode": "wireguard", "wireguard": {"port": 0}}, "wireguard.port"),
    ({"trafficEncryptionMode": "wireguard", "wireguard": {"colour": "blue"}}, "wireguard.colour"),
    ({"trafficEncryptionMode": "wireguard", "wireguard": {"implementation": "magic"}}, "wireguard.implementation"),
    ({"trafficEncryptionMode": "wireguard", "wireguard": {"keyDir": "relative"}}, "wireguard.keyDir"),
    ({"trafficEncryptionMode": "wireguard", "wireguard": {"rotationPeriod": 1}}, "wireguard.rotationPeriod"),
    ({"trafficEncryptionMode": "wireguard", "wireguard": {"interface": "x" * 16}}, "wireguard.interface"),
])
def test_bad_encryption_config_names_the_key(raw: dict, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        from_dict({"nodeName": "n", **raw})
    assert e.value.key == key


def test_clear_is_the_default() -> None:
    c = from_dict({"nodeName": "n"})
    assert c.encryption == "none" and not c.encrypted and c.tunnelled


def test_a_dual_stack_node_encrypts_over_ipv4_at_60_bytes() -> None:
    local = NodeRecord("node-a", ("192.168.77.11", "fd00:77::11"), ("10.244.1.0/24", "fd00:10:244:1::/64"))
    facts = LocalFacts(2, "02:00:00:00:01:01", None, "eth0", ("192.168.77.11/24", "fd00:77::11/64"), 1500)
    d = plan(cfg(trafficEncapMode="encap", clusterCIDRs=["10.244.0.0/16", "fd00:10:244::/48"]), local,
             [local, OTHER], facts)
    assert d.mtu == 1440  # the endpoints are IPv4 (routesync.wireguard.plan.endpoint): 60 bytes
