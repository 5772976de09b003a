"""Undo what a failed ADD created, in reverse order, without hiding the original error."""

from __future__ import annotations

from cni.lean.record import Factory, record
from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


@record
class Rollback:
    """Each step that creates something pushes how to remove it; ``commit`` forgets them all."""

    log: Any = None  # a cni.spec.log.Log (or anything with info/error)
    steps: list[tuple[str, Callable[[], object]]] = Factory(list)

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
                if self.log is not None:
                    self.log.info(f"rollback: removed {what}")
            except Exception as e:  # noqa: BLE001 - keep undoing the rest; the caller reports the first error
                if self.log is not None:
                    self.log.error(f"rollback: could not remove {what}: {e}")
                failed.append(what)
        return failed

    def __enter__(self) -> Rollback:  # noqa: PYI034 - typing.Self would import typing per exec
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.run()
