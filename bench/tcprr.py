"""TCP request/response round trips between two namespaces (standard library only), the latency
figure of bench_dataplane: one connection, a SIZE-byte request answered by SIZE bytes back, the
next request sent as soon as the answer is in (closed loop, as netperf's TCP_RR), each round
trip timed with ``perf_counter_ns`` in the client.  Run by file path with ``python3 -I -S``
inside any namespace, like lab/echo.py.

    tcprr.py serve PORT SIZE          # prints "ready" once listening on 0.0.0.0:PORT, serves one
                                      # connection (SIZE-byte messages echoed until EOF), exits
    tcprr.py client ADDR PORT COUNT SIZE WARMUP TIMEOUT
                                      # WARMUP untimed round trips, then COUNT timed ones; prints
                                      # JSON {"rtt_us": [...]} or {"error": "..."}, exit 1 on error
"""

from __future__ import annotations

import json
import socket
import sys
import time


def _exactly(sock: socket.socket, buf: bytearray) -> bool:
    """Fill ``buf`` from ``sock``; False on EOF before it is full."""
    view, got = memoryview(buf), 0
    while got < len(buf):
        n = sock.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


def serve(port: int, size: int) -> int:
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(1)
    print("ready", flush=True)
    conn, _ = ls.accept()
    ls.close()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(size)
    with conn:
        while _exactly(conn, buf):
            conn.sendall(buf)
    return 0


def client(addr: str, port: int, count: int, size: int, warmup: int, timeout: float) -> int:
    try:
        s = socket.create_connection((addr, port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        req, resp = bytes(size), bytearray(size)
        out: list[float] = []
        with s:
            for i in range(warmup + count):
                t0 = time.perf_counter_ns()
                s.sendall(req)
                if not _exactly(s, resp):
                    raise OSError(f"connection closed after {i} round trips")
                if i >= warmup:
                    out.append((time.perf_counter_ns() - t0) / 1000.0)
    except OSError as e:
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 1
    print(json.dumps({"rtt_us": out}))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) == 3:
        return serve(int(argv[1]), int(argv[2]))
    if argv[:1] == ["client"] and len(argv) == 7:
        return client(argv[1], int(argv[2]), int(argv[3]), int(argv[4]), int(argv[5]), float(argv[6]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
