"""Waiting on an observable condition instead of sleeping (issue 14).

A test that sleeps and then asserts passes or fails with the machine's speed.  ``until`` polls the
real condition; its deadline only bounds a hang, so it is generous (a loaded 2-core CI machine
shared with other builds must never reach it when the code is right), and reaching it fails the
test with what was awaited."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

HANG = 60.0  # s: only a hang takes this long
T = TypeVar("T")


def until(cond: Callable[[], T], what: str = "the condition", timeout: float = HANG, step: float = 0.01) -> T:
    """Poll ``cond()`` until it returns something truthy, and return that; AssertionError naming
    ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what} (last seen: {value!r})")
        time.sleep(step)


def elapsed_until(cond: Callable[[], object], what: str = "the condition", timeout: float = HANG,
                  step: float = 0.005) -> float:
    """Seconds until ``cond()`` held (a measurement to print, not to assert on)."""
    t0 = time.monotonic()
    until(cond, what, timeout, step)
    return time.monotonic() - t0


def flock_waiters(lock_path: str) -> int:
    """How many requests /proc/locks lists as blocked (``->``) on the lock file's inode: the event
    a test waits for to know that a lock's taker is waiting for its holder."""
    ino = os.stat(lock_path).st_ino
    with open("/proc/locks") as f:
        return sum(1 for line in f if "->" in line and line.split()[-3].endswith(f":{ino}"))
