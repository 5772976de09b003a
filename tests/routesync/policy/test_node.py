"""NetworkPolicy in route-sync's loop (``routesync.policy.node``), without root: the daemon applies
what the watches changed between full passes, an event that changes no flow writes nothing to
OVS (``OvsApplier.sync_flow_delta`` with its bundle recorded instead of sent), and a full pass
compares with the full planner, repairs drift and counts it."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from cni.pipeline.tables import Flow, Table
from routesync.apply.ovs import OvsApplier
from routesync.config import from_dict
from routesync.daemon import Daemon, NullObserver
from routesync.flowdelta import tail_changes
from routesync.model import DesiredState
from routesync.policy import plan as pp
from routesync.policy.incremental import Changes
from routesync.policy.model import Pod, Policy, policy_from
from routesync.sources.registry import RegistrySource
from tests.routesync.standins import RecordingAppliers

NODE = "node-a"


class JournalSource:
    """A ``routesync.policy.watch.PolicySource`` without a cluster: objects set by the test, each
    change journalled as the Reflectors do (``lose_next``: the next change reaches the cache but
    not the journal, as a lost event would)."""

    def __init__(self) -> None:
        self.pods: dict[str, Pod] = {}
        self.namespaces: dict[str, tuple[tuple[str, str], ...]] = {"ns": ()}
        self.policies: dict[str, Policy] = {}
        self.gen = 0
        self.journal: dict[str, dict[str, Any]] = {"pods": {}, "namespaces": {}, "policies": {}}
        self.lose_next = False

    def _note(self, kind: str, key: str, value: Any) -> None:
        self.gen += 1
        if self.lose_next:
            self.lose_next = False
            return
        self.journal[kind][key] = value

    def pod(self, pod: Pod) -> None:
        self.pods[pod.key] = pod
        self._note("pods", pod.key, pod)

    def policy(self, policy: Policy) -> None:
        self.policies[policy.key] = policy
        self._note("policies", policy.key, policy)

    def generation(self) -> tuple[int, int, int]:
        return (self.gen, 0, 0)

    def changes(self) -> tuple[tuple[int, int, int], Changes]:
        j, self.journal = self.journal, {"pods": {}, "namespaces": {}, "policies": {}}
        return self.generation(), Changes(j["pods"], j["namespaces"], j["policies"])

    def inputs_and_changes(self) -> tuple[tuple[int, int, int], Changes, pp.Inputs]:
        gen, changes = self.changes()
        return gen, changes, self.inputs()[1]

    def inputs(self) -> tuple[tuple[int, int, int], pp.Inputs]:
        """Everything; the journal starts again from here (as PolicySource.inputs)."""
        self.changes()
        return self.generation(), pp.Inputs(tuple(sorted(self.pods.values(), key=lambda p: p.key)),
                                            dict(self.namespaces),
                                            tuple(sorted(self.policies.values(), key=lambda p: p.key)))

    def service_cidrs(self, configured: tuple[str, ...]) -> tuple[str, ...]:
        return configured


class RecordingOvs(OvsApplier):
    """The real flow delta, its bundles recorded instead of sent."""

    def __init__(self) -> None:
        super().__init__("unix:/nonexistent", "br-int", "/nonexistent")
        self.bundles: list[tuple[list[int], list[int], list[int]]] = []

    def _send_bundle(self, add: list[int], replace: list[int], delete: list[int],
                     flows_by_cookie: dict[int, list[Flow]]) -> None:
        if add or replace or delete:
            self.bundles.append((add, replace, delete))


class DeltaAppliers(RecordingAppliers):
    """Incremental passes through ``sync_flow_delta`` (full ones: recorded as the starting point)."""

    def __init__(self) -> None:
        super().__init__()
        self.ovs = RecordingOvs()
        self.last: list[Flow] | None = None

    def apply(self, desired: DesiredState) -> None:
        super().apply(desired)
        if not desired.full and self.last is not None:
            self.ovs.sync_flow_delta(self.last, desired.flows)
        self.last = desired.flows


class Drifts(NullObserver):
    def __init__(self) -> None:
        self.what: list[str] = []

    def policy_drift_repaired(self, what: str) -> None:
        self.what.append(what)


def pod(name: str, ip: str, node: str = NODE, **labels: str) -> Pod:
    return Pod("ns", name, node, tuple(sorted(labels.items())), (ip,), ())


WEB = policy_from({"metadata": {"namespace": "ns", "name": "web"}, "spec": {
    "podSelector": {"matchLabels": {"app": "srv"}},
    "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "cli"}}}], "ports": [{"port": 80}]}]}})


def daemon(tmp_path: Any, source: JournalSource, observer: Any = None, **config: Any) -> tuple[Daemon, DeltaAppliers]:
    cfg = from_dict({"nodeName": NODE, "podCIDRs": ["10.244.1.0/24"], "stateFile": str(tmp_path / "s.json"),
                     "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg")}, **config})
    apl = DeltaAppliers()
    return Daemon(cfg, RegistrySource(str(tmp_path / "reg"), NODE), apl, observer=observer, policy=source), apl


def test_an_event_that_changes_no_flow_writes_nothing_and_one_that_does_writes_its_flow(tmp_path: Any) -> None:
    src = JournalSource()
    src.pod(pod("srv", "10.244.1.5", app="srv"))
    src.pod(pod("cli", "10.244.2.7", node="node-b", app="cli"))
    src.policy(WEB)
    d, apl = daemon(tmp_path, src)
    assert d.reconcile(full=True).ok
    first = d.policy_plan
    src.pod(pod("other", "10.244.2.9", node="node-b", app="other"))  # selected by nothing
    src.pod(pod("cli", "10.244.2.7", node="node-b", app="cli"))  # the same again
    assert d.reconcile(full=False).ok
    assert apl.ovs.bundles == []
    assert d.policy is not None and d.policy.planner is not None and d.policy.planner.events == 2
    src.pod(pod("cli2", "10.244.2.8", node="node-b", app="cli"))  # a peer more: its flow only
    assert d.reconcile(full=False).ok
    assert len(apl.ovs.bundles) == 1
    add, replace, delete = apl.ovs.bundles[0]
    assert len(add) == 1 and not replace and not delete
    assert d.policy_plan is not first
    assert d.reconcile(full=False).ok  # nothing moved: the same plan, nothing written
    assert len(apl.ovs.bundles) == 1


def test_a_pass_hands_the_applier_the_policy_groups_that_changed_and_nothing_else(tmp_path: Any) -> None:
    """The policy flows reach the applier as ``routesync.flowdelta`` tracks them: the cookie
    groups that changed since the pass before, so it need not group the policy flows again."""
    src = JournalSource()
    src.pod(pod("srv", "10.244.1.5", app="srv"))
    src.pod(pod("cli", "10.244.2.7", node="node-b", app="cli"))
    src.policy(WEB)
    d, apl = daemon(tmp_path, src)
    assert d.reconcile(full=True).ok
    src.pod(pod("cli2", "10.244.2.8", node="node-b", app="cli"))
    assert d.reconcile(full=False).ok
    before, after = apl.applied[-2].flows, apl.applied[-1].flows
    joined = tail_changes(before, after)
    assert joined is not None
    (_, peers_changed), (_, changed) = joined[2]  # the peers' tracked flows, then the policy's
    assert peers_changed == {}
    (cookie, (was, now)), = changed.items()
    assert was == () and [f.text() for f in now] == [f.text() for f in after if f.cookie.value == cookie]
    assert "nw_src=10.244.2.8" in now[0].text()
    assert apl.ovs.bundles == [([cookie], [], [])]
    assert d.reconcile(full=False).ok  # nothing moved: the same tracked flows, nothing to write
    again = tail_changes(after, apl.applied[-1].flows)
    assert again is not None and [c for _, c in again[2]] == [{}, {}] and len(apl.ovs.bundles) == 1


def test_a_full_pass_checks_against_the_full_planner_and_repairs_a_lost_event(
        tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    src = JournalSource()
    src.pod(pod("srv", "10.244.1.5", app="srv"))
    src.policy(WEB)
    drifts = Drifts()
    d, apl = daemon(tmp_path, src, drifts)
    assert d.reconcile(full=True).ok
    src.pod(pod("cli", "10.244.2.7", node="node-b", app="cli"))
    assert d.reconcile(full=True).ok  # what the journal had: no drift
    assert d.policy is not None and d.policy.drift_repairs == 0 and d.policy.checks == 1
    src.lose_next = True
    src.pod(pod("cli2", "10.244.2.8", node="node-b", app="cli"))
    assert d.reconcile(full=False).ok
    assert "nw_src=10.244.2.8" not in " ".join(f.text() for f in apl.applied[-1].flows)
    with caplog.at_level(logging.WARNING, logger="routesync.policy.node"):
        assert d.reconcile(full=True).ok
    assert d.policy.drift_repairs == 1 and drifts.what and "ns/cli2" in drifts.what[0]
    assert "NetworkPolicy drift repaired: events missed: 1 Pods (ns/cli2)" in caplog.text
    assert "nw_src=10.244.2.8" in " ".join(f.text() for f in apl.applied[-1].flows)
    # a plan that drifted (a flow lost from the incremental state) is repaired from the full planner's
    planner = d.policy.planner
    assert planner is not None
    key = next(k for k in planner._flows if "10.244.2.8" in k[2])
    del planner._flows[key]
    planner.version += 1
    with caplog.at_level(logging.WARNING, logger="routesync.policy.node"):
        assert d.reconcile(full=True).ok
    assert d.policy.drift_repairs == 2 and "the incremental plan differs from the full one: 1 flows" in drifts.what[1]
    assert "nw_src=10.244.2.8" in " ".join(f.text() for f in apl.applied[-1].flows)


class TierSource(JournalSource):
    """The same, with ClusterNetworkPolicies (``PolicySource.tier_objects``)."""

    def __init__(self) -> None:
        super().__init__()
        self.cnps: dict[str, Any] = {}
        self.tier_gen = 0

    def cnp(self, doc: dict[str, Any]) -> None:
        from routesync.policy.cnp.model import cluster_policy_from

        p = cluster_policy_from(doc)
        self.cnps[p.name] = p
        self.tier_gen += 1

    def tier_objects(self) -> tuple[tuple[int, int], tuple[Any, ...], tuple[Any, ...]]:
        return (self.tier_gen, 0), tuple(self.cnps.values()), ()


def test_cluster_policies_are_planned_in_the_pass_and_their_subjects_namespaces_start_pending(tmp_path: Any) -> None:
    import json

    src = TierSource()
    src.namespaces.update({"quiet": (), "ns": (("kubernetes.io/metadata.name", "ns"),)})
    src.pod(pod("srv", "10.244.1.5", app="srv"))
    d, apl = daemon(tmp_path, src)
    assert d.reconcile(full=True).ok
    assert not any(f.table == Table.INGRESS_ADMIN and f.priority for f in apl.applied[-1].flows)
    src.cnp({"metadata": {"name": "deny-all"}, "spec": {
        "tier": "Admin", "priority": 3,
        "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": "ns"}}},
        "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}})
    assert d.reconcile(full=False).ok
    admin = [f for f in apl.applied[-1].flows if f.table == Table.INGRESS_ADMIN and f.priority]
    assert any("nw_dst=10.244.1.5" in f.text() for f in admin) and any(f.text().endswith("drop") for f in admin)
    assert apl.applied[-1].policy_namespaces == ("ns",)  # a new Pod there starts pending; "quiet" is no subject
    assert d.policy is not None
    d.policy.flush_report()  # written off the pass (at most every REPORT_DELAY)
    report = json.loads((tmp_path / "policy.json").read_text())
    assert report["tiersOf"] == {"ns/srv": ["Admin/3/deny-all"]}
    src.cnps.clear()
    src.tier_gen += 1
    assert d.reconcile(full=False).ok
    assert not any(f.table == Table.INGRESS_ADMIN and f.priority for f in apl.applied[-1].flows)


@pytest.mark.parametrize("peers", ["cluster", "peerSlices"])
def test_with_peer_slices_a_remote_clients_egress_is_left_to_its_source(tmp_path: Any, peers: str) -> None:
    """``policyPeers: peerSlices`` plans no judgment of a remote Pod's egress, NetworkPolicy's or
    the tiers'; ``cluster`` (the default) still does, through full and incremental passes."""
    src = TierSource()
    src.namespaces.update({"ns": (("kubernetes.io/metadata.name", "ns"),)})
    src.pod(pod("srv", "10.244.1.5", app="srv"))
    src.pod(pod("cli", "10.244.2.5", node="node-b", app="cli"))
    src.policy(policy_from({"metadata": {"namespace": "ns", "name": "cli-out"}, "spec": {
        "podSelector": {"matchLabels": {"app": "cli"}}, "policyTypes": ["Egress"],
        "egress": [{"ports": [{"port": 53}]}]}}))
    src.cnp({"metadata": {"name": "cli-deny"}, "spec": {
        "tier": "Admin", "priority": 3, "subject": {"pods": {
            "namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "cli"}}}},
        "egress": [{"action": "Deny", "to": [{"networks": ["192.0.2.0/24"]}]}]}})
    d, apl = daemon(tmp_path, src, nodeSource={"type": "kubernetes"}, policyPeers=peers)
    cluster = peers == "cluster"
    for full, remote in ((True, ["ns/cli"]), (False, ["ns/cli", "ns/cli2"]), (True, ["ns/cli", "ns/cli2"])):
        assert d.reconcile(full=full).ok
        flows = " ".join(f.text() for f in apl.applied[-1].flows)
        node = d.policy
        assert node is not None and node.plan is not None
        assert ("nw_src=10.244.2.5" in flows) == cluster
        assert node.plan.remote_isolated == (remote if cluster else [])
        assert bool(node.plan.remote_rules) == bool(node.tiers.rules) == cluster
        src.pod(pod("cli2", "10.244.2.6", node="node-b", app="cli"))
    assert d.policy is not None and d.policy.drift_repairs == 0


def test_cluster_policies_follow_pod_events_between_full_passes_and_drift_is_repaired(tmp_path: Any) -> None:
    src = TierSource()
    src.namespaces.update({"ns": (("kubernetes.io/metadata.name", "ns"),)})
    src.pod(pod("srv", "10.244.1.5", app="srv"))
    src.cnp({"metadata": {"name": "deny-all"}, "spec": {
        "tier": "Admin", "priority": 3,
        "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": "ns"}}},
        "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}})
    d, apl = daemon(tmp_path, src)
    assert d.reconcile(full=True).ok

    def admin() -> set[str]:
        return {f.text() for f in apl.applied[-1].flows if f.table == Table.INGRESS_ADMIN and f.priority}

    src.pod(pod("new", "10.244.1.9", app="srv"))  # an event, no full pass: the tier planner takes it
    assert d.reconcile(full=False).ok
    assert any("nw_dst=10.244.1.9" in f for f in admin()) and any("nw_src=10.244.1.9" in f for f in admin())
    assert d.policy is not None and d.policy.tier_planner is not None
    repairs = d.policy.drift_repairs
    d.policy.tier_planner.pod_event("ns/new", None)  # a lost event: the planner no longer holds the Pod
    assert d.reconcile(full=False).ok
    assert not any("10.244.1.9" in f for f in admin())
    assert d.reconcile(full=True).ok  # the full pass finds it and repairs
    assert d.policy.drift_repairs == repairs + 1
    assert any("nw_dst=10.244.1.9" in f for f in admin())


def test_the_state_file_names_the_namespaces_where_a_new_pod_starts_pending(tmp_path: Any) -> None:
    """The plugin reads them from the node state file: a Pod added there starts pending until its
    policy is in force (the pass writes the desired state's)."""
    from cni.node import nodestate

    src = JournalSource()
    src.pod(pod("srv", "10.244.1.5", app="srv"))
    d, apl = daemon(tmp_path, src)
    assert d.reconcile(full=True).ok
    assert nodestate.read(str(tmp_path / "s.json")).policyNamespaces == []
    src.policy(WEB)
    assert d.reconcile(full=True).ok
    assert apl.applied[-1].policy_namespaces == ("ns",)
    assert nodestate.read(str(tmp_path / "s.json")).policyNamespaces == ["ns"]


def test_the_policy_report_is_written_off_the_pass_once_per_burst(tmp_path: Any) -> None:
    """``show policy``'s report waits REPORT_DELAY after the pass that moved it: the pass's flows do
    not wait for its JSON, and the passes of a burst are one write, of the last plan."""
    from routesync.policy.node import REPORT_DELAY
    from routesync.policy.stats import read_report

    src = JournalSource()
    src.pod(pod("srv", "10.244.1.5", app="srv"))
    src.policy(WEB)
    d, _ = daemon(tmp_path, src)
    assert d.policy is not None
    now = [100.0]
    d.policy.clock = lambda: now[0]
    writes = []
    real = d.policy.flush_report

    def counted() -> None:
        writes.append(now[0])
        real()
    d.policy.flush_report = counted  # type: ignore[method-assign]
    assert d.reconcile(full=True).ok
    assert not (tmp_path / "policy.json").exists() and d.policy.wake_in() == REPORT_DELAY
    for i in range(3):  # a burst: three passes that move the plan
        now[0] += 0.1
        src.pod(pod(f"srv{i}", f"10.244.1.{10 + i}", app="srv"))
        assert d.reconcile(full=False).ok
        d.policy.tick()
    assert not writes and d.policy.wake_in() == pytest.approx(REPORT_DELAY - 0.3)
    now[0] += REPORT_DELAY
    d.policy.tick()
    assert writes == [now[0]] and d.policy.wake_in() is None
    assert sorted(read_report(str(tmp_path / "s.json"))["pods"]) == ["ns/srv", "ns/srv0", "ns/srv1", "ns/srv2"]
    d.policy.tick()
    assert len(writes) == 1
