"""The lab's on-disk record of everything it created, written *before* each thing is created.

``down`` works from this file alone, so a lab whose ``up`` was killed half-way is still torn
down completely: an entry for something never created is simply absent at teardown.  Each
update rewrites the JSON atomically (temp file + rename), under a lock, because ``up`` builds
Nodes in parallel threads; and re-reads the file first, under a file lock beside it, because two
processes may add to one lab's record (``ferry-lab up`` and a test joining a Node, ``ferry-lab
join``): each keeps the other's entries instead of overwriting them with its own stale copy."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

MANIFEST = "manifest.json"
KINDS = ("netns", "pidfile", "pid", "dir", "file", "mountns", "cgroup")
# For the tests of a half-built lab: the process stops itself (SIGSTOP) right after this step is
# on record ("created": the manifest exists; else an entry kind), so a test kills it at exactly
# that point whatever the machine's speed.
STOP_AT_ENV = "FERRY_LAB_STOP_AT"


def _stop_at(step: str) -> None:
    if os.environ.get(STOP_AT_ENV) == step:
        os.kill(os.getpid(), signal.SIGSTOP)


@dataclass
class Manifest:
    path: str
    name: str
    state: str = "building"  # building | up | down-failed
    entries: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def create(cls, lab_dir: str, name: str) -> Manifest:
        """Start a new manifest; refuse when one exists (the lab is up or half-built)."""
        os.makedirs(lab_dir, exist_ok=True)
        path = os.path.join(lab_dir, MANIFEST)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # FileExistsError: taken
        os.close(fd)
        m = cls(path=path, name=name)
        m.save()
        _stop_at("created")
        return m

    @classmethod
    def load(cls, lab_dir: str) -> Manifest:
        path = os.path.join(lab_dir, MANIFEST)
        with open(path) as f:
            text = f.read()
        d = json.loads(text) if text.strip() else {}
        return cls(path=path, name=d.get("name", os.path.basename(lab_dir)),
                   state=d.get("state", "building"), entries=list(d.get("entries", [])),
                   info=dict(d.get("info", {})))

    def save(self) -> None:
        tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"name": self.name, "state": self.state, "entries": self.entries,
                       "info": self.info}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, self.path)

    @contextlib.contextmanager
    def _updating(self) -> Iterator[None]:
        """This process's lock and the file's (``<manifest>.lock``), with what is on disk read
        back first (another process may have added entries since this one last wrote)."""
        with self._lock, open(f"{self.path}.lock", "a") as lockf:
            fcntl.flock(lockf, fcntl.LOCK_EX)
            try:
                with open(self.path) as f:
                    text = f.read()
                d = json.loads(text) if text.strip() else {}
            except (OSError, ValueError):
                d = {}
            if d:
                self.state = d.get("state", self.state)
                self.entries = list(d.get("entries", self.entries))
                self.info = dict(d.get("info", self.info))
            yield

    def record(self, kind: str, **fields: Any) -> None:
        """Note that ``kind`` (netns/pidfile/pid/dir/file) is about to be created; persisted now."""
        if kind not in KINDS:
            raise ValueError(kind)
        entry = {"kind": kind, **fields}
        with self._updating():
            if entry not in self.entries:
                self.entries.append(entry)
                self.save()
                _stop_at(kind)

    def forget(self, kind: str, **fields: Any) -> None:
        entry = {"kind": kind, **fields}
        with self._updating():
            if entry in self.entries:
                self.entries.remove(entry)
                self.save()

    def set(self, state: str | None = None, **info: Any) -> None:
        with self._updating():
            if state:
                self.state = state
            self.info.update(info)
            self.save()

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.entries if e["kind"] == kind]
