"""The DaemonSet's ClusterRole grants exactly what Ferry reads and writes, nothing more: Nodes
(route-sync's peers and its own annotations) and, for NetworkPolicy, read access to Pods,
Namespaces and NetworkPolicies.  The kube e2e tests run route-sync under this very role."""

from __future__ import annotations

from lab.kube import manifests


def _grants() -> set[tuple[str, str, str]]:
    role = next(d for d in manifests.load() if d.get("kind") == "ClusterRole")
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def test_the_cluster_role_is_exactly_what_ferry_uses() -> None:
    read = ("get", "list", "watch")
    want = {("", "nodes", v) for v in (*read, "patch")}
    want |= {("", r, v) for r in ("pods", "namespaces") for v in read}
    want |= {("networking.k8s.io", "networkpolicies", v) for v in read}
    assert _grants() == want
