"""NetworkPolicy in route-sync's loop: the daemon's seam to it (``routesync.feature.Feature``), as
BGP has its speaker.  In each pass :meth:`PolicyNode.desire` adds the policy's flows, its host
judge and the namespaces where a new Pod starts pending to the desired state
(:meth:`PolicyNode.step`), and :meth:`PolicyNode.applied` lifts the pending block of the Pods
whose policy is in force now; between passes :meth:`PolicyNode.tick` reads the policy flows'
counters (metrics, the denied log).

Between full passes it plans incrementally (:class:`.incremental.IncrementalPlanner`): the
objects the watches changed since the last pass (:meth:`.watch.PolicySource.changes`) are
applied as events, and a new :class:`.plan.Plan` is taken only when one changed something.  A
full pass takes everything the watches hold, applies what changed, then checks twice: that the
incremental planner holds exactly those objects (an event lost on the way shows as a difference),
and that its plan is, field for field, the full planner's (:func:`.plan.plan`, run on a copy of
the same conjunction ids).  Drift of either kind is repaired (the planner rebuilt from the full
inputs, with the full planner's ids), logged with what drifted, and counted
(``ferry_route_sync_policy_drift_repairs_total``): it should read 0."""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Protocol

from cni.pipeline.tables import GATEWAY_PORT

from ..feature import Need
from ..flowdelta import FlowTracker, TrackedFlows, join
from . import plan as policy_plan
from .cnp import plan as tier_plan
from .cnp.incremental import TierPlanner
from .cnp.plan import TierPlan
from .incremental import Changes, FlowDelta, IncrementalPlanner
from .stats import DeniedLog

if TYPE_CHECKING:
    from collections.abc import Sequence

    from cni.ovs.openflow.ofctl import DumpedFlow
    from cni.pipeline.tables import Flow

    from ..config import Config
    from ..model import DesiredState, LocalFacts, NodeRecord
    from ..nftbody import NftBody
    from .cnp.model import ClusterPolicy, NodeInfo
    from .hostjudge import RenderMemo
    from .model import Pod

log = logging.getLogger(__name__)

DENIED_LOG_INTERVAL = 10.0  # seconds between looks at what NetworkPolicy dropped
REPORT_DELAY = 0.5  # s: the policy report is written at most this often, off the pass


class PolicyInputs(Protocol):
    """``routesync.policy.watch.PolicySource``: the cluster's Pods, Namespaces and policies.  A
    source that also has ``changes()`` and ``inputs_and_changes()`` (the watch's journals) is
    applied by what changed; one without is compared with by key."""

    def generation(self) -> tuple[int, int, int]: ...

    def inputs(self) -> tuple[tuple[int, int, int], policy_plan.Inputs]: ...

    def service_cidrs(self, configured: tuple[str, ...]) -> tuple[str, ...]: ...


class PolicyObserver(Protocol):
    """NetworkPolicy's part of ``routesync.daemon.DaemonObserver``."""

    def policy_planned(self, plan: policy_plan.Plan) -> None:
        """NetworkPolicy planned again (the cluster's Pods, Namespaces or policies moved)."""
        ...

    def policy_counters(self, plan: policy_plan.Plan, flows: list[DumpedFlow]) -> None:
        """Every :data:`DENIED_LOG_INTERVAL` s: the policy flows with their counters."""
        ...

    def policy_drift_repaired(self, what: str) -> None:
        """A full pass found the incremental policy plan (or the objects it holds) off the full
        planner's and repaired it (``what``: what drifted)."""
        ...


class NullPolicyObserver:
    """A :class:`PolicyObserver` that records nothing (``routesync.daemon.NullObserver``'s part)."""

    def policy_planned(self, plan: policy_plan.Plan) -> None:
        pass

    def policy_counters(self, plan: policy_plan.Plan, flows: list[DumpedFlow]) -> None:
        pass

    def policy_drift_repaired(self, what: str) -> None:
        pass


class PolicyAppliers(Protocol):
    """NetworkPolicy's part of ``routesync.daemon.Appliers`` (``routesync.apply.NodeAppliers``)."""

    def release_pending(self, pods: Sequence[Pod], full: bool) -> int:
        """After ``apply``, NetworkPolicy on: lift the pending block of every local Pod the policy
        planner has seen (its policy is in force now).  Delta: each Pod once; ``full``: all again
        (idempotent).  Returns how many were lifted."""
        ...

    def policy_flows(self) -> list[DumpedFlow]:
        """The installed NetworkPolicy flows with their counters (read-only).  An exception is
        logged (debug); the counters are not read this time."""
        ...


@dataclass(frozen=True)
class PolicyStep:
    """One pass's policy: the plan, the host's judge (``DesiredState.policy_nft``), how many
    flows changed since the previous pass, the ClusterNetworkPolicy tiers' plan, and both plans'
    flows as a :class:`..flowdelta.TrackedFlows` (which cookie groups changed since the previous
    step's: the OVS applier writes those without grouping the rest)."""

    plan: policy_plan.Plan
    nft: NftBody
    changed_flows: int
    tiers: TierPlan = field(default_factory=TierPlan)
    tracked: TrackedFlows | None = None

    @property
    def flows(self) -> list[Flow]:
        if self.tracked is not None:
            return self.tracked
        return self.plan.flows + self.tiers.flows

    @property
    def namespaces(self) -> list[str]:
        """Where a new Pod starts pending: a namespace with a NetworkPolicy or one a
        ClusterNetworkPolicy's subject selects."""
        return sorted(set(self.plan.policy_namespaces) | set(self.tiers.subject_namespaces))


def differences(got: policy_plan.Plan | TierPlan, want: policy_plan.Plan | TierPlan, most: int = 3) -> list[str]:
    """What differs between two plans (NetworkPolicy's or the tiers'), field by field (flows by
    identity), for a log line."""
    out = []
    for f in fields(want):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if f.name == "flows":
            fa, fb = {x.key(): x for x in a}, {x.key(): x for x in b}
            if fa == fb:
                continue
            wrong = sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))
            shown = ", ".join(f"{fa[k].text() if k in fa else '(none)'} instead of "
                              f"{fb[k].text() if k in fb else '(none)'}" for k in wrong[:most])
            out.append(f"{len(wrong)} flows ({shown}{', ...' if len(wrong) > most else ''})")
        elif a != b:
            out.append(f.name)
    return out


class PolicyNode:
    """This Node's NetworkPolicy: the watches' objects → the incremental planner → the plan
    and the host's judge, checked against the full planner at full passes (see the module)."""

    def __init__(self, config: Config, source: PolicyInputs, appliers: PolicyAppliers,
                 observer: PolicyObserver | None = None,
                 remote_sources: Callable[[Mapping[str, tuple[str, tuple[str, ...]]]], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.source = source
        self.appliers = appliers
        self.observer = observer
        self._remote_sources = remote_sources  # the per-connection denied log's naming of remote Pods
        self.clock = clock
        self.ids = policy_plan.ConjIds()
        self.planner: IncrementalPlanner | None = None
        self.plan: policy_plan.Plan | None = None
        self._gen: tuple[int, int, int] | None = None
        self._version = -1
        # (plan, tiers, addresses, body) of the host's judge last rendered
        self._judged: tuple[policy_plan.Plan, TierPlan, tuple[object, ...], NftBody] | None = None
        self._judge_memo: RenderMemo | None = None  # what the last render keeps for the next
        self.denied_log = DeniedLog()
        self._next_denied_log = 0.0
        self._report: tuple[policy_plan.Plan, TierPlan] | None = None  # the policy report to write
        self._report_at: float | None = None  # when it is written (clock)
        self.drift_repairs = 0
        self.checks = 0  # full passes that compared with the full planner
        self.tier_ids = policy_plan.ConjIds(tier_plan.FIRST_CONJ_ID)
        self.tier_planner: TierPlanner | None = None
        self.tiers = TierPlan()
        self._tier_gen: object = None
        self._tier_version = -1
        self.flow_tracker = FlowTracker()  # the flows handed over, by cookie group
        self._grouped_tiers: TierPlan | None = None  # the tiers' plan the tracker has

    # -- the loop's seam (routesync.feature.Feature) ----------------------------------------------
    def start(self) -> None:
        pass

    def own_record(self, me: NodeRecord, peers: Sequence[NodeRecord]) -> NodeRecord:
        return me

    def reconnect(self) -> None:
        """The cluster's watches opened again where the source holds any (``PolicySource``; see
        ``routesync.sources.base.NodeSource.reconnect``)."""
        again = getattr(self.source, "reconnect", None)
        if again is not None:
            again()

    def desire(self, desired: DesiredState, facts: LocalFacts) -> None:
        step = self.step(desired.gateway_addresses, facts, desired.full)
        desired.flows = join(desired.flows, step.flows)
        desired.policy_namespaces = tuple(step.namespaces)
        desired.policy_nft = step.nft

    def applied(self, me: NodeRecord, peers: Sequence[NodeRecord], desired: DesiredState) -> None:
        if self.plan is not None:  # this pass's (desire)
            self.appliers.release_pending(self.plan.local_pods, desired.full)

    def wake_in(self) -> float | None:
        # its counters every DENIED_LOG_INTERVAL s: the loop's looks are often enough; the report on time
        return None if self._report_at is None else max(0.0, self._report_at - self.clock())

    # -- the steps ------------------------------------------------------------------------------
    def facts(self, gateway_addresses: tuple[str, ...], local: LocalFacts) -> policy_plan.NodeFacts:
        # the Node's own traffic to its Pods (kubelet probes) comes from the gateway's addresses;
        # in networkPolicyOnly, where it has none, from whichever of the Node's the kernel picks
        own = gateway_addresses or local.node_addresses
        cfg = self.config
        return policy_plan.NodeFacts(cfg.node_name, tuple(sorted({a.split("/")[0] for a in own})),
                                     self.source.service_cidrs(cfg.service_cidrs),  # the cluster's (watch.py)
                                     cfg.denied_log.enabled and local.denied_log_meter,
                                     # the gateway holds the first address of each local Pod CIDR
                                     tuple(str(ipaddress.ip_interface(a).network) for a in gateway_addresses),
                                     cfg.remote_egress)

    def step(self, gateway_addresses: tuple[str, ...], local: LocalFacts, full: bool) -> PolicyStep:
        """This pass's policy: what changed applied (``full``: everything compared, drift
        repaired).  Raises ``SourceError`` until the watches have listed."""
        facts = self.facts(gateway_addresses, local)
        t0 = self.clock()
        planner = self.planner
        moved: list[Changes] = []
        if planner is None:
            self._gen, inputs = self.source.inputs()
            planner = self.planner = IncrementalPlanner(facts, self.ids)
            planner.load(inputs)
            how = "planned"
        else:
            planner.set_facts(facts)
            if full:
                moved = self._check(planner, facts)
                how = "checked against a full plan"
            elif self.source.generation() != self._gen:
                moved = [self._apply(planner)]
                how = "applied"
            else:
                how = ""
        plan = self.plan
        if plan is None or planner.version != self._version:
            plan = self._planned(planner.snapshot(), how, self.clock() - t0, planner)
        delta = planner.take_delta()
        tiers = self._tiers(planner, facts, full, moved)
        return PolicyStep(plan, self._host_judge(plan, tiers, local, facts.service_cidrs), len(delta), tiers,
                          self._tracked(plan, delta, tiers))

    def _tracked(self, plan: policy_plan.Plan, delta: FlowDelta, tiers: TierPlan) -> TrackedFlows:
        """Both plans' flows, with the cookie groups that changed since the last step's
        (:class:`..flowdelta.FlowTracker`: NetworkPolicy's from the planner's delta, the tiers'
        compared when their plan moved)."""
        moved = tiers is not self._grouped_tiers
        self._grouped_tiers = tiers
        # the tiers' own delta (the groups it touched), not all their flows grouped again
        tier_delta = self.tier_planner.take_flow_delta() if moved and self.tier_planner is not None else None
        flows = plan.flows + tiers.flows if tiers.flows else plan.flows  # the tracker copies it
        return self.flow_tracker.step(flows, delta.added, delta.removed,
                                      tiers.flows if moved else None, tier_delta)

    def _tiers(self, planner: IncrementalPlanner, facts: policy_plan.NodeFacts, full: bool,
               moved: list[Changes]) -> TierPlan:
        """The ClusterNetworkPolicy tiers (:class:`.cnp.incremental.TierPlanner`): the Pods and
        Namespaces NetworkPolicy's planner took this pass, and the policies and Nodes when their
        watch moved; at a full pass everything compared, and checked against the full planner."""
        objects = getattr(self.source, "tier_objects", None)
        if objects is None:
            return self.tiers
        tfacts = tier_plan.Facts(facts.node, facts.service_cidrs, facts.denied_log, facts.remote_egress)
        t0 = self.clock()
        tp = self.tier_planner
        if tp is None:
            self._tier_gen, policies, nodes = objects()
            tp = TierPlanner(tfacts, self.tier_ids)
            tp.load(tier_plan.Inputs(tuple(planner.pods.values()), planner.namespaces, policies, nodes))
            self.tier_planner, how = tp, "planned"
        else:
            tp.set_facts(tfacts)
            for changes in moved:
                tp.apply(changes)
            generation = getattr(self.source, "tier_generation", None)
            if full:
                self._check_tiers(tp, planner, tfacts, objects)
                how = "checked against a full plan"
            elif generation is None or generation() != self._tier_gen:
                self._tier_gen, policies, nodes = objects()
                tp.sync_tiers(policies, nodes)
                how = "applied"
            else:
                how = "applied"
        if tp.version == self._tier_version:
            return self.tiers
        tiers = tp.snapshot()
        for e in sorted(set(tiers.errors) - set(self.tiers.errors)):
            log.warning("ClusterNetworkPolicy %s", e)
        if tp.policies or self.tiers.flows:
            log.info("cluster policy %s in %.1f ms: %d policies, %d rules here, %d flows", how,
                     (self.clock() - t0) * 1e3, len(tp.policies), len(tiers.rules), len(tiers.flows))
        self.tiers, self._tier_version = tiers, tp.version
        if self.plan is not None:
            self._write_report(self.plan, tiers)
        return tiers

    def _check_tiers(self, tp: TierPlanner, planner: IncrementalPlanner, facts: tier_plan.Facts,
                     objects: Callable[[], tuple[object, tuple[ClusterPolicy, ...], tuple[NodeInfo, ...]]]) -> None:
        """A full pass: the tier planner holds what the watches hold, and plans what the full
        planner plans on a copy of its ids; drift repaired and counted as NetworkPolicy's."""
        self._tier_gen, policies, nodes = objects()
        inputs = tier_plan.Inputs(tuple(planner.pods.values()), dict(planner.namespaces), policies, nodes)
        tp.sync_tiers(policies, nodes)  # what the watch changed since the last look
        missed, _ = tp.sync(inputs)  # the Pods and Namespaces: given as NetworkPolicy's planner took them
        drift: list[str] = []
        if missed:
            drift.append(f"events missed: {missed.describe()}")
        ids = tp.ids.copy()
        want = tier_plan.plan(inputs, facts, ids)
        wrong = differences(tp.snapshot(), want)
        if wrong:
            drift.append("the incremental plan differs from the full one: " + "; ".join(wrong))
            tp.ids = self.tier_ids = ids
            tp.load(inputs)
        if drift:
            self.drift_repairs += 1
            what = "ClusterNetworkPolicy: " + " | ".join(drift)
            log.warning("%s drift repaired", what)
            if self.observer is not None:
                self.observer.policy_drift_repaired(what)

    def _apply(self, planner: IncrementalPlanner) -> Changes:
        """What the watches changed, applied; returned for the tiers."""
        changes = getattr(self.source, "changes", None)
        if changes is not None:
            self._gen, moved = changes()
            planner.apply(moved)
            return moved
        self._gen, inputs = self.source.inputs()
        return planner.sync(inputs)

    def _check(self, planner: IncrementalPlanner, facts: policy_plan.NodeFacts) -> list[Changes]:
        both = getattr(self.source, "inputs_and_changes", None)
        journal = both is not None
        out: list[Changes] = []
        if both is not None:
            self._gen, moved, inputs = both()
            planner.apply(moved)
            out.append(moved)
        else:
            self._gen, inputs = self.source.inputs()
        missed = planner.sync(inputs)
        out.append(missed)
        drift: list[str] = []
        if missed and journal:
            drift.append(f"events missed: {missed.describe()}")
        ids = planner.ids.copy()
        want = policy_plan.plan(inputs, facts, ids)
        self.checks += 1
        wrong = differences(planner.snapshot(), want)
        if wrong:
            drift.append("the incremental plan differs from the full one: " + "; ".join(wrong))
            planner.ids = self.ids = ids
            planner.load(inputs)
            still = differences(planner.snapshot(), want)
            if still:
                log.error("NetworkPolicy: rebuilt from the full inputs, the plan still differs (%s)", "; ".join(still))
        if drift:
            self.drift_repairs += 1
            what = " | ".join(drift)
            log.warning("NetworkPolicy drift repaired: %s", what)
            if self.observer is not None:
                self.observer.policy_drift_repaired(what)
        return out

    def _planned(self, plan: policy_plan.Plan, how: str, took: float, planner: IncrementalPlanner
                 ) -> policy_plan.Plan:
        before = self.plan
        if before is None or set(plan.errors) != set(before.errors):
            for e in sorted(set(plan.errors) - set(before.errors if before else [])):
                log.warning("NetworkPolicy %s", e)
        log.info("policy %s in %.1f ms: %d policies, %d rules here, %d flows", how or "unchanged", took * 1e3,
                 len(planner.policies), len(plan.rules), len(plan.flows))
        self.plan, self._version = plan, planner.version
        if self._remote_sources is not None:
            self._remote_sources(plan.remote_sources)
        self._write_report(plan, self.tiers)
        if self.observer is not None:
            self.observer.policy_planned(plan)
        return plan

    def _write_report(self, plan: policy_plan.Plan, tiers: TierPlan) -> None:
        """The policy report (``show policy``: :func:`.stats.write_report`) is written off the
        pass, at most every REPORT_DELAY: a burst of events is one write, and no event's flows
        wait for its JSON (~5 ms at 30,000 Pods)."""
        self._report = (plan, tiers)
        if self._report_at is None:
            self._report_at = self.clock() + REPORT_DELAY

    def flush_report(self) -> None:
        """The pending policy report written now (a tick once it is due; tests)."""
        pending, self._report, self._report_at = self._report, None, None
        if pending is None:
            return
        try:
            from . import stats

            stats.write_report(pending[0], self.config.state_file, pending[1])
        except OSError as e:
            log.warning("policy report not written: %s", e)

    def _host_judge(self, plan: policy_plan.Plan, tiers: TierPlan, local: LocalFacts,
                    services: tuple[str, ...]) -> NftBody:
        """The host's judge of what kube-proxy's NAT takes past OVS (:mod:`.hostjudge`), rendered
        again only when a plan, the Node's addresses or the Service CIDRs moved."""
        key = (local.node_addresses, services)
        j = self._judged
        if j is not None and j[0] is not plan and j[1] is tiers and j[2] == key and _same_judge(j[0], plan):
            j = self._judged = (plan, tiers, key, j[3])  # flows moved, the judge's inputs did not
        if j is None or j[0] is not plan or j[1] is not tiers or j[2] != key:
            from . import hostjudge

            judge = hostjudge.judge(plan, GATEWAY_PORT, local.node_addresses, services, tiers)
            if self._judge_memo is None:
                self._judge_memo = hostjudge.RenderMemo()
            j = self._judged = (plan, tiers, key, hostjudge.render_body(judge, self._judge_memo))
        return j[3]

    def tick(self) -> Need:
        """Every ``DENIED_LOG_INTERVAL`` s: the policy counters for the metrics and, when the
        per-connection log (``networkPolicyDeniedLog``, :mod:`.listener`) is off, a line per Pod
        whose isolation dropped packets since the last look (:class:`.stats.DeniedLog`: bounded
        per Node); the policy report once it is due.  Never asks for a pass."""
        if self._report_at is not None and self.clock() >= self._report_at:
            self.flush_report()
        plan, dl = self.plan, self.denied_log
        if plan is None or self.clock() < self._next_denied_log:
            return Need.NOTHING
        self._next_denied_log = self.clock() + DENIED_LOG_INTERVAL
        try:
            flows = self.appliers.policy_flows()
        except Exception as e:  # noqa: BLE001 - a log that cannot be read is not a reconcile failure
            log.debug("policy counters not read: %s", e)
            return Need.NOTHING
        lines = dl.lines({p.key: list(p.ips) for p in plan.local_pods}, plan.policies_of, flows)
        if not self.config.denied_log.enabled:
            for line in lines:
                log.info("%s", line)
        if self.observer is not None:
            self.observer.policy_counters(plan, flows)
            tier_counters = getattr(self.observer, "tier_counters", None)
            if tier_counters is not None:
                tier_counters(self.tiers, flows)
        return Need.NOTHING


def _same_judge(was: policy_plan.Plan, now: policy_plan.Plan) -> bool:
    """Whether ``now`` gives the host's judge ``was`` gave (:func:`.hostjudge.judge` reads the
    local Pods, their isolation and the host rules): by identity, element by element -- the
    planners hand an unchanged rule and an unchanged Pod over as the same objects -- so a Pod
    event that moved flows alone costs no render, no fingerprint and no write."""
    return (was.isolated == now.isolated and len(was.host_rules) == len(now.host_rules)
            and len(was.local_pods) == len(now.local_pods)
            and all(a is b for a, b in zip(was.host_rules, now.host_rules))
            and all(a is b for a, b in zip(was.local_pods, now.local_pods)))
