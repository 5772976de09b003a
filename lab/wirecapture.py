"""Capturing a lab's underlay while traffic runs: ``tcpdump -w`` on every port of every segment's
switch (``lab.wireevidence.points``), then the frames decoded (``lab.pcap``) into
:class:`lab.wireevidence.Evidence`.

    with WireCapture(lab) as cap:        # returns once every tcpdump listens
        check.run(lab)
        ev = cap.evidence()              # settled (each port's last frames are in), stopped, decoded
    assert not ev.sightings              # no Pod address on the wire

Synchronised on events, not on time: a tcpdump is started when it says it listens (its first line
on stderr), and a capture ends only once each port's file holds a marker sent after the traffic
(each Node pings its router with a marker size; a packet socket hands frames over in order), so
stopping tcpdump never loses the last frames."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Self

from lab import pcap, wireevidence
from lab.sh import LabError, in_netns
from lab.topology import router_address
from lab.wireevidence import Evidence, Point

if TYPE_CHECKING:
    from lab.api import Lab

SNAPLEN = 512  # headers through Geneve with options, an inner IPv6 and an ICMP error's quote
MARK_PAYLOAD = 1234  # ICMP echo data of the ping that closes a capture
ICMP_ECHO = {4: 8, 6: 128}
IP_HEADER = {4: 20, 6: 40}
SETTLE_TIMEOUT = 60.0  # s: bounds a hang only
DROPPED = re.compile(r"(\d+) packets? dropped by kernel")


class WireCapture:
    """tcpdump on ``points`` (default: every port of the lab's segments) until :meth:`stop`."""

    def __init__(self, lab: Lab, points: Sequence[Point] | None = None, ports: pcap.Ports | None = None,
                 keep: str | None = None) -> None:
        """``keep``: write the pcap files into this directory and leave them there (else a
        temporary one, removed at the end)."""
        self.lab = lab
        self.points = list(points if points is not None else wireevidence.points(lab.topology, lab.name))
        self.ports = ports or wireevidence.ports_of(lab.topology)
        self.keep = keep
        if keep:
            os.makedirs(keep, exist_ok=True)
        self.dir = keep or tempfile.mkdtemp(prefix="ferry-wire-")
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.dropped: dict[str, int] = {}
        try:
            for pt in self.points:
                self.procs[pt.name] = subprocess.Popen(
                    in_netns(pt.netns, ["tcpdump", "-U", "-nn", "-s", str(SNAPLEN), "-i", pt.port, "-w",
                                        self.file(pt)]),
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for name, p in self.procs.items():
                assert p.stderr is not None
                line = p.stderr.readline()
                if "listening on" not in line:
                    raise LabError(f"tcpdump on {name}: {line.strip() or 'exited'} (rc={p.poll()})")
        except BaseException:
            self.close()
            raise

    def file(self, pt: Point) -> str:
        return os.path.join(self.dir, f"{pt.segment}-{pt.port}.pcap")

    # ---------------------------------------------------------------- the end of a capture
    def settle(self) -> None:
        """Every frame sent so far is in the files: each Node pings its router once with the marker
        size, and each port's file is read until it holds the markers of the Nodes whose frames to
        the router cross it."""
        want: dict[str, set[tuple[str, str]]] = {}
        for n in self.lab.nodes:
            family = 4 if n.address(4) else 6
            src, gw = n.address(family), router_address(self.lab.topology, n.spec.segment)[family == 6]
            assert src is not None and gw is not None
            cp = n.exec(["ping", f"-{family}", "-n", "-c", "1", "-W", "5", "-s", str(MARK_PAYLOAD), gw])
            if cp.returncode != 0:
                raise LabError(f"the capture's marker ping {n.name} -> router {gw} failed: {cp.stdout.strip()}")
            for pt in self.points:
                if n.name in pt.nodes:
                    want.setdefault(pt.name, set()).add((src, gw))
        deadline = time.monotonic() + SETTLE_TIMEOUT
        for pt in self.points:
            while not want.get(pt.name, set()) <= self._markers(pt):
                if time.monotonic() > deadline:
                    raise LabError(f"the capture on {pt.name} did not get the markers of {sorted(want[pt.name])}")
                time.sleep(0.01)

    def _markers(self, pt: Point) -> set[tuple[str, str]]:
        try:
            pkts = pcap.packets(self.file(pt), self.ports)
        except (OSError, pcap.PcapError):
            return set()  # not written yet
        out = set()
        for p in pkts:
            o = p.outer
            fam = 6 if o and ":" in o.src else 4
            if o and o.icmp_type == ICMP_ECHO[fam] and o.size == IP_HEADER[fam] + 8 + MARK_PAYLOAD:
                out.add((o.src, o.dst))
        return out

    def stop(self) -> dict[str, list[pcap.Packet]]:
        """Stop every tcpdump and decode what each captured (point name -> frames)."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for name, p in self.procs.items():
            try:
                _out, err = p.communicate(timeout=SETTLE_TIMEOUT)
            except subprocess.TimeoutExpired:
                p.kill()
                _out, err = p.communicate()
            m = DROPPED.search(err or "")
            self.dropped[name] = int(m.group(1)) if m else 0
        try:
            return {pt.name: pcap.packets(self.file(pt), self.ports) for pt in self.points}
        finally:
            self.close()

    def evidence(self) -> Evidence:
        """:meth:`settle`, :meth:`stop`, and the evidence in what was captured."""
        self.settle()
        captured = self.stop()
        return wireevidence.of_topology(self.lab.topology, captured, self.dropped)

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
