"""Every implementation of the daemon's protocols implements all of it, with the protocol's
parameter names: the appliers (``routesync.daemon.Appliers``, composed of its own part and the
features' parts declared beside them: the real ones, the test stand-ins, the benchmark's
wrapper), the observers (``DaemonObserver``, composed the same way: the metrics one and the
no-op base) and the features (``routesync.feature.Feature``: WireGuard's, NetworkPolicy's).
The daemon calls each method without asking whether it is there, so a method missing or
misnamed would fail a pass (or, before, silently turn a feature off).  mypy checks this module
and the stand-ins too (the lint target); this test says the same at run time."""

from __future__ import annotations

import inspect
from typing import Protocol

import pytest

from bench.bench_routesync import TimedAppliers
from routesync.apply import NodeAppliers
from routesync.daemon import Appliers, DaemonObserver, NullObserver
from routesync.feature import Feature
from routesync.metrics import Observer
from routesync.policy.node import PolicyNode
from routesync.wireguard.loop import WireGuardLoop
from tests.routesync.standins import FastPathAppliers, PodAppliers, RecordingAppliers


def members(protocol: type) -> list[str]:
    """The protocol's members, its parts' included (each feature declares its own beside it)."""
    parts = [c for c in protocol.__mro__ if getattr(c, "_is_protocol", False) and c is not Protocol]
    return sorted({n for c in parts for n in vars(c) if not n.startswith("_")})


def test_the_protocols_name_every_method_the_daemon_calls() -> None:
    assert members(Appliers) == ["apply", "close", "kick_wireguard", "next_hops", "ovs_generation", "ovs_restoring",
                                 "policy_flows", "prepare", "rehandshake_wireguard", "release_pending",
                                 "restore_host_path", "retry_tunnel_neighbours", "switch_wireguard", "sync_pods",
                                 "teardown", "wireguard_awaited", "wireguard_generation",
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
    (Observer, DaemonObserver), (NullObserver, DaemonObserver),
    (WireGuardLoop, Feature), (PolicyNode, Feature)])
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
