"""Shared fixtures for the appliers' tests: namespaces (prefix ``fb-``), private OVS, veths."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from routesync.apply.ovs import OvsApplier
from tests.support.ovs_instance import OvsInstance, netns
from tests.support.waiting import HANG


def sh(*argv: str, check: bool = True) -> str:
    p = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=60)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip()}")
    return p.stdout


def ns_sh(ns: str, *argv: str, check: bool = True) -> str:
    return sh("ip", "netns", "exec", ns, *argv, check=check)


@dataclass
class Node:
    ns: str
    ovs: OvsInstance
    applier: OvsApplier


@contextmanager
def node(name: str, datapath: str = "netdev") -> Iterator[Node]:
    """A namespace with its own OVS and br-int (netdev), and an OvsApplier on it."""
    with ExitStack() as stack:
        ns = stack.enter_context(netns(name))
        ovs = stack.enter_context(OvsInstance(name, netns=ns))
        applier = OvsApplier(ovs.db, "br-int", ovs.run_dir)
        stack.callback(applier.close)
        applier.ensure_bridge(datapath)
        yield Node(ns, ovs, applier)


def veth(ns_a: str, name_a: str, ns_b: str, name_b: str) -> None:
    """A veth pair between two namespaces, both ends up."""
    tmp_a, tmp_b = f"fb-t{time.monotonic_ns() % 10**8}", f"fb-u{time.monotonic_ns() % 10**8}"
    sh("ip", "link", "add", tmp_a, "type", "veth", "peer", "name", tmp_b)
    sh("ip", "link", "set", tmp_a, "netns", ns_a, "name", name_a)
    sh("ip", "link", "set", tmp_b, "netns", ns_b, "name", name_b)
    ns_sh(ns_a, "ip", "link", "set", name_a, "up")
    ns_sh(ns_b, "ip", "link", "set", name_b, "up")


class Pinger:
    """``ping -i INTERVAL`` running in ``ns`` until ``stop()``; then sent/received counts."""

    def __init__(self, ns: str, target: str, interval: float = 0.01) -> None:
        self.proc = subprocess.Popen(["ip", "netns", "exec", ns, "ping", "-n", "-i", str(interval),
                                      "-W", "1", target], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self._cv = threading.Condition()
        self._seqs: list[int] = []
        self._ended = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            m = re.search(r"icmp_seq=(\d+) ", line)
            with self._cv:
                if m:
                    self._seqs.append(int(m.group(1)))
                self._cv.notify_all()
        with self._cv:
            self._ended = True
            self._cv.notify_all()

    def stop(self, replies_after: int = 10) -> tuple[int, int]:
        """(sent, lost) up to the last answered request: a request still in flight when the
        pinger is stopped is not counted as lost.  Stops once ``replies_after`` more replies came
        (traffic goes on after whatever happened before the call), not after a guessed time."""
        deadline = time.monotonic() + HANG
        with self._cv:
            want = len(self._seqs) + replies_after
            while len(self._seqs) < want and not self._ended:
                left = deadline - time.monotonic()
                assert left > 0, f"ping: no {replies_after} replies within {HANG:.0f} s (got {len(self._seqs)})"
                self._cv.wait(left)
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=HANG)
        self._reader.join()
        assert self.proc.stderr is not None
        assert len(self._seqs) >= want, f"ping ended early: {self.proc.stderr.read()}"
        seqs = set(self._seqs)
        last = max(seqs)
        return last, len(set(range(1, last + 1)) - seqs)
