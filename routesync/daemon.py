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
is no longer wanted is removed.

What rides a pass beside the routes reaches the loop through one seam each: BGP through
:class:`BgpSpeaker`, WireGuard and NetworkPolicy as features (``routesync.feature``: called in
each pass, and between passes at each look and when they ask to be woken).  Between passes the
loop sleeps until the earliest of its wake-ups, a declared list of (next time, action) (:class:`Wake`):
each feature's own, the state file an incremental pass left pending (``routesync.statefile``),
a change the source saw, the look every ``OVS_CHECK_INTERVAL`` (the features' ticks, then
ovs-vswitchd's: ``routesync.ovswatch``) and the next pass (a change, a retry, the resync)."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from . import planclaims, planner
from .feature import Feature, Need
from .findings import Findings, MacObserver
from .heap import HeapSettler
from .model import DesiredState, LocalFacts, NextHop, NodeRecord, TunnelSpec, UplinkSpec
from .ovswatch import OvsAppliers, OvsWatch
from .podinputs import PodInputsTracker
from .policy.node import NullPolicyObserver, PolicyAppliers, PolicyInputs, PolicyNode, PolicyObserver
from .recordlist import OwnSplit
from .sources import NodeSource, SourceError
from .statefile import StateFile
from .wireguard.loop import WireGuardAppliers, WireGuardLoop

if TYPE_CHECKING:
    from cni.node.nodestate import NodeState
    from cni.pipeline.podnet import PodInputs

    from .apply.pods import PodSyncReport
    from .config import Config
    from .policy.plan import Plan

log = logging.getLogger(__name__)

DEBOUNCE = 0.005  # seconds: collect a burst of changes into one reconcile
OVS_CHECK_INTERVAL = 0.25  # s between the loop's looks (ovs-vswitchd's pidfile: a read and an fstat, ~20 us)
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


class Appliers(OvsAppliers, PolicyAppliers, WireGuardAppliers, Protocol):
    """What the daemon drives: ``routesync.apply.NodeAppliers`` (built by ``make_appliers``), the
    test stand-ins (``tests/routesync/standins.py``) and the benchmark's wrapper.  The methods
    below are the passes' own; each feature declares its part beside it (ovs-vswitchd's:
    ``routesync.ovswatch``, the features': ``routesync.feature``).  Every method is called from the
    daemon's one thread, never two at once.  Unless a method says otherwise, an exception fails
    the pass: it is logged, the pass is retried with backoff, and the retry is full."""

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

    def sync_pods(self, state: NodeState, full: bool) -> PodSyncReport:
        """Running Pods to the per-path MTUs and routes of ``state`` (already on disk).  Delta: the
        Pods whose plan changed and new ones; ``full``: every Pod (idempotent).  A Pod that fails
        or is gone is counted in the report, not raised; an exception is the whole sync failing."""
        ...

    def teardown(self, config: Config) -> None:
        """Undo everything route-sync installed (``ferry-route-sync teardown``); idempotent."""
        ...

    def close(self) -> None:
        """Release sockets and threads; nothing installed is undone."""
        ...


class DaemonObserver(MacObserver, PolicyObserver, Protocol):
    """What the daemon reports to (``routesync.metrics.Observer``; :class:`NullObserver`: every
    method, doing nothing); the parts the features and the findings report to are declared beside
    them.  Called from the daemon's thread; must not raise into the loop."""

    def tick(self) -> None:
        """Every loop iteration (liveness)."""
        ...

    def reconciled(self, result: ReconcileResult, desired: DesiredState | None) -> None:
        """After every pass; ``desired`` the applied state, None when the pass failed."""
        ...

    def change_applied(self, seconds: float) -> None:
        """A Node change seen by the source, applied ``seconds`` later."""
        ...

    def pods_synced(self, report: PodSyncReport) -> None:
        """One pass of :meth:`Appliers.sync_pods` over the running Pods."""
        ...


class NullObserver(NullPolicyObserver):
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


@dataclass
class ReconcileResult:
    ok: bool
    duration: float
    peers: int = 0
    state_written: bool = False
    error: str | None = None


@dataclass(frozen=True)
class Wake:
    """One reason the loop wakes: ``at`` its next time (the loop's clock; None: none now) and
    ``then`` what is done once that time has come; ``idle``: also done as soon as a wait ends
    without a change."""

    at: Callable[[], float | None]
    then: Callable[[], None]
    idle: bool = False


@dataclass
class Loop:
    """The loop's state between its wake-ups (the loop's clock)."""

    resync: float  # s between full passes (resyncSeconds)
    dirty: bool = True  # a pass is wanted (at retry_at)
    full: bool = True  # the next pass must be full (first, after a failure, ovs-vswitchd restarted)
    retry_at: float = 0.0
    backoff: float = BACKOFF_MIN
    next_resync: float = 0.0
    next_look: float = 0.0
    changed_at: float | None = None  # the last wait ended with a change (not handled yet)
    change_seen: float | None = None  # the first change the next pass applies

    def need(self, need: Need) -> None:
        if need >= Need.PASS:
            self.dirty = True  # a pending retry keeps its backoff
        if need >= Need.FULL:
            self.retry_at, self.full = 0.0, True

    def pass_at(self) -> float:
        return min(self.next_resync, self.retry_at) if self.dirty else self.next_resync

    def passed(self, ok: bool, now: float) -> None:
        if ok:
            if self.full:  # the periodic re-assertion counts from the last full pass
                self.next_resync = now + self.resync
            self.dirty, self.change_seen, self.backoff, self.full = False, None, BACKOFF_MIN, False
        else:
            self.dirty, self.retry_at, self.full = True, now + self.backoff, True
            self.backoff = min(self.backoff * 2, BACKOFF_MAX)
            self.next_resync = now + self.resync


class Daemon:
    def __init__(self, config: Config, source: NodeSource, appliers: Appliers,
                 clock: Callable[[], float] = time.monotonic, observer: DaemonObserver | None = None,
                 bgp: BgpSpeaker | None = None, policy: PolicyInputs | None = None,
                 remote_sources: Callable[[Mapping[str, tuple[str, tuple[str, ...]]]], None] | None = None,
                 settle_heap: bool = False) -> None:
        self.config = config
        self.bgp = bgp  # the BGP speaker (bgp section); None: no BGP
        self.observer = observer  # metrics + health (routesync.metrics.Observer); None: off
        self.source = source
        self.appliers = appliers
        self.clock = clock
        self.stop = threading.Event()
        # what rides each pass beside the routes (routesync.feature), in the order they are called:
        # WireGuard (trafficEncryptionMode wireguard), NetworkPolicy from the cluster's objects
        # (``policy``: routesync.policy.watch; None: off; ``remote_sources``: the denied log's
        # naming of remote Pods, DeniedLog.set_remote, fed each plan)
        self.features: tuple[Feature, ...] = (
            *([WireGuardLoop(config, appliers)] if config.encrypted else []),
            *([] if policy is None else [PolicyNode(config, policy, appliers, observer, remote_sources, clock)]))
        self.ovs = OvsWatch(appliers, clock)  # ovs-vswitchd between passes
        self.state = StateFile(config, clock)  # the node state file the plugin reads
        self.findings = Findings(config, observer)  # MAC disagreements, Pod CIDR conflicts: logged, counted
        self.last_desired: DesiredState | None = None
        self.reconciles = 0
        self.failures = 0
        # Node change seen → applied, seconds (the latest 1,000).
        self.change_latencies: collections.deque[float] = collections.deque(maxlen=1000)
        # fast path: the kernel's next hops (``Appliers.next_hops``; None: fast path off)
        self.next_hops: NextHopSource | None = appliers.next_hops if config.fast_path else None
        self._memo = planner.PeerMemo()
        # after each full pass, what it built frozen out of the collector's scans (the process is
        # the daemon's: the CLI turns it on; routesync.heap)
        self.heap = HeapSettler() if settle_heap else None
        self._own_split = OwnSplit()  # this Node's record apart from the peers, by what changed
        # the last full-or-incremental pass's inputs to prepare and its answer (reused by
        # incremental passes while this Node's own record is the same)
        self._prepared: tuple[NodeRecord | None, LocalFacts] | None = None
        self._pod_inputs = PodInputsTracker()  # what decides the Pods, kept across passes
        self._pods_key: PodInputs | None = None  # what the Pods were converged to
        self.pod_syncs: collections.deque[tuple[int, float]] = collections.deque(maxlen=100)  # (updated, s)

    @property
    def policy(self) -> PolicyNode | None:
        """NetworkPolicy (routesync.policy.node); None: off."""
        return next((f for f in self.features if isinstance(f, PolicyNode)), None)

    @property
    def policy_plan(self) -> Plan | None:
        """The NetworkPolicy plan of the last pass (None: policy off, or not planned yet)."""
        return None if self.policy is None else self.policy.plan

    @property
    def mac_disagreements(self) -> int:
        """Fast path, macSource both: annotation/neighbour disagreements seen (each (peer, family,
        annotation MAC, neighbour MAC) counted once when it starts)."""
        return self.findings.mac_disagreements

    # -- one pass ------------------------------------------------------------------------------
    def reconcile(self, full: bool = True) -> ReconcileResult:
        """One pass; ``full`` False: incremental (see the module's docstring)."""
        t0 = self.clock()
        cfg = self.config
        try:
            try:
                nodes = self.source.list()
            except SourceError:
                self.ovs.restore_host_path(cfg)
                raise
            local, peers = self._own_split.split(nodes, cfg.node_name)
            prepared = self._prepared
            self._prepared = None
            if not full and prepared is not None and prepared[0] == local:
                facts = prepared[1]
            else:
                base = local or NodeRecord(cfg.node_name, (), cfg.pod_cidrs)
                gw = planner.gateway_addresses(cfg, base)
                facts = self.appliers.prepare(cfg, planner.tunnel_spec(cfg), planner.uplink_spec(cfg, base), gw)
                if facts.uplink_moved:  # the API server's watches were opened over the uplink before
                    self.source.reconnect()
                    if self.policy is not None:
                        self.policy.reconnect()
            me = planner.self_record(cfg, local, facts)
            for f in self.features:
                me = f.own_record(me, peers)
            if me != local:
                self.source.publish_self(me)
            hops = None
            if self.next_hops is not None:
                self.next_hops.changed.clear()  # what changes from here on is seen by this pass or the next
                hops = self.next_hops.resolve(planner.fast_candidates(cfg, peers, facts))
            desired = planner.plan(cfg, me, peers, facts, hops, memo=self._memo)
            desired.full = full
            for f in self.features:
                f.desire(desired, facts)
            self.findings.report(desired)
            self.appliers.apply(desired)
            for f in self.features:
                f.applied(me, peers, desired)
            state = self.state.state(me, desired, facts)
            written = self.state.write(state, full)
            self._sync_pods(state, desired, full)
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

    def _sync_pods(self, state: NodeState, desired: DesiredState, full: bool) -> None:
        """Running Pods to the state's per-path MTUs (``appliers.sync_pods``), when what decides
        them changed, and on full passes (drift).  The state file is on disk first: an ADD that
        read the older one notices the newer and converges its own Pod (``cni.commands.add.add``)."""
        key = self._pod_inputs.inputs(state, desired.nft.cluster_pod_cidrs, desired.nft.cluster_changes)
        if not full and key == self._pods_key:
            return
        self.state.flush()
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

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        self.source.start()
        self.ovs.start()
        for f in self.features:
            f.start()
        loop = Loop(self.config.resync_seconds, next_look=self.clock() + OVS_CHECK_INTERVAL)
        wakes = [  # in the order they are done once due
            *(self._feature_wake(f, loop) for f in self.features),
            Wake(self.state.flush_at, self.state.flush, idle=True),
            Wake(lambda: loop.changed_at, lambda: self._changed(loop)),
            Wake(lambda: loop.next_look, lambda: self._look(loop)),
            Wake(loop.pass_at, lambda: self._pass(loop)),
        ]
        try:
            while not self.stop.is_set():
                if self.observer:
                    self.observer.tick()
                for w in wakes:
                    t = w.at()
                    if t is not None and (self.clock() >= t or (w.idle and loop.changed_at is None)):
                        w.then()
                deadline = min(t for w in wakes if (t := w.at()) is not None)
                if self._wait_for_change(max(0.0, deadline - self.clock())):
                    loop.changed_at = self.clock()
        finally:
            self.state.flush()  # what an incremental pass left pending is on disk when run() returns

    def _feature_wake(self, feature: Feature, loop: Loop) -> Wake:
        """A feature's tick, when it asks for one sooner than the next look."""
        def at() -> float | None:
            seconds = feature.wake_in()
            return None if seconds is None else self.clock() + seconds

        return Wake(at, lambda: loop.need(feature.tick()))

    def _pass(self, loop: Loop) -> None:
        loop.full = loop.full or self.clock() >= loop.next_resync
        full = loop.full
        result = self.reconcile(full=full)
        if result.ok and full and self.heap is not None:
            self.heap.settle()
            log.debug("heap settled after a full pass: %d objects frozen in %.1f ms", self.heap.frozen,
                      self.heap.seconds * 1e3)
        if self.observer:
            self.observer.reconciled(result, self.last_desired if result.ok else None)
        now = self.clock()
        if result.ok and self.reconciles == 1:
            log.info("first reconcile done in %.1f ms (%d peers)", result.duration * 1e3, result.peers)
        if result.ok and loop.change_seen is not None:
            self.change_latencies.append(now - loop.change_seen)
            if self.observer:
                self.observer.change_applied(now - loop.change_seen)
            log.debug("change applied in %.1f ms", (now - loop.change_seen) * 1e3)
        loop.passed(result.ok, now)

    def _changed(self, loop: Loop) -> None:
        """The source (or the neighbour table) changed: a pass once the burst is in (a pending
        retry keeps its backoff: a change does not cut it short)."""
        loop.changed_at = None
        if loop.change_seen is None:
            loop.change_seen = self.clock()
        self.stop.wait(DEBOUNCE)
        loop.dirty = True

    def _look(self, loop: Loop) -> None:
        """Every OVS_CHECK_INTERVAL between passes: each feature's tick, then ovs-vswitchd's."""
        loop.next_look = self.clock() + OVS_CHECK_INTERVAL
        for f in self.features:
            loop.need(f.tick())
        loop.need(self.ovs.look())
