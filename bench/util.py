"""Small helpers shared by the benchmarks: timing an exec and nearest-rank percentiles."""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


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


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in header]] + [[f"{c:.2f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in cells]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
