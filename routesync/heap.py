"""The daemon's heap after a full pass: what the pass built (every peer's plan, flows and
routes, the policy's index) is long-lived, and Python's cyclic collector scans every tracked
object on each of its oldest-generation runs: at 5,000 peers ~190,000 objects, a 120 ms pause
in the middle of whichever Node change allocated last (``bench_routesync``).  After each full
pass the heap is settled: the frozen generation released, cycles collected once, and what
remains frozen (``gc.freeze``), so later collections scan only what changes have allocated
since.  Reference counting still frees a frozen object that is dropped; only a cycle among
frozen objects waits for the next full pass (a resync) to be collected.

The first settle also raises the youngest generation's threshold to ``YOUNG`` allocations (the
interpreter's default is 700).  A Node change at 5,000 peers replaces lists of tens of thousands
of references (the peers' plans, flows, rows; the route sets): with 700, a collection ran every
other change and scanned the lists that change had just made, and every tenth one a middle
generation run of ~1.5-2 ms; those lists are freed by reference counting when the next change
replaces them, so a young generation that waits longer scans them rarely.  ``bench_routesync``,
200 changes: the collector's CPU in route-sync's thread 52 -> 16 ms, and the ~1.5-4 ms pauses
every ~20 changes gone."""

from __future__ import annotations

import gc
import time

# allocations (less deallocations) of tracked objects between two collections of the youngest
# generation, from the first settle on (see the module)
YOUNG = 20_000


class HeapSettler:
    """``settle()`` after a full pass; counts what it did (for logs and tests).  ``young``: the
    youngest generation's threshold from the first settle on (None: the interpreter's)."""

    def __init__(self, young: int | None = YOUNG) -> None:
        self.young = young
        self.settles = 0
        self.frozen = 0  # objects frozen by the last settle
        self.seconds = 0.0  # the last settle's wall time

    def settle(self) -> None:
        t0 = time.monotonic()
        threshold = gc.get_threshold()
        if self.young is not None and threshold[0] < self.young:
            gc.set_threshold(self.young, *threshold[1:])
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.frozen = gc.get_freeze_count()
        self.seconds = time.monotonic() - t0
        self.settles += 1
