"""When the daemon asks its appliers to converge running Pods (``sync_pods``): when what decides
a Pod's routes changed, and on full passes; with the state file already on disk; counted by the
``pod_mtu_updates`` metric.  No root: the appliers record (the real ones are in routesync_apply
and e2e)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from routesync.config import from_dict
from routesync.daemon import Daemon
from routesync.metrics import Observer, RouteSyncMetrics
from routesync.model import NodeRecord
from routesync.sources.registry import RegistrySource
from tests.routesync.standins import PodAppliers


def test_pods_converged_on_path_changes_and_full_passes_state_file_first(tmp_path) -> None:  # type: ignore[no-untyped-def]
    state_file = str(tmp_path / "state.json")
    cfg = from_dict({"nodeName": "node-a", "podCIDRs": ["10.244.1.0/24"], "stateFile": state_file,
                     "trafficEncapMode": "hybrid", "clusterCIDRs": ["10.244.0.0/16"],
                     "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg")}})
    (tmp_path / "reg").mkdir()
    other = RegistrySource(str(tmp_path / "reg"), "node-b")
    apl = PodAppliers(state_file)
    metrics = RouteSyncMetrics()
    d = Daemon(cfg, RegistrySource(str(tmp_path / "reg"), "node-a"), apl, observer=Observer(metrics))
    assert d.reconcile(full=True).ok
    assert len(apl.calls) == 1 and apl.calls[0][1] is True  # first pass: full, every Pod looked at
    assert d.reconcile(full=False).ok and len(apl.calls) == 1  # nothing changed: no Pod entered
    # a peer in this Node's subnet joins: routed in hybrid, so every Pod gets a full-MTU route to it
    other.publish_self(NodeRecord("node-b", ("192.168.77.12",), ("10.244.2.0/24",)))
    assert d.reconcile(full=False).ok and len(apl.calls) == 2
    state, full, on_disk = apl.calls[-1]
    assert not full and [p.path for p in state.peers] == ["route"]
    assert on_disk == state  # the state file was written before the Pods were touched
    # the same peer, a change that moves no Pod route (an annotation): no Pod entered
    other.publish_self(NodeRecord("node-b", ("192.168.77.12",), ("10.244.2.0/24",), (("x", "y"),)))
    assert d.reconcile(full=False).ok and len(apl.calls) == 2
    # the peer moves to another subnet: tunnelled now, its full-MTU route goes
    other.publish_self(NodeRecord("node-b", ("192.168.88.12",), ("10.244.2.0/24",)))
    assert d.reconcile(full=False).ok and len(apl.calls) == 3
    assert [p.path for p in apl.calls[-1][0].peers] == ["tunnel"]
    assert d.reconcile(full=True).ok and len(apl.calls) == 4  # a full pass always looks (drift)
    counts = {(s.name, s.labels.get("result")): s.value
              for fam in text_string_to_metric_families(metrics.exposition()[0].decode()) for s in fam.samples}
    assert counts[("ferry_route_sync_pod_mtu_updates_total", "updated")] == 12
    assert counts[("ferry_route_sync_pod_mtu_updates_total", "skipped")] == 4
    assert counts[("ferry_route_sync_pod_mtu_updates_total", "failed")] == 0
