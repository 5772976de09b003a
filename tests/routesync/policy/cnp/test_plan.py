"""The tiers' planner (pure): rungs by precedence, actions by tier, the sum of a rule's sizes."""

from __future__ import annotations

from typing import Any

from cni.pipeline.tables import EgressAdmin, IngressAdmin, IngressBaseline, Table
from routesync.policy.cnp import plan as tp
from routesync.policy.cnp.model import cluster_policy_from, node_info_from
from routesync.policy.model import NamedPort, Pod

HERE = "n1"


def pod(ns: str, name: str, node: str, ip: str, labels: dict[str, str] | None = None,
        ports: tuple[NamedPort, ...] = ()) -> Pod:
    return Pod(ns, name, node, tuple(sorted((labels or {}).items())), (ip,), ports)


def cnp(name: str, tier: str, priority: int, subject: dict[str, Any], ingress: list | None = None,
        egress: list | None = None) -> Any:
    spec: dict[str, Any] = {"tier": tier, "priority": priority, "subject": subject}
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    return cluster_policy_from({"metadata": {"name": name}, "spec": spec})


def ns(label: str) -> dict[str, Any]:
    return {"namespaces": {"matchLabels": {"team": label}}}


NAMESPACES = {"a": (("team", "a"),), "b": (("team", "b"),)}
PODS = (pod("a", "a1", HERE, "10.0.1.1"), pod("a", "a2", "n2", "10.0.2.1"),
        pod("b", "b1", HERE, "10.0.1.2", ports=(NamedPort("http", "TCP", 8080),)),
        pod("b", "b2", "n2", "10.0.2.2", ports=(NamedPort("http", "TCP", 9090),)))


def planned(*policies: Any, pods: tuple[Pod, ...] = PODS, nodes: tuple = (), services: tuple[str, ...] = ()
            ) -> tp.TierPlan:
    return tp.plan(tp.Inputs(pods, NAMESPACES, tuple(policies), nodes), tp.Facts(HERE, services))


def conj_flow(p: tp.TierPlan, conj_id: int) -> Any:
    (f,) = [f for f in p.flows if f"conj_id={conj_id}," in f.text()]
    return f


def test_no_policy_no_flow() -> None:
    assert planned(services=("10.96.0.0/12",)).flows == []


def test_precedence_is_the_rung_and_the_action_says_where_next() -> None:
    hi = cnp("hi", "Admin", 10, ns("b"), ingress=[{"action": "Pass", "from": [ns("a")]},
                                                  {"action": "Deny", "from": [ns("a")]}])
    lo = cnp("lo", "Admin", 20, ns("b"), ingress=[{"action": "Accept", "from": [ns("a")]}])
    base = cnp("base", "Baseline", 0, ns("b"), ingress=[{"action": "Deny", "from": [ns("a")]}])
    p = planned(lo, base, hi)
    # evaluation order: Admin by priority, then Baseline; rules in order
    assert [(r.policy, r.index, r.action) for r in p.rules] == [("hi", 0, "Pass"), ("hi", 1, "Deny"),
                                                                ("lo", 0, "Accept"), ("base", 0, "Deny")]
    rungs = {(r.policy, r.index): conj_flow(p, r.conj_id).priority for r in p.rules}
    assert rungs == {("hi", 0): IngressAdmin.TOP - 260, ("hi", 1): IngressAdmin.TOP - 261,
                     ("lo", 0): IngressAdmin.TOP - 520, ("base", 0): IngressBaseline.TOP}
    acts = {r.policy + str(r.index): conj_flow(p, r.conj_id).text().split("actions=")[1] for r in p.rules}
    assert acts == {"hi0": f"goto_table:{int(Table.INGRESS_RULE)}", "hi1": "drop",
                    "lo0": f"goto_table:{int(Table.CONNTRACK_COMMIT)}", "base0": "drop"}
    # ingress applies to this Node's subjects only; its peers are every Pod the peer selects
    (hi0,) = [r for r in p.rules if (r.policy, r.index) == ("hi", 0)]
    clause1 = [f.text() for f in p.flows if f"conjunction({hi0.conj_id},1/2)" in f.text()]
    clause2 = [f.text() for f in p.flows if f"conjunction({hi0.conj_id},2/2)" in f.text()]
    assert [t.split(",actions")[0].rsplit(",", 1)[-1] for t in clause1] == ["nw_dst=10.0.1.2"]
    assert sorted(t.split(",actions")[0].rsplit(",", 1)[-1] for t in clause2) == ["nw_src=10.0.1.1",
                                                                                   "nw_src=10.0.2.1"]
    assert hi0.pods == ("b/b1",) and p.subject_namespaces == ["b"]
    assert p.tiers_of == {"b/b1": ["Admin/10/hi", "Admin/20/lo", "Baseline/0/base"]}


def test_egress_applies_to_every_subject_and_pass_goes_by_tier() -> None:
    admin = cnp("out", "Admin", 3, ns("a"), egress=[{"action": "Pass", "to": [{"networks": ["192.0.2.0/24"]}]}])
    base = cnp("bout", "Baseline", 3, ns("a"), egress=[{"action": "Pass", "to": [{"networks": ["192.0.2.0/24"]}]}])
    p = planned(admin, base, services=("10.96.0.0/12",))
    by = {r.policy: r for r in p.rules}
    assert by["out"].pods == ("a/a1",)  # the local one; the remote subject is in clause 1 too
    clause1 = [f.text() for f in p.flows if f"conjunction({by['out'].conj_id},1/2)" in f.text()]
    assert len(clause1) == 2 and any("nw_src=10.0.2.1" in t for t in clause1)
    assert conj_flow(p, by["out"].conj_id).text().endswith(f"goto_table:{int(Table.EGRESS_RULE)}")
    assert conj_flow(p, by["bout"].conj_id).text().endswith(f"goto_table:{int(Table.INGRESS_ADMIN)}")
    svc = [f for f in p.flows if f.table == Table.EGRESS_ADMIN and f.priority == EgressAdmin.SERVICE]
    assert [f.text().split(",actions=")[1] for f in svc] == [f"goto_table:{int(Table.CONNTRACK_COMMIT)}"]


def test_without_remote_egress_egress_applies_to_this_nodes_subjects_only() -> None:
    """``policyPeers: peerSlices``: a remote subject's egress is judged at its source alone."""
    out = cnp("out", "Admin", 3, ns("a"), egress=[{"action": "Deny", "to": [{"networks": ["192.0.2.0/24"]}]}])
    p = tp.plan(tp.Inputs(PODS, NAMESPACES, (out,)), tp.Facts(HERE, remote_egress=False))
    (r,) = p.rules
    assert r.pods == ("a/a1",)
    clause1 = [f.text() for f in p.flows if f"conjunction({r.conj_id},1/2)" in f.text()]
    assert len(clause1) == 1 and "nw_src=10.0.1.1" in clause1[0]  # a2 (on n2) is not judged here
    only_remote = (pod("a", "a2", "n2", "10.0.2.1"),)
    assert tp.plan(tp.Inputs(only_remote, NAMESPACES, (out,)), tp.Facts(HERE, remote_egress=False)).flows == []
    assert tp.plan(tp.Inputs(only_remote, NAMESPACES, (out,)), tp.Facts(HERE)).rules  # judged here too by default


def test_named_ports_resolve_on_the_destination() -> None:
    to_http = cnp("n", "Admin", 1, ns("a"), egress=[{"action": "Deny", "to": [ns("b")],
                                                     "protocols": [{"destinationNamedPort": "http"}]}])
    p = planned(to_http)
    assert sorted(r.port for r in p.rules) == ["http=8080/TCP", "http=9090/TCP"]
    for r in p.rules:
        peers = [f.text() for f in p.flows if f"conjunction({r.conj_id},2/3)" in f.text()]
        ports = [f.text() for f in p.flows if f"conjunction({r.conj_id},3/3)" in f.text()]
        want_ip = "10.0.1.2" if r.port.startswith("http=8080") else "10.0.2.2"
        assert len(peers) == 1 and want_ip in peers[0]
        assert all(f"tp_dst={r.port.split('=')[1].split('/')[0]}" in t for t in ports) and len(ports) == 2


def test_a_deny_all_rule_matches_every_peer_and_nodes_peers_are_node_addresses() -> None:
    broken = cnp("x", "Admin", 0, ns("b"), ingress=[{"action": "Deny", "from": [{}]}])
    p = planned(broken)
    (r,) = p.rules
    assert sorted(f.match_text() for f in p.flows if f"conjunction({r.conj_id},2/2)" in f.text()) == ["ip", "ipv6"]
    n = node_info_from({"metadata": {"name": "n2", "labels": {"role": "db"}},
                        "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.9"}]}})
    to_nodes = cnp("tn", "Admin", 0, ns("a"), egress=[{"action": "Deny", "to": [{"nodes": {
        "matchLabels": {"role": "db"}}}]}])
    p = planned(to_nodes, nodes=(n,))
    (r,) = p.rules
    assert [f.text().split(",actions")[0].rsplit(",", 1)[-1] for f in p.flows
            if f"conjunction({r.conj_id},2/2)" in f.text()] == ["nw_dst=192.0.2.9"]


def test_a_200_by_200_rule_costs_the_sum_of_its_sizes() -> None:
    """200 subject Pods here, 200 peer Pods, 3 ports: 200 + 200 + 3 x 2 families + the conj_id flow."""
    pods = tuple(pod("b", f"s{i}", HERE, f"10.1.{i // 200}.{i % 200 + 1}") for i in range(200)) + tuple(
        pod("a", f"p{i}", "n2", f"10.2.{i // 200}.{i % 200 + 1}") for i in range(200))
    rule = {"action": "Deny", "from": [ns("a")],
            "protocols": [{"tcp": {"destinationPort": {"number": n}}} for n in (80, 443, 8080)]}
    p = planned(cnp("big", "Admin", 0, ns("b"), ingress=[rule]), pods=pods)
    assert len(p.flows) == 200 + 200 + 3 * 2 + 1


def test_ids_are_stable_across_plans_and_apart_from_networkpolicys() -> None:
    ids = tp.ConjIds(tp.FIRST_CONJ_ID)
    one = cnp("one", "Admin", 0, ns("b"), ingress=[{"action": "Deny", "from": [ns("a")]}])
    two = cnp("two", "Admin", 1, ns("b"), ingress=[{"action": "Deny", "from": [ns("a")]}])
    inputs = tp.Inputs(PODS, NAMESPACES, (one, two))
    first = {r.policy: r.conj_id for r in tp.plan(inputs, tp.Facts(HERE), ids).rules}
    again = {r.policy: r.conj_id for r in tp.plan(tp.Inputs(PODS, NAMESPACES, (two,)), tp.Facts(HERE), ids).rules}
    assert again["two"] == first["two"] and min(first.values()) >= tp.FIRST_CONJ_ID


def test_with_the_denied_log_a_deny_sends_up_naming_its_rule_and_the_rest_is_unchanged() -> None:
    from routesync.policy import deniedlog

    deny = cnp("no-b", "Admin", 7, ns("a"), egress=[{"name": "to-b", "action": "Deny", "to": [ns("b")]},
                                                    {"action": "Accept", "to": [ns("b")]}])
    quiet = planned(deny)
    logged = tp.plan(tp.Inputs(PODS, NAMESPACES, (deny,), ()), tp.Facts(HERE, (), denied_log=True))
    d0, a0 = (r.conj_id for r in quiet.rules)
    assert conj_flow(quiet, d0).actions_text() == "drop"
    (up,) = conj_flow(logged, d0).actions
    assert deniedlog.parse_tier_userdata(up.userdata) == deniedlog.TierDenial("egress", "Admin/7/no-b", 0, "to-b")
    assert conj_flow(logged, a0) == conj_flow(quiet, a0)
    assert len(logged.flows) == len(quiet.flows)
