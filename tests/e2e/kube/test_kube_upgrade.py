"""An upgrade from the previous release and the rollback to it (issue 42), the way users take
them: ``helm install`` of the release's chart and image (deploy/previous-release names its tag;
``make release-image`` builds both from the tag), Pods with traffic, then ``helm upgrade`` to this
tree's chart and image, then ``helm rollback`` to the release.

A cluster whose Nodes have no Open vSwitch of their own (Ferry's openvswitch container, the
default users run), in each of three modes: encap (VXLAN), noEncap with the fast path (the uplink
on the bridge), and encap with WireGuard (wireguard-go in the openvswitch container, so it too
outlives route-sync's Pods). Across each event a 10 ms ping node-1 -> node-3 must lose
nothing (route-sync's Pods are replaced Node by Node; the switch's DaemonSet is OnDelete, so its
Pods and daemons stay), the Pods keep their OVS ports and external_ids, and every flow is what it
was (this tree and the release plan the same flows; a release whose flows differ changes this
expectation with the code that changes them). Pods created and deleted on node-2 throughout each
event must all run and go; the kubelet's failed attempts are counted and printed (``-s``), with the
longest gap and the churn's longest create -> Running.

The churn runs on node-2, not on the ping's Nodes: with the netdev datapath (the only one here)
ovs-vswitchd reconfigures its bridge on every link change in its netns, a Pod's veth created or
deleted among them, and a tunnelled packet crossing that moment is sometimes lost, upgrade or not
(docs/design/upgrades.md, "A Pod's veth and the userspace datapath"). Churned beside the ping it
failed 5 of 8 upgrades and rollbacks by 1-7 pings, each loss at a churned Pod's DEL; so it would
measure that, not the upgrade."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from lab.api import Lab
from lab.kube import lab_cluster, manifests, release
from lab.kube.cluster import Cluster
from tests.e2e.kube.rollout import (
    PodChurn,
    across,
    daemon_pids,
    ferry_pods,
    images,
    interfaces,
    lab_mode,
    mode_topology,
    modes,
    ovs_pods,
    ready,
    roll_out,
)

pytestmark = [pytest.mark.root, pytest.mark.slow]

NODES = ("node-1", "node-2", "node-3")


@pytest.fixture(scope="module", params=modes())
def lab(request, kube_module_lab_of) -> Iterator[Lab]:  # type: ignore[no-untyped-def]
    topo = mode_topology(request.param)
    topo["kubernetes"].update(installer="helm", release=release.previous())
    lab = kube_module_lab_of(topo)
    lab.add_pod("node-1", "a")
    lab.add_pod("node-3", "a")
    yield lab


def overlay(lab: Lab, image: str | None = None) -> manifests.Overlay:
    """The values the lab installed the release with (its up), for this tree's chart: the same
    cluster, the same route-sync keys; ``image`` None: the chart's own (its appVersion)."""
    plan = lab.kube().plan
    return manifests.Overlay(plan.api_host, plan.api_port, plan.cluster_cidrs,
                             lab_cluster.route_sync_keys(lab.topology), image, api_override=plan.kube_proxy == "none")


def route_sync_images(cluster: Cluster) -> set[str]:
    return {i for p in ferry_pods(cluster).values() for i in images(p).values()}


def across_helm(lab: Lab, what: str, helm: Callable[[], None], image: str) -> None:
    """``helm`` (an upgrade or a rollback) under a live ping and a Pod churn: nothing lost, every
    route-sync Pod replaced and on ``image``, the switch's Pods and daemons untouched, the Pods'
    OVS interfaces as they were."""
    cluster = lab.kube()
    old_pods = {p["metadata"]["name"] for p in ferry_pods(cluster).values()}
    old_ovs = {n: p["metadata"]["uid"] for n, p in ovs_pods(cluster).items()}
    pids = {n: daemon_pids(lab, n) for n in NODES}
    ifaces = {n: interfaces(lab, n) for n in ("node-1", "node-3")}

    churn = PodChurn(cluster, ("node-2",))

    def event() -> None:
        with churn:
            helm()
            roll_out(cluster)
        print(f"\n{what} ({lab_mode(lab)}): Pods on node-2 during it: {churn.summary()}")
        if churn.error is not None:
            raise AssertionError(f"a Pod's ADD or DEL during {what} did not complete: {churn.error}")

    result = across(lab, what, event, release_before=what.startswith("helm upgrade"))
    # what happened around a lost ping, for the failure's message: the churn's steps, route-sync's starts
    started = sorted((f"{n}: route-sync started {s['state']['running']['startedAt']}") for n, p in
                     ferry_pods(cluster).items() for s in p["status"].get("containerStatuses", [])
                     if "running" in s["state"])
    near = [(round(t - at, 2), e) for at in result.lost_after for t, e in churn.log if abs(t - at) < 3]
    pods = ferry_pods(cluster)
    assert set(pods) == set(NODES) and all(ready(p) for p in pods.values())
    assert not ({p["metadata"]["name"] for p in pods.values()} & old_pods), "every route-sync Pod was replaced"
    assert route_sync_images(cluster) == {image}
    assert {n: p["metadata"]["uid"] for n, p in ovs_pods(cluster).items()} == old_ovs, "a switch Pod was replaced"
    assert {n: daemon_pids(lab, n) for n in NODES} == pids, "an Open vSwitch daemon was restarted"
    for n, was in ifaces.items():
        now = interfaces(lab, n)
        assert {k: v for k, v in now.items() if k in was} == was, f"{n}: a Pod's interface changed"
    # lost_seqs: unanswered requests before the last answered one (not the one in flight at the stop)
    assert not result.lost_seqs, (f"pings {result.lost_seqs} of {result.transmitted} lost across {what} "
                                  f"(after replies at {result.lost_after}; churn within 3 s: {near}; {started})")


def test_the_lab_runs_the_previous_release(lab: Lab) -> None:
    cluster = lab.kube()
    tag = release.previous()
    want = release.image_ref(tag)
    assert route_sync_images(cluster) == {want}
    assert {i for p in ovs_pods(cluster).values() for i in images(p).values()} == {want}
    (rev,) = json.loads(cluster.helm("history", manifests.RELEASE, "-n", manifests.NAMESPACE, "-o", "json"))
    assert rev["chart"] == f"ferry-{tag.removeprefix('v')}" and rev["status"] == "deployed"


def test_helm_upgrade_to_this_tree_loses_nothing(lab: Lab) -> None:
    here = manifests.shipped_image(manifests.load())
    assert here != release.image_ref(release.previous()), "this tree must name a version of its own"
    across_helm(lab, f"helm upgrade {release.previous()} -> this tree",
                lambda: lab.kube().helm_upgrade(overlay(lab)), here)


def test_helm_rollback_to_the_previous_release_loses_nothing(lab: Lab) -> None:
    tag = release.previous()
    across_helm(lab, f"helm rollback this tree -> {tag}", lambda: lab.kube().helm_rollback(1), release.image_ref(tag))
    history = json.loads(lab.kube().helm("history", manifests.RELEASE, "-n", manifests.NAMESPACE, "-o", "json"))
    assert [h["revision"] for h in history] == [1, 2, 3] and history[-1]["status"] == "deployed"
