"""A tiny TCP and UDP echo server and client for connectivity checks (standard library only).

Run by file path with ``python -I -S echo.py``, inside any namespace.  Protocol: the client
sends N bytes and shuts its write side (UDP: one datagram); the server answers with the source
address it saw and its own address (space-separated), a newline, and the N bytes back.  So one
probe proves a full TCP exchange with segments larger than one MTU (what breaks when checksum
offload is wrong), shows SNAT, and (through a Service) says which backend answered.

    echo.py serve PORT          # prints "ready" once listening on [::]:PORT, TCP and UDP (IPv4 too)
    echo.py connect ADDR PORT SIZE TIMEOUT       # prints JSON {"ok", "peer", "server", "ms", "error"}
    echo.py connect-udp ADDR PORT SIZE TIMEOUT   # the same over UDP (SIZE up to one datagram)
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
            conn.sendall(_first_line(addr, conn.getsockname()) + b"".join(chunks))
        except OSError:
            pass


def _first_line(peer: tuple, local: tuple) -> bytes:
    return f"{peer[0].removeprefix('::ffff:')} {local[0].removeprefix('::ffff:')}\n".encode()


def _serve_udp(port: int) -> None:
    """Each datagram back to its sender, behind the first line; the reply leaves from the address
    the datagram was sent to (IPV6_RECVPKTINFO), as a UDP Service's conntrack entry needs."""
    u = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    u.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    u.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
    u.bind(("::", port))
    while True:
        data, anc, _flags, addr = u.recvmsg(65536, socket.CMSG_SPACE(20))
        info = next((d for lvl, typ, d in anc if lvl == socket.IPPROTO_IPV6 and typ == socket.IPV6_PKTINFO), None)
        local = (socket.inet_ntop(socket.AF_INET6, info[:16]),) if info else ("::",)
        try:
            u.sendmsg([_first_line(addr, local) + data], [(socket.IPPROTO_IPV6, socket.IPV6_PKTINFO, info)]
                      if info else [], 0, addr)
        except OSError:
            pass


def serve(port: int) -> None:
    threading.Thread(target=_serve_udp, args=(port,), daemon=True).start()
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
    return _result(b"".join(chunks), payload, t0)


def _result(data: bytes, payload: bytes, t0: float) -> dict:
    first, _, echoed = data.partition(b"\n")
    peer, _, server = first.decode(errors="replace").partition(" ")
    ok = echoed == payload
    return {"ok": ok, "peer": peer, "server": server or None, "ms": round((time.monotonic() - t0) * 1000, 2),
            "error": None if ok else f"echoed {len(echoed)} of {len(payload)} bytes"}


def connect_udp(addr: str, port: int, size: int, timeout: float) -> dict:
    payload = os.urandom(size)
    t0 = time.monotonic()
    try:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as u:
            u.settimeout(timeout)
            u.connect((addr, port))
            u.send(payload)
            data = u.recv(65536)
    except OSError as e:
        return {"ok": False, "peer": None, "server": None, "ms": None, "error": f"{type(e).__name__}: {e}"}
    return _result(data, payload, t0)


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        serve(int(argv[1]))
        return 0
    if argv[:1] == ["connect"]:
        r = connect(argv[1], int(argv[2]), int(argv[3]), float(argv[4]))
        print(json.dumps(r))
        return 0 if r["ok"] else 1
    if argv[:1] == ["connect-udp"]:
        r = connect_udp(argv[1], int(argv[2]), int(argv[3]), float(argv[4]))
        print(json.dumps(r))
        return 0 if r["ok"] else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
