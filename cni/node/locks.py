"""Short flocks shared by the plugin and route-sync: one per attachment, one for lone-Node setup.

The plugin holds an attachment's lock for a whole ADD, DEL or CHECK, and GC for each attachment
it removes; route-sync takes the same lock before it replays a Pod's flows after an ovs-vswitchd
restart and before it converges a running Pod's MTUs, so a replay can never put back the flows of a
Pod whose DEL or GC is half done, and CHECK never sees a Pod half made or half converged.  Files
live in ``<dir of the state file>/locks``."""

from __future__ import annotations

import fcntl
import os

from cni.pipeline.tables import sha256


class locked:  # used like a function: ``with locked(lock_dir, name):``
    """A short flock: per attachment (ADD/DEL/CHECK/GC of one Pod), or "node" for lone-Node setup.
    (A class, not @contextmanager: contextlib costs ~7 ms of imports per exec.)

    ``remove()`` (DEL and GC, under the lock) unlinks the file so lock files do not pile up, one per Pod
    ever created; a waiter that then wins the flock on the unlinked file notices (the path no
    longer names its inode) and locks the path afresh."""

    def __init__(self, lock_dir: str, name: str) -> None:
        self.dir, self.path, self.fd = lock_dir, os.path.join(lock_dir, name + ".lock"), -1

    def __enter__(self) -> locked:  # noqa: PYI034 - typing.Self would import typing per exec
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    current = os.stat(self.path, follow_symlinks=False).st_ino
                except FileNotFoundError:
                    current = -1
            except BaseException:
                os.close(fd)
                raise
            if current == os.fstat(fd).st_ino:
                self.fd = fd
                return self
            os.close(fd)  # removed (or replaced) while we waited: lock the path again

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def attachment_lock(lock_dir: str, container_id: str, ifname: str) -> locked:
    """The lock of one attachment (container ID, ifname)."""
    h = sha256(f"{container_id}\x00{ifname}".encode()).hexdigest()[:16]
    return locked(lock_dir, "pod-" + h)
