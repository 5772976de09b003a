"""route-sync's Prometheus metrics (prometheus-client, a registry per daemon, no global state).

    metrics = RouteSyncMetrics()
    obs = Observer(metrics, health)          # what the daemon calls (routesync.daemon.DaemonObserver)
    obs.reconciled(result, desired)          # after every reconcile (desired None on failure)
    obs.change_applied(seconds)              # a Node change seen -> applied
    obs.mac_disagreement(peer)               # fast path: annotation and neighbour MAC differ
    obs.pods_synced(report)                  # running Pods brought to their paths' MTUs
    obs.policy_planned(plan)                 # NetworkPolicy planned again
    obs.policy_counters(plan, flows)         # every 10 s: the policy flows' counters
    obs.policy_drift_repaired(what)          # a full pass repaired the incremental policy plan
    obs.tick()                               # every loop iteration (liveness)
    obs.bgp_peer(peer, up, {4: n4, 6: n6})   # BGP (routesync.bgp.speaker): a session's state
    obs.bgp_error(peer, reason)              # a session failed or ended

Names (exposition format; counters get ``_total``, histograms ``_bucket/_sum/_count``):

==============================================================  ==========================================
``ferry_route_sync_peers{path,family}``                          peers per decided path (tunnel, route,
                                                                 underlay, fast, none) and family (4, 6)
``ferry_route_sync_reconcile_duration_seconds``                  histogram of every reconcile pass
``ferry_route_sync_node_change_to_applied_seconds``              histogram: Node change seen -> applied
``ferry_route_sync_mac_source_disagreements_total``              annotation vs neighbour MAC differ
``ferry_route_sync_errors_total{type}``                          failed reconciles by exception type
``ferry_route_sync_reconciles_total{result}``                    reconciles, ok | error
``ferry_route_sync_last_reconcile_success``                      1 when the latest pass succeeded
``ferry_route_sync_state_file_writes_total``                     node state file rewrites
``ferry_route_sync_pod_cidr_conflicts``                          Pod CIDR claims set aside: they overlap
                                                                 another Node's (routesync.planclaims)
``ferry_route_sync_pod_mtu_updates_total{result}``               running Pods brought to their paths'
                                                                 MTUs: updated | failed | skipped (gone)
``ferry_route_sync_bgp_session_established{peer}``                1 while the BGP session to the peer is up
``ferry_route_sync_bgp_prefixes_advertised{peer,family}``         prefixes advertised on that session
``ferry_route_sync_bgp_session_errors_total{peer,reason}``        sessions that failed or ended, by reason
                                                                 (bad-peer-as, connect-failed, hold-timer-
                                                                 expired, connection-closed, ...)
``ferry_route_sync_bgp_speaker_restarts_total``                  ExaBGP exited and was started again
``ferry_route_sync_policy_rule_packets_total{policy,direction,   packets (bytes) of the new connections
rule}`` and ``..._bytes_total``                                  a NetworkPolicy rule allowed on this Node
``ferry_route_sync_policy_denied_packets_total{pod,direction}``  packets of new connections a local Pod's
                                                                 isolation dropped (no rule allowed them)
``ferry_route_sync_policy_remote_denied_packets_total``          packets of new connections that remote Pods'
                                                                 egress isolation dropped here (judged at the
                                                                 destination Node; the denied log names them)
``ferry_route_sync_policy_flows``                                NetworkPolicy flows installed
``ferry_route_sync_cluster_policy_rule_packets_total{policy,     packets (bytes) a ClusterNetworkPolicy rule
tier,direction,rule,action}`` and ``..._bytes_total``            accepted, denied or passed on this Node (its
                                                                 conj_id flow: every packet of the original
                                                                 direction, not only a connection's first)
``ferry_route_sync_policy_drift_repairs_total``                  full passes that found the incremental
                                                                 policy plan off the full planner's (or an
                                                                 object's event lost) and repaired it: 0
``ferry_route_sync_policy_denied_log_lines_total``               denied connections logged, one line each
``ferry_route_sync_policy_denied_log_suppressed_total``          denied connections the log's per-Node bound
                                                                 (``networkPolicyDeniedLog``) left out
``ferry_route_sync_policy_denied_log_listening``                 1 while the denied log's OpenFlow connection
                                                                 listens for packet-ins
==============================================================  ==========================================

The policy figures are the switch's own counters, read every 10 s (``routesync.policy.node``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from cni.pipeline.modes import PATHS

if TYPE_CHECKING:
    from cni.ovs.openflow.ofctl import DumpedFlow

    from .apply.pods import PodSyncReport
    from .daemon import ReconcileResult
    from .health import Health
    from .model import DesiredState, PeerPlan
    from .policy.cnp.plan import TierPlan
    from .policy.plan import Plan

FAMILIES = ("4", "6")
PREFIX = "ferry_route_sync"
# A reconcile is a few ms (no change) to a few hundred (first pass, uplink move, many peers).
RECONCILE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CHANGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def peer_counts(peers: Iterable[PeerPlan]) -> dict[tuple[str, str], int]:
    """(path, family) -> count for every known pair (zeros included, so a vanished path drops to 0)."""
    counts: dict[tuple[str, str], int] = {(p, f): 0 for p in PATHS for f in FAMILIES}
    for peer in peers:
        key = (str(peer.path), str(peer.family))
        counts[key] = counts.get(key, 0) + 1
    return counts


def error_type(error: str | None) -> str:
    """``ReconcileResult.error`` is ``"Type: message"``; the label is the type."""
    if not error:
        return "unknown"
    head = error.split(":", 1)[0].strip()
    return head if head.isidentifier() else "unknown"


class RouteSyncMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.peers = Gauge(f"{PREFIX}_peers", "Peers by decided path and address family",
                           ["path", "family"], registry=r)
        self.reconcile_duration = Histogram(f"{PREFIX}_reconcile_duration_seconds",
                                            "Duration of one reconcile pass", buckets=RECONCILE_BUCKETS,
                                            registry=r)
        self.change_to_applied = Histogram(f"{PREFIX}_node_change_to_applied_seconds",
                                           "From a Node change seen by the source to its state applied",
                                           buckets=CHANGE_BUCKETS, registry=r)
        self.mac_disagreements = Counter(f"{PREFIX}_mac_source_disagreements",
                                         "Peer MAC from the annotation and from the neighbour table differ",
                                         registry=r)  # no peer label: cardinality = cluster size
        self.errors = Counter(f"{PREFIX}_errors", "Failed reconcile passes by exception type", ["type"],
                              registry=r)
        self.reconciles = Counter(f"{PREFIX}_reconciles", "Reconcile passes by result", ["result"], registry=r)
        self.last_success = Gauge(f"{PREFIX}_last_reconcile_success",
                                  "1 when the latest reconcile pass succeeded, else 0", registry=r)
        self.state_writes = Counter(f"{PREFIX}_state_file_writes", "Node state file rewrites", registry=r)
        self.pod_cidr_conflicts = Gauge(f"{PREFIX}_pod_cidr_conflicts",
                                        "Pod CIDR claims set aside because they overlap another Node's",
                                        registry=r)
        self.pod_mtu_updates = Counter(f"{PREFIX}_pod_mtu_updates",
                                       "Running Pods whose interface/route MTUs route-sync changed, by result",
                                       ["result"], registry=r)
        for res in ("updated", "failed", "skipped"):
            self.pod_mtu_updates.labels(res)
        # BGP: the peer label's cardinality is the number of configured peers (a few routers)
        self.bgp_established = Gauge(f"{PREFIX}_bgp_session_established",
                                     "1 while the BGP session to the peer is established", ["peer"], registry=r)
        self.bgp_advertised = Gauge(f"{PREFIX}_bgp_prefixes_advertised",
                                    "Prefixes advertised on the BGP session", ["peer", "family"], registry=r)
        self.bgp_errors = Counter(f"{PREFIX}_bgp_session_errors", "BGP sessions that failed or ended, by reason",
                                  ["peer", "reason"], registry=r)
        self.bgp_restarts = Counter(f"{PREFIX}_bgp_speaker_restarts", "ExaBGP exited and was started again",
                                    registry=r)
        for p, f in peer_counts(()):
            self.peers.labels(p, f).set(0)
        for res in ("ok", "error"):
            self.reconciles.labels(res)

        self.policy_drift_repairs = Counter(
            f"{PREFIX}_policy_drift_repairs",
            "Full passes that found the incremental NetworkPolicy plan off the full planner's and repaired it",
            registry=r)
        self.policy = PolicyCounters()
        r.register(self.policy)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class PolicyCounters:
    """A collector of the latest NetworkPolicy counters (``policy_counters`` sets them)."""

    def __init__(self) -> None:
        self.rules: list[tuple[str, str, str, int, int]] = []  # policy, direction, rule, packets, bytes
        self.denied: dict[tuple[str, str], int] = {}
        self.remote_denied = 0
        self.flows = 0
        self.tier_rules: list[tuple[str, str, str, str, str, int, int]] = []  # policy, tier, direction, rule, action
        self.denied_log: Any = None  # routesync.policy.listener.DeniedListener, when the per-connection log is on

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        labels = ["policy", "direction", "rule"]
        packets = CounterMetricFamily(f"{PREFIX}_policy_rule_packets", "Packets of new connections a rule allowed",
                                      labels=labels)
        octets = CounterMetricFamily(f"{PREFIX}_policy_rule_bytes", "Bytes of new connections a rule allowed",
                                     labels=labels)
        for policy, direction, rule, n, b in self.rules:
            packets.add_metric([policy, direction, rule], n)
            octets.add_metric([policy, direction, rule], b)
        denied = CounterMetricFamily(f"{PREFIX}_policy_denied_packets",
                                     "Packets of new connections a Pod's isolation dropped",
                                     labels=["pod", "direction"])
        for (pod, direction), n in sorted(self.denied.items()):
            denied.add_metric([pod, direction], n)
        remote = CounterMetricFamily(f"{PREFIX}_policy_remote_denied_packets",
                                     "Packets of new connections remote Pods' egress isolation dropped here")
        remote.add_metric([], self.remote_denied)
        flows = GaugeMetricFamily(f"{PREFIX}_policy_flows", "NetworkPolicy flows installed")
        flows.add_metric([], self.flows)
        out = [packets, octets, denied, remote, flows]
        tier_labels = ["policy", "tier", "direction", "rule", "action"]
        tp = CounterMetricFamily(f"{PREFIX}_cluster_policy_rule_packets",
                                 "Packets a ClusterNetworkPolicy rule accepted, denied or passed", labels=tier_labels)
        tb = CounterMetricFamily(f"{PREFIX}_cluster_policy_rule_bytes",
                                 "Bytes a ClusterNetworkPolicy rule accepted, denied or passed", labels=tier_labels)
        for policy, tier, direction, rule, action, n, b in self.tier_rules:
            tp.add_metric([policy, tier, direction, rule, action], n)
            tb.add_metric([policy, tier, direction, rule, action], b)
        out += [tp, tb]
        listener = self.denied_log
        if listener is not None:
            lines = CounterMetricFamily(f"{PREFIX}_policy_denied_log_lines", "Denied connections logged")
            lines.add_metric([], listener.denied.logged)
            left = CounterMetricFamily(f"{PREFIX}_policy_denied_log_suppressed",
                                       "Denied connections the per-Node bound kept out of the log")
            left.add_metric([], listener.denied.suppressed)
            up = GaugeMetricFamily(f"{PREFIX}_policy_denied_log_listening",
                                   "1 while route-sync's OpenFlow connection for the denied log listens")
            up.add_metric([], 1 if listener.listening.is_set() else 0)
            out += [lines, left, up]
        return out


class Observer:
    """What the daemon reports to; forwards to the metrics and the health state. Never raises
    into the loop (a metrics bug must not stop reconciling)."""

    def __init__(self, metrics: RouteSyncMetrics, health: Health | None = None) -> None:
        self.metrics = metrics
        self.health = health

    def tick(self) -> None:
        if self.health is not None:
            self.health.tick()

    def reconciled(self, result: ReconcileResult, desired: DesiredState | None) -> None:
        """``desired``: the applied state when the pass succeeded."""
        m = self.metrics
        try:
            m.reconcile_duration.observe(max(0.0, result.duration))
            if result.ok:
                m.reconciles.labels("ok").inc()
                m.last_success.set(1)
                if result.state_written:
                    m.state_writes.inc()
                if desired is not None:
                    for (path, family), n in peer_counts(desired.peers).items():
                        m.peers.labels(path, family).set(n)
                    m.pod_cidr_conflicts.set(len(desired.cidr_conflicts))
            else:
                m.reconciles.labels("error").inc()
                m.errors.labels(error_type(result.error)).inc()
                m.last_success.set(0)
        finally:
            if self.health is not None:
                self.health.reconciled(result.ok)

    def pods_synced(self, report: PodSyncReport) -> None:
        """One pass over the Pods."""
        for res, n in (("updated", report.updated), ("failed", report.failed), ("skipped", report.skipped)):
            if n:
                self.metrics.pod_mtu_updates.labels(res).inc(n)

    def change_applied(self, seconds: float) -> None:
        self.metrics.change_to_applied.observe(max(0.0, seconds))

    def mac_disagreement(self, peer: str) -> None:
        self.metrics.mac_disagreements.inc()

    def bgp_peer(self, peer: str, established: bool, advertised: dict[int, int]) -> None:
        self.metrics.bgp_established.labels(peer).set(1 if established else 0)
        for family, n in advertised.items():
            self.metrics.bgp_advertised.labels(peer, str(family)).set(n)

    def bgp_error(self, peer: str, reason: str) -> None:
        self.metrics.bgp_errors.labels(peer, reason).inc()

    def policy_planned(self, plan: Plan) -> None:
        """``plan`` just planned: the flows gauge follows it at
        once (the rule and denied counters wait for the next read of the switch's counters)."""
        self.metrics.policy.flows = len(plan.flows)

    def policy_drift_repaired(self, what: str) -> None:
        """A full pass repaired the incremental policy plan (``what``: what drifted; logged by
        routesync.policy.node)."""
        self.metrics.policy_drift_repairs.inc()

    def policy_counters(self, plan: Plan, flows: list[DumpedFlow]) -> None:
        """``flows``: the plan's flows as dumped."""
        from .policy import stats

        pc = self.metrics.policy
        totals: dict[tuple[str, str, str], list[int]] = {}
        for c in stats.rule_counts(plan.rules, flows):
            t = totals.setdefault((c.rule.policy, c.rule.direction, str(c.rule.index)), [0, 0])
            t[0] += c.packets
            t[1] += c.bytes
        pc.rules = [(*k, v[0], v[1]) for k, v in sorted(totals.items())]
        pc.denied = stats.denied({p.key: list(p.ips) for p in plan.local_pods}, flows)
        pc.remote_denied = stats.remote_denied(plan.remote_isolation_id, flows)
        pc.flows = len(plan.flows)

    def tier_counters(self, tiers: TierPlan, flows: list[DumpedFlow]) -> None:
        """``flows``: the policy flows as dumped."""
        from .policy import stats

        totals: dict[tuple[str, str, str, str, str], list[int]] = {}
        for c in stats.tier_rule_counts(tiers.rules, flows):
            r = c.rule
            t = totals.setdefault((r.policy, r.tier, r.direction, r.name or str(r.index), r.action), [0, 0])
            t[0] += c.packets
            t[1] += c.bytes
        self.metrics.policy.tier_rules = [(*k, v[0], v[1]) for k, v in sorted(totals.items())]

    def bgp_speaker_restart(self) -> None:
        self.metrics.bgp_restarts.inc()
