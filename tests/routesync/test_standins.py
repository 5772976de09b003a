"""Every implementation of the daemon's protocols implements all of it, with the protocol's
parameter names: the appliers (``routesync.daemon.Appliers``: the real ones, the test stand-ins,
the benchmark's wrapper) and the observers (``DaemonObserver``: the metrics one and the no-op
base).  The daemon calls each method without asking whether it is there, so a method missing or
misnamed would fail a pass (or, before, silently turn a feature off).  mypy checks this module
and the stand-ins too (the lint target); this test says the same at run time."""

from __future__ import annotations

import inspect

import pytest

from bench.bench_routesync import TimedAppliers
from routesync.apply import NodeAppliers
from routesync.daemon import Appliers, DaemonObserver, NullObserver
from routesync.metrics import Observer
from tests.routesync.standins import FastPathAppliers, PodAppliers, RecordingAppliers


def members(protocol: type) -> list[str]:
    return sorted(n for n in vars(protocol) if not n.startswith("_"))


def test_the_protocols_name_every_method_the_daemon_calls() -> None:
    assert members(Appliers) == ["apply", "close", "next_hops", "ovs_generation", "ovs_restoring", "policy_flows",
                                 "prepare", "release_pending", "restore_host_path", "retry_tunnel_neighbours",
                                 "switch_wireguard", "sync_pods", "teardown", "wireguard_generation",
                                 "wireguard_implementation"]
    assert members(DaemonObserver) == ["change_applied", "mac_disagreement", "pods_synced", "policy_counters",
                                       "policy_drift_repaired", "policy_planned", "reconciled", "tick"]
    # mypy: none left out
    stand_ins: list[Appliers] = [RecordingAppliers(), PodAppliers("/nonexistent"), FastPathAppliers({})]
    observers: list[DaemonObserver] = [NullObserver()]
    assert stand_ins and observers


@pytest.mark.parametrize(("impl", "protocol"), [
    (NodeAppliers, Appliers), (RecordingAppliers, Appliers), (PodAppliers, Appliers), (FastPathAppliers, Appliers),
    (TimedAppliers, Appliers),
    (Observer, DaemonObserver), (NullObserver, DaemonObserver)])
def test_an_implementation_defines_every_member_with_its_parameters(impl: type, protocol: type) -> None:
    for name in members(protocol):
        want = getattr(protocol, name)
        if isinstance(want, property):
            have = inspect.getattr_static(impl, name, None)
            if have is None:  # an attribute its __init__ sets (NodeAppliers.next_hops)
                assert f"self.{name}" in inspect.getsource(vars(impl)["__init__"]), f"{impl.__name__}.{name}"
            continue
        have = inspect.getattr_static(impl, name, None)
        assert have is not None and have is not inspect.getattr_static(protocol, name), \
            f"{impl.__name__} does not define {name}"
        assert list(inspect.signature(have).parameters) == list(inspect.signature(want).parameters), \
            f"{impl.__name__}.{name} parameters"
