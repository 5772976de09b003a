"""What a Node reads, held to the planners: on random clusters (Pods of every shape on four
Nodes, Namespaces relabelled, NetworkPolicies and ClusterNetworkPolicies of every shape, Nodes),
after every event and for every Node,

- the Node's NetworkPolicy and tier plans from its own Pods plus the Pods
  :func:`relevance.reads` names equal the plans from every Pod, field for field, flow for flow;
- :func:`relevance.spans`, turned around, names for each Node exactly what ``reads`` names;

both with the planners judging a remote client's egress (``remote_egress``, route-sync's
``policyPeers: cluster``) and without (``peerSlices``: egress judged at its source only).

The clusters keep the API server's invariant the module states (a Pod's Namespace exists)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from routesync.policy import plan as pp
from routesync.policy import relevance
from routesync.policy.cnp import plan as tp
from routesync.policy.cnp.model import ClusterPolicy, NodeInfo, cluster_policy_from
from routesync.policy.model import Pod, Policy, policy_from
from routesync.policy.node import differences
from tests.routesync.policy.cnp.test_incremental import World as TierWorld
from tests.routesync.policy.test_incremental import World as PolicyWorld

NODES = ("n1", "n2", "n3", "n4")  # n4 never has a Pod: it reads only what every Node reads
POD_NODES = ("n1", "n2", "n3")
NAMESPACES = ("a", "b", "a-b", "c")


class Cluster:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.np = PolicyWorld(rng)
        self.tiers = TierWorld(rng)
        self.pods: dict[str, Pod] = {}
        self.namespaces: dict[str, tuple[tuple[str, str], ...]] = {}
        self.policies: dict[str, Policy] = {}
        self.cluster_policies: dict[str, ClusterPolicy] = {}
        self.nodes: dict[str, NodeInfo] = {}

    def inputs(self) -> pp.Inputs:
        return pp.Inputs(tuple(sorted(self.pods.values(), key=lambda p: p.key)), dict(self.namespaces),
                         tuple(sorted(self.policies.values(), key=lambda p: p.key)))

    def tier_policies(self) -> tuple[ClusterPolicy, ...]:
        return tuple(sorted(self.cluster_policies.values(), key=lambda p: p.name))

    def tier_inputs(self, pods: tuple[Pod, ...]) -> tp.Inputs:
        return tp.Inputs(pods, dict(self.namespaces), self.tier_policies(),
                         tuple(sorted(self.nodes.values(), key=lambda n: n.name)))

    def namespace_labels(self, ns: str) -> tuple[tuple[str, str], ...]:
        rng = self.rng
        labels = {"kubernetes.io/metadata.name": ns}
        if rng.random() < 0.7:
            labels["team"] = rng.choice(("t1", "t2"))
        if rng.random() < 0.5:
            labels["env"] = rng.choice(("prod", "dev"))
        return tuple(sorted(labels.items()))

    def event(self) -> str:
        rng = self.rng
        r = rng.random()
        if r < 0.45:
            ns = rng.choice(NAMESPACES)
            if ns not in self.namespaces:
                self.namespaces[ns] = self.namespace_labels(ns)
                return f"namespace {ns} created"
            name = f"p{rng.randrange(8)}"
            if f"{ns}/{name}" in self.pods and rng.random() < 0.25:
                del self.pods[f"{ns}/{name}"]
                return f"pod {ns}/{name} deleted"
            base = self.np.pod(ns, name)
            pod = Pod(ns, name, rng.choice(POD_NODES), base.labels, base.ips, base.ports)
            self.pods[pod.key] = pod
            return f"pod {pod}"
        if r < 0.55:
            ns = rng.choice(NAMESPACES)
            if ns in self.namespaces and rng.random() < 0.2:
                for key in [k for k, p in self.pods.items() if p.namespace == ns]:
                    del self.pods[key]  # a Namespace goes after its Pods
                del self.namespaces[ns]
                return f"namespace {ns} deleted with its Pods"
            self.namespaces[ns] = self.namespace_labels(ns)
            return f"namespace {ns} {self.namespaces[ns]}"
        if r < 0.78:
            ns, name = rng.choice(NAMESPACES), f"pol{rng.randrange(4)}"
            if f"{ns}/{name}" in self.policies and rng.random() < 0.25:
                del self.policies[f"{ns}/{name}"]
                return f"policy {ns}/{name} deleted"
            policy = self.np.policy(ns, name)
            self.policies[policy.key] = policy
            return f"policy {policy}"
        if r < 0.92:
            name = f"cnp{rng.randrange(3)}"
            if name in self.cluster_policies and rng.random() < 0.3:
                del self.cluster_policies[name]
                return f"cluster policy {name} deleted"
            cp = self.cluster_policies[name] = self.tiers.policy(name)
            return f"cluster policy {cp}"
        name = rng.choice(NODES)
        node = self.nodes[name] = self.tiers.node(name)
        return f"node {node}"


def check(cluster: Cluster, where: str, remote_egress: bool = True) -> tuple[int, int]:
    """Both properties for every Node; returns (Pods read, remote Pods) summed over the Nodes."""
    inputs, tiers = cluster.inputs(), cluster.tier_policies()
    read_total = remote_total = 0
    reads_by_node = {}
    for node in NODES:
        reads = relevance.reads(node, inputs, tiers, remote_egress)
        reads_by_node[node] = set(reads)
        view = relevance.view(node, inputs, reads)
        facts = pp.NodeFacts(node, pod_cidrs=("10.0.0.0/28",), remote_egress=remote_egress)
        want, got = pp.plan(inputs, facts), pp.plan(view, facts)
        wrong = differences(got, want)
        assert not wrong, f"{where}: NetworkPolicy plan of {node} from the Pods it reads: {wrong}"
        tfacts = tp.Facts(node, remote_egress=remote_egress)
        twant, tgot = tp.plan(cluster.tier_inputs(inputs.pods), tfacts), tp.plan(cluster.tier_inputs(view.pods), tfacts)
        wrong = differences(tgot, twant)
        assert not wrong, f"{where}: tier plan of {node} from the Pods it reads: {wrong}"
        read_total += len(reads)
        remote_total += sum(p.node != node for p in inputs.pods)
    spans = relevance.spans(inputs, tiers, remote_egress)
    if not remote_egress:
        assert not any(s.everywhere or s.populated for s in spans.values()), f"{where}: a span everywhere"
    turned = relevance.per_node(spans, inputs.pods, [*NODES, *cluster.nodes])
    for node in NODES:
        assert turned.get(node, set()) == reads_by_node[node], (
            f"{where}: spans name for {node} {sorted(turned.get(node, set()) ^ reads_by_node[node])} "
            "differently from reads")
    return read_total, remote_total


@pytest.mark.parametrize("remote_egress", [True, False], ids=["cluster", "peerSlices"])
@pytest.mark.parametrize("seed", range(8))
def test_a_node_plans_the_same_from_the_pods_it_reads(seed: int, remote_egress: bool) -> None:
    rng = random.Random(seed)
    cluster = Cluster(rng)
    read = remote = 0
    for step in range(150):
        what = cluster.event()
        a, b = check(cluster, f"seed {seed} event {step}: {what}", remote_egress)
        read, remote = read + a, remote + b
    # not vacuous: Nodes read Pods, and leave some out
    assert 0 < read < remote, (read, remote)


def pod(ns: str, name: str, node: str, ip: str, **labels: str) -> Pod:
    return Pod(ns, name, node, tuple(sorted(labels.items())), (ip,))


def np(ns: str, name: str, spec: dict[str, Any]) -> Policy:
    return policy_from({"metadata": {"namespace": ns, "name": name}, "spec": spec})


def test_an_ingress_policy_reads_its_peers_where_it_selects_and_nothing_else() -> None:
    pods = (pod("a", "web", "n1", "10.0.0.1", app="web"), pod("a", "db", "n2", "10.0.0.2", app="db"),
            pod("a", "cache", "n3", "10.0.0.3", app="cache"), pod("b", "web", "n3", "10.0.0.4", app="web"))
    policy = np("a", "db-from-web", {"podSelector": {"matchLabels": {"app": "db"}},
                                     "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]})
    inputs = pp.Inputs(pods, {"a": (), "b": ()}, (policy,))
    assert relevance.reads("n2", inputs) == {"a/web"}  # the policy's Pod is on n2; its peer a/web
    assert relevance.reads("n1", inputs) == set()
    assert relevance.reads("n3", inputs) == set()  # b/web is in another namespace, a/cache no peer
    assert relevance.spans(inputs) == {"a/web": relevance.Span(frozenset({"n2"}))}


def test_an_egress_isolated_pod_is_read_on_every_node_with_pods() -> None:
    pods = (pod("a", "client", "n1", "10.0.0.1", app="client"), pod("a", "server", "n2", "10.0.0.2"))
    policy = np("a", "deny-egress", {"podSelector": {"matchLabels": {"app": "client"}}, "policyTypes": ["Egress"]})
    inputs = pp.Inputs(pods, {"a": ()}, (policy,))
    assert relevance.reads("n2", inputs) == {"a/client"}  # judged where it arrives too
    assert relevance.reads("n9", inputs) == set()  # a Node without Pods judges nothing
    spans = relevance.spans(inputs)
    assert spans == {"a/client": relevance.Span(populated=True)}
    assert relevance.per_node(spans, pods, ["n1", "n2", "n9"]) == {"n1": set(), "n2": {"a/client"}, "n9": set()}


def test_without_remote_egress_an_egress_isolated_pod_is_read_nowhere_else() -> None:
    pods = (pod("a", "client", "n1", "10.0.0.1", app="client"), pod("a", "server", "n2", "10.0.0.2", app="server"))
    policy = np("a", "to-server", {"podSelector": {"matchLabels": {"app": "client"}}, "policyTypes": ["Egress"],
                                   "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "server"}}}]}]})
    inputs = pp.Inputs(pods, {"a": ()}, (policy,))
    assert relevance.reads("n2", inputs, remote_egress=False) == set()  # judged at its source only
    assert relevance.reads("n1", inputs, remote_egress=False) == {"a/server"}  # the source reads its peer
    assert relevance.spans(inputs, remote_egress=False) == {"a/server": relevance.Span(frozenset({"n1"}))}


def test_without_remote_egress_a_cluster_policy_reads_its_egress_peers_where_it_has_a_subject() -> None:
    pods = (pod("a", "client", "n1", "10.0.0.1", app="client"), pod("b", "server", "n2", "10.0.0.2", app="server"),
            pod("b", "other", "n3", "10.0.0.3"))
    cp = cluster_policy_from({"metadata": {"name": "to-servers"}, "spec": {
        "tier": "Admin", "priority": 1, "subject": {"pods": {"namespaceSelector": {},
                                                             "podSelector": {"matchLabels": {"app": "client"}}}},
        "egress": [{"action": "Accept", "to": [{"pods": {"namespaceSelector": {},
                                                           "podSelector": {"matchLabels": {"app": "server"}}}}]}]}})
    inputs = pp.Inputs(pods, {"a": (), "b": ()}, ())
    assert relevance.reads("n1", inputs, (cp,), remote_egress=False) == {"b/server"}
    assert relevance.reads("n3", inputs, (cp,), remote_egress=False) == set()
    assert relevance.spans(inputs, (cp,), remote_egress=False) == {"b/server": relevance.Span(frozenset({"n1"}))}
    # with it, every Node reads the subject and the peer
    assert relevance.reads("n3", inputs, (cp,)) == {"a/client", "b/server"}
