"""route-sync's monitoring, wired: the metrics (``routesync.metrics``) and the health state and its
HTTP endpoint (``routesync.health``) for one daemon. Its own module so that neither of those two
imports the other: the health side sees only an exposition callable, the metrics side only the
health state it forwards ticks and reconciles to."""

from __future__ import annotations

from .health import Health, HealthServer
from .metrics import Observer, RouteSyncMetrics


def serve(state_file: str, host: str, port: int) -> tuple[Observer, HealthServer]:
    """Metrics + health for a daemon: the observer to hand it and the started server."""
    metrics = RouteSyncMetrics()
    health = Health(state_file)
    server = HealthServer((host, port), health, metrics.exposition).start()
    return Observer(metrics, health), server
