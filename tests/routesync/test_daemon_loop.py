"""The daemon loop with the real registry source and a recording stand-in for the appliers
(tests/routesync/standins.py; ``routesync.apply.make_appliers`` on a Node; here the loop's own
behaviour: reconcile on change, state file, retry on failure, own record).
The end-to-end run with the real appliers is in the root tests."""

from __future__ import annotations

import statistics
import threading
import time

from cni.node import nodestate
from routesync.config import from_dict
from routesync.daemon import Daemon
from routesync.model import MAC_ANNOTATION, NodeRecord
from routesync.sources.registry import RegistrySource
from tests.routesync.standins import RecordingAppliers
from tests.support.waiting import HANG, until


def start(tmp_path, **kw):  # type: ignore[no-untyped-def]
    cfg = from_dict({"nodeName": "node-a", "podCIDRs": ["10.244.1.0/24"], "stateFile": str(tmp_path / "state.json"),
                     "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg"),
                                    "pollInterval": 0.05}, **kw})
    apl = RecordingAppliers()
    d = Daemon(cfg, RegistrySource(str(tmp_path / "reg"), "node-a", poll_interval=0.05), apl)
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    return d, apl, t


def test_publishes_itself_writes_state_and_follows_peers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # no periodic pass during the test: every change seen is applied because it was seen
    d, apl, t = start(tmp_path, resyncSeconds=3600)
    other = RegistrySource(str(tmp_path / "reg"), "node-b")
    try:
        until(lambda: (tmp_path / "state.json").exists())
        st = nodestate.read(str(tmp_path / "state.json"))
        assert (st.node, st.mtu, st.podCIDRs, st.peers) == ("node-a", 1450, ["10.244.1.0/24"], [])
        mine = {r.name: r for r in other.list()}["node-a"]
        assert mine.transport_addresses == ("192.168.77.11",)
        assert mine.annotation(MAC_ANNOTATION) == "02:00:00:00:00:11"

        latencies = []
        for i in range(10):
            n = len(apl.applied)
            t0 = time.monotonic()
            other.publish_self(NodeRecord("node-b", (f"192.168.77.{50 + i}",), ("10.244.2.0/24",)))
            until(lambda n=n, i=i: len(apl.applied) > n and apl.applied[-1].peers
                  and apl.applied[-1].peers[0].transport_address == f"192.168.77.{50 + i}")
            latencies.append(time.monotonic() - t0)
        print(f"registry change -> applied: p50 {statistics.median(latencies) * 1e3:.0f} ms, "
              f"max {max(latencies) * 1e3:.0f} ms")
        # the state file is written after the apply the loop above saw: it may still hold no peer
        until(lambda: [p.addresses for p in nodestate.read(str(tmp_path / "state.json")).peers]
              == [["192.168.77.59"]])
        n_written = d.reconciles
        mtime = (tmp_path / "state.json").stat().st_mtime_ns
        apl.generation = 2  # "ovs-vswitchd restarted": a full reconcile, state unchanged → not rewritten
        until(lambda: d.reconciles > n_written, "the full pass after the ovs-vswitchd restart")
        assert (tmp_path / "state.json").stat().st_mtime_ns == mtime

        other.remove_self()
        until(lambda: nodestate.read(str(tmp_path / "state.json")).peers == [])
        assert apl.applied[-1].routes == set()
    finally:
        d.stop.set()
        t.join(HANG)
    assert not t.is_alive()


def test_failed_apply_is_retried_with_backoff_not_fatal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "reg").mkdir()
    RegistrySource(str(tmp_path / "reg"), "node-b").publish_self(
        NodeRecord("node-b", ("192.168.77.12",), ("10.244.2.0/24",)))
    cfg_apl = RecordingAppliers()
    cfg_apl.fail_next = 3
    cfg = from_dict({"nodeName": "node-a", "podCIDRs": ["10.244.1.0/24"], "stateFile": str(tmp_path / "s.json"),
                     "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg")}})
    d = Daemon(cfg, RegistrySource(str(tmp_path / "reg"), "node-a"), cfg_apl)
    t = threading.Thread(target=d.run, daemon=True)
    t0 = time.monotonic()
    t.start()
    try:
        until(lambda: cfg_apl.applied, "an apply after the three failures")
        elapsed = time.monotonic() - t0
        assert d.failures == 3
        assert elapsed >= 0.2 + 0.4 + 0.8 - 0.05  # backoff doubled between attempts
        assert not (tmp_path / "s.json").exists() or nodestate.read(str(tmp_path / "s.json")).peers
        until(lambda: (tmp_path / "s.json").exists())
    finally:
        d.stop.set()
        t.join(HANG)


def test_no_pod_cidr_waits_instead_of_crashing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = from_dict({"nodeName": "node-a", "stateFile": str(tmp_path / "s.json"),
                     "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg")}})
    apl = RecordingAppliers()
    d = Daemon(cfg, RegistrySource(str(tmp_path / "reg"), "node-a"), apl)
    r = d.reconcile()
    assert not r.ok and "no Pod CIDR" in (r.error or "")
    assert not (tmp_path / "s.json").exists()
    (tmp_path / "reg" / "node-a.yaml").write_text("name: node-a\npodCIDRs: [10.244.7.0/24]\n")
    assert d.reconcile().ok
    assert nodestate.read(str(tmp_path / "s.json")).podCIDRs == ["10.244.7.0/24"]


class UnlistedSource(RegistrySource):
    """A source whose API server is out of reach (the Node's own path to it is down)."""

    def list(self):  # type: ignore[no-untyped-def]
        from routesync.sources import SourceError

        raise SourceError("Kubernetes Nodes not listed yet")


def test_an_unlistable_source_still_gets_the_uplink_path_back_once_per_vswitchd(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """ovs-vswitchd restarted while route-sync had no Node cache: the uplink (moved onto the
    bridge, encap on netdev) carries the Node's own traffic only with its pass-through flows, and
    the API server is reached only through them: the daemon puts them back before it can plan."""
    cfg = from_dict({"nodeName": "node-a", "podCIDRs": ["10.244.1.0/24"], "stateFile": str(tmp_path / "s.json"),
                     "trafficEncapMode": "encap", "datapathType": "netdev",
                     "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg")}})
    apl = RecordingAppliers()
    restored = apl.restored
    d = Daemon(cfg, UnlistedSource(str(tmp_path / "reg"), "node-a"), apl)
    assert not d.reconcile().ok and not d.reconcile().ok
    assert restored == [(1, "eth0")]  # once for this ovs-vswitchd
    apl.generation = 2  # it restarted: its flows are gone again
    assert not d.reconcile().ok
    assert restored == [(1, "eth0"), (2, "eth0")]
    assert not apl.applied


def test_a_mac_disagreement_is_counted_once_when_it_starts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """macSource both: a peer's annotation and the kernel's neighbour entry name different MACs; the
    daemon reports it to the observer (the metric) once, not on every pass, and again only when a
    disagreement starts anew."""
    from routesync.metrics import Observer, RouteSyncMetrics
    from routesync.model import NextHop
    from tests.routesync.standins import FastPathAppliers

    (tmp_path / "reg").mkdir()
    cfg = from_dict({"nodeName": "node-a", "podCIDRs": ["10.244.1.0/24"], "stateFile": str(tmp_path / "s.json"),
                     "trafficEncapMode": "noEncap", "fastPath": True, "macSource": "both",
                     "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg")}})
    other = RegistrySource(str(tmp_path / "reg"), "node-b")
    other.publish_self(NodeRecord("node-b", ("192.168.77.12",), ("10.244.2.0/24",),
                                  ((MAC_ANNOTATION, "02:00:00:00:00:0a"),)))
    apl = FastPathAppliers({"192.168.77.12": NextHop("192.168.77.12", "02:00:00:00:00:0b")})
    metrics = RouteSyncMetrics()
    d = Daemon(cfg, RegistrySource(str(tmp_path / "reg"), "node-a"), apl, observer=Observer(metrics))

    def counted() -> float:
        return metrics.registry.get_sample_value("ferry_route_sync_mac_source_disagreements_total") or 0.0

    assert d.reconcile().ok and d.reconcile(full=False).ok and d.reconcile().ok
    assert [p.path for p in apl.applied[-1].peers] == ["fast"]
    assert (d.mac_disagreements, counted()) == (1, 1)
    apl.hops.hops["192.168.77.12"] = NextHop("192.168.77.12", "02:00:00:00:00:0a")  # they agree now
    assert d.reconcile().ok and counted() == 1
    apl.hops.hops["192.168.77.12"] = NextHop("192.168.77.12", "02:00:00:00:00:0c")  # a new disagreement
    assert d.reconcile().ok and (d.mac_disagreements, counted()) == (2, 2)


def test_unresolved_tunnel_next_hops_are_retried_between_passes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The loop asks the appliers to retry tunnel next hops that did not answer (on a tagged
    underlay a peer not tagging yet), without a pass: several times while no pass runs."""
    d, apl, t = start(tmp_path, resyncSeconds=3600)
    calls: list[int] = []
    apl.retry_tunnel_neighbours = lambda: calls.append(d.reconciles) or []  # type: ignore[attr-defined]
    try:
        until(lambda: d.reconciles >= 1)
        passes = d.reconciles
        until(lambda: len(calls) >= 3, "three retries")
        assert d.reconciles == passes  # no pass was needed for them
    finally:
        d.stop.set()
        t.join(HANG)


class _Policies:
    """The cluster as policy sees it: node-a's Pod b, isolated for ingress by ns/deny."""

    def __init__(self) -> None:
        from routesync.policy import plan as pp
        from routesync.policy.model import Pod, policy_from

        deny = policy_from({"metadata": {"namespace": "ns", "name": "deny"},
                            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}})
        self.value = pp.Inputs((Pod("ns", "b", "node-a", (), ("10.244.1.5",), ()),), {"ns": ()}, (deny,))

    def generation(self) -> tuple[int, int, int]:
        return (1, 1, 1)

    def inputs(self):  # type: ignore[no-untyped-def]
        return (1, 1, 1), self.value

    def service_cidrs(self, configured: tuple[str, ...]) -> tuple[str, ...]:
        return configured


def test_the_denied_log_flows_only_with_its_meter_on_the_bridge(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The isolation's flows send packets up (controller) only when the appliers made the meter
    and the config has the log on; otherwise the drops are all there is."""
    import dataclasses

    from cni.pipeline.actions import Controller

    class MeterAppliers(RecordingAppliers):
        def __init__(self, meter: bool) -> None:
            super().__init__()
            self.meter = meter

        def prepare(self, *a):  # type: ignore[no-untyped-def]
            return dataclasses.replace(super().prepare(*a), denied_log_meter=self.meter)

    def controllers(meter: bool, **kw) -> int:  # type: ignore[no-untyped-def]
        cfg = from_dict({"nodeName": "node-a", "podCIDRs": ["10.244.1.0/24"],
                         "stateFile": str(tmp_path / f"s{meter}{len(kw)}.json"),
                         "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg")}, **kw})
        apl = MeterAppliers(meter)
        d = Daemon(cfg, RegistrySource(str(tmp_path / "reg"), "node-a"), apl, policy=_Policies())
        assert d.reconcile().ok
        flows = apl.applied[-1].flows
        assert sum(1 for f in flows if f.text().endswith("actions=drop") and "table=51" in f.text()) == 1
        return sum(1 for f in flows for a in f.actions if isinstance(a, Controller))

    assert controllers(True) == 1
    assert controllers(False) == 0  # no meter: no way up for a flood
    assert controllers(True, networkPolicyDeniedLog={"enabled": False}) == 0


def test_each_policy_plan_hands_the_denied_log_its_remote_pods(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A remote Pod isolated for egress (node-b's cli) is judged here; the plan's map of its
    addresses reaches the per-connection log (``remote_sources``), so its lines can name it."""
    import dataclasses

    from routesync.policy import plan as pp
    from routesync.policy.model import Pod, policy_from

    class MeterAppliers(RecordingAppliers):
        def prepare(self, *a):  # type: ignore[no-untyped-def]
            return dataclasses.replace(super().prepare(*a), denied_log_meter=True)

    policies = _Policies()
    out = policy_from({"metadata": {"namespace": "ns", "name": "out"},
                       "spec": {"podSelector": {"matchLabels": {"app": "cli"}}, "policyTypes": ["Egress"]}})
    cli = Pod("ns", "cli", "node-b", (("app", "cli"),), ("10.244.2.7",), ())
    policies.value = pp.Inputs((*policies.value.pods, cli), {"ns": ()}, (*policies.value.policies, out))
    handed: list[dict] = []
    cfg = from_dict({"nodeName": "node-a", "podCIDRs": ["10.244.1.0/24"], "stateFile": str(tmp_path / "s.json"),
                     "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg")}})
    d = Daemon(cfg, RegistrySource(str(tmp_path / "reg"), "node-a"), MeterAppliers(), policy=policies,
               remote_sources=lambda m: handed.append(dict(m)))
    assert d.reconcile().ok
    assert handed == [{"10.244.2.7": ("ns/cli", ("ns/out",))}]


def test_a_new_vswitchd_s_pass_waits_for_its_flows_to_be_restored(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """flow-restore-wait set (the supervisor, or the host's ovs-ctl, is putting the saved flows
    back): the full pass of the new instance waits until it is cleared, then runs once."""
    (tmp_path / "reg").mkdir()
    looked = threading.Semaphore(0)

    class Restoring(RecordingAppliers):
        def ovs_restoring(self) -> bool:
            looked.release()
            return self.restoring

    apl = Restoring()
    cfg = from_dict({"nodeName": "node-a", "podCIDRs": ["10.244.1.0/24"], "stateFile": str(tmp_path / "s.json"),
                     "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg")}})
    d = Daemon(cfg, RegistrySource(str(tmp_path / "reg"), "node-a"), apl)
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    try:
        until(lambda: d.reconciles >= 1 and not d.stop.is_set(), "the first pass")
        until(lambda: len(apl.applied) >= 1, "the first apply")
        n = len(apl.applied)
        while looked.acquire(blocking=False):  # the look at start, restoring nothing
            pass
        apl.restoring = True
        apl.generation = 2
        for _ in range(3):  # the daemon looked three times and held the pass each time
            assert looked.acquire(timeout=HANG)
        assert len(apl.applied) == n
        apl.restoring = False
        until(lambda: len(apl.applied) > n, "the full pass once the flows are restored")
        assert apl.applied[-1].full
    finally:
        d.stop.set()
        t.join(HANG)


def test_a_restore_that_hangs_holds_the_pass_for_a_bounded_time(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from routesync.ovswatch import RESTORE_WAIT_MAX

    now = [100.0]
    apl = RecordingAppliers()
    cfg = from_dict({"nodeName": "node-a", "podCIDRs": ["10.244.1.0/24"], "stateFile": str(tmp_path / "s.json"),
                     "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg")}})
    d = Daemon(cfg, RegistrySource(str(tmp_path / "reg"), "node-a"), apl, clock=lambda: now[0])
    assert d.ovs.restoring(2) is False  # not waiting: nothing held
    apl.restoring = True
    assert d.ovs.restoring(2) is True
    now[0] += RESTORE_WAIT_MAX
    assert d.ovs.restoring(2) is True
    now[0] += 1.0
    assert d.ovs.restoring(2) is False  # given up: route-sync puts its flows back itself
    assert d.ovs.restoring(3) is True  # another instance: held again


class ReconnectCounting(RegistrySource):
    reconnects = 0

    def reconnect(self) -> None:
        self.reconnects += 1


def test_the_watches_are_opened_again_when_the_uplink_moved(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A pass whose prepare moved the uplink onto the bridge has the source open its watches
    again (they were opened over the uplink before: their events stalled ~15 s on a Kubernetes
    lab); passes that found it moved do not."""
    from dataclasses import replace

    from tests.routesync.standins import FastPathAppliers

    (tmp_path / "reg").mkdir()
    cfg = from_dict({"nodeName": "node-a", "podCIDRs": ["10.244.1.0/24"], "stateFile": str(tmp_path / "s.json"),
                     "trafficEncapMode": "noEncap", "fastPath": True,
                     "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg")}})
    apl = FastPathAppliers({})
    first = apl.prepare
    moves = iter([True, False, False])
    apl.prepare = lambda *a: replace(first(*a), uplink_moved=next(moves))  # type: ignore[method-assign]
    source = ReconnectCounting(str(tmp_path / "reg"), "node-a")
    d = Daemon(cfg, source, apl)
    assert d.reconcile().ok and source.reconnects == 1
    assert d.reconcile().ok and d.reconcile().ok and source.reconnects == 1
