"""A tiny TCP echo server and client for connectivity checks (standard library only).

Run by file path with ``python -I -S echo.py``, inside any namespace.  Protocol: the client
sends N bytes and shuts its write side; the server answers with the source address it saw,
a newline, and the N bytes back.  So one probe proves a full TCP exchange with segments
larger than one MTU (what breaks when checksum offload is wrong) and shows SNAT.

    echo.py serve PORT          # prints "ready" once listening on [::]:PORT (IPv4 too)
    echo.py connect ADDR PORT SIZE TIMEOUT   # prints JSON {"ok", "peer", "ms", "error"}
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time


def _handle(conn: socket.socket, addr: tuple) -> None:
    with conn:
        conn.settimeout(10)
        chunks = []
        try:
            while True:
                b = conn.recv(65536)
                if not b:
                    break
                chunks.append(b)
            peer = addr[0].removeprefix("::ffff:")
            conn.sendall(peer.encode() + b"\n" + b"".join(chunks))
        except OSError:
            pass


def serve(port: int) -> None:
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", port))
    s.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    os.close(1)
    while True:
        conn, addr = s.accept()
        threading.Thread(target=_handle, args=(conn, addr), daemon=True).start()


def connect(addr: str, port: int, size: int, timeout: float) -> dict:
    payload = os.urandom(size)
    t0 = time.monotonic()
    try:
        with socket.create_connection((addr, port), timeout=timeout) as c:
            c.sendall(payload)
            c.shutdown(socket.SHUT_WR)
            chunks = []
            while True:
                b = c.recv(65536)
                if not b:
                    break
                chunks.append(b)
    except OSError as e:
        return {"ok": False, "peer": None, "ms": None, "error": f"{type(e).__name__}: {e}"}
    data = b"".join(chunks)
    peer, _, echoed = data.partition(b"\n")
    ok = echoed == payload
    return {"ok": ok, "peer": peer.decode(errors="replace"), "ms": round((time.monotonic() - t0) * 1000, 2),
            "error": None if ok else f"echoed {len(echoed)} of {size} bytes"}


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        serve(int(argv[1]))
        return 0
    if argv[:1] == ["connect"]:
        r = connect(argv[1], int(argv[2]), int(argv[3]), float(argv[4]))
        print(json.dumps(r))
        return 0 if r["ok"] else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
