"""A ping (or a TCP stream) running in a namespace while a test disrupts something, read as it
runs (issue 14).

Tests used to start ``ping -c N`` and sleep before and after the disruption, hoping the ping
would still be running when the disruption was over; on a slow machine it was not, and the
test passed without testing anything (or failed).  Here the test waits for replies instead:
some before the disruption, some after it, then stops the ping and reads the result."""

from __future__ import annotations

import itertools
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Self

from tests.support.waiting import HANG

REPLY = re.compile(r"^\[([\d.]+)\] \d+ bytes from .*icmp_seq=(\d+)")


@dataclass(frozen=True)
class PingResult:
    transmitted: int
    received: int
    gap: float  # s: longest gap between consecutive replies
    lost_seqs: list[int]  # requests up to the last answered one that got no answer
    lost_after: list[float] = field(default_factory=list)  # per lost request: the stamp of the reply before it

    @property
    def lost(self) -> int:
        return self.transmitted - self.received


class LivePing:
    """``ping -D -i INTERVAL DST`` in ``netns`` (``ip netns exec``) until :meth:`stop`."""

    def __init__(self, netns: str, dst: str, interval: float = 0.02, timeout: float = 1.0) -> None:
        # stop() ends the ping with SIGINT, which makes it print its summary. No -w: with a deadline,
        # iputils ping exits at the first ICMP error (a transient "Net Unreachable" while a route
        # comes back ended the ping, and the replies after it never came); a timer bounds a hang.
        self.proc = subprocess.Popen(["ip", "netns", "exec", netns, "ping", "-n", "-D", "-i", f"{interval:g}",
                                      "-W", f"{timeout:g}", dst],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._watchdog = threading.Timer(HANG * 10, self.proc.kill)
        self._watchdog.daemon = True
        self._watchdog.start()
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
        self._watchdog.cancel()
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
            lost = sorted(set(range(1, last + 1)) - seqs)
            stamp = dict(zip(self.seqs, self.stamps, strict=True))
            return PingResult(int(m.group(1)), int(m.group(2)),
                              max((b - a for a, b in itertools.pairwise(self.stamps)), default=0.0),
                              lost, [max((t for q, t in stamp.items() if q < s), default=0.0) for s in lost])

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._watchdog.cancel()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


STREAM_SERVER = r"""
import socket, sys, time
fam = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.socket(fam, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
print("ready", flush=True)
s.settimeout(600)  # bounds a hang only
c, _ = s.accept()
c.settimeout(600)
stamp = int(sys.argv[3])
total = step = 0
while True:
    b = c.recv(65536)
    if not b:
        break
    total += len(b)
    if total // stamp != step:
        step = total // stamp
        print("rx", total, time.monotonic(), flush=True)
print("done", total, flush=True)
"""
STREAM_CLIENT = r"""
import socket, sys, threading, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=600)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
chunk, pause = b"x" * int(sys.argv[3]), float(sys.argv[4])
while not stop.is_set():
    c.sendall(chunk)
    time.sleep(pause)  # pacing: a steady stream, not a flood
c.shutdown(socket.SHUT_WR)
c.recv(1)  # the server read everything and closed
print("sent", flush=True)
"""


class LiveTcp:
    """One TCP connection from ``client_ns`` to ``addr:port`` in ``server_ns`` carrying a steady
    stream until :meth:`stop`; the test waits for bytes to arrive (:meth:`more_bytes`) before,
    during and after a disruption, and :meth:`stop` fails unless the same connection survived."""

    def __init__(self, server_ns: str, addr: str, client_ns: str, port: int,
                 via: tuple[str, int] | None = None, chunk: int = 16384, pause: float = 0.002,
                 stamp: int = 65536) -> None:
        """``via``: the client connects to this (address, port) instead, e.g. a Service's
        ClusterIP whose backend is the server. The client sends ``chunk`` bytes every ``pause``
        s (the default ~8 MB/s); the server notes the time of every ``stamp`` bytes, the
        resolution of :meth:`longest_stall` (a slow stream with a small stamp measures short
        stalls without loading the path: 1 KiB every 10 ms stamped each KiB, ~100 KB/s)."""
        self.server = subprocess.Popen(["ip", "netns", "exec", server_ns, sys.executable, "-c", STREAM_SERVER, addr,
                                        str(port), str(stamp)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True)
        assert self.server.stdout is not None
        line = self.server.stdout.readline().strip()
        if line != "ready":  # listening now: the client connects at once
            self.server.kill()
            raise AssertionError(f"stream server did not start: {line} {self.server.stdout.read()}")
        self._cv = threading.Condition()
        self.received = 0
        self.stamps: list[float] = []  # the server's monotonic time of each ``stamp`` bytes it got
        self.done: int | None = None
        self.other: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        to_addr, to_port = via or (addr, port)
        self.client = subprocess.Popen(["ip", "netns", "exec", client_ns, sys.executable, "-c", STREAM_CLIENT, to_addr,
                                        str(to_port), str(chunk), str(pause)], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def _read(self) -> None:
        assert self.server.stdout is not None
        for line in self.server.stdout:
            words = line.split()
            with self._cv:
                if len(words) == 3 and words[0] == "rx":
                    self.received = int(words[1])
                    self.stamps.append(float(words[2]))  # CLOCK_MONOTONIC: one clock for every process
                elif len(words) == 2 and words[0] == "done":
                    self.done = int(words[1])
                else:
                    self.other.append(line)
                self._cv.notify_all()
        with self._cv:
            if self.done is None:
                self.done = -1
            self._cv.notify_all()

    def more_bytes(self, n: int, what: str = "", timeout: float = HANG) -> None:
        """Wait until ``n`` more bytes arrived at the server (AssertionError after ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            want = self.received + n
            while self.received < want:
                left = deadline - time.monotonic()
                if left <= 0 or self.done is not None:
                    raise AssertionError(f"TCP: {n} more bytes did not arrive {what} (have {self.received}); "
                                         f"server: {''.join(self.other)[-500:]}")
                self._cv.wait(left)

    def longest_stall(self, since: float = 0.0, until: float = float("inf")) -> float:
        """The longest time (s) between two stamps the server took, from the last before
        ``since`` to the first after ``until`` (time.monotonic's)."""
        with self._cv:
            before = [x for x in self.stamps if x < since][-1:]
            after = [x for x in self.stamps if x > until][:1]
            t = before + [x for x in self.stamps if since <= x <= until] + after
        return max((b - a for a, b in itertools.pairwise(t)), default=0.0)

    def stop(self) -> int:
        """End the stream cleanly; the bytes the server got.  Fails unless the one connection
        carried everything (no reset, no reconnect)."""
        assert self.client.stdin is not None
        self.client.stdin.close()  # the client's cue to finish
        self.client.stdin = None  # closed: communicate() must not flush it
        out, _ = self.client.communicate(timeout=HANG)
        self.server.wait(timeout=HANG)
        self._reader.join()
        assert self.client.returncode == 0 and out.strip() == "sent", f"TCP client failed: {out[-500:]}"
        assert self.done is not None and self.done > 0, f"TCP server: {''.join(self.other)[-500:]}"
        return self.done

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in (self.client, self.server):
            if p.poll() is None:
                p.kill()
                p.wait()
