"""Undo what a failed ADD created, in reverse order, without hiding the original error."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("ferry")


@dataclass
class Rollback:
    """Each step that creates something pushes how to remove it; ``commit`` forgets them all."""

    steps: list[tuple[str, Callable[[], object]]] = field(default_factory=list)

    def push(self, what: str, undo: Callable[[], object]) -> None:
        self.steps.append((what, undo))

    def commit(self) -> None:
        self.steps.clear()

    def run(self) -> list[str]:
        """Undo every step, newest first; returns the steps whose undo failed (also logged)."""
        failed = []
        while self.steps:
            what, undo = self.steps.pop()
            try:
                undo()
                log.info("rollback: removed %s", what)
            except Exception as e:  # keep undoing the rest; the caller reports the first error
                log.error("rollback: could not remove %s: %s", what, e)
                failed.append(what)
        return failed

    def __enter__(self) -> "Rollback":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.run()
