"""Replace a file atomically: a fresh temp file beside it, fsync, rename over, fsync the directory.

Readers see the old content or the new, never a torn file; a symlink planted at the path is
replaced, never followed (rename does not follow), and the temp file is created with O_EXCL and
O_NOFOLLOW so nothing planted there is written through.  Used for the node state file (route-sync)
and the embedded registry's records."""

from __future__ import annotations

import os


def write_atomic(path: str, data: bytes, mode: int = 0o644, sync: bool = True) -> None:
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, mode)
    except FileExistsError:  # left by a process of ours that died (same pid, reused): ours to replace
        os.unlink(tmp)
        fd = os.open(tmp, flags, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, mode)  # the umask may have narrowed it
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if sync:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
