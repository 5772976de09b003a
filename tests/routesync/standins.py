"""Stand-ins for route-sync's appliers in the daemon tests that run without root: they implement the
daemon's ``Appliers`` protocol (``routesync.daemon``) by subclassing it, so mypy (the lint target
checks this module) fails on a method missing or misnamed here, and record what the daemon asked.
The real appliers are tested with root (tests/routesync/apply, tests/e2e)."""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from cni.node import nodestate
from routesync.apply.pods import PodSyncReport
from routesync.daemon import Appliers, NextHopSource
from routesync.model import DesiredState, LocalFacts, NextHop, TunnelSpec, UplinkSpec

if TYPE_CHECKING:
    from cni.ovs.openflow.ofctl import DumpedFlow
    from routesync.config import Config
    from routesync.policy.model import Pod
    from routesync.wireguard.model import WgSpec


class RecordingAppliers(Appliers):
    """Applies nothing: records each ``apply``, fails the next ``fail_next`` of them, reports
    ``generation`` as the ovs-vswitchd instance, converges no Pod."""

    def __init__(self) -> None:
        self.applied: list[DesiredState] = []
        self.fail_next = 0
        self.generation = 1
        self.restoring = False  # flow-restore-wait set (ovs_restoring)
        self.prepared = 0
        self.restored: list[tuple[int, str]] = []  # (generation, uplink) of each restore_host_path
        self.pod_syncs: list[tuple[nodestate.NodeState, bool]] = []
        self.released: list[tuple[int, bool]] = []  # (Pods, full) of each release_pending

    @property
    def next_hops(self) -> NextHopSource | None:
        return None

    def prepare(self, config: Config, tunnel: TunnelSpec | None, uplink: UplinkSpec | None,
                gateway_addresses: tuple[str, ...]) -> LocalFacts:
        self.prepared += 1
        return LocalFacts(2, "02:00:00:00:01:01", 3 if tunnel else None, "eth0", ("192.168.77.11/24",), 1500,
                          "02:00:00:00:00:11")

    def apply(self, desired: DesiredState) -> None:
        if self.fail_next > 0:
            self.fail_next -= 1
            raise RuntimeError("ovs-ofctl: connection refused")
        self.applied.append(desired)

    def release_pending(self, pods: Sequence[Pod], full: bool) -> int:
        self.released.append((len(pods), full))
        return 0

    def sync_pods(self, state: nodestate.NodeState, full: bool) -> PodSyncReport:
        self.pod_syncs.append((state, full))
        return PodSyncReport()

    def restore_host_path(self, uplink: UplinkSpec) -> bool:
        self.restored.append((self.generation, uplink.name))
        return True

    def policy_flows(self) -> list[DumpedFlow]:
        return []

    def retry_tunnel_neighbours(self, now: float | None = None) -> list[tuple[str, str]]:
        return []

    def ovs_generation(self) -> int:
        return self.generation

    def ovs_restoring(self) -> bool:
        return self.restoring

    def wireguard_generation(self) -> int:
        return 0

    def wireguard_implementation(self) -> str | None:
        return None

    def switch_wireguard(self, spec: WgSpec) -> None:
        pass

    def rehandshake_wireguard(self, since: float, among: Collection[str] | None = None) -> tuple[str, ...]:
        return ()

    def kick_wireguard(self, since: float, among: Collection[str]) -> tuple[str, ...]:
        return ()

    def wireguard_awaited(self) -> tuple[tuple[float, tuple[str, ...]], ...]:
        return ()

    def teardown(self, config: Config) -> None:
        pass

    def close(self) -> None:
        pass


class PodAppliers(RecordingAppliers):
    """Reports 3 Pods updated and 1 skipped per ``sync_pods``, noting the state file as it was then."""

    def __init__(self, state_file: str) -> None:
        super().__init__()
        self.state_file = state_file
        self.calls: list[tuple[nodestate.NodeState, bool, nodestate.NodeState]] = []

    def sync_pods(self, state: nodestate.NodeState, full: bool) -> PodSyncReport:
        self.calls.append((state, full, nodestate.read(self.state_file)))
        return PodSyncReport(updated=3, skipped=1)


class FixedNextHops:
    """A :class:`routesync.daemon.NextHopSource` whose kernel knows ``hops`` (destination -> next hop)."""

    def __init__(self, hops: Mapping[str, NextHop]) -> None:
        self.hops = dict(hops)
        self.changed = threading.Event()

    def resolve(self, destinations: Iterable[str]) -> dict[str, NextHop]:
        return {d: self.hops[d] for d in destinations if d in self.hops}


class FastPathAppliers(RecordingAppliers):
    """The uplink on the bridge (the fast path's prerequisite) and the kernel's next hops ``hops``."""

    def __init__(self, hops: Mapping[str, NextHop]) -> None:
        super().__init__()
        self.hops = FixedNextHops(hops)

    @property
    def next_hops(self) -> NextHopSource | None:
        return self.hops

    def prepare(self, config: Config, tunnel: TunnelSpec | None, uplink: UplinkSpec | None,
                gateway_addresses: tuple[str, ...]) -> LocalFacts:
        self.prepared += 1
        return LocalFacts(2, "02:00:00:00:01:01", None, "eth0", ("192.168.77.11/24",), 1500, "02:00:00:00:00:11",
                          uplink_ofport=5, uplink_host_ofport=6)
