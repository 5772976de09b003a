"""Small helpers shared by the benchmarks: timing an exec, nearest-rank percentiles, and the
first moment a watching process's output names something."""

from __future__ import annotations

import math
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar


@dataclass(frozen=True)
class Call:
    """One exec: wall time of fork+exec+run+exit, and what it printed."""

    ms: float
    rc: int
    stdout: bytes


def timed_exec(argv: Sequence[str], env: Mapping[str, str], stdin: bytes) -> Call:
    t = time.perf_counter()
    p = subprocess.run(list(argv), input=stdin, env=dict(env), capture_output=True, check=False, timeout=60)
    return Call((time.perf_counter() - t) * 1000.0, p.returncode, p.stdout)


def percentile(samples: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (p50 of 100 samples is the 50th smallest)."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


def pct(xs: Sequence[float], q: float) -> float:
    """The sample at rank ``q`` (0..1) of ``xs``, by position in the sorted list (nan when empty)."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def cpu(fn: Any) -> tuple[float, Any]:
    """``fn()``'s CPU time in this process (seconds) and its result."""
    c = time.process_time()
    out = fn()
    return time.process_time() - c, out


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in header]] + [[f"{c:.2f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in cells]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


S = TypeVar("S")  # an A/B phase's side


def ab_order(sides: Sequence[S], pairs: int) -> list[tuple[S, int]]:
    """An A/B phase's interleaved calls: pair i is one call (an ADD, or a DEL) of each side, the
    first side first in even pairs and the other first in odd ones, so neither side always runs
    on a bridge one Pod fuller or right after the other's work."""
    out: list[tuple[S, int]] = []
    for i in range(pairs):
        out += [(side, i) for side in (sides if i % 2 == 0 else sides[::-1])]
    return out


def ab_by_side(samples: Sequence[float], calls: Sequence[tuple[S, int]], sides: Sequence[S]) -> dict[S, list[float]]:
    """The samples of the calls of :func:`ab_order`, per side, in pair order."""
    out: dict[S, list[float]] = {side: [] for side in sides}
    for ms, (side, _) in sorted(zip(samples, calls, strict=True), key=lambda x: x[1][1]):
        out[side].append(ms)
    return out


def ab_ratios(ms: Mapping[str, Mapping[Any, list[float]]], ours: Any, ref: Any, target: float) -> dict[str, Any]:
    """An A/B phase's figures, ``ours`` / ``ref`` (``ms``: op -> side -> samples, the sides
    interleaved call by call): ADD p50 (the issue's figure, with its ``target``), ADD p99, DEL
    p50, and the median of the per-pair ADD ratios (each pair ran back to back)."""
    add, dele = ms["add"], ms["del"]
    add_p50 = percentile(add[ours], 50) / percentile(add[ref], 50)
    pairs = [a / b for a, b in zip(add[ours], add[ref], strict=True) if b]
    return {"ADD p50": add_p50, "ADD p99": percentile(add[ours], 99) / percentile(add[ref], 99),
            "DEL p50": percentile(dele[ours], 50) / percentile(dele[ref], 50),
            "ADD per pair, median": statistics.median(pairs) if pairs else None,
            "target": f"ADD p50 <= {target}x", "pass": add_p50 <= target}


class FirstSeen:
    """A process whose stdout reports events (``kubectl get --watch``, ``ovs-ofctl monitor``),
    read on a thread: the first moment (``time.monotonic``) each key was seen.  ``keys`` maps
    one line of output to the keys it reports (none for most); ``stderr_too``: read the
    process's stderr as well (ovs-ofctl monitor prints the updates after its first reply there)."""

    def __init__(self, argv: Sequence[str], keys: Callable[[str], Iterable[Hashable]],
                 env: Mapping[str, str] | None = None, stderr_too: bool = False) -> None:
        self.seen: dict[Hashable, float] = {}
        self.times: dict[Hashable, list[float]] = {}  # every moment each key was seen, in order
        self.cond = threading.Condition()
        self.keys = keys
        self.proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT if stderr_too else subprocess.DEVNULL, text=True,
                                     env=dict(env) if env is not None else None)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.monotonic()
            for key in self.keys(line):
                with self.cond:
                    self.times.setdefault(key, []).append(now)
                    if key not in self.seen:
                        self.seen[key] = now
                    self.cond.notify_all()

    def wait(self, key: Hashable, timeout: float) -> float:
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.seen, timeout):
                raise TimeoutError(f"{key!r} not seen within {timeout}s")
            return self.seen[key]

    def wait_after(self, key: Hashable, after: float, timeout: float) -> float:
        """The first moment ``key`` was seen at or after ``after`` (a key seen again, as a flow
        added, deleted and added back)."""
        def found() -> float | None:
            return next((t for t in self.times.get(key, ()) if t >= after), None)
        with self.cond:
            if not self.cond.wait_for(lambda: found() is not None, timeout):
                raise TimeoutError(f"{key!r} not seen after {after} within {timeout}s")
            t = found()
            assert t is not None
            return t

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
