"""Network namespaces: open one by path, enter it for the calling thread, come back.

Standard library only (ctypes for setns(2)).  ``setns`` changes the namespace of the calling
*thread*, so ``entered`` keeps an fd of this thread's original namespace and always returns to
it, even when the body raises.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager

CLONE_NEWNET = 0x40000000
SELF_NETNS = "/proc/thread-self/ns/net"


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)  # dlopen(NULL): the already-loaded libc, ~10 us


def open_netns(path: str) -> int:
    """An fd of the namespace at ``path``; FileNotFoundError if it is gone."""
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def setns(fd: int, nstype: int = CLONE_NEWNET) -> None:
    """Move the calling thread into the namespace ``fd`` refers to."""
    if _libc().setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextmanager
def entered(path_or_fd: str | int) -> Iterator[None]:
    """Run the body inside another network namespace, then return to the original one."""
    own = isinstance(path_or_fd, str)
    fd = open_netns(path_or_fd) if isinstance(path_or_fd, str) else path_or_fd
    try:
        origin = open_netns(SELF_NETNS)
        try:
            setns(fd)
            try:
                yield
            finally:
                setns(origin)
        finally:
            os.close(origin)
    finally:
        if own:
            os.close(fd)
