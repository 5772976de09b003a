"""A ping running in a namespace while a test disrupts something, read as it runs (issue 14).

Tests used to start ``ping -c N`` and sleep before and after the disruption, hoping the ping
would still be running when the disruption was over; on a slow machine it was not, and the
test passed without testing anything (or failed).  Here the test waits for replies instead:
some before the disruption, some after it, then stops the ping and reads the result."""

from __future__ import annotations

import itertools
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Self

from tests.waiting import HANG

REPLY = re.compile(r"^\[([\d.]+)\] \d+ bytes from .*icmp_seq=(\d+)")


@dataclass(frozen=True)
class PingResult:
    transmitted: int
    received: int
    gap: float  # s: longest gap between consecutive replies
    lost_seqs: list[int]  # requests up to the last answered one that got no answer

    @property
    def lost(self) -> int:
        return self.transmitted - self.received


class LivePing:
    """``ping -D -i INTERVAL DST`` in ``netns`` (``ip netns exec``) until :meth:`stop`."""

    def __init__(self, netns: str, dst: str, interval: float = 0.02, timeout: float = 1.0) -> None:
        # -w bounds a hang only: stop() ends the ping with SIGINT, which makes it print its summary
        self.proc = subprocess.Popen(["ip", "netns", "exec", netns, "ping", "-n", "-D", "-i", f"{interval:g}",
                                      "-W", f"{timeout:g}", "-w", str(int(HANG * 10)), dst],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._cv = threading.Condition()
        self.stamps: list[float] = []  # wall-clock times (time.time()) of the replies, in order
        self.seqs: list[int] = []
        self.other: list[str] = []
        self._ended = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            m = REPLY.match(line)
            with self._cv:
                if m:
                    self.stamps.append(float(m.group(1)))
                    self.seqs.append(int(m.group(2)))
                else:
                    self.other.append(line)
                self._cv.notify_all()
        with self._cv:
            self._ended = True
            self._cv.notify_all()

    def _wait(self, cond, timeout: float) -> bool:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        with self._cv:
            while not cond():
                left = deadline - time.monotonic()
                if left <= 0 or self._ended:
                    return False
                self._cv.wait(left)
            return True

    @property
    def replies(self) -> int:
        with self._cv:
            return len(self.stamps)

    def more_replies(self, n: int, what: str = "", timeout: float = HANG) -> None:
        """Wait for ``n`` replies more than have come so far (AssertionError after ``timeout``)."""
        with self._cv:
            want = len(self.stamps) + n
        if not self._wait(lambda: len(self.stamps) >= want, timeout):
            raise AssertionError(f"ping: {n} more replies did not come within {timeout:.0f} s {what}".strip()
                                 + f"; output: {''.join(self.other)[-500:]}")

    def reply_after(self, wall: float, timeout: float = HANG) -> bool:
        """Wait for a reply stamped after ``wall`` (``time.time()``); False after ``timeout``."""
        return self._wait(lambda: bool(self.stamps) and self.stamps[-1] > wall, timeout)

    def stop(self) -> PingResult:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # `ip netns exec` exec'd ping: same pid
        try:
            self.proc.wait(timeout=HANG)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join()
        with self._cv:
            m = re.search(r"(\d+) packets transmitted, (\d+) received", "".join(self.other))
            assert m, "".join(self.other)[-500:]
            seqs = set(self.seqs)
            last = max(seqs, default=0)
            return PingResult(int(m.group(1)), int(m.group(2)),
                              max((b - a for a, b in itertools.pairwise(self.stamps)), default=0.0),
                              sorted(set(range(1, last + 1)) - seqs))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
