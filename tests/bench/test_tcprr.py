"""bench/tcprr.py, the data-plane benchmark's latency probe, on loopback: the server says it is
ready once it listens, the client times exactly COUNT round trips after WARMUP untimed ones and
the server exits when the client closes; a client that cannot connect says why and fails."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from bench.bench_dataplane import TCPRR


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _client(port: int, count: int, warmup: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-S", TCPRR, "client", "127.0.0.1", str(port), str(count), "64",
                           str(warmup), "5"], capture_output=True, text=True, check=False, timeout=60)


def test_the_client_times_count_round_trips_and_the_server_exits_after() -> None:
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-I", "-S", TCPRR, "serve", str(port), "64"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        cp = _client(port, 25, 5)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        rtts = json.loads(cp.stdout)["rtt_us"]
        assert len(rtts) == 25 and all(x > 0 for x in rtts)
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()
        server.communicate()


def test_a_client_that_cannot_connect_says_so() -> None:
    cp = _client(_free_port(), 5, 0)
    assert cp.returncode == 1 and "ConnectionRefusedError" in json.loads(cp.stdout)["error"]
