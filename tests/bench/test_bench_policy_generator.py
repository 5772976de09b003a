"""bench_policy's pure parts: the simulated cluster is the same for the same seed, has the sizes
and the mix of shapes asked for, reads into the model without an error, and the data-plane set
keeps the policy count while the pair's rule is the last conjunction and allows only the client."""

from __future__ import annotations

import ipaddress

from bench.bench_policy import (
    CLIENT_NS,
    OTHER_NS,
    SERVER_NS,
    changed,
    dataplane_cluster,
    generate,
    interleaved_cases,
    parse,
    shape_counts,
)
from routesync.policy import plan as pp


def test_same_seed_same_cluster_other_seed_another() -> None:
    a, b = generate(400, 10, 40, seed=3), generate(400, 10, 40, seed=3)
    assert a == b
    assert generate(400, 10, 40, seed=4).policies != a.policies


def test_sizes_spread_and_shapes() -> None:
    c = generate(2000, 20, 200, nodes=4)
    assert (len(c.pods), len(c.namespaces), len(c.policies)) == (2000, 20, 200)
    assert c.objects == 2220
    per_node: dict[str, int] = {}
    for p in c.pods:
        per_node[p["spec"]["nodeName"]] = per_node.get(p["spec"]["nodeName"], 0) + 1
        assert 2 <= len(p["metadata"]["labels"]) <= 3
        assert p["spec"]["containers"][0]["ports"][0]["name"] == "http"
    assert per_node == {f"node-{i}": 500 for i in range(1, 5)}
    ips = [i["ip"] for p in c.pods for i in p["status"]["podIPs"]]
    assert len(set(ips)) == len(ips) == 4000 and {ipaddress.ip_address(i).version for i in ips} == {4, 6}
    # a Namespace's Pods are not all on one Node (placement independent of namespace)
    assert len({p["spec"]["nodeName"] for p in c.pods if p["metadata"]["namespace"] == "ns-000"}) == 4
    shapes = shape_counts(c)
    assert {"default-deny-ingress", "pod-from-pod", "from-namespace", "namespace-and-pod", "ip-block",
            "named-port", "port-range", "egress-dns-db", "egress-internet"} <= set(shapes)
    assert sum(shapes.values()) == 200
    text = repr(c.policies)
    for needle in ("'except'", "'endPort'", "'port': 'http'", "'namespaceSelector'", "'matchExpressions'", "'Egress'"):
        assert needle in text, needle


def test_every_object_parses_whole_and_plans() -> None:
    c = generate(1000, 10, 100)
    inputs = parse(c)
    assert len(inputs.pods) == 1000 and len(inputs.policies) == 100 and len(inputs.namespaces) == 10
    assert not [p.errors for p in inputs.policies if p.errors]
    plan = pp.plan(inputs, pp.NodeFacts("node-1"))
    assert plan.flows and plan.rules and not plan.errors


def test_a_changed_policy_differs_in_that_policy_only() -> None:
    c = generate(400, 10, 40)
    d = changed(c, 7)
    assert d.policies[7] != c.policies[7]
    assert d.policies[:7] == c.policies[:7] and d.policies[8:] == c.policies[8:]
    assert c.policies[7] == generate(400, 10, 40).policies[7]  # the original is not touched


def test_the_pair_is_allowed_by_the_last_conjunction_only_for_the_client() -> None:
    base = generate(400, 10, 40)
    real = {"client": (CLIENT_NS, {"app": "bench-client"}, ("10.244.1.2", "fd00:10:244:1::2")),
            "server": (SERVER_NS, {"app": "bench-server"}, ("10.244.1.3", "fd00:10:244:1::3")),
            "other": (OTHER_NS, {"app": "bench-client"}, ("10.244.1.4", "fd00:10:244:1::4"))}
    c = dataplane_cluster(base, real, (5201, 7000))
    assert len(c.policies) == len(base.policies)
    plan = pp.plan(parse(c), pp.NodeFacts("node-1"))
    last = plan.rules[-1]
    assert last.policy == f"{SERVER_NS}/zz-allow-client" and last.pods == (f"{SERVER_NS}/server",)
    assert plan.isolated[f"{SERVER_NS}/server"] == (True, False)
    assert plan.isolated[f"{CLIENT_NS}/client"] == (False, True)
    assert plan.isolated[f"{OTHER_NS}/other"] == (False, False)
    peers = {f.match_text() for f in plan.flows if any(getattr(a, "id", None) == last.conj_id for a in f.actions)}
    assert "ip,nw_src=10.244.1.2" in peers and not any("10.244.1.4" in t for t in peers)


def test_cases_alternate_their_order() -> None:
    assert interleaved_cases(0) == ("none", "policy") and interleaved_cases(1) == ("policy", "none")


def test_the_generated_cluster_network_policies_read_without_an_error() -> None:
    """A shape the reader refuses fails closed (its Accept matches nothing), so a bench of such
    policies would time rules that do nothing: every shape must read as written."""
    from bench.bench_policy_replay import cluster_policies

    policies = cluster_policies(40, 10, seed=3)
    assert {p.tier for p in policies} == {"Admin", "Baseline"}
    assert [e for p in policies for e in p.errors] == []
