"""The route-sync loop: Node source → planner → appliers → state file → own record.

One thread does every reconcile, so nothing is applied twice at once.  A reconcile runs

* when the source reports a change (after a short debounce, so a burst is one pass),
* every ``resyncSeconds`` (re-assert: a route deleted by hand comes back),
* when ovs-vswitchd restarted (its flows are gone; the appliers report a new generation),
* after a failure, with exponential backoff (0.2 s doubling to 30 s); a failing step is
  logged and retried, it never ends the process.

The first pass, the periodic one, the one after an ovs-vswitchd restart and the one after a
failure are *full*: the appliers are prepared (bridge, ports, uplink) and compare with what the
system holds.  A pass for a Node change in between is *incremental*: the local facts of the last
pass are reused while this Node's own record is unchanged, the planner re-plans only the peers
whose records changed (``planner.PeerMemo``), and the appliers apply only the difference from
what they applied last (``DesiredState.full`` False), so one change costs milliseconds whatever
the number of peers.

On start nothing special happens: the appliers diff against what is installed (flows by cookie,
routes by protocol number, Ferry's nft table), so what an earlier run left is adopted, and what
is no longer wanted is removed."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from cni.node import nodestate

from . import conflicts as conflicts_mod
from . import planclaims, planner
from .model import (
    CidrConflict,
    DesiredState,
    LocalFacts,
    MacDisagreement,
    NextHop,
    NodeRecord,
    PeerPlan,
    TunnelSpec,
    UplinkSpec,
)
from .policy import plan as policy_plan
from .policy.node import PolicyInputs, PolicyNode
from .sources import NodeSource, SourceError
from .wireguard.model import PUBLIC_KEY_ANNOTATION

if TYPE_CHECKING:
    from collections.abc import Sequence

    from cni.node.nodestate import NodeState
    from cni.ovs.openflow.ofctl import DumpedFlow

    from .apply.pods import PodSyncReport
    from .config import Config
    from .policy.model import Pod
    from .wireguard.model import WgSpec
    from .wireguard.node import WireGuardNode

log = logging.getLogger(__name__)

DEBOUNCE = 0.005  # seconds: collect a burst of changes into one reconcile
OVS_CHECK_INTERVAL = 0.25  # s between looks at ovs-vswitchd's pidfile (a read and an fstat: ~20 us)
# s a new ovs-vswitchd's full pass waits for its flows to be restored (flow-restore-wait cleared);
# after that route-sync puts its flows back anyway (a restore that hangs must not keep the Node down)
RESTORE_WAIT_MAX = 30.0
# seconds: an incremental pass's state file write (see _write_state)
STATE_CHEAP, STATE_IDLE, STATE_MAX_DELAY = 0.01, 0.1, 1.0
BACKOFF_MIN, BACKOFF_MAX = 0.2, 30.0
NEIGH_POLL = 0.05  # fast path: how often the wait looks at the neighbour watcher's flag


class NextHopSource(Protocol):
    """``routesync.apply.nexthops.NextHops``: the kernel's next hops, and a flag its neighbour
    watcher sets when one of their MACs changed."""

    changed: threading.Event

    def resolve(self, destinations: Iterable[str]) -> dict[str, NextHop]: ...


class BgpSpeaker(Protocol):
    """``routesync.bgp.speaker.Speaker``: told after every reconcile what this Node advertises."""

    def want(self, pod_cidrs: tuple[str, ...], uplink_addresses: tuple[str, ...]) -> None: ...


class Appliers(Protocol):
    """What the daemon drives: ``routesync.apply.NodeAppliers`` (built by ``make_appliers``), the
    test stand-ins (``tests/routesync/standins.py``) and the benchmark's wrapper.  Every method is
    called from the daemon's one thread, never two at once.  Unless a method says otherwise, an
    exception fails the pass: it is logged, the pass is retried with backoff, and the retry is full."""

    @property
    def next_hops(self) -> NextHopSource | None:
        """The kernel's next hops and their neighbour watcher (fast path); None when the fast path
        is off.  Read once, when the daemon starts."""
        ...

    def prepare(self, config: Config, tunnel: TunnelSpec | None, uplink: UplinkSpec | None,
                gateway_addresses: tuple[str, ...]) -> LocalFacts:
        """Full and idempotent: make the bridge, the gateway port (with ``gateway_addresses``), the
        tunnel port (None: none) and the uplink move (None: undone when an earlier run made it) be
        as given, and report what the planner needs of them.  Called on full passes and when this
        Node's own record changed; an incremental pass reuses the last answer."""
        ...

    def apply(self, desired: DesiredState) -> None:
        """Idempotent: install ``desired`` (flows, routes, neighbours, nft, MTUs).  ``desired.full``
        True: compare with what the system holds and repair drift (after an ovs-vswitchd restart
        also replay the Pods' flows); False: a delta from the last apply that succeeded is enough
        (the appliers fall back to full when they have none).  An exception leaves the system
        between the two states; the next (full) pass converges it."""
        ...

    def release_pending(self, pods: Sequence[Pod], full: bool) -> int:
        """After ``apply``, NetworkPolicy on: lift the pending block of every local Pod the policy
        planner has seen (its policy is in force now).  Delta: each Pod once; ``full``: all again
        (idempotent).  Returns how many were lifted."""
        ...

    def sync_pods(self, state: NodeState, full: bool) -> PodSyncReport:
        """Running Pods to the per-path MTUs and routes of ``state`` (already on disk).  Delta: the
        Pods whose plan changed and new ones; ``full``: every Pod (idempotent).  A Pod that fails
        or is gone is counted in the report, not raised; an exception is the whole sync failing."""
        ...

    def restore_host_path(self, uplink: UplinkSpec) -> bool:
        """Only the uplink's pass-through flows (the Node's own way out, when its uplink is on the
        bridge), without a pass: when the source cannot list.  Idempotent; whether any were put
        back.  An exception is logged; the pass reports the source's error."""
        ...

    def policy_flows(self) -> list[DumpedFlow]:
        """The installed NetworkPolicy flows with their counters (read-only).  An exception is
        logged (debug); the counters are not read this time."""
        ...

    def retry_tunnel_neighbours(self, now: float | None = None) -> list[tuple[str, str]]:
        """Between passes: probe the last apply's unresolved tunnel next hops again (rate-limited
        by the applier; ``now``: a monotonic time, for tests) and write those the kernel now
        knows into OVS's cache; what was written.  Idempotent.  An exception is logged; the next
        full pass tries again."""
        ...

    def wireguard_generation(self) -> int:
        """The WireGuard device's generation (its ifindex; 0: none, or no encryption): a new one
        (the device made again) makes the next pass full."""
        ...

    def wireguard_implementation(self) -> str | None:
        """kernel | userspace (None: no encryption)."""
        ...

    def switch_wireguard(self, spec: WgSpec) -> None:
        """Between passes, at a key rotation's switch time: the WireGuard device to ``spec`` (its
        difference from what the last pass applied), nothing else."""
        ...

    def ovs_generation(self) -> int:
        """Which ovs-vswitchd instance runs (one number per instance; 0: none): a change means its
        flows are gone and the next pass is full.  An exception is logged and asked again at the
        next look (``OVS_CHECK_INTERVAL``)."""
        ...

    def ovs_restoring(self) -> bool:
        """True while ovs-vswitchd's flows are being put back by whoever restarted it
        (``other_config:flow-restore-wait`` set: Ferry's openvswitch container, or the host's
        ``ovs-ctl restart``): a new instance's full pass waits until it is cleared, then finds
        the restored flows and changes only what differs.  Exceptions are taken as False."""
        ...

    def teardown(self, config: Config) -> None:
        """Undo everything route-sync installed (``ferry-route-sync teardown``); idempotent."""
        ...

    def close(self) -> None:
        """Release sockets and threads; nothing installed is undone."""
        ...


class DaemonObserver(Protocol):
    """What the daemon reports to (``routesync.metrics.Observer``; :class:`NullObserver`: every
    method, doing nothing).  Called from the daemon's thread; must not raise into the loop."""

    def tick(self) -> None:
        """Every loop iteration (liveness)."""
        ...

    def reconciled(self, result: ReconcileResult, desired: DesiredState | None) -> None:
        """After every pass; ``desired`` the applied state, None when the pass failed."""
        ...

    def change_applied(self, seconds: float) -> None:
        """A Node change seen by the source, applied ``seconds`` later."""
        ...

    def mac_disagreement(self, peer: str) -> None:
        """Fast path, macSource both: ``peer``'s annotation and neighbour MAC started to differ."""
        ...

    def pods_synced(self, report: PodSyncReport) -> None:
        """One pass of :meth:`Appliers.sync_pods` over the running Pods."""
        ...

    def policy_planned(self, plan: policy_plan.Plan) -> None:
        """NetworkPolicy planned again (the cluster's Pods, Namespaces or policies moved)."""
        ...

    def policy_counters(self, plan: policy_plan.Plan, flows: list[DumpedFlow]) -> None:
        """Every ``routesync.policy.node.DENIED_LOG_INTERVAL`` s: the policy flows with their counters."""
        ...

    def policy_drift_repaired(self, what: str) -> None:
        """A full pass found the incremental policy plan (or the objects it holds) off the full
        planner's and repaired it (``what``: what drifted)."""
        ...


class NullObserver:
    """A :class:`DaemonObserver` that records nothing (a base for observers that want a few)."""

    def tick(self) -> None:
        pass

    def reconciled(self, result: ReconcileResult, desired: DesiredState | None) -> None:
        pass

    def change_applied(self, seconds: float) -> None:
        pass

    def mac_disagreement(self, peer: str) -> None:
        pass

    def pods_synced(self, report: PodSyncReport) -> None:
        pass

    def policy_planned(self, plan: policy_plan.Plan) -> None:
        pass

    def policy_counters(self, plan: policy_plan.Plan, flows: list[DumpedFlow]) -> None:
        pass

    def policy_drift_repaired(self, what: str) -> None:
        pass


@dataclass
class ReconcileResult:
    ok: bool
    duration: float
    peers: int = 0
    state_written: bool = False
    error: str | None = None


class Daemon:
    def __init__(self, config: Config, source: NodeSource, appliers: Appliers,
                 clock: Callable[[], float] = time.monotonic, observer: DaemonObserver | None = None,
                 bgp: BgpSpeaker | None = None, policy: PolicyInputs | None = None,
                 remote_sources: Callable[[Mapping[str, tuple[str, tuple[str, ...]]]], None] | None = None) -> None:
        self.config = config
        # NetworkPolicy (routesync.policy.node) from the cluster's Pods/Namespaces/policies
        # (routesync.policy.watch); None: off.  ``remote_sources``: the per-connection denied
        # log's naming of remote Pods (DeniedLog.set_remote), fed each plan
        self.policy = None if policy is None else PolicyNode(config, policy, observer, remote_sources, clock)
        self._host_path_for: int | None = None  # ovs-vswitchd instance the uplink flows were put back for
        self._restore_seen: tuple[int, float, bool] | None = None  # (instance, since, warned): flow-restore-wait
        self.bgp = bgp  # the BGP speaker (bgp section); None: no BGP
        self.observer = observer  # metrics + health (routesync.metrics.Observer); None: off
        self.source = source
        self.appliers = appliers
        self.clock = clock
        self.stop = threading.Event()
        self.last_state: nodestate.NodeState | None = None
        self.last_desired: DesiredState | None = None
        self.reconciles = 0
        self.failures = 0
        # Node change seen → applied, seconds (the latest 1,000).
        self.change_latencies: collections.deque[float] = collections.deque(maxlen=1000)
        # fast path: the kernel's next hops (``Appliers.next_hops``; None: fast path off) and,
        # with macSource both, annotation/neighbour disagreements seen (a counter for metrics;
        # each (peer, family, annotation MAC, neighbour MAC) counted once when it starts).
        self.next_hops: NextHopSource | None = appliers.next_hops if config.fast_path else None
        self.mac_disagreements = 0
        self._disagreeing: set[MacDisagreement] = set()
        self._conflicts: tuple[CidrConflict, ...] | None = None  # the Pod CIDR conflicts last reported
        self._memo = planner.PeerMemo()
        self._state_rows: dict[int, tuple[PeerPlan, nodestate.Peer]] = {}  # planner.node_state's rows
        # an incremental pass's state, written once the loop is idle (or overdue)
        self._state_pending: nodestate.NodeState | None = None
        self._state_pending_since = 0.0
        self._state_written: nodestate.NodeState | None = None  # what the file holds, when known
        self._state_cost = 0.0  # seconds the last write took
        # the last full-or-incremental pass's inputs to prepare and its answer (reused by
        # incremental passes while this Node's own record is the same)
        self._prepared: tuple[NodeRecord | None, LocalFacts] | None = None
        self._pods_key: tuple | None = None  # cni.pipeline.podnet.state_key the Pods were converged to
        self.pod_syncs: collections.deque[tuple[int, float]] = collections.deque(maxlen=100)  # (updated, s)
        # trafficEncryptionMode wireguard: the keys, each pass's WireGuard plan (routesync.wireguard)
        self.wireguard: WireGuardNode | None = None
        if config.encrypted:
            from .wireguard.node import WireGuardNode

            self.wireguard = WireGuardNode(config)
        self.wall_clock: Callable[[], float] = time.time  # the key rotation's switch times are wall-clock
        self._wg_ahead: tuple[float, WgSpec] | None = None  # (switch time, the device then): see run()

    # -- one pass ------------------------------------------------------------------------------
    def reconcile(self, full: bool = True) -> ReconcileResult:
        """One pass; ``full`` False: incremental (see the module's docstring)."""
        t0 = self.clock()
        cfg = self.config
        try:
            try:
                nodes = self.source.list()
            except SourceError:
                self._restore_host_path()
                raise
            local = next((n for n in nodes if n.name == cfg.node_name), None)
            prepared = self._prepared
            self._prepared = None
            if not full and prepared is not None and prepared[0] == local:
                facts = prepared[1]
            else:
                base = local or NodeRecord(cfg.node_name, (), cfg.pod_cidrs)
                gw = planner.gateway_addresses(cfg, base)
                facts = self.appliers.prepare(cfg, planner.tunnel_spec(cfg), planner.uplink_spec(cfg, base), gw)
            me = planner.self_record(cfg, local, facts)
            peers = [n for n in nodes if n.name != cfg.node_name]
            wg = None
            if self.wireguard is not None:
                from .wireguard.plan import annotate

                wg = self.wireguard.plan_for(me, peers, self.wall_clock())
                me = replace(me, annotations=annotate(dict(me.annotations), wg))
            if me != local:
                self.source.publish_self(me)
            hops = None
            if self.next_hops is not None:
                self.next_hops.changed.clear()  # what changes from here on is seen by this pass or the next
                hops = self.next_hops.resolve(planner.fast_candidates(cfg, peers, facts))
            desired = planner.plan(cfg, me, peers, facts, hops, memo=self._memo)
            desired.full = full
            policies = None
            pending_namespaces: list[str] = []
            if self.policy is not None:
                step = self.policy.step(desired.gateway_addresses, facts, full)
                policies = step.plan
                desired.flows = desired.flows + step.flows
                pending_namespaces = step.namespaces
                desired.policy_namespaces = tuple(pending_namespaces)
                desired.policy_nft = step.nft
            self._count_disagreements(desired)
            self._report_conflicts(desired.cidr_conflicts)
            if wg is not None and self.wireguard is not None:
                desired.wireguard = self.wireguard.spec(wg, desired.gateway_addresses, desired.mtu)
            self.appliers.apply(desired)
            if wg is not None and self.wireguard is not None:
                names = {dict(n.annotations).get(PUBLIC_KEY_ANNOTATION, ""): n.name for n in peers}
                replaced = {p.peer: p.fallback for p in desired.peers if p.fallback is not None}
                self.wireguard.applied(wg, self.appliers.wireguard_implementation(), names, replaced)
                ahead = self.wireguard.plan_ahead(me, peers, wg)
                self._wg_ahead = None if ahead is None else (
                    ahead[0], self.wireguard.spec(ahead[1], desired.gateway_addresses, desired.mtu))
            if policies is not None:
                self.appliers.release_pending(policies.local_pods, full)
            state = planner.node_state(cfg, me, desired, facts, self._state_rows,
                                       pending_namespaces if policies is not None else [])
            written = self._write_state(state, full)
            self._sync_pods(state, full)
            if self.bgp is not None:  # advertise this Node's Pod CIDRs (a no-op when they are the same)
                self.bgp.want(planclaims.advertised(me.pod_cidrs, desired.cidr_conflicts, me.name),
                              facts.uplink_addresses)
            self.last_desired = desired
            self._prepared = (local, facts)
            self.reconciles += 1
            return ReconcileResult(True, self.clock() - t0, len(peers), written)
        except Exception as e:
            self.failures += 1
            level = logging.INFO if isinstance(e, (planner.PlanError, SourceError)) else logging.ERROR
            log.log(level, "reconcile failed (%s: %s); will retry", type(e).__name__, e,
                    exc_info=level == logging.ERROR)
            return ReconcileResult(False, self.clock() - t0, error=f"{type(e).__name__}: {e}")

    def _switch_wireguard(self) -> None:
        """A key rotation's switch time: the device as the last pass planned it for that instant."""
        assert self._wg_ahead is not None
        at, spec = self._wg_ahead
        self._wg_ahead = None
        try:
            self.appliers.switch_wireguard(spec)
            log.info("WireGuard: switched at the rotation's instant (%.1f ms after it)",
                     (self.wall_clock() - at) * 1e3)
        except Exception as e:  # noqa: BLE001 - the pass right after applies it again
            log.warning("WireGuard: the rotation's switch not applied ahead of the pass: %s", e)

    def _wireguard_generation(self) -> int:
        if self.wireguard is None:
            return 0
        try:
            return self.appliers.wireguard_generation()
        except Exception as e:  # noqa: BLE001 - the next look tries again
            log.warning("cannot read the WireGuard device's generation: %s", e)
            return 0

    def _restore_host_path(self) -> None:
        """The Node's own way out when it runs through the bridge (the uplink moved onto it),
        without a pass: when the source cannot list (the API server not reached) after
        ovs-vswitchd lost its flows, the Node would otherwise never reach the API server that
        a pass needs.  Once per ovs-vswitchd instance."""
        spec = planner.uplink_spec(self.config)
        if spec is None:
            return
        try:
            gen = self.appliers.ovs_generation()
            if gen == self._host_path_for:
                return
            if self.appliers.restore_host_path(spec):
                log.warning("source not listed yet: the uplink's pass-through flows put back so the Node "
                            "reaches its API server")
            self._host_path_for = gen
        except Exception as e:  # noqa: BLE001 - the pass reports the source's error; this one is logged
            log.warning("cannot restore the uplink's pass-through flows: %s", e)

    def _retry_tunnel_neighbours(self) -> None:
        """Tunnel next hops that did not answer (a peer not up yet; on a tagged underlay, one
        whose route-sync does not tag yet) are asked again between passes, not only at the next
        full one: OVS learns no IPv6 next hop itself, so until then that tunnel is dark."""
        try:
            self.appliers.retry_tunnel_neighbours()
        except Exception as e:  # noqa: BLE001 - the next full pass tries again
            log.info("tunnel neighbours not retried: %s", e)

    @property
    def policy_plan(self) -> policy_plan.Plan | None:
        """The NetworkPolicy plan of the last pass (None: policy off, or not planned yet)."""
        return None if self.policy is None else self.policy.plan

    def _log_denied(self) -> None:
        if self.policy is not None:
            self.policy.tick(self.appliers)

    def _sync_pods(self, state: nodestate.NodeState, full: bool) -> None:
        """Running Pods to the state's per-path MTUs (``appliers.sync_pods``), when what decides
        them changed, and on full passes (drift).  The state file is on disk first: an ADD that
        read the older one notices the newer and converges its own Pod (``cni.commands.add.add``)."""
        from cni.pipeline import podnet

        key = podnet.state_key(state)
        if not full and key == self._pods_key:
            return
        if self._state_pending is not None:
            self.flush_state()
        t0 = self.clock()
        report = self.appliers.sync_pods(state, full)
        took = self.clock() - t0
        self.pod_syncs.append((report.updated, took))
        if report.updated or report.failed:
            log.info("Pods to the paths' MTUs in %.1f ms: %d updated, %d unchanged, %d skipped, %d failed",
                     took * 1e3, report.updated, report.unchanged, report.skipped, report.failed)
        if self.observer is not None:
            self.observer.pods_synced(report)
        self._pods_key = key if not report.failed else None

    def _count_disagreements(self, desired: DesiredState) -> None:
        now = set(desired.mac_disagreements)
        for d in sorted(now - self._disagreeing, key=repr):
            log.warning("next-hop MAC of %s (IPv%d): annotation says %s, the neighbour table %s; "
                        "using the annotation", d.peer, d.family, d.annotation, d.neighbor)
            self.mac_disagreements += 1
            if self.observer is not None:
                self.observer.mac_disagreement(d.peer)
        self._disagreeing = now

    def _report_conflicts(self, found: tuple[CidrConflict, ...]) -> None:
        """Pod CIDRs two Nodes claim (``routesync.planclaims``): a log line when one starts and
        when it ends (not every pass), and the status file ``show`` reads, written when the set
        changes (and on the first pass, so an earlier run's does not linger)."""
        before = self._conflicts
        if found == before:
            return
        name = self.config.node_name
        for c in sorted(set(found) - set(before or ()), key=repr):
            log.warning("%s", conflicts_mod.describe(c, name))
        for c in sorted(set(before or ()) - set(found), key=repr):
            log.info("Pod CIDR conflict over: %s of %s no longer overlaps %s of %s", c.cidr, c.node, c.owner_cidr,
                     c.owner)
        try:
            conflicts_mod.write(self.config.state_file, found)
        except OSError as e:
            log.warning("Pod CIDR conflicts not written for show: %s", e)
        self._conflicts = found

    def _wait_for_change(self, timeout: float) -> bool:
        """The source's changes, and (fast path) the neighbour table's."""
        if self.next_hops is None:
            return self.source.wait_for_change(timeout)
        deadline = self.clock() + timeout
        while True:
            if self.next_hops.changed.is_set():
                return True
            left = deadline - self.clock()
            if self.source.wait_for_change(max(0.0, min(NEIGH_POLL, left))):
                return True
            if left <= NEIGH_POLL:
                return self.next_hops.changed.is_set()

    def _write_state(self, state: nodestate.NodeState, full: bool = True) -> bool:
        """Full passes write the file before returning, unless it already holds ``state``; so
        do incremental ones while a write is cheap (the last took < ``STATE_CHEAP``).  Otherwise
        an incremental pass leaves a changed state pending: the loop writes it when no further
        change came for ``STATE_IDLE`` s, and at the latest ``STATE_MAX_DELAY`` s later (the
        file costs ~55 ms at 1,000 peers, ~300 ms at 5,000; what the plugin reads from it does
        not change in such passes, only the per-peer list does)."""
        if not full and self._state_cost >= STATE_CHEAP:
            if state == self.last_state:
                return False
            if self._state_pending is None:
                self._state_pending_since = self.clock()
            self._state_pending = self.last_state = state
            return True
        self._state_pending = None
        self.last_state = state
        if state == self._state_written:
            return False
        if self._state_written is None:  # an earlier run may have written the same
            try:
                if nodestate.read(self.config.state_file) == state:
                    self._state_written = state
                    return False
            except nodestate.StateError:
                pass
        self._state_written = None
        t0 = self.clock()
        nodestate.write(state, self.config.state_file)
        self._state_cost = self.clock() - t0
        self._state_written = state
        log.info("state file %s written (%d peers, mtu %d)", self.config.state_file, len(state.peers), state.mtu)
        return True

    def flush_state(self) -> None:
        """Write the state an incremental pass left pending (errors are logged; the next full
        pass writes the file again)."""
        state, self._state_pending = self._state_pending, None
        if state is None or state == self._state_written:
            return
        self._state_written = None
        t0 = self.clock()
        try:
            nodestate.write(state, self.config.state_file)
            self._state_cost = self.clock() - t0
            self._state_written = state
        except OSError as e:
            log.error("state file %s not written: %s", self.config.state_file, e)

    # -- the loop ------------------------------------------------------------------------------
    def _restoring(self, gen: int) -> bool:
        """ovs-vswitchd instance ``gen``'s flows are being restored (flow-restore-wait set), for
        at most RESTORE_WAIT_MAX from when this was first seen of ``gen``."""
        try:
            waiting = bool(self.appliers.ovs_restoring())
        except Exception as e:  # noqa: BLE001
            log.warning("cannot read flow-restore-wait: %s", e)
            waiting = False
        if not waiting:
            if self._restore_seen is not None:
                log.info("ovs-vswitchd's flows restored (flow-restore-wait cleared) after %.0f ms",
                         (self.clock() - self._restore_seen[1]) * 1e3)
                self._restore_seen = None
            return False
        now = self.clock()
        if self._restore_seen is None or self._restore_seen[0] != gen:
            log.info("ovs-vswitchd (generation %s) waits for its flows to be restored (flow-restore-wait): "
                     "holding the full pass", gen)
            self._restore_seen = (gen, now, False)
        _, since, warned = self._restore_seen
        if now - since <= RESTORE_WAIT_MAX:
            return True
        if not warned:
            log.warning("flow-restore-wait still set after %.0f s: re-installing anyway", RESTORE_WAIT_MAX)
            self._restore_seen = (gen, since, True)
        return False

    def run(self) -> None:
        cfg = self.config
        self.source.start()
        dirty = True
        change_seen: float | None = None
        backoff = BACKOFF_MIN
        retry_at = 0.0
        next_resync = 0.0
        full = True  # the next pass must be full (first, after a failure, ovs-vswitchd restarted)
        try:
            ovs_gen = self.appliers.ovs_generation()
        except Exception:  # noqa: BLE001
            ovs_gen = 0
        if ovs_gen and self._restoring(ovs_gen):
            # started beside a restore (both containers restarted): the first pass adds what it
            # wants; once the restore is done, the pass of a "new" instance removes what is stale
            ovs_gen = 0
        next_ovs_check = self.clock() + OVS_CHECK_INTERVAL
        wg_gen = self._wireguard_generation()
        try:
            while not self.stop.is_set():
                if self.observer:
                    self.observer.tick()
                now = self.clock()
                if (dirty and now >= retry_at) or now >= next_resync:
                    full = full or now >= next_resync
                    result = self.reconcile(full=full)
                    if self.observer:
                        self.observer.reconciled(result, self.last_desired if result.ok else None)
                    now = self.clock()
                    if result.ok:
                        if self.reconciles == 1:
                            log.info("first reconcile done in %.1f ms (%d peers)", result.duration * 1e3,
                                     result.peers)
                        if change_seen is not None:
                            self.change_latencies.append(now - change_seen)
                            if self.observer:
                                self.observer.change_applied(now - change_seen)
                            log.debug("change applied in %.1f ms", (now - change_seen) * 1e3)
                        if full:  # the periodic re-assertion counts from the last full pass
                            next_resync = now + cfg.resync_seconds
                        dirty, change_seen, backoff, full = False, None, BACKOFF_MIN, False
                    else:
                        dirty, retry_at, full = True, now + backoff, True
                        backoff = min(backoff * 2, BACKOFF_MAX)
                        next_resync = now + cfg.resync_seconds
                deadline = min(next_resync, next_ovs_check, retry_at if dirty else next_resync)
                wake = self._wg_ahead[0] if self._wg_ahead is not None else None
                if wake is not None:  # a key rotation's switch: on time, not at the next look
                    deadline = min(deadline, self.clock() + max(0.0, wake - self.wall_clock()))
                pending = self._state_pending is not None
                if pending:
                    deadline = min(deadline, self.clock() + STATE_IDLE,
                                   self._state_pending_since + STATE_MAX_DELAY)
                changed = self._wait_for_change(max(0.0, deadline - self.clock()))
                if self._wg_ahead is not None and self.wall_clock() >= self._wg_ahead[0]:
                    self._switch_wireguard()
                    dirty = True  # the pass of the new instant: publish, finish the rotation
                if pending and (not changed or self.clock() >= self._state_pending_since + STATE_MAX_DELAY):
                    self.flush_state()
                if changed:
                    if change_seen is None:
                        change_seen = self.clock()
                    self.stop.wait(DEBOUNCE)
                    dirty = True  # a pending retry keeps its backoff: a change does not cut it short
                self._log_denied()
                if self.wireguard is not None and self.wireguard.due(self.wall_clock()):
                    dirty = True
                if self.clock() >= next_ovs_check:
                    next_ovs_check = self.clock() + OVS_CHECK_INTERVAL
                    try:
                        gen = self.appliers.ovs_generation()
                    except Exception as e:  # noqa: BLE001
                        log.warning("cannot read the ovs-vswitchd generation: %s", e)
                        continue
                    if gen != ovs_gen and not self._restoring(gen):
                        log.warning("ovs-vswitchd restarted (generation %s -> %s): re-installing", ovs_gen, gen)
                        ovs_gen, dirty, retry_at, full = gen, True, 0.0, True
                    now_wg = self._wireguard_generation()
                    if now_wg != wg_gen:
                        if wg_gen:
                            log.warning("WireGuard device gone or made again (ifindex %s -> %s): re-installing",
                                        wg_gen, now_wg)
                        wg_gen, dirty, retry_at, full = now_wg, True, 0.0, True
                    self._retry_tunnel_neighbours()
        finally:
            self.flush_state()  # what an incremental pass left pending is on disk when run() returns
