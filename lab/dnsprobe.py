"""A minimal DNS client for the lab's cluster-DNS checks (standard library only; no dig here).

Run by file path with ``python -I -S dnsprobe.py``, inside any namespace: one query for an A or
AAAA record, over UDP or TCP (RFC 1035 4.2.2: a two-byte length before each message), straight to
the server named (a Pod's resolv.conf is not read: the caller names the server and the full name).

    dnsprobe.py SERVER NAME A|AAAA udp|tcp TIMEOUT   # prints JSON {"ok", "rcode", "addresses", "error"}
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys

TYPES = {"A": 1, "AAAA": 28}


def query(name: str, qtype: int, ident: int) -> bytes:
    """A recursive query for ``name`` (one question, class IN)."""
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split(".") if p)
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", qtype, 1)


def _skip_name(msg: bytes, i: int) -> int:
    while True:
        n = msg[i]
        if n == 0:
            return i + 1
        if n & 0xC0 == 0xC0:  # a compression pointer ends the name
            return i + 2
        i += 1 + n


def answers(msg: bytes, ident: int, qtype: int) -> tuple[int, list[str]]:
    """(rcode, the addresses of ``qtype`` in the answer section); ValueError on a foreign reply."""
    rid, flags, qd, an, _ns, _ar = struct.unpack_from("!HHHHHH", msg)
    if rid != ident or not flags & 0x8000:
        raise ValueError("not the answer to our query")
    i = 12
    for _ in range(qd):
        i = _skip_name(msg, i) + 4
    out = []
    for _ in range(an):
        i = _skip_name(msg, i)
        rtype, _cls, _ttl, size = struct.unpack_from("!HHIH", msg, i)
        i += 10
        if rtype == qtype:
            family = socket.AF_INET if rtype == 1 else socket.AF_INET6
            out.append(socket.inet_ntop(family, msg[i:i + size]))
        i += size
    return flags & 0xF, out


def resolve(server: str, name: str, qtype: int, tcp: bool, timeout: float) -> dict:
    ident = int.from_bytes(os.urandom(2), "big")
    q = query(name, qtype, ident)
    family = socket.AF_INET6 if ":" in server else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM if tcp else socket.SOCK_DGRAM) as s:
            s.settimeout(timeout)
            s.connect((server, 53))
            if tcp:
                s.sendall(struct.pack("!H", len(q)) + q)
                buf = b""
                while len(buf) < 2 or len(buf) < 2 + struct.unpack_from("!H", buf)[0]:
                    chunk = s.recv(65536)
                    if not chunk:
                        raise OSError("connection closed before the whole answer")
                    buf += chunk
                msg = buf[2:]
            else:
                s.send(q)
                msg = s.recv(65536)
        rcode, addrs = answers(msg, ident, qtype)
    except (OSError, ValueError, struct.error, IndexError) as e:
        return {"ok": False, "rcode": None, "addresses": [], "error": f"{type(e).__name__}: {e}"}
    return {"ok": rcode == 0 and bool(addrs), "rcode": rcode, "addresses": addrs, "error": None}


def main(argv: list[str]) -> int:
    if len(argv) != 5 or argv[2] not in TYPES or argv[3] not in ("udp", "tcp"):
        print(__doc__, file=sys.stderr)
        return 2
    r = resolve(argv[0], argv[1], TYPES[argv[2]], argv[3] == "tcp", float(argv[4]))
    print(json.dumps(r))
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
