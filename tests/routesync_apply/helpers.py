"""Shared fixtures for the appliers' tests: namespaces (prefix ``fb-``), private OVS, veths."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from routesync.apply.ovs import OvsApplier
from tests.ovs_instance import OvsInstance, netns


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

    def stop(self) -> tuple[int, int]:
        """(sent, lost) up to the last answered request: a request still in flight when the
        pinger is stopped is not counted as lost."""
        time.sleep(0.3)
        self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=10)
        seqs = {int(m) for m in re.findall(r"icmp_seq=(\d+) ", out)}
        assert seqs, out
        last = max(seqs)
        return last, len(set(range(1, last + 1)) - seqs)
