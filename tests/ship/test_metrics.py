"""route-sync's /metrics, /healthz, /readyz over real HTTP, fed by the real daemon loop (real
registry source on disk; the appliers are the recording stand-in of tests/routesync, since the
real ones need root: the root run on a lab is in test_lab_frozen.py)."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from routesync.config import from_dict
from routesync.daemon import Daemon
from routesync.health import Health, HealthServer
from routesync.metrics import Observer, RouteSyncMetrics
from routesync.sources.registry import RegistrySource
from tests.routesync.standins import RecordingAppliers
from tests.support.waiting import HANG, until


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=HANG) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def scrape_when(port: int, key: tuple, value: float) -> dict | None:
    """The scraped samples once ``key`` has ``value``, else None."""
    s = samples(get(port, "/metrics")[1])
    return s if s.get(key) == value else None


def write_peer(reg: Path, name: str, addr: str, cidr: str) -> None:
    reg.mkdir(parents=True, exist_ok=True)
    (reg / f"{name}.yaml").write_text(yaml.safe_dump(
        {"name": name, "transportAddresses": [addr], "podCIDRs": [cidr], "annotations": {}}))


@pytest.fixture
def served(tmp_path: Path):  # type: ignore[no-untyped-def]
    reg = tmp_path / "reg"
    cfg = from_dict({"nodeName": "node-a", "podCIDRs": ["10.244.1.0/24"], "stateFile": str(tmp_path / "state.json"),
                     "nodeSource": {"type": "registry", "registryDir": str(reg), "pollInterval": 0.02}})
    metrics, health = RouteSyncMetrics(), Health(cfg.state_file)
    server = HealthServer(("127.0.0.1", 0), health, metrics.exposition).start()
    apl = RecordingAppliers()
    apl.fail_next = 1  # the first pass fails: errors counted, not ready
    d = Daemon(cfg, RegistrySource(str(reg), "node-a", poll_interval=0.02), apl, observer=Observer(metrics, health))
    t = threading.Thread(target=d.run, daemon=True)
    try:
        yield server.port, d, t, reg
    finally:
        d.stop.set()
        t.join(HANG)
        server.close()


def test_scrape_follows_the_loop(served) -> None:  # type: ignore[no-untyped-def]
    port, daemon, thread, reg = served
    code, text = get(port, "/readyz")
    assert code == 503 and "state file" in text  # nothing ran yet
    t_start = time.monotonic()
    thread.start()
    s = until(lambda: scrape_when(port, ("ferry_route_sync_reconciles_total", (("result", "ok"),)), 1))
    assert s[("ferry_route_sync_errors_total", (("type", "RuntimeError"),))] == 1
    assert s[("ferry_route_sync_reconciles_total", (("result", "error"),))] == 1
    assert s[("ferry_route_sync_last_reconcile_success", ())] == 1
    assert s[("ferry_route_sync_state_file_writes_total", ())] == 1
    assert s[("ferry_route_sync_reconcile_duration_seconds_count", ())] == 2
    assert s[("ferry_route_sync_peers", (("family", "4"), ("path", "tunnel")))] == 0
    assert until(lambda: get(port, "/readyz")[0] == 200)
    assert get(port, "/healthz")[0] == 200
    assert get(port, "/nothing")[0] == 404

    # a peer appears: counted by path and family, and its change-to-applied latency observed
    write_peer(reg, "node-b", "192.168.77.12", "10.244.2.0/24")
    s = until(lambda: scrape_when(port, ("ferry_route_sync_peers", (("family", "4"), ("path", "tunnel"))), 1))
    running = time.monotonic() - t_start
    count = s[("ferry_route_sync_node_change_to_applied_seconds_count", ())]
    assert count >= 1
    # in seconds: none of them longer than the loop has run (a bound that does not depend on how
    # fast the machine is, unlike the "< 5 s" it replaces)
    assert 0 < s[("ferry_route_sync_node_change_to_applied_seconds_sum", ())] <= count * running
    assert s[("ferry_route_sync_peers", (("family", "6"), ("path", "tunnel")))] == 0
    assert s[("ferry_route_sync_mac_source_disagreements_total", ())] == 0

    # the peer goes away: its path drops back to 0 (the gauge is reset, not left stale)
    (reg / "node-b.yaml").unlink()
    until(lambda: samples(get(port, "/metrics")[1])[
        ("ferry_route_sync_peers", (("family", "4"), ("path", "tunnel")))] == 0)

    # a failing pass makes it unready (and counted); the retry makes it ready again
    daemon.appliers.fail_next = 1
    write_peer(reg, "node-c", "192.168.77.13", "10.244.3.0/24")
    until(lambda: samples(get(port, "/metrics")[1])[
        ("ferry_route_sync_errors_total", (("type", "RuntimeError"),))] == 2)
    until(lambda: get(port, "/readyz")[0] == 200)


def test_healthz_fails_when_the_loop_stops_ticking(tmp_path: Path) -> None:
    now = [100.0]
    h = Health(str(tmp_path / "state.json"), stale_after=30, clock=lambda: now[0])
    server = HealthServer(("127.0.0.1", 0), h, RouteSyncMetrics().exposition).start()
    try:
        assert get(server.port, "/healthz")[0] == 200
        now[0] += 31
        code, text = get(server.port, "/healthz")
        assert code == 503 and "stuck" in text
        h.tick()
        assert get(server.port, "/healthz")[0] == 200
        (tmp_path / "state.json").write_text("{}")
        assert get(server.port, "/readyz") == (503, "no reconcile yet\n")
        h.reconciled(False)
        assert get(server.port, "/readyz")[0] == 503
        h.reconciled(True)
        assert get(server.port, "/readyz")[0] == 200
    finally:
        server.close()


def test_mac_disagreement_counter() -> None:
    m = RouteSyncMetrics()
    Observer(m).mac_disagreement("node-b")
    Observer(m).mac_disagreement("node-c")
    s = samples(m.exposition()[0].decode())
    assert s[("ferry_route_sync_mac_source_disagreements_total", ())] == 2
