"""route-sync's health and the HTTP endpoint serving ``/metrics``, ``/healthz`` and ``/readyz``.

* ``/healthz``: 200 while the process is alive and its loop ticks (the daemon's loop wakes at
  least every second to check ovs-vswitchd; no tick for ``stale_after`` seconds = stuck), else 503.
* ``/readyz``: 200 once the node state file exists and the latest reconcile succeeded, else 503
  (the plugin answers ADD with code 11 until the state file is there).
* ``/metrics``: Prometheus exposition of :class:`routesync.metrics.RouteSyncMetrics`.

    server = HealthServer(("0.0.0.0", 9469), health, metrics.exposition)
    server.start(); ...; server.close()

It knows nothing of the metrics but their exposition callable; ``routesync.monitoring`` wires the
two together for the daemon."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

DEFAULT_PORT = 9469
STALE_AFTER = 30.0  # seconds without a loop tick before /healthz fails


class Health:
    def __init__(self, state_file: str, stale_after: float = STALE_AFTER,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.state_file = state_file
        self.stale_after = stale_after
        self.clock = clock
        self._lock = threading.Lock()
        self._last_tick = clock()
        self._last_ok: bool | None = None  # None: no reconcile yet

    def tick(self) -> None:
        with self._lock:
            self._last_tick = self.clock()

    def reconciled(self, ok: bool) -> None:
        with self._lock:
            self._last_ok = ok
            self._last_tick = self.clock()

    def healthz(self) -> tuple[bool, str]:
        with self._lock:
            age = self.clock() - self._last_tick
        if age > self.stale_after:
            return False, f"loop stuck: no tick for {age:.1f}s (limit {self.stale_after:g}s)"
        return True, f"ok: loop ticked {age:.1f}s ago"

    def readyz(self) -> tuple[bool, str]:
        with self._lock:
            last_ok = self._last_ok
        if not os.path.exists(self.state_file):
            return False, f"state file {self.state_file} not written yet"
        if last_ok is None:
            return False, "no reconcile yet"
        if not last_ok:
            return False, "latest reconcile failed"
        return True, "ok"


class HealthServer:
    """A threading HTTP server in a daemon thread; ``port`` 0 picks a free one (see ``.port``)."""

    def __init__(self, address: tuple[str, int], health: Health,
                 exposition: Callable[[], tuple[bytes, str]]) -> None:
        checks: dict[str, Callable[[], tuple[bool, str]]] = {"/healthz": health.healthz,
                                                              "/readyz": health.readyz}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body, ctype = exposition()
                    code = 200
                elif path in checks:
                    ok, text = checks[path]()
                    body, ctype, code = (text + "\n").encode(), "text/plain; charset=utf-8", 200 if ok else 503
                else:
                    body, ctype, code = b"not found\n", "text/plain; charset=utf-8", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("http %s " + format, self.client_address[0], *args)

        self.httpd = ThreadingHTTPServer(address, Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="health-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> HealthServer:
        self._thread.start()
        log.info("metrics and health on http://%s:%d (/metrics /healthz /readyz)",
                 self.httpd.server_address[0], self.port)
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

