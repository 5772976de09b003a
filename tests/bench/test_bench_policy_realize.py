"""bench_policy_realize's pure parts: the Pods and policies it creates (each policy selects a Pod
on every Node and names a port of its own), the monitor lines it reads, and the report's goals."""

from __future__ import annotations

from bench import bench_policy_realize as br
from bench import report


def test_every_policy_selects_a_pod_on_every_node_and_names_its_own_port() -> None:
    pods = br.bulk_pods(per_node=5, policies=3)["items"]
    assert len(pods) == 15 and len({p["metadata"]["name"] for p in pods}) == 15
    for i in range(3):
        policy = br.group_policy(i)
        sel = policy["spec"]["podSelector"]["matchLabels"]
        nodes = {p["spec"]["nodeSelector"]["kubernetes.io/hostname"] for p in pods
                 if all(p["metadata"]["labels"].get(k) == v for k, v in sel.items())}
        assert nodes == set(br.NODES), (i, nodes)
    ports = [br.group_policy(i)["spec"]["ingress"][0]["ports"][0]["port"] for i in range(100)]
    assert len(set(ports)) == 100 and min(ports) == br.PORT_BASE


def test_monitor_lines_give_the_ports_of_added_flows_only() -> None:
    added = (" event=ADDED table=45 cookie=0x700000000000001 tcp,tp_dst=20007 "
             "actions=conjunction(12,3/3)")
    assert br.added_ports(added) == [20007]
    assert br.added_ports(added.replace("ADDED", "MODIFIED")) == [20007]
    assert br.added_ports(added.replace("ADDED", "DELETED")) == []
    assert br.added_ports(" event=ADDED table=45 tcp,tp_dst=200071 actions=drop") == [200071]
    assert br.added_ports(" event=ADDED table=45 ip,nw_dst=10.0.0.1 actions=drop") == []


def test_the_report_reads_the_realization_goals() -> None:
    data = {"enforcement": {"enforced_all_nodes": {"p50_ms": 80.0, "p99_ms": 250.0},
                            "api_watch": {"p50_ms": 20.0, "p99_ms": 40.0}},
            "reach": {"policy": {"p50_ms": 150.0, "p99_ms": 400.0}, "open": {"p50_ms": 50.0, "p99_ms": 90.0}}}
    rows = {r.figure: r for r in report.goal_rows({"meta": {}, "benchmarks": {
        "realize": {"status": "ok", "data": data}}}) if r.figure.startswith(("policy created", "policy enforced",
                                                                              "selected Pod"))}
    assert rows["policy created → enforced on every Node, p99"].ratio == 0.5
    assert rows["policy created → enforced on every Node, p99"].verdict == "pass"
    assert rows["policy enforced on every Node p99 / seen by an API watch p50"].ratio == 12.5
    assert rows["selected Pod Running → reachable by its allowed peer, p99"].ratio == 0.4
    assert rows["selected Pod reachable p99 / a Pod without policy p50"].ratio == 8.0


def test_first_seen_keeps_the_first_moment_of_each_key() -> None:
    from bench.util import FirstSeen

    w = FirstSeen(["printf", "a\nb\na\n"], lambda line: [line.strip()] if line.strip() else [])
    try:
        b = w.wait("b", 30)
        assert w.wait("a", 30) <= b  # "a" again later: the first moment stays
    finally:
        w.close()


def test_running_pods_reads_kubectls_pretty_json_events() -> None:
    import json

    from bench.bench_kube import RunningPods

    def event(phase: str, ips: list) -> str:
        return json.dumps({"type": "MODIFIED", "object": {"metadata": {"name": "p"},
                                                          "status": {"phase": phase, "podIPs": ips}}}, indent=2)
    read = RunningPods()
    lines = (event("Pending", []) + "\n" + event("Running", []) + "\n" + event("Running", [{"ip": "10.0.0.1"}])
             + "\n").splitlines(keepends=True)
    assert [name for line in lines for name in read(line)] == ["p"]


def test_each_tier_pair_has_one_subject_and_peers_and_a_port_of_each_kind() -> None:
    from routesync.policy.cnp.model import cluster_policy_from
    from routesync.policy.model import policy_from

    ports = []
    for i in range(60):
        pair = br.tier_pair(i)
        np_doc, np_port = pair[br.NP_KIND]
        cnp_doc, cnp_port = pair[br.CNP_KIND]
        ports += [np_port, cnp_port]
        np_obj, cnp_obj = policy_from(np_doc), cluster_policy_from(cnp_doc)
        assert not cnp_obj.errors, cnp_obj.errors
        assert cnp_obj.tier == "Admin" and [r.action for r in cnp_obj.ingress] == ["Accept"]
        assert [p.first for r in cnp_obj.ingress for p in r.ports or ()] == [cnp_port]
        # the same subject: grp=g<i> in the bench's namespace
        assert np_doc["spec"]["podSelector"] == cnp_doc["spec"]["subject"]["pods"]["podSelector"]
        assert np_doc["metadata"]["namespace"] == \
            cnp_doc["spec"]["subject"]["pods"]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        assert np_obj.ingress and np_obj.ingress[0].ports[0].port == np_port
    assert len(set(ports)) == len(ports)
    assert not set(ports) & {br.PORT_BASE + i for i in range(100)}
    assert [br.tier_order(i)[0] for i in range(4)] == [br.NP_KIND, br.CNP_KIND, br.NP_KIND, br.CNP_KIND]


def test_each_kind_is_posted_to_its_collection() -> None:
    assert br.collection_path(br.group_policy(0)) == "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies"
    cnp, _ = br.tier_pair(0)[br.CNP_KIND]
    assert br.collection_path(cnp) == "/apis/policy.networking.k8s.io/v1beta1/clusternetworkpolicies"
    import pytest

    with pytest.raises(ValueError, match="kind"):
        br.collection_path({"apiVersion": "v1", "kind": "Pod", "metadata": {}})


def test_the_report_holds_a_cluster_network_policy_to_the_network_policy_of_its_run() -> None:
    data = {"tiers": {br.NP_KIND: {"enforced_all_nodes": {"p50_ms": 60.0, "p99_ms": 200.0}},
                      br.CNP_KIND: {"enforced_all_nodes": {"p50_ms": 50.0, "p99_ms": 250.0}}}}
    rows = [r for r in report.goal_rows({"meta": {}, "benchmarks": {"realize": {"status": "ok", "data": data}}})
            if r.figure.startswith("ClusterNetworkPolicy")]
    assert len(rows) == 1 and rows[0].ratio == 1.25 and rows[0].verdict != "pass"
