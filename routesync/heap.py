"""The daemon's heap after a full pass: what the pass built (every peer's plan, flows and
routes, the policy's index) is long-lived, and Python's cyclic collector scans every tracked
object on each of its oldest-generation runs: at 5,000 peers ~190,000 objects, a 120 ms pause
in the middle of whichever Node change allocated last (``bench_routesync``).  After each full
pass the heap is settled: the frozen generation released, cycles collected once, and what
remains frozen (``gc.freeze``), so later collections scan only what changes have allocated
since.  Reference counting still frees a frozen object that is dropped; only a cycle among
frozen objects waits for the next full pass (a resync) to be collected."""

from __future__ import annotations

import gc
import time


class HeapSettler:
    """``settle()`` after a full pass; counts what it did (for logs and tests)."""

    def __init__(self) -> None:
        self.settles = 0
        self.frozen = 0  # objects frozen by the last settle
        self.seconds = 0.0  # the last settle's wall time

    def settle(self) -> None:
        t0 = time.monotonic()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.frozen = gc.get_freeze_count()
        self.seconds = time.monotonic() - t0
        self.settles += 1
