"""Config: defaults, normalisation, and every bad value names its key (also through the CLI)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from routesync.cli import main
from routesync.config import (
    PEERS_CLUSTER,
    PEERS_SLICES,
    Config,
    ConfigError,
    NodeSourceConfig,
    WireGuardConfig,
    from_dict,
    load,
)


def test_defaults_and_case_insensitive_mode() -> None:
    c = from_dict({"nodeName": "n1", "trafficEncapMode": "NOENCAP", "tunnelType": "Geneve"})
    assert (c.mode, c.tunnel_type, c.tunnel_port) == ("noEncap", "geneve", 6081)
    d = from_dict({"nodeName": "n1"})
    assert (d.mode, d.tunnel_type, d.tunnel_port, d.bridge, d.datapath_type) == (
        "encap", "vxlan", 4789, "br-int", "netdev")
    assert d.node_source.type == "registry" and d.resync_seconds == 60
    assert from_dict({"nodeName": "n", "tunnelType": "gre"}).tunnel_port is None
    assert from_dict({"nodeName": "n", "tunnelType": "stt", "datapathType": "system"}).tunnel_port == 7471
    assert from_dict({}).node_name  # hostname


def test_an_empty_file_gives_the_dataclasses_defaults() -> None:
    """The defaults are declared once, on the fields: the parser reads them from there."""
    assert from_dict({"nodeName": "n"}) == Config(node_name="n")
    assert from_dict({"nodeName": "n", "nodeSource": {}}).node_source == NodeSourceConfig()
    wg = from_dict({"nodeName": "n", "trafficEncryptionMode": "wireguard", "wireguard": {}}).wireguard
    assert wg == WireGuardConfig()


@pytest.mark.parametrize("raw,key", [
    ({"bogus": 1}, "bogus"),
    ({"trafficEncapMode": "overlay"}, "trafficEncapMode"),
    ({"tunnelType": "ipip"}, "tunnelType"),
    ({"tunnelType": "stt"}, "tunnelType"),  # netdev cannot do stt
    ({"tunnelType": "gre", "tunnelPort": 4789}, "tunnelPort"),
    ({"tunnelPort": 70000}, "tunnelPort"),
    ({"tunnelPort": "4789"}, "tunnelPort"),
    ({"noSNAT": True}, "noSNAT"),  # encap
    ({"noSNAT": True, "trafficEncapMode": "hybrid"}, "noSNAT"),
    ({"noSNAT": "yes", "trafficEncapMode": "noEncap"}, "noSNAT"),
    ({"fastPath": True}, "fastPath"),
    ({"defaultMTU": 20}, "defaultMTU"),
    ({"datapathType": "dpdk"}, "datapathType"),
    ({"transportInterface": "a-very-long-interface-name"}, "transportInterface"),
    ({"transportInterfaceCIDRs": ["192.168.77.300/24"]}, "transportInterfaceCIDRs"),
    ({"podCIDRs": ["10.244.1.1/24"]}, "podCIDRs"),
    ({"podCIDRs": ["10.244.1.0/24", "10.244.2.0/24"]}, "podCIDRs"),
    ({"clusterCIDRs": "nope"}, "clusterCIDRs"),
    ({"ovsdb": "/var/run/db.sock"}, "ovsdb"),
    ({"nodeSource": {"type": "etcd"}}, "nodeSource.type"),
    ({"nodeSource": {"type": "registry", "kubeconfig": "/x"}}, "nodeSource.kubeconfig"),
    ({"nodeSource": {"type": "registry", "dir": "/x"}}, "nodeSource.dir"),
    ({"macSource": "arp"}, "macSource"),
    ({"resyncSeconds": 0}, "resyncSeconds"),
    ({"nodeName": ""}, "nodeName"),
    ({"networkPolicyDeniedLog": False}, "networkPolicyDeniedLog"),
    ({"networkPolicyDeniedLog": {"rate": 0}}, "networkPolicyDeniedLog.rate"),
    ({"networkPolicyDeniedLog": {"burst": "10"}}, "networkPolicyDeniedLog.burst"),
    ({"networkPolicyDeniedLog": {"enabled": "no"}}, "networkPolicyDeniedLog.enabled"),
    ({"networkPolicyDeniedLog": {"limit": 5}}, "networkPolicyDeniedLog.limit"),
    ({"policyPeers": "slices", "nodeSource": {"type": "kubernetes"}}, "policyPeers"),
    ({"policyPeers": True, "nodeSource": {"type": "kubernetes"}}, "policyPeers"),
    ({"policyPeers": "peerSlices"}, "policyPeers"),  # the registry source has no Pods
    ({"policyPeers": "peerSlices", "nodeSource": {"type": "kubernetes"}, "networkPolicy": False}, "policyPeers"),
])
def test_bad_values_name_the_key(raw: dict, key: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError) as e:
        from_dict(raw)
    assert e.value.key == key
    assert repr(key) in str(e.value)


def test_the_denied_log_is_on_by_default_and_bounded() -> None:
    d = from_dict({"nodeName": "n"}).denied_log
    assert (d.enabled, d.rate, d.burst, d.meter) == (True, 10, 100, (100, 1000))
    c = from_dict({"nodeName": "n", "networkPolicyDeniedLog": {"enabled": False, "rate": 2, "burst": 5}}).denied_log
    assert (c.enabled, c.rate, c.burst, c.meter) == (False, 2, 5, (20, 50))


def test_policy_peers_default_to_every_pod_and_take_peer_slices_on_kubernetes() -> None:
    assert from_dict({"nodeName": "n"}).policy_peers == PEERS_CLUSTER
    kube = {"nodeName": "n", "nodeSource": {"type": "kubernetes"}}
    assert from_dict({**kube, "policyPeers": "peerslices"}).policy_peers == PEERS_SLICES
    assert from_dict({**kube, "policyPeers": "cluster", "networkPolicy": False}).policy_peers == PEERS_CLUSTER


def test_peer_slices_judge_egress_at_its_source_only() -> None:
    kube = {"nodeName": "n", "nodeSource": {"type": "kubernetes"}}
    assert from_dict(kube).remote_egress  # cluster: a remote client's egress judged here too, as before
    assert not from_dict({**kube, "policyPeers": "peerSlices"}).remote_egress


def test_noSNAT_and_fastPath_accepted_where_valid() -> None:
    assert from_dict({"nodeName": "n", "trafficEncapMode": "noEncap", "noSNAT": True}).no_snat
    assert from_dict({"nodeName": "n", "trafficEncapMode": "hybrid", "fastPath": True}).fast_path


def test_load_yaml_and_cli_exit_code(tmp_path) -> None:  # type: ignore[no-untyped-def]
    good = tmp_path / "good.yaml"
    good.write_text("nodeName: n1\ntrafficEncapMode: hybrid\nnodeSource: {type: kubernetes, kubeconfig: /k}\n")
    c = load(str(good))
    assert c.mode == "hybrid" and c.node_source.kubeconfig == "/k"
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodeName: n1\ntunnelType: stt\n")
    r = CliRunner().invoke(main, ["run", "--config", str(bad)])
    assert r.exit_code != 0
    assert "tunnelType" in r.output and "netdev" in r.output
    r = CliRunner().invoke(main, ["show", "--config", str(tmp_path / "missing.yaml")])
    assert r.exit_code != 0 and "does not exist" in r.output
