"""The NetworkPolicy planner without a switch: which flows a Node gets, how many, and that OVS
takes them (``ovs-ofctl parse-flows``).  The datapath itself: tests/cni/pipeline/test_policy_datapath.py."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni.pipeline.actions import Conjunction
from cni.pipeline.tables import EgressDefault, Flow, Table
from routesync.policy import plan as pp
from routesync.policy import ranges
from routesync.policy import selector as sel
from routesync.policy.model import NamedPort, Pod, policy_from

NODE = "n1"


def pod(ns: str, name: str, ip: str, node: str = NODE, ports: tuple[NamedPort, ...] = (), **labels: str) -> Pod:
    return Pod(ns, name, node, tuple(sorted(labels.items())), (ip,), ports)


def policy(ns: str, name: str, selector: dict, ingress: list | None = None, egress: list | None = None,
           types: tuple[str, ...] = ("Ingress",)) -> dict:
    spec: dict = {"podSelector": selector, "policyTypes": list(types)}
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    return {"metadata": {"namespace": ns, "name": name}, "spec": spec}


def plan(pods: list[Pod], policies: list[dict], namespaces: dict | None = None, **facts) -> pp.Plan:
    ns = namespaces if namespaces is not None else {p.namespace: () for p in pods}
    return pp.plan(pp.Inputs(tuple(pods), ns, tuple(policy_from(d) for d in policies)), pp.NodeFacts(NODE, **facts))


def in_table(p: pp.Plan, table: Table) -> list[str]:
    return [f.text().split(",", 3)[3] for f in p.flows if f.table == table]


def test_a_200_by_200_rule_costs_the_sum_of_its_sizes() -> None:
    servers = [pod("s", f"srv{i}", f"10.1.{i // 250}.{i % 250 + 1}", app="srv") for i in range(200)]
    clients = [pod("c", f"cli{i}", f"10.2.{i // 250}.{i % 250 + 1}", node="n2", app="cli") for i in range(200)]
    rule = {"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "cli"}}}],
            "ports": [{"port": 80}]}
    p = plan(servers + clients, [policy("s", "web", {"matchLabels": {"app": "srv"}}, [rule])])
    rules = [f for f in p.flows if f.table == Table.INGRESS_RULE]
    # 200 applied-to + 200 peers + 2 port flows (tcp, tcp6) + 1 conj_id; + 1 isolation drop per Pod
    assert len(rules) == 200 + 200 + 2 + 1
    assert len([f for f in p.flows if f.table == Table.INGRESS_DEFAULT]) == 200
    assert len(p.rules) == 1 and len(p.rules[0].pods) == 200


def test_no_local_pod_selected_means_no_flows_here() -> None:
    pods = [pod("a", "x", "10.0.0.1", node="elsewhere", app="x")]
    p = plan(pods, [policy("a", "deny", {})])
    assert not [f for f in p.flows if f.table in (Table.INGRESS_RULE, Table.INGRESS_DEFAULT)]
    assert p.policy_namespaces == ["a"]


def test_default_deny_isolates_without_rules_and_egress_only_when_typed() -> None:
    pods = [pod("a", "x", "10.0.0.1", app="x"), pod("a", "y", "fd00::2", app="y")]
    p = plan(pods, [policy("a", "deny-in", {}), policy("a", "deny-out", {"matchLabels": {"app": "y"}}, egress=[],
                                                          types=("Egress",))])
    assert p.isolated == {"a/x": (True, False), "a/y": (True, True)}
    assert in_table(p, Table.INGRESS_DEFAULT) == ["ip,nw_dst=10.0.0.1,actions=drop",
                                                   "ipv6,ipv6_dst=fd00::2,actions=drop"]
    assert in_table(p, Table.EGRESS_DEFAULT) == ["ipv6,ipv6_src=fd00::2,actions=drop"]


def test_a_pod_in_two_rules_is_one_flow_with_both_conjunctions() -> None:
    pods = [pod("a", "x", "10.0.0.1", app="x"), pod("a", "y", "10.0.0.2", app="y")]
    r1 = [{"from": [{"podSelector": {"matchLabels": {"app": "y"}}}]}]
    r2 = [{"ports": [{"port": 53, "protocol": "UDP"}]}]
    p = plan(pods, [policy("a", "p1", {"matchLabels": {"app": "x"}}, r1),
                    policy("a", "p2", {"matchLabels": {"app": "x"}}, r2)])
    applied = [f for f in p.flows if f.table == Table.INGRESS_RULE and "nw_dst=10.0.0.1" in f.match_text()]
    assert len(applied) == 1
    conj = [a for a in applied[0].actions if isinstance(a, Conjunction)]
    assert sorted((c.clause, c.n_clauses) for c in conj) == [(1, 2), (1, 3)]
    assert len({c.id for c in conj}) == 2
    # keys are unique: OpenFlow would let a second flow with the same key replace the first
    keys = [f.key() for f in p.flows]
    assert len(keys) == len(set(keys))


def test_named_ports_resolve_per_pod_into_a_conjunction_each() -> None:
    pods = [pod("a", "x", "10.0.0.1", ports=(NamedPort("http", "TCP", 8080),), app="web"),
            pod("a", "y", "10.0.0.2", ports=(NamedPort("http", "TCP", 9090),), app="web"),
            pod("a", "z", "10.0.0.3", app="web")]
    p = plan(pods, [policy("a", "http", {"matchLabels": {"app": "web"}}, [{"ports": [{"port": "http"}]}])])
    assert sorted((r.port, r.pods) for r in p.rules) == [("http=8080/TCP", ("a/x",)), ("http=9090/TCP", ("a/y",))]
    assert "tcp,tp_dst=8080" in " ".join(in_table(p, Table.INGRESS_RULE))
    assert p.isolated["a/z"] == (True, False)  # selected, no port of that name: nothing allowed


def test_a_named_port_listed_twice_is_one_conjunction_and_the_host_judge_renders() -> None:
    """``{port: http}`` beside ``{port: http, protocol: TCP}`` (the same port, TCP by default): one
    rule, not two with one id, whose host judge declared its sets twice and failed every pass."""
    from routesync.policy import hostjudge
    from routesync.policy.incremental import IncrementalPlanner

    pods = [pod("a", "x", "10.0.0.1", ports=(NamedPort("http", "TCP", 8080),), app="web"),
            pod("a", "c", "10.0.0.9", node="n2", app="cli")]
    pol = policy("a", "http", {"matchLabels": {"app": "web"}},
                 [{"from": [{"podSelector": {"matchLabels": {"app": "cli"}}}],
                   "ports": [{"port": "http"}, {"port": "http", "protocol": "TCP"},
                             {"port": "http", "protocol": "UDP"}]}])
    p = plan(pods, [pol])
    assert sorted((r.port, r.pods) for r in p.rules) == [("http=8080/TCP", ("a/x",))]
    assert len({r.conj_id for r in p.host_rules}) == len(p.host_rules) == 1
    body = hostjudge.render_body(hostjudge.judge(p, "ferry-gw0", ("192.168.1.1/24",)))
    assert "tcp dport { 8080 }" in body.text
    inc = IncrementalPlanner(pp.NodeFacts(NODE))
    inc.load(pp.Inputs(tuple(pods), {"a": ()}, (policy_from(pol),)))
    assert inc.snapshot().rules == p.rules


def test_egress_named_port_resolves_on_the_peer() -> None:
    pods = [pod("a", "cli", "10.0.0.1", app="cli"),
            pod("b", "srv", "10.0.1.1", node="n2", ports=(NamedPort("dns", "UDP", 5353),), app="srv")]
    rule = [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "srv"}}}],
             "ports": [{"port": "dns", "protocol": "UDP"}]}]
    p = plan(pods, [policy("a", "out", {"matchLabels": {"app": "cli"}}, egress=rule, types=("Egress",))])
    flows = " ".join(in_table(p, Table.EGRESS_RULE))
    assert "nw_src=10.0.0.1" in flows and "nw_dst=10.0.1.1" in flows and "udp,tp_dst=5353" in flows


def test_ip_block_except_and_port_ranges_become_prefixes_and_masks() -> None:
    pods = [pod("a", "x", "10.0.0.1", app="x")]
    rule = [{"from": [{"ipBlock": {"cidr": "192.168.0.0/16", "except": ["192.168.1.0/24"]}}],
             "ports": [{"port": 1000, "endPort": 1003, "protocol": "SCTP"}]}]
    p = plan(pods, [policy("a", "blk", {}, rule)])
    text = " ".join(in_table(p, Table.INGRESS_RULE))
    assert "nw_src=192.168.0.0/24" in text and "nw_src=192.168.1.0/24" not in text and "nw_src=192.168.128.0/17" in text
    assert "sctp,tp_dst=0x3e8/0xfffc" in text or "sctp,tp_dst=1000/0xfffc" in text


def remote_egress(p: pp.Plan) -> tuple[list[str], list[str]]:
    """The flows that judge remote Pods' egress here: EgressRule's whose conjunctions are remote
    rules', and EgressDefault's remote isolation."""
    ids = {r.conj_id for r in p.remote_rules}

    def remote(f: Flow) -> bool:
        return (f.match_text() in {f"conj_id={n}" for n in ids}
                or any(isinstance(a, Conjunction) and a.id in ids for a in f.actions))

    rules = [f.text().split(",", 3)[3] for f in p.flows if f.table == Table.EGRESS_RULE and remote(f)]
    return rules, in_table(p, Table.EGRESS_DEFAULT)


def test_a_remote_clients_egress_is_judged_on_what_it_sends_here() -> None:
    """The Service gap of routed modes: a DNATed connection may reach this Node without having
    crossed the client's OVS after the DNAT, so the client's egress is judged here too, on this
    Node's Pods only (its rule's peers on other Nodes are that Node's business)."""
    pods = [pod("a", "cli", "10.0.2.5", node="n2", app="cli"),
            pod("b", "srv", "10.0.1.5", ports=(NamedPort("http", "TCP", 8080),), app="srv"),
            pod("b", "other", "10.0.1.6", app="other"),
            pod("b", "srv-far", "10.0.3.5", node="n3", app="srv")]
    rule = [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "srv"}}}],
             "ports": [{"port": 80}]},
            {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "srv"}}}],
             "ports": [{"port": "http"}]},
            {"to": [{"ipBlock": {"cidr": "10.0.1.6/32"}}], "ports": [{"port": 53, "protocol": "UDP"}]}]
    p = plan(pods, [policy("a", "out", {"matchLabels": {"app": "cli"}}, egress=rule, types=("Egress",))])
    assert p.rules == [] and p.isolated == {"b/srv": (False, False), "b/other": (False, False)}
    assert [(r.policy, r.direction, r.index, r.pods, r.port) for r in p.remote_rules] == [
        ("a/out", "egress", 0, ("a/cli",), ""), ("a/out", "egress", 1, ("a/cli",), "http=8080/TCP"),
        ("a/out", "egress", 2, ("a/cli",), "")]
    r0, r1, r2 = (r.conj_id for r in p.remote_rules)
    assert len({r0, r1, r2, p.remote_isolation_id}) == 4
    allow, isolation = remote_egress(p)
    assert sorted(allow) == sorted([
        f"conj_id={r0},actions=goto_table:46", f"conj_id={r1},actions=goto_table:46",
        f"conj_id={r2},actions=goto_table:46",
        f"ip,nw_dst=10.0.1.5,actions=conjunction({r0},2/3),conjunction({r1},2/3)",  # srv here; srv-far is not
        f"ip,nw_dst=10.0.1.6,actions=conjunction({r2},2/3)",  # the ipBlock, as it is
        f"ip,nw_src=10.0.2.5,actions=conjunction({r0},1/3),conjunction({r1},1/3),conjunction({r2},1/3)",
        f"tcp,tp_dst=80,actions=conjunction({r0},3/3)", f"tcp6,tp_dst=80,actions=conjunction({r0},3/3)",
        f"tcp,tp_dst=8080,actions=conjunction({r1},3/3)", f"tcp6,tp_dst=8080,actions=conjunction({r1},3/3)",
        f"udp,tp_dst=53,actions=conjunction({r2},3/3)", f"udp6,tp_dst=53,actions=conjunction({r2},3/3)"])
    n = p.remote_isolation_id
    assert isolation == [f"conj_id={n},actions=drop", f"ip,nw_dst=10.0.1.5,actions=conjunction({n},2/2)",
                         f"ip,nw_dst=10.0.1.6,actions=conjunction({n},2/2)",
                         f"ip,nw_src=10.0.2.5,actions=conjunction({n},1/2)"]
    assert all(f.priority == EgressDefault.REMOTE_ISOLATED < EgressDefault.ISOLATED
               for f in p.flows if f.table == Table.EGRESS_DEFAULT)
    assert p.remote_isolated == ["a/cli"]


def test_without_remote_egress_a_remote_clients_egress_is_left_to_its_source() -> None:
    """``policyPeers: peerSlices``: the source Node judges its Pods' egress (OVS, the host's judge);
    here nothing judges a remote client, and a local client's egress is judged as before."""
    pods = [pod("a", "cli", "10.0.2.5", node="n2", app="cli"), pod("a", "cli-here", "10.0.1.7", app="cli"),
            pod("b", "srv", "10.0.1.5", app="srv")]
    out = [policy("a", "out", {"matchLabels": {"app": "cli"}}, types=("Egress",),
                  egress=[{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "srv"}}}]}])]
    both = plan(pods, out, pod_cidrs=("10.0.1.0/24",))
    assert both.remote_isolated == ["a/cli"] and both.remote_rules
    p = plan(pods, out, pod_cidrs=("10.0.1.0/24",), remote_egress=False)
    assert (p.remote_rules, p.remote_isolated, p.remote_isolation_id, p.remote_sources) == ([], [], None, {})
    assert not [f for f in p.flows if f.table == Table.EGRESS_DEFAULT
                and f.priority in (EgressDefault.REMOTE_ISOLATED, EgressDefault.REMOTE_ISOLATED_NEW)]
    assert "10.0.2.5" not in " ".join(f.text() for f in p.flows)
    assert [(r.policy, r.pods) for r in p.rules] == [(r.policy, r.pods) for r in both.rules] == [
        ("a/out", ("a/cli-here",))]
    assert p.isolated == both.isolated == {"a/cli-here": (False, True),
                                                                      "b/srv": (False, False)}


def test_a_200_remote_by_200_local_egress_rule_costs_the_sum() -> None:
    clients = [pod("c", f"cli{i}", f"10.2.{i // 250}.{i % 250 + 1}", node="n2", app="cli") for i in range(200)]
    servers = [pod("s", f"srv{i}", f"10.1.{i // 250}.{i % 250 + 1}", app="srv") for i in range(200)]
    far = [pod("s", f"far{i}", f"10.3.{i // 250}.{i % 250 + 1}", node="n3", app="srv") for i in range(200)]
    rule = [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "srv"}}}],
             "ports": [{"port": 80}]}]
    p = plan(clients + servers + far, [policy("c", "out", {"matchLabels": {"app": "cli"}}, egress=rule,
                                              types=("Egress",))])
    allow, isolation = remote_egress(p)
    # 200 remote clients + 200 local servers (not the 200 on n3) + tcp, tcp6 + 1 conj_id
    assert len(allow) == len(in_table(p, Table.EGRESS_RULE)) == 200 + 200 + 2 + 1
    # 200 remote sources + 200 local destinations + 1 conj_id
    assert len(isolation) == 200 + 200 + 1
    assert len(p.remote_rules) == 1 and len(p.remote_rules[0].pods) == 200
    # with the Node's Pod CIDRs known, they stand for its Pods: 200 remote sources + 2 CIDRs + 1 conj_id
    by_cidr = plan(clients + servers + far, [policy("c", "out", {"matchLabels": {"app": "cli"}}, egress=rule,
                                                    types=("Egress",))], pod_cidrs=("10.1.0.0/16", "fd00:1::/64"))
    assert len(remote_egress(by_cidr)[1]) == 200 + 2 + 1


def test_local_destinations_are_the_pod_cidrs_and_any_pod_outside_them() -> None:
    local = [pod("a", "in", "10.1.0.5"), pod("a", "out", "10.9.0.5"), pod("a", "six", "fd00:1::5")]
    assert pp.local_destinations(local, ("10.1.0.0/16", "fd00:1::/64")) == ["10.1.0.0/16", "fd00:1::/64", "10.9.0.5"]
    assert pp.local_destinations(local, ()) == ["10.1.0.5", "10.9.0.5", "fd00:1::5"]  # networkPolicyOnly


def test_remote_egress_only_for_remote_pods_a_policy_isolates_for_egress() -> None:
    pods = [pod("a", "cli", "10.0.2.5", node="n2", app="cli"), pod("a", "loc", "10.0.1.7", app="cli"),
            pod("b", "srv", "10.0.1.5", app="srv")]
    to_srv = [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "srv"}}}]}]
    ingress_only = policy("a", "in", {"matchLabels": {"app": "cli"}}, [{}], egress=to_srv, types=("Ingress",))
    p = plan(pods, [ingress_only])
    assert not p.remote_rules and not p.remote_isolated and not in_table(p, Table.EGRESS_DEFAULT)
    # no Pod on this Node: nothing to judge a remote Pod's egress on
    assert not plan([pods[0]], [policy("a", "out", {}, egress=to_srv, types=("Egress",))]).remote_rules
    # a Pod of the policy here and one elsewhere: one conjunction each, apart
    both = plan(pods, [policy("a", "out", {}, egress=to_srv, types=("Egress",))])
    assert [r.pods for r in both.rules] == [("a/loc",)] and [r.pods for r in both.remote_rules] == [("a/cli",)]
    assert both.rules[0].conj_id != both.remote_rules[0].conj_id
    # every peer of the rule elsewhere: it allows nothing here, the isolation still drops
    away = plan(pods[:2], [policy("a", "out", {"matchLabels": {"app": "cli"}}, egress=to_srv, types=("Egress",))])
    assert not away.remote_rules and away.remote_isolated == ["a/cli"]
    assert f"conj_id={away.remote_isolation_id},actions=drop" in in_table(away, Table.EGRESS_DEFAULT)
    # a remote record holding a local Pod's address (its Pod gone, the address reused here) is not judged here
    stale = plan(pods + [pod("a", "old", "10.0.1.5", node="n2", app="cli")],
                 [policy("a", "out", {"matchLabels": {"app": "cli"}}, egress=to_srv, types=("Egress",))])
    assert stale.remote_isolated == ["a/cli"]


def test_host_and_service_flows() -> None:
    p = plan([pod("a", "x", "10.0.0.1")], [], host_addresses=("10.0.0.254",), service_cidrs=("10.96.0.0/12",))
    assert in_table(p, Table.INGRESS_RULE) == ["ip,nw_src=10.0.0.254,actions=goto_table:60"]
    assert in_table(p, Table.EGRESS_RULE) == ["ip,nw_dst=10.96.0.0/12,actions=goto_table:60"]


def test_unreadable_rules_deny_and_are_named() -> None:
    bad = policy("a", "bad", {}, [{"from": [{"ipBlock": {"cidr": "not-a-cidr"}}]}])
    p = plan([pod("a", "x", "10.0.0.1")], [bad])
    assert p.isolated["a/x"] == (True, False)
    assert not [r for r in p.rules] and p.errors and "ingress[0]" in p.errors[0] and "a/bad" in p.errors[0]


def test_conj_ids_are_stable_and_reused() -> None:
    ids = pp.ConjIds()
    a, b = ids.get("a"), ids.get("b")
    ids.sweep()
    assert ids.get("b") == b
    ids.sweep()  # "a" freed
    assert ids.get("c") == a


def test_selector_operators() -> None:
    s = sel.parse({"matchLabels": {"k": "v"}, "matchExpressions": [
        {"key": "t", "operator": "In", "values": ["1", "2"]}, {"key": "x", "operator": "DoesNotExist"},
        {"key": "e", "operator": "Exists"}, {"key": "n", "operator": "NotIn", "values": ["no"]}]}, "sel")
    assert s.matches({"k": "v", "t": "2", "e": ""}) and not s.matches({"k": "v", "t": "3", "e": ""})
    assert not s.matches({"k": "v", "t": "1", "e": "", "x": "1"}) \
        and not s.matches({"k": "v", "t": "1", "e": "", "n": "no"})
    with pytest.raises(sel.SelectorError, match=r"sel.matchExpressions\[0\].operator"):
        sel.parse({"matchExpressions": [{"key": "a", "operator": "Near"}]}, "sel")


@given(st.integers(0, 65535), st.integers(0, 65535))
def test_port_masks_cover_exactly_the_range(a: int, b: int) -> None:
    lo, hi = min(a, b), max(a, b)
    masks = ranges.port_masks(lo, hi)
    assert len(masks) <= 30
    covered = 0
    for value, mask in masks:
        size = (~mask & 0xFFFF) + 1
        assert value & ~mask & 0xFFFF == 0 and lo <= value and value + size - 1 <= hi
        covered += size
    assert covered == hi - lo + 1


@given(st.integers(8, 30), st.lists(st.integers(0, 255), max_size=4))
def test_block_minus_is_the_set_difference(plen: int, octets: list[int]) -> None:
    block = ipaddress.ip_network(f"10.0.0.0/{plen}")
    excepts = [f"10.0.{o}.0/24" for o in octets]
    parts = ranges.block_minus(str(block), excepts)
    excluded = [ipaddress.ip_network(e) for e in excepts]
    for probe in (ipaddress.ip_address(f"10.0.{o}.7") for o in range(0, 256, 17)):
        want = probe in block and not any(probe in e for e in excluded)
        assert any(probe in p for p in parts) == want


@pytest.mark.skipif(shutil.which("ovs-ofctl") is None, reason="ovs-ofctl not installed")
def test_ovs_takes_every_planned_flow() -> None:
    pods = [pod("a", "x", "10.0.0.1", ports=(NamedPort("h", "TCP", 80),), app="x"), pod("a", "y", "fd00::2", app="y"),
            pod("a", "r", "10.0.9.1", node="n2", app="r"), pod("a", "r6", "fd00:9::1", node="n2", app="r")]
    rules = [{"from": [{"podSelector": {}}, {"ipBlock": {"cidr": "10.8.0.0/16", "except": ["10.8.1.0/24"]}}],
              "ports": [{"port": "h"}, {"port": 1000, "endPort": 2000, "protocol": "UDP"}, {"protocol": "SCTP"}]},
             {}]
    p = plan(pods, [policy("a", "all", {}, rules, egress=rules[:1], types=("Ingress", "Egress"))],
             host_addresses=("10.0.0.254", "fd00::fe"), service_cidrs=("10.96.0.0/12", "fd00:96::/112"))
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "parse-flows", "-"],
                         input="\n".join(f.text() for f in p.flows), capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert p.remote_rules and p.remote_isolation_id is not None  # the remote Pods' flows are among them
