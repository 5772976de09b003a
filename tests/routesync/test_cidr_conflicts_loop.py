"""Two Nodes claiming one Pod CIDR, through the running daemon loop (real registry source, the
recording appliers of tests/routesync/standins.py, the real metrics): the claim that loses is not
applied, one log line when the conflict starts and one when it ends (not one per pass), the
``ferry_route_sync_pod_cidr_conflicts`` gauge, and ``ferry-route-sync show``.  No root."""

from __future__ import annotations

import logging
import threading

from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from routesync import conflicts
from routesync.cli import main
from routesync.config import from_dict
from routesync.daemon import Daemon
from routesync.metrics import Observer, RouteSyncMetrics
from routesync.model import NodeRecord
from routesync.sources.registry import RegistrySource
from tests.routesync.standins import RecordingAppliers
from tests.support.waiting import HANG, until


def gauge(metrics: RouteSyncMetrics) -> float:
    return next(s.value for fam in text_string_to_metric_families(metrics.exposition()[0].decode())
                for s in fam.samples if s.name == "ferry_route_sync_pod_cidr_conflicts")


def test_a_claimed_twice_cidr_is_applied_once_logged_once_counted_and_shown(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    state_file = str(tmp_path / "state.json")
    cfg = from_dict({"nodeName": "node-a", "podCIDRs": ["10.244.1.0/24"], "stateFile": state_file,
                     "resyncSeconds": 3600,
                     "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg"), "pollInterval": 0.02}})
    (tmp_path / "reg").mkdir()
    reg = {n: RegistrySource(str(tmp_path / "reg"), n) for n in ("node-b", "node-c", "node-d")}
    reg["node-b"].publish_self(NodeRecord("node-b", ("192.168.77.12",), ("10.244.2.0/24",)))
    reg["node-c"].publish_self(NodeRecord("node-c", ("192.168.77.13",), ("10.244.2.0/25",)))  # inside node-b's
    apl, metrics = RecordingAppliers(), RouteSyncMetrics()
    d = Daemon(cfg, RegistrySource(str(tmp_path / "reg"), "node-a", poll_interval=0.02), apl,
               observer=Observer(metrics))
    caplog.set_level(logging.INFO, logger="routesync.findings")
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    try:
        until(lambda: conflicts.read(state_file), "the conflict in the status file")
        (c,) = conflicts.read(state_file)
        assert (c.node, c.cidr, c.owner, c.owner_cidr) == ("node-c", "10.244.2.0/25", "node-b", "10.244.2.0/24")
        until(lambda: apl.applied and apl.applied[-1].cidr_conflicts == (c,))
        last = apl.applied[-1]
        assert sorted((r.dst, r.gw) for r in last.routes) == [("10.244.2.0/24", "10.244.2.1")]  # to node-b (encap)
        assert [p.peer for p in last.peers] == ["node-b"]  # node-c's only CIDR is set aside: nothing of it
        assert until(lambda: gauge(metrics) == 1)

        # passes for other changes: the conflict is not logged again
        n = len(apl.applied)
        reg["node-d"].publish_self(NodeRecord("node-d", ("192.168.77.14",), ("10.244.4.0/24",)))
        until(lambda: len(apl.applied) > n and any(p.peer == "node-d" for p in apl.applied[-1].peers))
        out = CliRunner().invoke(main, ["show", "--state-file", state_file])
        assert out.exit_code == 0, out.output
        assert "Pod CIDR conflicts (1):" in out.output
        assert "10.244.2.0/25 of node-c overlaps 10.244.2.0/24 of node-b" in out.output

        # node-c moves to a CIDR of its own: the conflict ends, said once, and node-c is planned
        reg["node-c"].publish_self(NodeRecord("node-c", ("192.168.77.13",), ("10.244.3.0/24",)))
        until(lambda: conflicts.read(state_file) == () and apl.applied[-1].cidr_conflicts == ())
        assert any(p.peer == "node-c" for p in apl.applied[-1].peers)
        assert until(lambda: gauge(metrics) == 0)
    finally:
        d.stop.set()
        t.join(HANG)
    said = [r.getMessage() for r in caplog.records if "10.244.2.0/25" in r.getMessage()]
    assert len(said) == 2, said  # started, ended
    assert "node-b's stands" in said[0] and said[1].startswith("Pod CIDR conflict over")


class Speaker:
    """The BGP speaker as the daemon sees it (routesync.daemon.BgpSpeaker): what it was told."""

    def __init__(self) -> None:
        self.wanted: list[tuple[str, ...]] = []

    def want(self, pod_cidrs: tuple[str, ...], uplink_addresses: tuple[str, ...]) -> None:
        self.wanted.append(pod_cidrs)


def test_bgp_does_not_advertise_this_nodes_cidr_that_another_node_owns(tmp_path) -> None:  # type: ignore[no-untyped-def]
    state_file = str(tmp_path / "state.json")
    cfg = from_dict({"nodeName": "node-b", "podCIDRs": ["10.244.1.0/24", "fd00:10:244:1::/64"], "stateFile": state_file,
                     "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg")}})
    (tmp_path / "reg").mkdir()
    other = RegistrySource(str(tmp_path / "reg"), "node-a")
    speaker = Speaker()
    d = Daemon(cfg, RegistrySource(str(tmp_path / "reg"), "node-b"), RecordingAppliers(), bgp=speaker)
    assert d.reconcile().ok
    assert speaker.wanted[-1] == ("10.244.1.0/24", "fd00:10:244:1::/64")
    other.publish_self(NodeRecord("node-a", ("192.168.77.12",), ("10.244.1.0/24",)))  # sorts first: it owns
    assert d.reconcile(full=False).ok
    assert speaker.wanted[-1] == ("fd00:10:244:1::/64",)  # the underlay routers send 10.244.1.0/24 to node-a
    assert [c.node for c in conflicts.read(state_file)] == ["node-a", "node-b"]  # node-a's set aside here too
