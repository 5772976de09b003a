"""An encrypted lab's pure parts (issue 30) and its refusals, without root: the ``encryption``
key and ``--encryption``, what each Node's route-sync config gets (route-sync reads it back),
what cannot be encrypted refused naming the key or the flag and before anything is built, the
state file that must say it encrypts, and the picture's WireGuard edges."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from cni.pipeline.modes import ENCRYPTION_NONE, ENCRYPTION_WIREGUARD
from lab import build, cli, layout, overrides, picture, tools, topology
from lab.overrides import Overrides
from lab.sh import LabError
from lab.topology import TopologyError
from routesync.config import from_dict

TOPOLOGIES = os.path.join(os.path.dirname(topology.__file__), "topologies")
WG_YAML = os.path.join(TOPOLOGIES, "wireguard.yaml")


def test_wireguard_yaml_encrypts_three_nodes_on_two_segments() -> None:
    t = topology.load(WG_YAML)
    assert t.encrypted and t.encryption == ENCRYPTION_WIREGUARD
    assert [n.segment for n in t.nodes] == ["a", "a", "b"] and not t.route_pod_cidrs
    assert topology.parse(topology.to_doc(t)) == t
    assert not topology.load().encrypted and topology.load().encryption == ENCRYPTION_NONE


def test_each_nodes_route_sync_config_encrypts_with_its_own_dirs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tools.WIREGUARD_GO_ENV, "/opt/wg/wireguard-go")
    t = topology.load(WG_YAML)
    seen = set()
    for n in t.nodes:
        paths = layout.node_paths("/run/ferry-lab/x", n.name)
        doc = layout.route_sync_config(t, n, paths, "/run/ferry-lab/x")
        assert doc["trafficEncryptionMode"] == ENCRYPTION_WIREGUARD
        wg = doc["wireguard"]
        assert wg == {"runDir": f"/run/ferry-lab/x/nodes/{n.name}/wireguard/run",
                      "keyDir": f"/run/ferry-lab/x/nodes/{n.name}/wireguard/keys",
                      "userspaceCommand": "/opt/wg/wireguard-go"}
        cfg = from_dict(doc)  # route-sync takes it
        assert cfg.encrypted and cfg.wireguard.run_dir == wg["runDir"] and cfg.wireguard.key_dir == wg["keyDir"]
        assert cfg.wireguard.userspace_command == "/opt/wg/wireguard-go" and cfg.wireguard.start_userspace
        seen.add((cfg.wireguard.run_dir, cfg.wireguard.key_dir))
    assert len(seen) == len(t.nodes)  # no two Nodes share a socket or a key
    monkeypatch.delenv(tools.WIREGUARD_GO_ENV)
    assert tools.wireguard_go() == os.path.abspath(tools.tool("wireguard-go"))
    clear = topology.load()
    doc = layout.route_sync_config(clear, clear.nodes[0], layout.node_paths("/x", "node-1"), "/x")
    assert "trafficEncryptionMode" not in doc and "wireguard" not in doc  # route-sync refuses the section then


@pytest.mark.parametrize("doc, message", [
    ({"encryption": "ipsec"}, "encryption 'ipsec': one of none, wireguard"),
    ({"encryption": True}, "encryption True: one of"),
    ({"encryption": "wireguard", "routeSync": None}, "encryption: wireguard needs a routeSync block"),
    ({"encryption": "wireguard", "routeSync": {"trafficEncapMode": "networkPolicyOnly"}},
     "encryption: wireguard is not valid with routeSync.trafficEncapMode networkPolicyOnly"),
])
def test_what_cannot_be_encrypted_is_refused_naming_the_key(doc: dict, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        topology.parse({"routeSync": {"trafficEncapMode": "encap"}, **doc})


def test_a_kubernetes_lab_turns_encryption_on_in_the_daemonsets_configmap() -> None:
    from lab.kube.lab_cluster import route_sync_keys

    ferry = topology.parse(overrides.load(WG_YAML, Overrides()) | {"kubernetes": {"ovsDaemons": "ferry"}})
    keys = route_sync_keys(ferry)
    # Ferry's openvswitch container runs wireguard-go, whoever runs Open vSwitch: it outlives
    # route-sync's container
    assert keys["trafficEncryptionMode"] == "wireguard" and keys["wireguard"] == {"startUserspace": False}
    host = topology.parse(overrides.load(WG_YAML, Overrides()) | {"kubernetes": {"ovsDaemons": "host"}})
    assert route_sync_keys(host)["wireguard"] == {"startUserspace": False}
    clear = topology.parse(overrides.load(WG_YAML, Overrides(encryption="none")) | {"kubernetes": {}})
    assert "trafficEncryptionMode" not in route_sync_keys(clear)


def test_the_encryption_flag() -> None:
    base = {"routeSync": {"trafficEncapMode": "hybrid"}}
    assert overrides.apply(base, Overrides(encryption="wireguard"))["encryption"] == "wireguard"
    off = overrides.apply({**base, "encryption": "wireguard"}, Overrides(encryption="none"))
    assert not topology.parse(off).encrypted
    # a topology without route-sync: nothing would encrypt, unless --mode runs it
    lone = os.path.join(TOPOLOGIES, "lone.yaml")
    with pytest.raises(TopologyError, match="--encryption wireguard: the topology runs no route-sync"):
        overrides.load(lone, Overrides(encryption="wireguard"))
    t = topology.parse(overrides.load(lone, Overrides(mode="hybrid", encryption="wireguard")))
    assert t.encrypted and t.route_sync is not None and t.route_sync.trafficEncapMode == "hybrid"
    assert not topology.parse(overrides.load(lone, Overrides(encryption="none"))).encrypted
    t = topology.parse(overrides.load(WG_YAML, Overrides(mode="noEncap", fast_path=True)))
    assert t.encrypted and t.route_sync is not None and t.route_sync.fastPath
    with pytest.raises(TopologyError, match="--encryption wireguard: not with --mode networkPolicyOnly"):
        overrides.apply(base, Overrides(mode="networkPolicyOnly", encryption="wireguard"))
    with pytest.raises(TopologyError, match="--encryption wireguard: not with --mode networkPolicyOnly"):
        overrides.load(os.path.join(TOPOLOGIES, "policy-only.yaml"), Overrides(encryption="wireguard"))


@pytest.mark.parametrize("args, message", [
    (["--mode", "networkPolicyOnly", "--encryption", "wireguard"], "--encryption wireguard: not with --mode"),
    (["--encryption", "ipsec"], "'ipsec' is not one of 'none', 'wireguard'"),
])
@pytest.mark.parametrize("command", ["up", "demo"])
def test_cli_refuses_before_building_anything(command: str, args: list[str], message: str) -> None:
    res = CliRunner().invoke(cli.main, [command, "--name", "tlwnone", *args])
    assert res.exit_code in (1, 2), res.output
    assert message in res.output
    assert not os.path.exists(layout.lab_dir("tlwnone"))


def test_no_wireguard_to_run_is_refused_before_anything_is_built(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(tools.WIREGUARD_GO_ENV, str(tmp_path / "no-such-wireguard-go"))
    monkeypatch.setattr(build, "KERNEL_WIREGUARD", str(tmp_path / "no-module"))
    t = topology.load(WG_YAML)
    with pytest.raises(LabError, match="no userspace WireGuard at .*no-such-wireguard-go and no kernel module"):
        build.check_encryption(t)
    with pytest.raises(LabError, match="no userspace WireGuard"):
        build.up(t, topology.to_doc(t), "tlwnone", "/nonexistent", root=str(tmp_path / "labs"))
    assert not os.path.exists(tmp_path / "labs")
    build.check_encryption(topology.load())  # a clear lab needs none
    monkeypatch.setenv(tools.WIREGUARD_GO_ENV, "/bin/true")
    build.check_encryption(t)
    monkeypatch.setattr(build, "route_sync_command", lambda: None)
    with pytest.raises(LabError, match="needs ferry-route-sync"):
        build.check_encryption(t)


def test_a_route_sync_that_does_not_say_it_encrypts_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    paths = layout.node_paths(str(tmp_path), "node-1")
    os.makedirs(os.path.dirname(paths.state_file))
    for said, ok in (({"encryption": "wireguard"}, True), ({"encryption": "none"}, False), ({}, False)):
        with open(paths.state_file, "w") as f:
            json.dump({"node": "node-1", **said}, f)
        if ok:
            build.check_encrypts(paths, "node-1")
        else:
            with pytest.raises(LabError, match="ferry-route-sync on node-1 does not encrypt: its state file says "
                                               "encryption 'none'"):
                build.check_encrypts(paths, "node-1")


def test_the_picture_draws_wireguard_edges() -> None:
    states = {}
    cidrs = {"node-1": "10.244.1.0/24", "node-2": "10.244.2.0/24", "node-3": "10.244.3.0/24"}
    for me in cidrs:
        states[me] = {"mode": "noEncap", "mtu": 1440, "transportMTU": 1500, "encryption": "wireguard",
                      "peers": [{"name": o, "addresses": [], "podCIDRs": [c], "path": "wireguard"}
                                for o, c in cidrs.items() if o != me]}
    edges = picture.peer_edges(states)
    assert [(e.a, e.b, e.main, e.label()) for e in edges] == [
        ("node-1", "node-2", "wireguard", "WireGuard"), ("node-1", "node-3", "wireguard", "WireGuard"),
        ("node-2", "node-3", "wireguard", "WireGuard")]
    t = topology.load(WG_YAML)
    views = tuple(picture.NodeView(n.name, n.segment, (), n.pod_cidrs, (), states[n.name]) for n in t.nodes)
    src = picture.graph(picture.Scene("tlw", t, views)).source
    assert "encrypted (wireguard: every peer)" in src and "WireGuard 1440" in src
    assert src.count('color="#0b7a75"') >= 3
