"""The ``ferry`` executable: the protocol core wired to the command handlers.

Each verb's module (``cni.commands.add``, ``delete``, ``check``, ``status``, ``gc``: and with it
netlink, OVSDB, IPAM) is imported only when that command runs, so an ADD loads no other verb;
VERSION and every input error are answered by :mod:`cni.spec.protocol` alone."""

from __future__ import annotations

from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from cni.spec.request import Handlers, Request
    from cni.spec.result import Result


def _add(req: Request) -> Result | None:
    from cni.commands.add import add

    return add(req)


def _delete(req: Request) -> None:
    from cni.commands.delete import delete

    delete(req)


def _check(req: Request) -> None:
    from cni.commands.check import check

    check(req)


def _status(req: Request) -> None:
    from cni.commands.status import status

    status(req)


def _gc(req: Request) -> None:
    from cni.commands.gc import gc

    gc(req)


def handlers() -> Handlers:
    return {"ADD": _add, "DEL": _delete, "CHECK": _check, "STATUS": _status, "GC": _gc}


def _read_stdin() -> bytes:
    import sys

    if sys.stdin is None:
        return b""
    if sys.stdin.isatty():  # someone typed `CNI_COMMAND=VERSION ferry`: do not wait for input
        return b""
    return sys.stdin.buffer.read()


def main() -> int:
    import os
    import sys

    from cni.spec import protocol

    return protocol.run(handlers(), os.environ, _read_stdin(), sys.stdout.buffer, sys.stderr)


def leave(code: int) -> None:
    """Exit with ``code`` now, without the interpreter's teardown (freeing every module and
    object: ~5 ms of a per-Pod call, 7.6 M instructions, for memory the kernel reclaims anyway).  Safe for the
    per-Pod executables: the result and errors are flushed here, the log is written with
    ``os.write``, every file and socket is closed by its ``with`` block before the handler
    returns, and nothing registers ``atexit`` hooks."""
    import os
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more to deliver
            code = code or 1
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    raise SystemExit(main())
