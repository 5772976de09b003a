"""ExaBGP's API process: copies ExaBGP's JSON events (its stdin) to route-sync's socket and
route-sync's commands from the socket to ExaBGP (its stdout).

ExaBGP talks to the programs it starts (``process { run ...; }``) through their standard
streams; route-sync is ExaBGP's parent, not its child, so this relay joins the two: it connects
to the Unix socket named by ``$FERRY_BGP_SOCKET`` and ends when either side closes (ExaBGP then
ends too, ``exabgp.api.terminate``).  Standard library only: ExaBGP starts it on every restart."""

from __future__ import annotations

import os
import socket
import sys
import threading

ENV = "FERRY_BGP_SOCKET"


def _pump(read: int, write: int, done: threading.Event) -> None:
    try:
        _copy(read, write)
    finally:
        done.set()


def _copy(read: int, write: int) -> None:
    try:
        while True:
            data = os.read(read, 65536)
            if not data:
                return
            while data:
                data = data[os.write(write, data):]
    except OSError:
        return


def main() -> int:
    path = os.environ.get(ENV)
    if not path:
        print(f"{ENV} is not set", file=sys.stderr)
        return 2
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as e:
        print(f"cannot connect to {path}: {e}", file=sys.stderr)
        return 1
    done = threading.Event()
    for src, dst in ((sock.fileno(), sys.stdout.fileno()), (sys.stdin.fileno(), sock.fileno())):
        threading.Thread(target=_pump, args=(src, dst, done), daemon=True).start()
    done.wait()  # route-sync closed the socket, or ExaBGP our stdin: either way the pair is over
    return 0


if __name__ == "__main__":
    sys.exit(main())
