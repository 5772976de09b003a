"""The incremental policy planner held to the full one: randomized event sequences (Pods added,
deleted, relabelled, moved between Nodes, re-addressed in both families, with named ports;
Namespaces relabelled and deleted; policies created, edited, deleted, of every shape the model
reads; events delivered twice and out of order, as watches do) and, after *every* event, the
incremental state equal to ``plan.plan`` of the same inputs with the same conjunction ids: flow
for flow (table, priority, match, actions in order, cookie), every other field of the Plan, and
the flows its deltas installed.  Nothing here depends on the machine's speed.

``FERRY_POLICY_DIFF_EVENTS`` sets how many events in all (default 10,000; the bench's replay
runs 1,000,000 through :func:`replay`)."""

from __future__ import annotations

import os
import random
from dataclasses import fields
from typing import Any

import pytest

from cni.pipeline.tables import Flow
from routesync.apply.ovs import OvsApplier
from routesync.flowdelta import FlowTracker, join
from routesync.policy import plan as pp
from routesync.policy.incremental import IncrementalPlanner
from routesync.policy.model import NamedPort, Pod, Policy, policy_from

EVENTS = int(os.environ.get("FERRY_POLICY_DIFF_EVENTS", "10000"))
PER_SEQUENCE = 250
NODE = "n1"
NAMESPACES = ("a", "b", "a-b", "c")  # "a-b" sorts before "a/..." as a key, after "a" as a name
NODES = (NODE, NODE, "n2", "n3")
APPS = ("x", "y", "z")
TIERS = ("web", "db")


def facts_for(rng: random.Random, remote_egress: bool = True) -> pp.NodeFacts:
    return pp.NodeFacts(NODE,
                        host_addresses=rng.choice(((), ("10.0.0.254",), ("10.0.0.254", "fd00::fe"))),
                        service_cidrs=rng.choice(((), ("10.96.0.0/12",), ("10.96.0.0/12", "fd00:96::/112"))),
                        denied_log=rng.random() < 0.5,
                        pod_cidrs=rng.choice(((), ("10.0.0.0/29",), ("10.0.0.0/28", "fd00::/120"))),
                        remote_egress=remote_egress)


class World:
    """What the watches have delivered, as plain dicts (the reference's inputs), and a generator
    of the next event."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.pods: dict[str, Pod] = {}
        self.namespaces: dict[str, tuple[tuple[str, str], ...]] = {}
        self.policies: dict[str, Policy] = {}
        self.history: list[tuple[str, Any]] = []  # every upsert so far: stale copies to redeliver

    def inputs(self) -> pp.Inputs:
        return pp.Inputs(tuple(sorted(self.pods.values(), key=lambda p: p.key)), dict(self.namespaces),
                         tuple(sorted(self.policies.values(), key=lambda p: p.key)))

    # -- objects -------------------------------------------------------------------------------
    def labels(self) -> tuple[tuple[str, str], ...]:
        rng = self.rng
        out = {}
        if rng.random() < 0.8:
            out["app"] = rng.choice(APPS)
        if rng.random() < 0.6:
            out["tier"] = rng.choice(TIERS)
        if rng.random() < 0.2:
            out["version"] = rng.choice(("v1", "v2"))
        return tuple(sorted(out.items()))

    def ips(self) -> tuple[str, ...]:
        rng = self.rng
        v4 = f"10.0.0.{rng.randrange(1, 14)}"
        v6 = f"fd00::{rng.randrange(1, 14):x}"
        return rng.choice(((v4,), (v6,), (v4, v6), (v4, v6), (v6, v4)))

    def ports(self) -> tuple[NamedPort, ...]:
        rng = self.rng
        out = []
        if rng.random() < 0.6:
            out.append(NamedPort("http", "TCP", rng.choice((80, 8080))))
        if rng.random() < 0.3:
            out.append(NamedPort("dns", "UDP", rng.choice((53, 5353))))
        return tuple(out)

    def pod(self, ns: str, name: str) -> Pod:
        return Pod(ns, name, self.rng.choice(NODES), self.labels(), self.ips(), self.ports())

    def selector(self, empty_ok: bool = True) -> dict[str, Any]:
        rng = self.rng
        r = rng.random()
        if r < 0.2 and empty_ok:
            return {}
        if r < 0.6:
            return {"matchLabels": {"app": rng.choice(APPS)}}
        if r < 0.75:
            return {"matchLabels": {"tier": rng.choice(TIERS)}}
        op = rng.choice(("In", "NotIn", "Exists", "DoesNotExist"))
        key = rng.choice(("app", "tier", "version"))
        expr: dict[str, Any] = {"key": key, "operator": op}
        if op in ("In", "NotIn"):
            expr["values"] = sorted(set(rng.sample(APPS + TIERS, 2)))
        return {"matchExpressions": [expr]}

    def ns_selector(self) -> dict[str, Any]:
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            return {}
        if r < 0.6:
            return {"matchLabels": {"team": rng.choice(("t1", "t2"))}}
        if r < 0.8:
            return {"matchLabels": {"kubernetes.io/metadata.name": rng.choice(NAMESPACES)}}
        return {"matchExpressions": [{"key": "env", "operator": rng.choice(("In", "NotIn")), "values": ["prod"]}]}

    def peer(self) -> dict[str, Any]:
        rng = self.rng
        r = rng.random()
        if r < 0.35:
            return {"podSelector": self.selector()}
        if r < 0.55:
            return {"namespaceSelector": self.ns_selector()}
        if r < 0.8:
            return {"namespaceSelector": self.ns_selector(), "podSelector": self.selector()}
        if rng.random() < 0.5:
            n = rng.randrange(0, 4)
            return {"ipBlock": {"cidr": f"10.0.0.{n * 4}/30", "except": [f"10.0.0.{n * 4 + 1}/32"]}}
        if rng.random() < 0.1:
            return {"ipBlock": {"cidr": "not-a-cidr"}}  # unreadable: the rule allows nothing
        return {"ipBlock": {"cidr": rng.choice(("fd00::/124", "10.0.0.0/29", "0.0.0.0/0"))}}

    def port(self) -> dict[str, Any]:
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            return {"port": rng.choice((80, 8080, 443))}
        if r < 0.55:
            return {"port": "http"}
        if r < 0.65:
            return {"port": "dns", "protocol": "UDP"}
        if r < 0.8:
            first = rng.choice((78, 80, 1000))
            return {"port": first, "endPort": first + rng.choice((0, 1, 3, 20)),
                    "protocol": rng.choice(("TCP", "SCTP"))}
        if r < 0.9:
            return {"protocol": rng.choice(("UDP", "SCTP"))}
        return {"port": 80, "protocol": "TCP"}

    def rule(self, peers_key: str) -> dict[str, Any]:
        rng = self.rng
        out: dict[str, Any] = {}
        if rng.random() < 0.75:
            out[peers_key] = [self.peer() for _ in range(rng.choice((1, 1, 2)))]
        if rng.random() < 0.7:
            ports = [self.port() for _ in range(rng.choice((1, 1, 2, 3)))]
            if rng.random() < 0.1:
                ports.append(dict(ports[0]))  # the same port twice
            out["ports"] = ports
        return out

    def policy(self, ns: str, name: str) -> Policy:
        rng = self.rng
        spec: dict[str, Any] = {"podSelector": self.selector()}
        types = rng.choice((None, ["Ingress"], ["Egress"], ["Ingress", "Egress"]))
        if types is not None:
            spec["policyTypes"] = types
        if rng.random() < 0.8:
            spec["ingress"] = [self.rule("from") for _ in range(rng.choice((0, 1, 1, 2)))]
        if rng.random() < 0.6:
            spec["egress"] = [self.rule("to") for _ in range(rng.choice((0, 1, 1, 2)))]
        return policy_from({"metadata": {"namespace": ns, "name": name}, "spec": spec})

    # -- events --------------------------------------------------------------------------------
    def event(self) -> tuple[str, Any]:
        rng = self.rng
        r = rng.random()
        if r < 0.08 and self.history:  # a stale or repeated delivery of something seen before
            return rng.choice(self.history)
        if r < 0.45:
            ns, name = rng.choice(NAMESPACES), f"p{rng.randrange(7)}"
            key = f"{ns}/{name}"
            old = self.pods.get(key)
            if old is None or rng.random() < 0.2:
                return ("pod", self.pod(ns, name))
            change = rng.randrange(4)
            if change == 0:
                return ("pod", Pod(ns, name, old.node, self.labels(), old.ips, old.ports))
            if change == 1:
                return ("pod", Pod(ns, name, rng.choice(NODES), old.labels, old.ips, old.ports))
            if change == 2:
                return ("pod", Pod(ns, name, old.node, old.labels, self.ips(), old.ports))
            return ("pod", Pod(ns, name, old.node, old.labels, old.ips, self.ports()))
        if r < 0.58:
            if self.pods and rng.random() < 0.9:
                return ("pod-", rng.choice(sorted(self.pods)))
            return ("pod-", "a/never")
        if r < 0.7:
            ns = rng.choice(NAMESPACES)
            labels = {"kubernetes.io/metadata.name": ns}
            if rng.random() < 0.7:
                labels["team"] = rng.choice(("t1", "t2"))
            if rng.random() < 0.5:
                labels["env"] = rng.choice(("prod", "dev"))
            return ("ns", (ns, tuple(sorted(labels.items()))))
        if r < 0.75:
            return ("ns-", rng.choice(NAMESPACES))
        if r < 0.93:
            ns, name = rng.choice(NAMESPACES), f"pol{rng.randrange(4)}"
            return ("policy", self.policy(ns, name))
        if self.policies and rng.random() < 0.9:
            return ("policy-", rng.choice(sorted(self.policies)))
        return ("policy-", "a/never")

    def apply(self, ev: tuple[str, Any], inc: IncrementalPlanner) -> None:
        kind, obj = ev
        if kind == "pod":
            self.pods[obj.key] = obj
            inc.upsert_pod(obj)
        elif kind == "pod-":
            self.pods.pop(obj, None)
            inc.delete_pod(obj)
        elif kind == "ns":
            self.namespaces[obj[0]] = obj[1]
            inc.upsert_namespace(*obj)
        elif kind == "ns-":
            self.namespaces.pop(obj, None)
            inc.delete_namespace(obj)
        elif kind == "policy":
            self.policies[obj.key] = obj
            inc.upsert_policy(obj)
        else:
            self.policies.pop(obj, None)
            inc.delete_policy(obj)
        if kind in ("pod", "ns", "policy"):
            self.history.append(ev)
            del self.history[:-40]


def assert_same(inc: IncrementalPlanner, world: World, facts: pp.NodeFacts, where: str) -> pp.Plan:
    """The incremental state is the full plan of the same inputs with the same ids, field for field."""
    inputs = world.inputs()
    assert inc.inputs() == inputs, where
    ids = inc.ids.copy()
    want = pp.plan(inputs, facts, ids)
    assert ids.held() == inc.ids.held(), f"{where}: the full plan needed other conjunction ids"
    got = inc.snapshot(ordered=True)
    for f in fields(pp.Plan):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if a != b:
            if f.name == "flows":
                ga, gb = {x.text() for x in a}, {x.text() for x in b}
                pytest.fail(f"{where}: flows differ: extra {sorted(ga - gb)[:5]}, missing {sorted(gb - ga)[:5]}")
            pytest.fail(f"{where}: {f.name} differs:\n incremental {a}\n full        {b}")
    return want


class InstallingOvs(OvsApplier):
    """The OVS applier's flow delta, its bundles applied to a dict (cookie -> flows) instead of
    sent: what OVS would hold."""

    def __init__(self) -> None:
        super().__init__("unix:/nonexistent", "br-int", "/nonexistent")
        self.groups: dict[int, list[Flow]] = {}

    def _send_bundle(self, add: list[int], replace: list[int], delete: list[int],
                     flows_by_cookie: dict[int, list[Flow]]) -> None:
        for c in delete + replace:
            assert self.groups.pop(c, None) is not None, f"{c:#x} deleted or replaced, not installed"
        for c in add + replace:
            assert c not in self.groups, f"{c:#x} added twice"
            self.groups[c] = list(flows_by_cookie[c])


def by_cookie(flows: list[Flow]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for f in flows:
        out.setdefault(f.cookie.value, []).append(f.text())
    return {c: sorted(t) for c, t in out.items()}


def replay(seed: int, events: int, check_every: int = 1, remote_egress: bool = True) -> int:
    """``events`` random events from ``seed``, the incremental planner checked against the full one
    every ``check_every`` events (and at the end); the number of flow changes its deltas carried.
    Its deltas also go through route-sync's way to OVS (``routesync.flowdelta``: the groups that
    changed, behind the Node's own flows; now and then a pass that never reached the applier, so
    the next one groups everything): what that installs is the full plan too.  ``remote_egress``:
    the Node's facts judge a remote client's egress (``policyPeers: cluster``) or not (``peerSlices``);
    a change of facts flips it now and then."""
    rng = random.Random(seed)
    facts = facts_for(rng, remote_egress)
    world = World(rng)
    inc = IncrementalPlanner(facts)
    installed: dict[tuple[int, int, str], Flow] = {}
    tracker, ovs = FlowTracker(), InstallingOvs()
    applied: list[Flow] = []
    changes = 0
    pending: tuple[str, Any] | None = None
    for i in range(events):
        ev = world.event()
        if pending is None and rng.random() < 0.05:
            pending = ev  # delivered after the next one
            continue
        world.apply(ev, inc)
        if pending is not None:
            world.apply(pending, inc)
            pending = None
        if rng.random() < 0.01:  # the Node's facts change: everything again
            facts = facts_for(rng, remote_egress if rng.random() < 0.7 else not facts.remote_egress)
            inc.set_facts(facts)
        delta = inc.take_delta()
        changes += len(delta)
        for f in delta.removed:
            assert installed.pop(f.key()) == f
        for f in delta.added:
            assert f.key() not in installed
            installed[f.key()] = f
        after = join([], tracker.step(inc.flows(), delta.added, delta.removed, None))
        if rng.random() < 0.97:  # else a pass whose apply failed: OVS keeps what it had
            ovs.sync_flow_delta(applied, after)
            applied = after
        if i % check_every == 0 or i == events - 1:
            want = assert_same(inc, world, facts, f"seed {seed} event {i} {ev[0]}")
            assert sorted(installed.values(), key=Flow.key) == sorted(want.flows, key=Flow.key)
            if applied is after:
                assert by_cookie([f for g in ovs.groups.values() for f in g]) == by_cookie(want.flows)
    return changes


@pytest.mark.parametrize("remote_egress", [True, False], ids=["cluster", "peerSlices"])
@pytest.mark.parametrize("seed", range(max(1, EVENTS // PER_SEQUENCE)))
def test_incremental_equals_the_full_plan_after_every_event(seed: int, remote_egress: bool) -> None:
    replay(seed, min(PER_SEQUENCE, EVENTS), remote_egress=remote_egress)


def pod(ns: str, name: str, ip: str, node: str = NODE, **labels: str) -> Pod:
    return Pod(ns, name, node, tuple(sorted(labels.items())), (ip,), ())


def test_an_event_that_changes_nothing_changes_no_flow() -> None:
    inc = IncrementalPlanner(pp.NodeFacts(NODE))
    inc.upsert_pod(pod("a", "srv", "10.0.0.1", app="srv"))
    inc.upsert_pod(pod("a", "cli", "10.0.0.2", node="n2", app="cli"))
    inc.upsert_policy(policy_from({"metadata": {"namespace": "a", "name": "web"}, "spec": {
        "podSelector": {"matchLabels": {"app": "srv"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "cli"}}}], "ports": [{"port": 80}]}]}}))
    assert len(inc.take_delta()) > 0
    inc.upsert_pod(pod("a", "cli", "10.0.0.2", node="n2", app="cli"))  # the same again
    inc.upsert_pod(pod("a", "other", "10.0.0.3", node="n2", app="other"))  # selected by nothing
    inc.upsert_namespace("b", (("team", "t1"),))  # no selector looks at namespaces
    assert len(inc.take_delta()) == 0


def test_a_peer_joining_changes_its_own_flow_only_and_ids_stay() -> None:
    inc = IncrementalPlanner(pp.NodeFacts(NODE))
    inc.upsert_pod(pod("a", "srv", "10.0.0.1", app="srv"))
    for p in ("p1", "p2"):
        inc.upsert_policy(policy_from({"metadata": {"namespace": "a", "name": p}, "spec": {
            "podSelector": {"matchLabels": {"app": "srv"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": p}}}]}]}}))
    inc.upsert_pod(pod("a", "c1", "10.0.0.2", node="n2", app="p1"))
    inc.upsert_pod(pod("a", "c2", "10.0.0.3", node="n2", app="p2"))
    ids = {r.policy: r.conj_id for r in inc.snapshot().rules}
    inc.take_delta()
    inc.upsert_pod(pod("a", "c3", "10.0.0.4", node="n2", app="p2"))
    delta = inc.take_delta()
    assert [f.match_text() for f in delta.added] == ["ip,nw_src=10.0.0.4"] and not delta.removed
    inc.delete_policy("a/p1")
    inc.upsert_policy(policy_from({"metadata": {"namespace": "a", "name": "p1"}, "spec": {
        "podSelector": {"matchLabels": {"app": "srv"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "p1"}}}], "ports": [{"port": 80}]}]}}))
    assert {r.policy: r.conj_id for r in inc.snapshot().rules} == ids
