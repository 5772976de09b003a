"""A bounded wait in a short-lived process: try, and while one kind of failure says "not yet", try
again with a growing pause (10 ms to 200 ms) until the budget is spent.  The plugin's waits for a
Node's parts to start (route-sync's state file, ovsdb-server) are this: one stat or one connect
per try, nothing worth a watch.  Standard library only (the per-Pod path)."""

from __future__ import annotations

import time

from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    T = TypeVar("T")

FIRST_PAUSE, LONGEST_PAUSE = 0.01, 0.2  # seconds


def patiently(attempt: Callable[[], T], not_yet: type[Exception], wait: float,
              waiting: Callable[[], None] | None = None) -> T:
    """``attempt()``'s result; while it raises ``not_yet``, again until ``wait`` seconds have passed,
    then that exception.  ``waiting`` is called once, when the first try failed and there is time
    left (a log line saying what is awaited)."""
    deadline = time.monotonic() + wait
    pause = FIRST_PAUSE
    while True:
        try:
            return attempt()
        except not_yet:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            if waiting is not None and pause == FIRST_PAUSE:
                waiting()
            time.sleep(min(pause, left))
            pause = min(pause * 2, LONGEST_PAUSE)
