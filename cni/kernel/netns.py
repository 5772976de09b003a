"""Network namespaces: open one by path, enter it for the calling thread, come back.

Standard library only: setns(2) through ``_ctypes``, the C half of ctypes, loaded on first use
(``import ctypes`` executes ~7 M more instructions, callgrind).  ``setns`` changes the namespace of the calling
*thread*, so ``entered`` keeps an fd of this thread's original namespace and always returns to
it, even when the body raises.
"""

from __future__ import annotations

import os

CLONE_NEWNET = 0x40000000
SELF_NETNS = "/proc/thread-self/ns/net"


class _Setns:
    """libc's ``int setns(int fd, int nstype)``, called with errno captured."""

    def __init__(self) -> None:
        from _ctypes import (
            FUNCFLAG_CDECL,
            FUNCFLAG_USE_ERRNO,
            CFuncPtr,
            _SimpleCData,
            dlopen,
            dlsym,
            get_errno,
        )

        class CInt(_SimpleCData):
            _type_ = "i"

        class Func(CFuncPtr):
            _flags_ = FUNCFLAG_CDECL | FUNCFLAG_USE_ERRNO
            _restype_ = CInt

        self.call = Func(dlsym(dlopen(None, os.RTLD_NOW), "setns"))  # type: ignore[arg-type]  # NULL: libc
        self.call.argtypes = (CInt, CInt)
        self.errno = get_errno


def open_netns(path: str) -> int:
    """An fd of the namespace at ``path``; FileNotFoundError if it is gone."""
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def setns(fd: int, nstype: int = CLONE_NEWNET) -> None:
    """Move the calling thread into the namespace ``fd`` refers to."""
    fn = _Setns()
    if fn.call(fd, nstype) != 0:
        err = fn.errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class entered:
    """Run the body inside another network namespace, then return to the original one.
    (A class, not @contextmanager: contextlib costs ~7 ms of imports per exec.)"""

    def __init__(self, path_or_fd: str | int) -> None:
        self.target = path_or_fd
        self.fd = -1
        self.origin = -1

    def __enter__(self) -> None:
        own = isinstance(self.target, str)
        self.fd = open_netns(self.target) if isinstance(self.target, str) else self.target
        try:
            self.origin = open_netns(SELF_NETNS)
            try:
                setns(self.fd)
            except BaseException:
                os.close(self.origin)
                raise
        except BaseException:
            if own:
                os.close(self.fd)
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            setns(self.origin)
        finally:
            os.close(self.origin)
            if isinstance(self.target, str):
                os.close(self.fd)
