"""A userspace WireGuard device for tests: wireguard-go (``build/tools/wireguard-go``, from
``tools/build-go-tools.sh wireguard-go``) in a network namespace, in the foreground, until the
block ends.

Its UAPI socket is ``/var/run/wireguard/NAME.sock``, one directory for every namespace (``wg``
looks there, whatever namespace it runs in), so every device gets a unique name.  Ready means
the socket is there (polled with a deadline, no sleep); the process is killed and reaped at the
end, and a socket it left behind removed."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from lab import tools
from tests.support.waiting import until

RUN_DIR = "/var/run/wireguard"


def binary() -> str | None:
    """The built wireguard-go, or None (a skip reason's business)."""
    path = tools.tool("wireguard-go")
    return path if os.access(path, os.X_OK) else None


def socket_path(name: str) -> str:
    return os.path.join(RUN_DIR, f"{name}.sock")


@contextmanager
def device(netns: str, name: str) -> Iterator[subprocess.Popen[bytes]]:
    """wireguard-go running device ``name`` inside ``netns``; yields the process."""
    exe = binary()
    assert exe, "no build/tools/wireguard-go: run tools/build-go-tools.sh wireguard-go"
    sock = socket_path(name)
    assert not os.path.exists(sock), f"{sock} exists already: another device has the name {name}"
    # WG_PROCESS_FOREGROUND=1: without it wireguard-go prints a banner on kernels newer than 5.6
    env = {**os.environ, "WG_PROCESS_FOREGROUND": "1", "LOG_LEVEL": "error"}
    proc = subprocess.Popen(["ip", "netns", "exec", netns, exe, "-f", name], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        until(lambda: os.path.exists(sock) or proc.poll() is not None, f"wireguard-go's socket {sock}")
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise AssertionError(f"wireguard-go {name} exited {proc.returncode}: {err}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stderr:
            proc.stderr.close()
        if os.path.exists(sock):
            os.unlink(sock)
