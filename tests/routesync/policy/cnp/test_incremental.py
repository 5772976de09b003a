"""The incremental tier planner held to the full one: randomized event sequences (Pods added,
moved, relabelled, re-addressed, deleted; Namespaces relabelled, created, deleted; Nodes; policies
of every tier, action and peer kind, named ports and ranges; Service CIDRs; egress judged on
remote subjects too or on local ones only, ``Facts.remote_egress``), the two plans
compared field by field, flows by identity, after every event, on the same conjunction ids."""

from __future__ import annotations

import random
from typing import Any

import pytest

from cni.pipeline.tables import Flow
from routesync.flowdelta import FlowTracker
from routesync.policy.cnp import plan as tp
from routesync.policy.cnp.incremental import TierPlanner
from routesync.policy.cnp.model import ClusterPolicy, NodeInfo, cluster_policy_from
from routesync.policy.model import NamedPort, Pod
from routesync.policy.node import differences

HERE = "n1"
NAMESPACES = ("a", "b", "c", "d")
NODES = ("n1", "n2", "n3")


class World:
    """The cluster as the watches would hold it, changed one random event at a time."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.pods: dict[str, Pod] = {}
        self.namespaces: dict[str, tuple[tuple[str, str], ...]] = {}
        self.nodes: dict[str, NodeInfo] = {}
        self.policies: dict[str, ClusterPolicy] = {}
        self.services: tuple[str, ...] = ("10.96.0.0/16",)
        self.denied_log = False
        self.remote_egress = True  # egress rules on remote subjects too (policyPeers: cluster)

    def labels(self) -> tuple[tuple[str, str], ...]:
        rng = self.rng
        out = {}
        if rng.random() < 0.7:
            out["app"] = rng.choice(("web", "db", "dns"))
        if rng.random() < 0.4:
            out["tier"] = rng.choice(("1", "2"))
        return tuple(sorted(out.items()))

    def pod(self, ns: str, name: str) -> Pod:
        rng = self.rng
        # a small pool of addresses: two Pods may hold one for a while (a reused address)
        ips = [f"10.0.0.{rng.randrange(1, 12)}"]
        if rng.random() < 0.5:
            ips.append(f"fd00::{rng.randrange(1, 12):x}")
        ports = tuple(NamedPort(n, rng.choice(("TCP", "UDP")), rng.choice((80, 8080, 53)))
                      for n in ("http", "dns") if rng.random() < 0.4)
        return Pod(ns, name, rng.choice(NODES), self.labels(), tuple(ips), ports)

    def selector(self) -> dict[str, Any]:
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            return {}
        if r < 0.6:
            return {"matchLabels": {"app": rng.choice(("web", "db", "dns"))}}
        if r < 0.8:
            return {"matchExpressions": [{"key": "tier", "operator": rng.choice(("Exists", "DoesNotExist"))}]}
        return {"matchLabels": {"team": rng.choice(NAMESPACES)}}

    def selection(self) -> dict[str, Any]:
        if self.rng.random() < 0.5:
            return {"namespaces": self.selector()}
        return {"pods": {"namespaceSelector": self.selector(), "podSelector": self.selector()}}

    def peer(self, egress: bool) -> dict[str, Any]:
        rng = self.rng
        r = rng.random()
        if not egress or r < 0.6:
            return self.selection()
        if r < 0.75:
            return {"nodes": self.selector()}
        if r < 0.95:
            return {"networks": [rng.choice(("10.0.0.0/29", "10.0.0.5/32", "fd00::/124", "192.168.0.0/16"))]}
        return {"domainNames": ["example.com"]}

    def ports(self) -> list[dict[str, Any]]:
        rng = self.rng
        out: list[dict[str, Any]] = []
        for _ in range(rng.choice((1, 1, 2))):
            r = rng.random()
            if r < 0.35:
                out.append({"tcp": {"destinationPort": rng.choice((80, 53, 8080))}})
            elif r < 0.55:
                out.append({"udp": {"destinationPortRange": {"start": 50, "end": rng.choice((60, 90))}}})
            elif r < 0.65:
                out.append({"tcp": {}})
            else:
                out.append({"destinationNamedPort": rng.choice(("http", "dns"))})
        return out

    def rule(self, egress: bool) -> dict[str, Any]:
        rng = self.rng
        out: dict[str, Any] = {"name": f"r{rng.randrange(9)}", "action": rng.choice(("Accept", "Deny", "Pass"))}
        out["to" if egress else "from"] = [self.peer(egress) for _ in range(rng.choice((1, 1, 2)))]
        if rng.random() < 0.6:
            out["protocols"] = self.ports()
        if rng.random() < 0.05:
            out["action"] = "Frobnicate"  # read as Deny all
        return out

    def policy(self, name: str) -> ClusterPolicy:
        rng = self.rng
        spec: dict[str, Any] = {"tier": rng.choice(("Admin", "Baseline")), "priority": rng.choice((0, 1, 5)),
                                "subject": self.selection()}
        if rng.random() < 0.7:
            spec["ingress"] = [self.rule(False) for _ in range(rng.choice((1, 1, 2)))]
        if rng.random() < 0.7:
            spec["egress"] = [self.rule(True) for _ in range(rng.choice((1, 1, 2)))]
        return cluster_policy_from({"metadata": {"name": name}, "spec": spec})

    def node(self, name: str) -> NodeInfo:
        rng = self.rng
        return NodeInfo(name, (("app", rng.choice(("web", "db"))),), (f"192.168.0.{rng.randrange(1, 5)}",))

    def event(self, inc: TierPlanner) -> str:
        rng = self.rng
        r = rng.random()
        if r < 0.5:
            key = f"{rng.choice(NAMESPACES)}/p{rng.randrange(8)}"
            if key in self.pods and rng.random() < 0.3:
                del self.pods[key]
                inc.pod_event(key, None)
                return f"delete pod {key}"
            ns, name = key.split("/")
            pod = self.pod(ns, name)
            self.pods[key] = pod
            inc.pod_event(key, pod)
            return f"pod {pod}"
        if r < 0.62:
            ns = rng.choice(NAMESPACES)
            if ns in self.namespaces and rng.random() < 0.3:
                del self.namespaces[ns]
                inc.namespace_event(ns, None)
                return f"delete namespace {ns}"
            labels = tuple(sorted({"team": rng.choice(NAMESPACES), **dict(self.labels())}.items()))
            self.namespaces[ns] = labels
            inc.namespace_event(ns, labels)
            return f"namespace {ns} {labels}"
        if r < 0.7:
            name = rng.choice(NODES)
            if name in self.nodes and rng.random() < 0.3:
                del self.nodes[name]
                inc.node_event(name, None)
                return f"delete node {name}"
            node = self.nodes[name] = self.node(name)
            inc.node_event(name, node)
            return f"node {node}"
        if r < 0.97:
            name = f"cnp{rng.randrange(5)}"
            if name in self.policies and rng.random() < 0.3:
                del self.policies[name]
                inc.policy_event(name, None)
                return f"delete policy {name}"
            policy = self.policies[name] = self.policy(name)
            inc.policy_event(name, policy)
            return f"policy {policy}"
        self.services = rng.choice(((), ("10.96.0.0/16",), ("10.96.0.0/16", "fd00:96::/112")))
        self.denied_log = rng.random() < 0.3
        if rng.random() < 0.3:
            self.remote_egress = not self.remote_egress
        inc.set_facts(tp.Facts(HERE, self.services, self.denied_log, self.remote_egress))
        return f"services {self.services}, denied log {self.denied_log}, remote egress {self.remote_egress}"

    def inputs(self) -> tp.Inputs:
        return tp.Inputs(tuple(self.pods.values()), dict(self.namespaces), tuple(self.policies.values()),
                         tuple(sorted(self.nodes.values(), key=lambda n: n.name)))


def assert_same(inc: TierPlanner, world: World, where: str) -> tp.TierPlan:
    ids = inc.ids.copy()
    want = tp.plan(world.inputs(), tp.Facts(HERE, world.services, world.denied_log, world.remote_egress), ids)
    got = inc.snapshot()
    wrong = differences(got, want)
    assert not wrong, f"{where}: {wrong}"
    assert ids.held() == inc.ids.held(), f"{where}: conjunction ids differ"
    return want


@pytest.mark.parametrize("remote_egress", [True, False], ids=["cluster", "peerSlices"])
@pytest.mark.parametrize("seed", range(12))
def test_incremental_tiers_equal_the_full_plan_after_every_event(seed: int, remote_egress: bool) -> None:
    rng = random.Random(seed)
    world = World(rng)
    world.remote_egress = remote_egress
    inc = TierPlanner(tp.Facts(HERE, world.services, remote_egress=remote_egress))
    installed = Installed()
    seen_flows = deltas = 0
    for step in range(300):
        what = world.event(inc)
        want = assert_same(inc, world, f"seed {seed} event {step}: {what}")
        deltas += installed.step(inc, f"seed {seed} event {step}: {what}")
        seen_flows = max(seen_flows, len(want.flows))
    assert seen_flows > 50  # the sequences reach plans worth comparing
    assert deltas > 100  # most steps went by the planner's delta, not a whole regroup
    # the same objects loaded from scratch give the same plan and keep every id
    held = inc.ids.held()
    inc.load(inc.inputs())
    assert_same(inc, world, f"seed {seed} reloaded")
    installed.step(inc, f"seed {seed} reloaded")
    assert inc.ids.held() == held


class Installed:
    """What an applier following :class:`routesync.flowdelta.FlowTracker`'s changes would have
    installed, fed as route-sync's policy step feeds it (the tiers' flows when their snapshot
    moved, with the planner's delta when it knows it): after every step exactly the snapshot's
    flows (as OVS holds them: a flow rebuilt equal is the same flow)."""

    def __init__(self) -> None:
        self.tracker = FlowTracker()
        self.groups: dict[int, tuple[Flow, ...]] = {}
        self.grouped: tp.TierPlan | None = None

    def step(self, inc: TierPlanner, where: str) -> int:
        snap = inc.snapshot()
        if snap is self.grouped:
            return 0
        self.grouped = snap
        delta = inc.take_flow_delta()
        tracked = self.tracker.step(list(snap.flows), [], [], snap.flows, delta)
        for cookie, (_was, now) in tracked.changed.items():
            if now:
                self.groups[cookie] = now
            else:
                self.groups.pop(cookie, None)
        got = sorted(f.text() for g in self.groups.values() for f in g)
        assert got == sorted(f.text() for f in snap.flows), f"{where}: the applier's flows differ from the plan's"
        return int(delta is not None)


def test_an_event_elsewhere_touches_no_flow_and_a_peer_touches_one() -> None:
    inc = TierPlanner(tp.Facts(HERE))
    web = cluster_policy_from({"metadata": {"name": "web"}, "spec": {
        "tier": "Admin", "priority": 1, "subject": {"namespaces": {"matchLabels": {"team": "a"}}},
        "ingress": [{"action": "Deny", "from": [{"namespaces": {"matchLabels": {"team": "b"}}}]}]}})
    for ns in ("a", "b", "c"):
        inc.namespace_event(ns, (("team", ns),))
    inc.policy_event("web", web)
    inc.pod_event("a/s", Pod("a", "s", HERE, (), ("10.0.1.1",)))
    for i in range(50):
        inc.pod_event(f"b/c{i}", Pod("b", f"c{i}", "n2", (), (f"10.0.2.{i + 1}",)))
    before = {f.text() for f in inc.snapshot().flows}
    inc.pod_event("c/x", Pod("c", "x", "n2", (), ("10.0.3.1",)))  # no policy reads Namespace c
    assert {f.text() for f in inc.snapshot().flows} == before
    inc.pod_event("b/c50", Pod("b", "c50", "n3", (), ("10.0.2.99",)))
    after = {f.text() for f in inc.snapshot().flows}
    assert len(after - before) == 1 and not before - after  # one peer flow more, nothing else moved
    assert "nw_src=10.0.2.99" in next(iter(after - before))


def test_a_flow_built_again_with_the_same_actions_is_no_change() -> None:
    """A key touched whose flow comes out the same (a conjunction counted twice, then once) gives
    no delta, and keeps the object handed over before; a real change gives the old one and the new."""
    from cni.pipeline.actions import Conjunction
    from routesync.policy.cnp.incremental import MergedFlows

    merged = MergedFlows({})
    conj, other = Conjunction(1 << 24, 1, 2), Conjunction((1 << 24) + 1, 1, 2)
    merged.address(46, 100, "10.0.0.1", True, conj, 1)
    (first,) = merged.flows()
    assert merged.take_delta() == ([first], [])
    merged.address(46, 100, "10.0.0.1", True, conj, 1)  # counted twice: the same flow
    merged.address(46, 100, "10.0.0.1", True, conj, -1)
    merged.flows()
    assert merged.take_delta() == ([], [])
    assert merged.flows() == [first] and merged.flows()[0] is first
    merged.address(46, 100, "10.0.0.1", True, other, 1)
    (second,) = merged.flows()
    assert merged.take_delta() == ([second], [first])
