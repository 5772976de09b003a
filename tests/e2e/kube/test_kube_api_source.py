"""route-sync's Kubernetes Node source against the real kube-apiserver (the cases that
tests/support/kubeserver.py played before): a list, then ADDED / MODIFIED / DELETED through one
watch; the merge patch that publishes this Node's ``ferry.io/*`` annotations and leaves everyone
else's; and an unchanged publication that sends no request.

The source runs in this process, in the external host's network namespace where the API server
listens (the thread that starts it enters the namespace; the watch thread it spawns inherits it),
with the lab's admin kubeconfig. The Node objects are made through kubectl, as a controller would."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from lab.api import Lab
from lab.kube.cluster import Cluster
from routesync.model import TRANSPORT_ANNOTATION
from routesync.sources.kube import KubeSource
from tests.e2e.kube.helpers import topology
from tests.support.waiting import until

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def lab(kube_module_lab_of) -> Iterator[Lab]:  # type: ignore[no-untyped-def]
    yield kube_module_lab_of(topology({"trafficEncapMode": "encap", "tunnelType": "vxlan"}, nodes=2))


@contextmanager
def in_api_netns(cluster: Cluster) -> Iterator[None]:
    """This thread (and the threads it starts) in the API server's network namespace."""
    from pyroute2 import netns

    netns.pushns(cluster.plan.process("kube-apiserver").netns)
    try:
        yield
    finally:
        netns.popns()


@pytest.fixture
def cluster(lab: Lab) -> Cluster:
    return lab.kube()


def ghost(cluster: Cluster, name: str, cidrs: list[str], transport: str, **annotations: str) -> dict[str, Any]:
    """A Node object without a kubelet (what a controller sees of a Node that registered)."""
    doc = {"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name, "annotations": {TRANSPORT_ANNOTATION: transport, **annotations}},
           "spec": {"podCIDR": cidrs[0], "podCIDRs": cidrs}}
    return json.loads(cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(doc)).stdout)


def names(source: KubeSource) -> set[str]:
    return {r.name for r in source.list()}


def test_list_then_added_modified_deleted_through_one_watch(cluster: Cluster) -> None:
    with in_api_netns(cluster):
        source = KubeSource.from_kubeconfig("node-1", cluster.plan.admin_kubeconfig)
        try:
            assert names(source) == {"node-1", "node-2"}
            ghost(cluster, "ghost-a", ["10.244.200.0/24", "fd00:10:244:c8::/64"], "192.168.77.99")
            until(lambda: "ghost-a" in names(source))
            rec = {r.name: r for r in source.list()}["ghost-a"]
            assert rec.pod_cidrs == ("10.244.200.0/24", "fd00:10:244:c8::/64")
            assert rec.transport_addresses == ("192.168.77.99",)

            cluster.kubectl("annotate", "node", "ghost-a", f"{TRANSPORT_ANNOTATION}=192.168.77.98", "--overwrite")
            until(lambda: {r.name: r for r in source.list()}["ghost-a"].transport_addresses == ("192.168.77.98",))

            cluster.kubectl("delete", "node", "ghost-a", "--wait=true")
            until(lambda: "ghost-a" not in names(source))
            assert source.relists == 1  # all of it through the one watch
            assert source.errors == 0 and source.expired == 0
        finally:
            source.close()


def test_publish_self_merge_patches_ferry_annotations_only(cluster: Cluster) -> None:
    """A JSON merge patch: this Node's ferry.io/* keys written, every other annotation kept; the
    same record published again sends no request."""
    from routesync.model import NodeRecord

    ghost(cluster, "ghost-b", ["10.244.201.0/24"], "192.168.77.97", **{"example.com/keep": "yes"})
    try:
        with in_api_netns(cluster):
            source = KubeSource.from_kubeconfig("ghost-b", cluster.plan.admin_kubeconfig)
            try:
                until(lambda: "ghost-b" in names(source))
                me = NodeRecord(name="ghost-b", transport_addresses=("192.168.77.97",),
                                pod_cidrs=("10.244.201.0/24",),
                                annotations=(("ferry.io/mac-address", "02:00:00:00:00:b0"),))
                patches: list[str] = []  # the PATCH requests the source sends (the server answers them)
                send = source.api.patch_node
                source.api.patch_node = lambda name, *a, **k: (patches.append(name), send(name, *a, **k))[1]
                source.publish_self(me)
                assert patches == ["ghost-b"]
                node = cluster.nodes()["ghost-b"]
                anns = node["metadata"]["annotations"]
                assert anns["ferry.io/mac-address"] == "02:00:00:00:00:b0"
                assert anns["example.com/keep"] == "yes"
                assert anns[TRANSPORT_ANNOTATION] == "192.168.77.97"
                until(lambda: dict({r.name: r for r in source.list()}["ghost-b"].annotations)
                      .get("ferry.io/mac-address") == "02:00:00:00:00:b0")
                source.publish_self(me)  # unchanged: no second request (the Node's resourceVersion is no
                assert patches == ["ghost-b"]  # measure: the controller-manager writes a kubelet-less Node too)
                with pytest.raises(ValueError, match="publishes 'ghost-b' only"):
                    source.publish_self(NodeRecord(name="node-1", transport_addresses=(), pod_cidrs=(),
                                                   annotations=()))
            finally:
                source.close()
    finally:
        cluster.kubectl("delete", "node", "ghost-b", "--wait=true")


def test_policy_reads_the_service_cidrs_from_the_cluster(cluster: Cluster) -> None:
    """The Service CIDRs OVS hands to kube-proxy unjudged come from the cluster's ServiceCIDR
    objects (``networking.k8s.io/v1``), IPv6 included, not from a manifest's IPv4-only default;
    a ServiceCIDR added or deleted is followed."""
    from routesync.policy.watch import PolicySource
    from routesync.sources.kube import api_client

    flags = cluster.plan.process("kube-apiserver").argv
    ranges = next(a.split("=", 1)[1] for a in flags if a.startswith("--service-cluster-ip-range="))
    want = tuple(sorted(ranges.split(",")))
    extra = {"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR", "metadata": {"name": "ferry-extra"},
             "spec": {"cidrs": ["10.97.0.0/24", "fd00:97::/112"]}}
    with in_api_netns(cluster):
        policy = PolicySource(api_client(cluster.plan.admin_kubeconfig))
        try:
            assert policy.service_cidrs(("192.0.2.0/24",)) == want  # the configured value is not used
            assert len(want) == 2 and any(":" in c for c in want)
            cluster.kubectl("create", "-f", "-", input=json.dumps(extra))
            until(lambda: policy.service_cidrs(()) == tuple(sorted((*want, "10.97.0.0/24", "fd00:97::/112"))))
            cluster.kubectl("delete", "servicecidr", "ferry-extra", "--wait=true")
            until(lambda: policy.service_cidrs(()) == want)
        finally:
            policy.close()
