"""Replace a file atomically: a fresh temp file beside it, fsync, rename over, fsync the directory.

Readers see the old content or the new, never a torn file; a symlink planted at the path is
replaced, never followed (rename does not follow), and the temp file is created with O_EXCL and
O_NOFOLLOW so nothing planted there is written through.  Used for the node state file (route-sync),
the embedded registry's records and every file of the IPAM store (``cni.ipam.store``, which names
its files relative to directory descriptors it holds, and fsyncs its directories in batches)."""

from __future__ import annotations

import os


def write_atomic(path: str, data: bytes, mode: int = 0o644, sync: bool = True, *, dir_fd: int | None = None,
                 sync_dir: bool | None = None, tmp_name: str | None = None) -> None:
    """Replace ``path`` with ``data`` (file mode ``mode``, whatever the umask).

    ``sync``: fsync the file before the rename (a power cut leaves the old content or the new).
    ``sync_dir``: fsync the directory after the rename (the rename itself survives a power cut);
    by default as ``sync``; False for a caller that fsyncs the directory once after several files.
    ``dir_fd``: ``path`` is a name in that open directory (resolved against the descriptor, never
    through the path again).  ``tmp_name``: the temp file's name (default ``.<name>.<pid>.tmp``);
    a fixed name suits a writer that holds a lock on the directory, so a leftover of a process that
    died is reused rather than piling up.  Either way the temp file's name starts with a dot."""
    directory = os.path.dirname(path) or "."
    tmp = tmp_name or f".{os.path.basename(path)}.{os.getpid()}.tmp"
    if dir_fd is None:
        tmp = os.path.join(directory, tmp)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
    except FileExistsError:  # left by a process that died (a lock holder, or our reused pid): ours to replace
        os.unlink(tmp, dir_fd=dir_fd)
        fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, mode)  # the umask may have narrowed it
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise
    if sync if sync_dir is None else sync_dir:
        if dir_fd is not None:
            os.fsync(dir_fd)
            return
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
