"""Single-stack and dual-stack labs, and the mode flags, without root: what the topology gives
each part (addresses, routes, registry records, conflists), which probes ``check`` plans for
the Pods that exist, and what ``--mode/--tunnel/--fast-path/--family`` make of a topology."""

from __future__ import annotations

import os

import pytest
import yaml
from click.testing import CliRunner

from lab import check, cli, layout, netplan, overrides, topology
from lab.api import Lab
from lab.manifest import Manifest
from lab.overrides import Overrides
from lab.topology import TopologyError

TOPOLOGIES = os.path.join(os.path.dirname(topology.__file__), "topologies")


def load(name: str) -> topology.Topology:
    return topology.load(os.path.join(TOPOLOGIES, name))


def plan_lines(t: topology.Topology) -> list[str]:
    p = netplan.plan("tlf", t)
    return [line for stage in p.stages for lines in stage.values() for line in lines]


def v6(lines: list[str]) -> list[str]:
    return [line for line in lines if ":" in line.split(" dev ")[0] or "::/0" in line]


def v4(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith(("addr add", "route add")) and line not in v6(lines)]


# ---------------------------------------------------------------- families of the parts

def test_the_issue_topology_ipv4_segments_and_cluster_gets_no_ipv6_anywhere() -> None:
    t = topology.parse({"clusterCIDRs": ["10.244.0.0/16"],
                        "segments": {"a": {"ipv4": "192.168.77.0/24"}, "b": {"ipv4": "192.168.88.0/24"}},
                        "routeSync": {"trafficEncapMode": "encap"}})
    assert t.pod_families == (4,) and t.underlay_families == (4,)
    assert [s.ipv6 for s in t.segments] == [None, None] and t.external_ipv6 is None
    assert topology.node_addresses(t, t.node("node-1")) == ("192.168.77.11", None)
    lines = plan_lines(t)
    assert v6(lines) == [] and "addr add 192.168.77.11/24 dev eth0" in lines
    assert layout.registry_record(t, t.node("node-3"))["transportAddresses"] == ["192.168.88.13"]
    assert t.node("node-1").pod_cidrs == ("10.244.1.0/24",)


@pytest.mark.parametrize("file, families", [("ipv4-only.yaml", (4,)), ("ipv6-only.yaml", (6,)),
                                            ("default.yaml", (4, 6))])
def test_shipped_topologies_give_every_part_exactly_their_families(file: str, families: tuple[int, ...]) -> None:
    t = load(file)
    assert t.pod_families == families and t.underlay_families == families
    assert all(s.families == families for s in t.segments)
    assert tuple(f for f in (4, 6) if t.external_cidr(f)) == families
    for n in t.nodes:
        assert topology.families_of(n.pod_cidrs) == families
        assert tuple(f for f, a in zip((4, 6), topology.node_addresses(t, n), strict=True) if a) == families
        conf = layout.conflist(t, n, layout.node_paths("/run/ferry-lab/tlf", n.name), lone=True)
        assert [topology.families_of([r[0]["subnet"]]) for r in conf["plugins"][0]["ipam"]["ranges"]] == \
            [(f,) for f in families]
    lines = plan_lines(t)
    assert bool(v6(lines)) == (6 in families) and bool(v4(lines)) == (4 in families)
    # every namespace with an address has a default route of each of its families
    config = netplan.plan("tlf", t).stages[1]
    for ns in ("tlf-node-1", "tlf-node-3", "tlf-ext"):
        assert ("route add ::/0 via" in " ".join(config[ns])) == (6 in families), ns
        assert ("route add default via" in " ".join(config[ns])) == (4 in families), ns
    assert topology.parse(yaml.safe_load(yaml.safe_dump(topology.to_doc(t)))) == t


def test_ipv6_only_routes_pod_cidrs_and_node_routes_over_ipv6() -> None:
    t = topology.parse(overrides.load(os.path.join(TOPOLOGIES, "ipv6-only.yaml"), Overrides(mode="networkPolicyOnly")))
    config = netplan.plan("tlf", t).stages[1]
    assert "route add fd00:10:244:3::/64 via fd00:88::d" in config["tlf-router"]
    assert "route add fd00:10:244:2::/64 via fd00:77::c" in config["tlf-node-1"]
    assert not any("10.244" in line for lines in config.values() for line in lines)


def test_a_segment_naming_no_family_gets_the_clusters() -> None:
    t = topology.parse({"clusterCIDRs": ["fd00:10:244::/48"], "segments": {"a": {"mtu": 1400}, "z": {}},
                        "nodes": [{"name": "n1", "segment": "z"}]})
    assert [(s.ipv4, s.ipv6) for s in t.segments] == [(None, "fd00:77::/64"), (None, "fd00:65::/64")]
    assert (t.external_ipv4, t.external_ipv6) == (None, "fd00:99::/64")
    # a dual-stack underlay under IPv4-only Pods, when the segments name both
    t = topology.parse({"clusterCIDRs": ["10.244.0.0/16"],
                        "segments": {"a": {"ipv4": "192.168.77.0/24", "ipv6": "fd00:77::/64"}},
                        "nodes": [{"name": "n1"}]})
    assert t.pod_families == (4,) and t.underlay_families == (4, 6) and t.external_ipv6 == "fd00:99::/64"


@pytest.mark.parametrize("doc, message", [
    ({"clusterCIDRs": ["10.244.0.0/16", "10.245.0.0/16"]}, r"clusterCIDRs .*one per address family"),
    ({"clusterCIDRs": []}, "clusterCIDRs: expected a non-empty list"),
    ({"segments": {"a": {"ipv6": "192.168.1.0/24"}}}, r"segments.a.ipv6: .* not IPv6"),
    ({"segments": {"a": {"ipv5": "x"}}}, r"segments.a: unknown keys \['ipv5'\]"),
    ({"routeSync": {"trafficEncapMode": "encap", "fastPath": True}},
     r"routeSync.fastPath: only with trafficEncapMode noEncap or hybrid \(mode is encap"),
    ({"routeSync": {"trafficEncapMode": "networkPolicyOnly", "fastPath": True}}, r"routeSync.fastPath: .*primary CNI"),
    ({"routeSync": {"trafficEncapMode": "hybrid", "noSNAT": True}}, r"routeSync.noSNAT: only with .*noEncap"),
    ({"routeSync": {"tunnelType": "stt"}}, r"routeSync.tunnelType: stt needs datapath system"),
    ({"routeSync": {"tunnelType": "ipip"}}, r"routeSync.tunnelType: 'ipip' is not one of vxlan, geneve, gre"),
    ({"routeSync": {"tunnelType": "gre", "tunnelPort": 4789}}, r"routeSync.tunnelPort: gre has no UDP port"),
])
def test_inconsistent_topologies_are_refused_naming_the_key(doc: dict, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        topology.parse(doc)


# ---------------------------------------------------------------- the probes check plans

def _lab_on_disk(tmp_path, t: topology.Topology, pods: dict[str, list[str]], route_sync: bool = True) -> Lab:  # type: ignore[no-untyped-def]
    """A Lab object over files only (manifest, Pod results): what ``check.plan`` reads."""
    directory = str(tmp_path / "tlf")
    Manifest.create(directory, "tlf").set(state="up", routeSync=route_sync)
    lab = Lab("tlf", t, directory, "/nonexistent", None)
    for node, ips in pods.items():
        for i in (1, 2):
            result = {"ips": [{"address": ip.replace("X", str(i + 1))} for ip in ips],
                      "interfaces": [{"name": "eth0", "mac": f"02:00:00:00:00:0{i}", "sandbox": "/x"}]}
            layout.write_json(lab.node(node).paths.pod_result(f"p{i}"), {"netns": f"tlf-{node}-p{i}", "result": result})
    return lab


@pytest.mark.parametrize("file, per_family", [("ipv4-only.yaml", {4: 15}), ("ipv6-only.yaml", {6: 15}),
                                              ("default.yaml", {4: 15, 6: 15})])
def test_check_plans_probes_of_the_configured_families_only(tmp_path, file: str, per_family: dict) -> None:  # type: ignore[no-untyped-def]
    t = load(file)
    pods = {n.name: [f"{topology.host(c, 0)}X/{c.split('/')[1]}" for c in n.pod_cidrs] for n in t.nodes}
    lab = _lab_on_disk(tmp_path, t, pods)
    specs = check.plan(lab)
    assert {f: sum(1 for s in specs if s.family == f) for f in (4, 6) if any(s.family == f for s in specs)} \
        == per_family
    assert all(s.addr for s in specs)  # every probe has a destination address of its family
    ext = [s for s in specs if s.category == "pod-to-external"]
    assert {s.expect_source for s in ext} == {a for n in lab.nodes for a in n.addresses if a}  # masquerade


def test_check_fails_a_configured_family_a_pod_lacks(tmp_path) -> None:  # type: ignore[no-untyped-def]
    t = load("default.yaml")
    pods = {n.name: [f"{topology.host(c, 0)}X/{c.split('/')[1]}" for c in n.pod_cidrs] for n in t.nodes}
    pods["node-2"] = pods["node-2"][:1]  # IPAM gave node-2's Pods no IPv6 address
    specs = check.plan(_lab_on_disk(tmp_path, t, pods))
    missing = [s for s in specs if s.addr is None]
    assert missing and all(s.family == 6 and "node-2" in s.dst for s in missing)
    rows = [check.Row(s, True, None, None) for s in missing]
    assert not any(r.ok for r in rows)


# ---------------------------------------------------------------- the flags

def base() -> dict:
    with open(topology.DEFAULT_TOPOLOGY) as f:
        return yaml.safe_load(f)


@pytest.mark.parametrize("o, mode, tunnel, fast, routed, node_routes", [
    (Overrides(mode="noEncap"), "noEncap", "vxlan", False, True, False),
    (Overrides(mode="hybrid", tunnel="geneve"), "hybrid", "geneve", False, False, False),
    (Overrides(mode="hybrid", fast_path=True), "hybrid", "vxlan", True, False, False),
    (Overrides(mode="noEncap", fast_path=True), "noEncap", "vxlan", True, True, False),
    (Overrides(mode="networkPolicyOnly"), "networkPolicyOnly", "vxlan", False, True, True),
    (Overrides(tunnel="gre"), "encap", "gre", False, False, False),
])
def test_mode_flags_override_the_topology(o: Overrides, mode: str, tunnel: str, fast: bool, routed: bool,
                                          node_routes: bool) -> None:
    t = topology.parse(overrides.apply(base(), o))
    assert t.route_sync is not None
    assert (t.route_sync.trafficEncapMode, t.route_sync.tunnelType, t.route_sync.fastPath) == (mode, tunnel, fast)
    assert (t.route_pod_cidrs, t.node_pod_routes) == (routed, node_routes)
    assert t.chained == (mode == "networkPolicyOnly")


def test_mode_flag_drops_file_keys_the_new_mode_cannot_take() -> None:
    doc = {"routeSync": {"trafficEncapMode": "noEncap", "fastPath": True, "noSNAT": True}, "nodePodRoutes": True}
    t = topology.parse(overrides.apply(doc, Overrides(mode="encap")))
    assert t.route_sync is not None and not t.route_sync.fastPath and not t.route_sync.noSNAT
    assert not t.node_pod_routes
    # and --mode on a lone-Node topology starts route-sync
    t = topology.parse(overrides.load(os.path.join(TOPOLOGIES, "lone.yaml"), Overrides(mode="hybrid")))
    assert t.route_sync is not None and t.route_sync.trafficEncapMode == "hybrid"
    # the file's tunnelPort belongs to its tunnel type
    t = topology.parse(overrides.apply({"routeSync": {"tunnelType": "vxlan", "tunnelPort": 8472}},
                                       Overrides(tunnel="gre")))
    assert t.route_sync is not None and t.route_sync.tunnelPort is None


@pytest.mark.parametrize("o, doc, message", [
    (Overrides(mode="encap", fast_path=True), None,
     r"--fast-path: only with --mode noEncap or hybrid \(mode is encap: every peer is tunnelled"),
    (Overrides(fast_path=True), None, r"--fast-path: .*\(mode is encap \(from the topology\)"),
    (Overrides(fast_path=True), {"routeSync": None}, r"--fast-path: .*\(mode is encap \(the default"),
    (Overrides(mode="networkPolicyOnly", fast_path=True), None, r"--fast-path: .*primary CNI routes"),
    (Overrides(mode="noEncap", tunnel="gre"), None,
     r"--tunnel gre: only with --mode encap or hybrid \(mode is noEncap: no peer is tunnelled\)"),
    (Overrides(tunnel="vxlan"), {"routeSync": {"trafficEncapMode": "networkPolicyOnly"}},
     r"--tunnel vxlan: .*\(mode is networkPolicyOnly \(from the topology\)"),
    (Overrides(mode="tunnel"), None, r"--mode tunnel: one of encap, noEncap, hybrid, networkPolicyOnly"),
    (Overrides(family="5"), None, r"--family 5: one of 4, 6, dual"),
])
def test_invalid_flag_combinations_are_refused_with_the_reason(o: Overrides, doc: dict | None, message: str
                                                               ) -> None:
    with pytest.raises(TopologyError, match=message):
        overrides.apply(base() if doc is None else doc, o)


@pytest.mark.parametrize("family, families", [("4", (4,)), ("6", (6,)), ("dual", (4, 6))])
def test_family_flag_makes_any_topology_that_family(family: str, families: tuple[int, ...]) -> None:
    for file in ("default.yaml", "ipv4-only.yaml", "ipv6-only.yaml", "policy-only.yaml", "routed.yaml"):
        with open(os.path.join(TOPOLOGIES, file)) as f:
            t = topology.parse(overrides.apply(yaml.safe_load(f), Overrides(family=family)))
        assert t.pod_families == families and t.underlay_families == families, file
        assert all(s.families == families for s in t.segments), file
        assert tuple(f for f in (4, 6) if t.external_cidr(f)) == families, file
        assert all(topology.families_of(n.pod_cidrs) == families for n in t.nodes), file
    # addresses the file names are kept; a family added gets the defaults
    t = topology.parse(overrides.apply({"segments": {"a": {"ipv4": "10.9.0.0/24"}}, "nodes": [{"name": "n1"}]},
                                       Overrides(family=family)))
    assert t.segments[0].ipv4 == ("10.9.0.0/24" if 4 in families else None)
    assert t.segments[0].ipv6 == ("fd00:77::/64" if 6 in families else None)


def test_family_flag_keeps_explicit_pod_cidrs_of_the_family() -> None:
    doc = {"nodes": [{"name": "n1", "podCIDRs": ["10.1.0.0/24", "fd00:1::/64"]}]}
    assert topology.parse(overrides.apply(doc, Overrides(family="6"))).node("n1").pod_cidrs == ("fd00:1::/64",)
    doc = {"clusterCIDRs": ["10.244.0.0/16"], "nodes": [{"name": "n1", "podCIDRs": ["10.1.0.0/24"]}]}
    assert topology.parse(overrides.apply(doc, Overrides(family="dual"))).node("n1").pod_cidrs == \
        ("10.1.0.0/24", "fd00:10:244:1::/64")


def test_no_flags_leave_the_topology_as_it_is() -> None:
    assert overrides.apply(base(), Overrides()) == base()


@pytest.mark.parametrize("args, message", [
    (["--mode", "encap", "--fast-path"], "--fast-path: only with --mode noEncap or hybrid"),
    (["--mode", "noEncap", "--tunnel", "gre"], "--tunnel gre: only with --mode encap or hybrid"),
    (["-f", os.path.join(TOPOLOGIES, "policy-only.yaml"), "--fast-path"], "--fast-path: only with"),
])
@pytest.mark.parametrize("command", ["up", "demo"])
def test_cli_refuses_before_building_anything(command: str, args: list[str], message: str) -> None:
    res = CliRunner().invoke(cli.main, [command, "--name", "tlfnone", *args])
    assert res.exit_code == 1, res.output
    assert message in res.output
    assert not os.path.exists(layout.lab_dir("tlfnone"))


def test_cli_lists_the_flag_choices() -> None:
    res = CliRunner().invoke(cli.main, ["up", "--mode", "bogus"])
    assert res.exit_code == 2 and "'encap', 'noEncap', 'hybrid', 'networkPolicyOnly'" in res.output
    res = CliRunner().invoke(cli.main, ["demo", "--help"])
    for flag in ("--mode", "--tunnel", "--fast-path", "--family", "--picture"):
        assert flag in res.output
