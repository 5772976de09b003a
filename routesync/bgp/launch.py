"""Start ExaBGP so that it dies with route-sync: ``PR_SET_PDEATHSIG`` = SIGKILL, then exec.

    python -I -S launch.py PARENT_PID ARGV...     (the frozen bundle: ``ferry-route-sync exabgp``)

Set in the child itself rather than in a ``preexec_fn`` (unsafe in route-sync, which runs
threads).  The death signal survives ``execve``; if route-sync died before ``prctl`` ran, the
parent pid no longer matches and the launcher exits instead.  Standard library only."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # the parent is gone already
        os._exit(1)


def main(argv: list[str]) -> None:
    die_with_parent(int(argv[0]))
    os.execv(argv[1], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
