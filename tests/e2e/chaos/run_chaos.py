"""Chaos run: a 3-Node lab with route-sync, many concurrent ADD/DEL, SIGKILLed plugin processes,
route-sync killed and restarted, ovs-vswitchd restarted once mid-run; then a full audit.

    python -m tests.e2e.chaos.run_chaos --ops 1000 --workers 16 --kills 100      # make chaos
    python -m tests.e2e.chaos.run_chaos --ops 150 --workers 8 --kills 15 --json  # the CI size

What a runtime would do is what the workers do: exec the plugin (CNI env + stdin, inside the
Node's netns, so the driver holds the plugin's pid), SIGKILL some at a random instant, and
follow every killed or failed ADD with a DEL, repeating a DEL until it succeeds (the kubelet
retries DEL).  The wanted number of kills lands whatever the machine's speed (see
``Chaos._kill_delay``).

The disruptions are scheduled by operation count (:func:`schedule`), not by time: each event
runs once the ops before its mark have finished, and the op stream is held until it has run
(:class:`OpStream`), so a fast machine gets the same events at the same marks as a slow one.
The report lists every event and whether it happened; one that did not fails the run.  At the
end (:func:`audit`): every live Pod pings every other (IPv4 and IPv6), no address is held twice,
and no veth, OVS port, per-Pod flow or IPAM record exists for a Pod that is gone.  During the
ovs-vswitchd restart the Node sees no ADD/DEL: its per-peer and per-Pod flows must come back from
route-sync alone (replay from OVS external_ids), and the traffic gap of a 20 ms ping between two
anchor Pods across Nodes is measured.

Namespaces created here are ``fx<tag>-<n>``; the lab is ``tx<tag>``; all are removed at the end."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from cni.pipeline import tables as pl
from cni.pipeline.flows import PodPort, pod_flows
from tests.e2e.modes.helpers import tunnel_neighbours
from tests.support.liveping import LivePing
from tests.support.paths import REPO

IFNAME = "eth0"
KILL_WINDOW_MAX = 0.25  # s: the latest instant a plugin call is SIGKILLed at
KILL_WINDOW_MIN = 0.002
FLOWS_BACK_TIMEOUT = 60.0  # s: bounds a hang only; flows come back in about a second
PROCESS_TIMEOUT = 30.0  # s: bounds a hang only (a process to die, a ping reply to come)


def topology(resync: float = 2.0) -> dict:
    """Three Nodes: node-1 and node-2 on one segment, node-3 behind the router; encap/vxlan."""
    return {"datapath": "netdev", "clusterCIDRs": ["10.244.0.0/16", "fd00:10:244::/48"],
            "segments": {"a": {"ipv4": "192.168.77.0/24", "ipv6": "fd00:77::/64"},
                         "b": {"ipv4": "192.168.88.0/24", "ipv6": "fd00:88::/64"}},
            "router": {"routePodCIDRs": False},
            "nodes": [{"name": "node-1", "segment": "a"}, {"name": "node-2", "segment": "a"},
                      {"name": "node-3", "segment": "b"}],
            "routeSync": {"trafficEncapMode": "encap", "tunnelType": "vxlan", "resyncSeconds": resync}}


@dataclass
class Settings:
    ops: int = 150
    workers: int = 8
    kills: int = 15
    route_sync_restarts: int = 2
    vswitchd_restart: bool = True
    pods_per_node: int = 6  # the population each Node hovers around
    seed: int = 0
    cni_bin: str = ""
    keep: bool = False


ROUTE_SYNC_KILL = "route-sync kill"
ROUTE_SYNC_START = "route-sync start"
VSWITCHD_RESTART = "ovs-vswitchd restart"
VSWITCHD_NODE = "node-1"


@dataclass
class Event:
    """One scheduled disruption: it runs once ``mark`` ops have finished and before op ``mark``
    starts (the op stream is held meanwhile, see :class:`OpStream`), whatever the machine's speed."""

    mark: int
    what: str  # ROUTE_SYNC_KILL, ROUTE_SYNC_START or VSWITCHD_RESTART
    node: str
    happened: bool = False
    at_op: int | None = None  # ops finished when it ran (== mark when it ran in place)
    error: str | None = None


def schedule(s: Settings, nodes: list[str]) -> list[Event]:
    """The run's events, ordered by mark.  Route-sync restart k SIGKILLs route-sync on
    ``nodes[k % len(nodes)]`` at ``ops * (k+1) / (n+1)`` and starts it again ``ops / (4 (n+1))``
    ops later (those ops run while it is down); ovs-vswitchd on node-1 restarts at half-time, or
    right after node-1's route-sync is back when half-time falls while it is down (route-sync
    alone brings the flows back)."""
    n = s.route_sync_restarts
    down_for = max(1, s.ops // (4 * (n + 1)))
    events: list[Event] = []
    windows: list[tuple[int, int]] = []  # node-1's route-sync down: [kill, start)
    for k in range(n):
        node = nodes[k % len(nodes)]
        kill = s.ops * (k + 1) // (n + 1)
        start = min(kill + down_for, s.ops)
        events += [Event(kill, ROUTE_SYNC_KILL, node), Event(start, ROUTE_SYNC_START, node)]
        if node == VSWITCHD_NODE:
            windows.append((kill, start))
    if s.vswitchd_restart:
        mark = s.ops // 2
        for kill, start in sorted(windows):
            if kill <= mark < start:
                mark = start
        events.append(Event(mark, VSWITCHD_RESTART, VSWITCHD_NODE))
    order = {ROUTE_SYNC_KILL: 1, ROUTE_SYNC_START: 0, VSWITCHD_RESTART: 2}  # a start first at a shared mark
    return sorted(events, key=lambda e: (e.mark, order[e.what]))


class OpStream:
    """Hands out op numbers ``0 .. total-1`` to the workers and holds them at each event's mark:
    event ``e`` gets its turn (:meth:`next_event`) once ops ``0 .. e.mark-1`` have all finished,
    and op ``e.mark`` starts only after :meth:`event_done`.  So every event happens at its
    mark, on a fast machine as on a slow one; :meth:`stop` ends the run early (an error)."""

    def __init__(self, total: int, events: list[Event]) -> None:
        if any(not 0 <= e.mark <= total for e in events):
            raise ValueError(f"an event's mark lies outside 0..{total}: {events}")
        self.total = total
        self._cv = threading.Condition()
        self._pending = sorted(events, key=lambda e: e.mark)  # stable: the schedule's order at a mark
        self._next = 0
        self._in_flight = 0
        self._finished = 0
        self._waiting = 0
        self._stopped = False

    def claim(self) -> int | None:
        """The next op's number, once no event is due before it; None when the run is over."""
        with self._cv:
            while True:
                if self._stopped or self._next >= self.total:
                    return None
                if not (self._pending and self._pending[0].mark <= self._next):
                    i, self._next, self._in_flight = self._next, self._next + 1, self._in_flight + 1
                    return i
                self._waiting += 1
                self._cv.wait()
                self._waiting -= 1

    def finish(self) -> None:
        with self._cv:
            self._in_flight -= 1
            self._finished += 1
            self._cv.notify_all()

    def next_event(self) -> Event | None:
        """The next event once it is due (ops before its mark done, none running); None when
        none is left, or the run stopped before reaching it."""
        with self._cv:
            while True:
                if not self._pending:
                    return None
                if self._in_flight == 0 and self._next >= self._pending[0].mark:
                    return self._pending[0]
                if self._in_flight == 0 and (self._stopped or self._next >= self.total):
                    return None
                self._cv.wait()

    def event_done(self, event: Event) -> None:
        with self._cv:
            assert self._pending and self._pending[0] is event
            self._pending.pop(0)
            self._cv.notify_all()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()

    @property
    def finished(self) -> int:
        with self._cv:
            return self._finished

    @property
    def waiting(self) -> int:
        """Workers held at an event's mark right now."""
        with self._cv:
            return self._waiting


@dataclass
class Report:
    ops: int = 0
    adds: int = 0
    adds_ok: int = 0
    adds_failed: int = 0  # answered with an error (e.g. OVS restarting); followed by DEL
    dels: int = 0
    del_retries: int = 0
    kills: int = 0  # SIGKILLs that landed on a running plugin process
    kills_add: int = 0
    kills_del: int = 0
    route_sync_kills: int = 0
    route_sync_restarts: int = 0
    vswitchd_restarts: int = 0
    # every scheduled event (see :func:`schedule`) and what became of it
    events: list[Event] = field(default_factory=list)
    traffic_back: bool | None = None  # a reply crossed the anchors after the ovs-vswitchd restart
    traffic_gap_s: float | None = None  # longest gap between replies of a 20 ms ping across the restart
    pings_lost_during_restart: int | None = None
    flows_back_s: float | None = None  # vswitchd restart -> every PEER flow and every Pod's cookie back
    # Pods whose replayed flows differ in number from what the plugin installed before the restart
    pod_flows_differing_after_restart: list[str] = field(default_factory=list)
    live_pods: int = 0
    pairs_pinged: int = 0
    unreachable: list[str] = field(default_factory=list)
    duplicate_addresses: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    flow_mismatches: list[str] = field(default_factory=list)  # a live Pod whose flow count != the plan
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def missing_events(self) -> list[str]:
        """One line for each scheduled event that did not happen (empty when all did)."""
        return [f"{e.what} on {e.node} at op {e.mark} did not happen: {e.error or 'never reached'}"
                for e in self.events if not e.happened]

    @property
    def ok(self) -> bool:
        return not (self.unreachable or self.duplicate_addresses or self.leaks or self.errors
                    or self.flow_mismatches or self.pod_flows_differing_after_restart or self.missing_events)


@dataclass
class LivePod:
    node: str
    netns: str
    cid: str
    host_veth: str
    mac: str
    ips: list[str]  # CIDRs

    def address(self, family: int) -> str:
        return next(a.split("/")[0] for a in self.ips if (":" in a) == (family == 6))


def _run(argv: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)


# ------------------------------------------------------------------------------- the plugin


class Plugin:
    """Exec ``ferry`` for one Node as a runtime does, optionally SIGKILLing it after ``kill_after`` s."""

    def __init__(self, lab, node: str) -> None:  # type: ignore[no-untyped-def]
        self.node = lab.node(node)
        with open(self.node.paths.conflist) as f:
            conflist = json.load(f)
        self.conf = dict(conflist["plugins"][0], cniVersion=conflist["cniVersion"], name=conflist["name"])
        self.exe = os.path.join(lab.cni_bin, "ferry")
        self.cni_bin = lab.cni_bin

    def call(self, command: str, netns_path: str, cid: str, pod: str,
             kill_after: float | None = None) -> tuple[int | None, str]:
        """(exit code, stdout); exit code None when our SIGKILL landed on the running process."""
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "CNI_COMMAND": command,
               "CNI_CONTAINERID": cid, "CNI_NETNS": netns_path, "CNI_IFNAME": IFNAME, "CNI_PATH": self.cni_bin,
               "CNI_ARGS": f"K8S_POD_NAMESPACE=chaos;K8S_POD_NAME={pod}"}
        proc = subprocess.Popen(["ip", "netns", "exec", self.node.netns, self.exe], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(self.conf).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        proc.stdin = None  # closed: communicate() must not flush it
        if kill_after is not None:
            try:
                proc.wait(timeout=kill_after)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)  # `ip netns exec` exec'd the plugin: same pid
        out, _ = proc.communicate(timeout=120)
        if kill_after is not None and proc.returncode == -signal.SIGKILL:
            return None, ""
        return proc.returncode, out.decode(errors="replace")


# ------------------------------------------------------------------------------- the run


class Gate:
    """Per-Node pause: ``pause(node)`` waits until no op is in flight there and keeps new ones out until
    ``resume(node)``."""

    def __init__(self, nodes: list[str]) -> None:
        self._cv = threading.Condition()
        self._paused: set[str] = set()
        self._busy = dict.fromkeys(nodes, 0)

    @contextmanager
    def op(self, node: str) -> Iterator[None]:
        with self._cv:
            while node in self._paused:
                self._cv.wait()
            self._busy[node] += 1
        try:
            yield
        finally:
            with self._cv:
                self._busy[node] -= 1
                self._cv.notify_all()

    def pause(self, node: str) -> None:
        """Keep new ops off ``node`` and wait until none runs there."""
        with self._cv:
            self._paused.add(node)
            while self._busy[node]:
                self._cv.wait()

    def resume(self, node: str) -> None:
        with self._cv:
            self._paused.discard(node)
            self._cv.notify_all()

    def free(self, nodes: list[str]) -> list[str]:
        with self._cv:
            return [n for n in nodes if n not in self._paused]


class Chaos:
    def __init__(self, lab, settings: Settings, tag: str, log: Callable[[str], None]) -> None:  # type: ignore[no-untyped-def]
        self.lab = lab
        self.s = settings
        self.tag = tag
        self.log = log
        self.rng = random.Random(settings.seed)
        self.lock = threading.Lock()
        self.nodes = [n.name for n in lab.nodes]
        self.plugins = {n: Plugin(lab, n) for n in self.nodes}
        self.live: dict[str, LivePod] = {}  # netns -> Pod
        self.busy: set[str] = set()  # netns being deleted
        self.created_netns: set[str] = set()
        self.counter = itertools.count()
        self.ops_started = 0
        self.kills_left = settings.kills  # kills not yet landed nor reserved by a running call
        self.kill_window = KILL_WINDOW_MAX  # a kill's instant is drawn from [0, kill_window) s
        self.report = Report(events=schedule(settings, self.nodes))
        self.stream = OpStream(settings.ops, self.report.events)
        self.gate = Gate(self.nodes)
        self.anchors: dict[str, LivePod] = {}
        self.recovery: dict[str, threading.Thread] = {}  # node -> its flows-back check after a restart

    # -- one Pod ------------------------------------------------------------------------------
    def _new_netns(self) -> tuple[str, int]:
        i = next(self.counter)
        ns = f"fx{self.tag}-{i}"
        with self.lock:
            self.created_netns.add(ns)
        _run(["ip", "netns", "add", ns], timeout=30)
        _run(["ip", "-n", ns, "link", "set", "lo", "up"], timeout=30)
        return ns, i

    def _drop_netns(self, ns: str) -> None:
        _run(["ip", "netns", "del", ns], timeout=30)
        with self.lock:
            self.created_netns.discard(ns)

    def _kill_delay(self) -> float | None:
        """An instant to SIGKILL this call at, or None.  The wanted kills are spread over the run
        and reserved here (:meth:`_kill_outcome` gives back one that missed because the call had
        finished).  The instant is random within a window that halves on each miss and grows on
        each hit, so kills land on a fast machine as on a slow one; once the kills left come
        close to the ops left, every call is killed at once (that always lands)."""
        with self.lock:
            if self.kills_left <= 0:
                return None
            left_ops = max(1, self.s.ops - self.ops_started)
            must = self.kills_left + self.s.workers >= left_ops
            if not must and self.rng.random() > min(1.0, 1.6 * self.kills_left / left_ops):
                return None
            self.kills_left -= 1
            return 0.0 if must else self.rng.uniform(0.0, self.kill_window)

    def _kill_outcome(self, landed: bool) -> None:
        with self.lock:
            if landed:
                self.report.kills += 1
                self.kill_window = min(KILL_WINDOW_MAX, self.kill_window * 1.25)
            else:
                self.kills_left += 1
                self.kill_window = max(KILL_WINDOW_MIN, self.kill_window / 2)

    def _delete_until_done(self, node: str, ns: str, cid: str, pod: str) -> None:
        """DEL as the kubelet does: repeated until it succeeds (some of the calls get killed too)."""
        plugin = self.plugins[node]
        for attempt in range(60):
            delay = self._kill_delay() if attempt == 0 else None
            rc, out = plugin.call("DEL", f"/run/netns/{ns}", cid, pod, delay)
            if delay is not None:
                self._kill_outcome(landed=rc is None)
            with self.lock:
                self.report.dels += 1
                if rc is None:
                    self.report.kills_del += 1
            if rc == 0:
                return
            with self.lock:
                self.report.del_retries += 1
            if rc is not None:
                self.log(f"DEL {cid} on {node} failed ({rc}): {out.strip()[:300]}")
            time.sleep(0.1 + 0.05 * attempt)
        with self.lock:
            self.report.errors.append(f"DEL {cid} on {node} never succeeded")

    def add(self, node: str, anchor: bool = False) -> LivePod | None:
        ns, i = self._new_netns()
        cid = f"chaos{self.tag}{i:06d}"
        pod = f"p{i}"
        delay = None if anchor else self._kill_delay()
        rc, out = self.plugins[node].call("ADD", f"/run/netns/{ns}", cid, pod, delay)
        if delay is not None:
            self._kill_outcome(landed=rc is None)
        with self.lock:
            self.report.adds += 1
            if rc is None:
                self.report.kills_add += 1
        if rc == 0:
            result = json.loads(out)
            p = LivePod(node, ns, cid,
                        next(x["name"] for x in result["interfaces"] if not x.get("sandbox")),
                        next(x["mac"] for x in result["interfaces"] if x.get("sandbox")),
                        [x["address"] for x in result["ips"]])
            with self.lock:
                self.report.adds_ok += 1
                if anchor:
                    self.anchors[node] = p
                else:
                    self.live[ns] = p
            return p
        if rc is not None:
            with self.lock:
                self.report.adds_failed += 1
            self.log(f"ADD {cid} on {node} failed ({rc}): {out.strip()[:300]}")
        self._delete_until_done(node, ns, cid, pod)  # a runtime cleans up a failed/killed ADD
        self._drop_netns(ns)
        return None

    def delete(self, p: LivePod) -> None:
        self._delete_until_done(p.node, p.netns, p.cid, "p" + p.cid[-6:].lstrip("0"))
        self._drop_netns(p.netns)

    # -- workers --------------------------------------------------------------------------------
    def _one_op(self) -> None:
        node = self.rng.choice(self.gate.free(self.nodes) or self.nodes)
        with self.gate.op(node):
            with self.lock:
                mine = [p for ns, p in self.live.items() if p.node == node and ns not in self.busy]
                low, high = self.s.pods_per_node // 2, self.s.pods_per_node * 3 // 2
                do_add = len(mine) < low or (len(mine) < high and self.rng.random() < 0.5)
                victim = None if do_add or not mine else self.rng.choice(mine)
                if victim is not None:
                    self.busy.add(victim.netns)
                    del self.live[victim.netns]
            if victim is None:
                self.add(node)
            else:
                try:
                    self.delete(victim)
                finally:
                    with self.lock:
                        self.busy.discard(victim.netns)

    def _worker(self) -> None:
        while (i := self.stream.claim()) is not None:
            with self.lock:
                self.ops_started = max(self.ops_started, i + 1)
            try:
                self._one_op()
            except Exception as e:  # noqa: BLE001 - recorded, ends the run
                with self.lock:
                    self.report.errors.append(f"worker: {type(e).__name__}: {e}")
            with self.lock:
                self.report.ops += 1
                failed = bool(self.report.errors)
            self.stream.finish()
            if failed:
                self.stream.stop()

    # -- events ---------------------------------------------------------------------------------
    def _events(self) -> None:
        """Run each scheduled event when the op stream reaches its mark (the stream waits)."""
        while (ev := self.stream.next_event()) is not None:
            try:
                rec = self.recovery.get(ev.node)
                if rec is not None:  # the Node's flows-back check ends before anything else happens there
                    rec.join()
                ev.at_op = self.stream.finished
                self.log(f"{ev.what} on {ev.node} at op {ev.at_op}")
                if ev.what == ROUTE_SYNC_KILL:
                    self._kill_route_sync(ev.node)
                elif ev.what == ROUTE_SYNC_START:
                    self._start_route_sync(ev.node)
                elif ev.what == VSWITCHD_RESTART:
                    self._restart_vswitchd(ev.node)
                else:
                    raise ValueError(f"unknown event {ev.what!r}")
                ev.happened = True
            except Exception as e:  # noqa: BLE001 - the report names the event that did not happen
                ev.error = f"{type(e).__name__}: {e}"
                with self.lock:
                    self.report.errors.append(f"{ev.what} on {ev.node}: {ev.error}")
                self.stream.stop()
            finally:
                self.stream.event_done(ev)

    def _kill_route_sync(self, node: str) -> None:
        """SIGKILL route-sync; the ops up to the matching start run without it (the state file stays)."""
        self.lab.kill_route_sync(node, timeout=PROCESS_TIMEOUT)
        with self.lock:
            self.report.route_sync_kills += 1

    def _start_route_sync(self, node: str) -> None:
        pid = self.lab.start_route_sync(node)
        if self.lab.route_sync_pid(node) != pid:
            raise RuntimeError(f"route-sync {pid} on {node} is not running after its start")
        with self.lock:
            self.report.route_sync_restarts += 1

    def _restart_vswitchd(self, node: str) -> None:
        """SIGKILL ovs-vswitchd and start it again while a 20 ms ping crosses from this Node's
        anchor Pod to node-3's.  The Node sees no ADD/DEL until :meth:`_flows_back` (a thread,
        joined before the audit) has seen every flow come back from route-sync alone."""
        n = self.lab.node(node)
        self.gate.pause(node)
        ping: LivePing | None = None
        try:
            want_peer = len(flow_lines(n, pl.Cookie.owner_match(pl.Owner.PEER)))
            live = {pl.pod_cookie(p.cid, IFNAME).value for p in [*self.live.values(), *self.anchors.values()]
                    if p.node == node}
            before = pod_flow_counts(n)
            want_pod = {c: k for c, k in before.items() if c in live}
            want_neigh = tunnel_neighbours(self.lab, node)
            with self.lock:  # flows of no live Pod: left behind (the restart would hide them)
                self.report.leaks += [f"{node}: flows only: {k} per-Pod flows with cookie {c:#x} of no live Pod "
                                      "(before the ovs-vswitchd restart)"
                                      for c, k in before.items() if c not in live]
            src, dst = self.anchors.get(node), self.anchors.get("node-3")
            if src and dst:
                ping = LivePing(src.netns, dst.address(4), interval=0.02)
                if not ping.reply_after(0.0, timeout=PROCESS_TIMEOUT):
                    raise RuntimeError(f"no ping reply from {src.cid} to {dst.cid} before the restart")
            t_kill, t0 = time.time(), time.monotonic()
            self.lab.restart_vswitchd(node)
        except BaseException:
            if ping is not None:
                ping.stop()
            self.gate.resume(node)
            raise
        with self.lock:
            self.report.vswitchd_restarts += 1
        rec = threading.Thread(target=self._flows_back, args=(node, want_peer, want_pod, want_neigh, t0, t_kill, ping))
        self.recovery[node] = rec
        rec.start()

    def _flows_back(self, node: str, want_peer: int, want_pod: dict[int, int], want_neigh: set[tuple[str, str]],
                    t0: float, t_kill: float, ping: LivePing | None) -> None:
        n = self.lab.node(node)
        try:
            deadline = t0 + FLOWS_BACK_TIMEOUT
            while True:  # every PEER flow back, every Pod's flows as the plugin had installed them,
                # and the tunnel neighbours OVS lost (until route-sync refills them IPv6 underlay drops)
                have_peer = len(flow_lines(n, pl.Cookie.owner_match(pl.Owner.PEER)))
                have_pod = pod_flow_counts(n)
                if have_peer == want_peer and have_pod == want_pod and tunnel_neighbours(self.lab, node) >= want_neigh:
                    break
                if time.monotonic() > deadline:
                    if have_peer == want_peer and set(have_pod) == set(want_pod):
                        with self.lock:  # all there, some with other flows than the plugin's
                            self.report.pod_flows_differing_after_restart = [
                                f"{c:#x}: {have_pod.get(c)} of {k}" for c, k in want_pod.items()
                                if have_pod.get(c) != k]
                        break
                    raise AssertionError(
                        f"{node}: flows not back {FLOWS_BACK_TIMEOUT:.0f} s after the ovs-vswitchd "
                        f"restart (PEER {have_peer}/{want_peer}, Pods {len(have_pod)}/{len(want_pod)}, "
                        f"tunnel neighbours missing: {want_neigh - tunnel_neighbours(self.lab, node)})")
                time.sleep(0.05)
            with self.lock:
                self.report.flows_back_s = round(time.monotonic() - t0, 3)
            if ping is not None:
                back = ping.reply_after(t_kill, timeout=PROCESS_TIMEOUT)
                with self.lock:
                    self.report.traffic_back = back
                if not back:
                    raise AssertionError(f"{node}: no ping reply across the Nodes {PROCESS_TIMEOUT:.0f} s after "
                                         "its flows came back")
        except Exception as e:  # noqa: BLE001
            with self.lock:
                self.report.errors.append(f"{node} after the ovs-vswitchd restart: {type(e).__name__}: {e}")
        finally:
            if ping is not None:
                res = ping.stop()
                with self.lock:
                    self.report.traffic_gap_s, self.report.pings_lost_during_restart = round(res.gap, 3), res.lost
            self.gate.resume(node)
        self.log(f"{node}: flows back after {self.report.flows_back_s}s, traffic gap {self.report.traffic_gap_s}s")

    # -- the whole run ----------------------------------------------------------------------------
    def run(self) -> Report:
        t0 = time.monotonic()
        for node in self.nodes:  # long-lived Pods: the traffic probe across the vswitchd restart
            if self.add(node, anchor=True) is None:
                raise RuntimeError(f"anchor Pod on {node} could not be added")
        events = threading.Thread(target=self._events, daemon=True)
        events.start()
        workers = [threading.Thread(target=self._worker) for _ in range(self.s.workers)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        events.join()  # the stream ended: every event due has run, or the run stopped early
        for rec in self.recovery.values():
            rec.join()
        for line in self.report.missing_events:
            self.log(f"MISSING EVENT: {line}")
        self.log(f"{self.report.ops} ops done in {time.monotonic() - t0:.1f}s; auditing")
        audit(self.lab, [*self.anchors.values(), *self.live.values()], self.report)
        self.report.seconds = round(time.monotonic() - t0, 1)
        return self.report

    def cleanup(self) -> None:
        for p in list(self.live.values()) + list(self.anchors.values()):
            self.plugins[p.node].call("DEL", f"/run/netns/{p.netns}", p.cid, "x")
        for ns in list(self.created_netns):
            self._drop_netns(ns)


# ------------------------------------------------------------------------------- the audit


def flow_lines(node, cookie_match: str | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    args = [f"cookie={cookie_match}"] if cookie_match else []
    out = node.ofctl("dump-flows", *args)
    return [ln for ln in out.splitlines() if "cookie=" in ln]


def pod_flow_counts(node) -> dict[int, int]:  # type: ignore[no-untyped-def]
    """Per-Pod flows on ``node``: cookie value -> number of flows."""
    counts: dict[int, int] = {}
    for ln in flow_lines(node, pl.Cookie.owner_match(pl.Owner.POD)):
        m = re.search(r"cookie=(0x[0-9a-f]+)", ln)
        if m:
            counts[int(m.group(1), 16)] = counts.get(int(m.group(1), 16), 0) + 1
    return counts


def _plan(port: PodPort, gw_mac: str, gw_ofport: int | None) -> list:
    """The per-Pod flows the plugin's ADD installs (the gateway ofport argument is recent)."""
    try:
        return pod_flows(port, gw_mac, gw_ofport)  # type: ignore[call-arg]
    except TypeError:
        return pod_flows(port, gw_mac)


def pod_ports(node) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    """OVS ports the plugin made (``ferry-owner=pod``): name -> {ofport, external_ids}."""
    out = node.vsctl("--format=json", "--columns=name,ofport,external_ids", "find", "Interface",
                     f"external_ids:{pl.EXT_OWNER}=pod")
    rows = json.loads(out)["data"]
    return {r[0]: {"ofport": r[1] if isinstance(r[1], int) else -1, "external_ids": dict(r[2][1])} for r in rows}


def ipam_rows(lab, node) -> list[dict]:  # type: ignore[no-untyped-def]
    p = _run([os.path.join(lab.cni_bin, "ferry-ipam"), "ls", "--json", "--data-dir", node.paths.ipam])
    if p.returncode != 0:
        raise RuntimeError(f"ferry-ipam ls failed: {p.stderr}")
    return json.loads(p.stdout)


def audit(lab, pods: list[LivePod], report: Report) -> None:  # type: ignore[no-untyped-def]
    """Leaks, doubled addresses and all-pairs reachability, written into ``report``."""
    report.live_pods = len(pods)
    owners: dict[str, str] = {}
    for node in lab.nodes:
        mine = [p for p in pods if p.node == node.name]
        want_veths = {p.host_veth for p in mine}
        links = node.exec(["ip", "-o", "link", "show"], check=True).stdout
        have_veths = {ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines()}
        have_veths = {x for x in have_veths if x.startswith(pl.HOST_VETH_PREFIX)}
        report.leaks += [f"{node.name}: veth {x} left" for x in sorted(have_veths - want_veths)]
        report.errors += [f"{node.name}: veth {x} of a live Pod missing" for x in sorted(want_veths - have_veths)]
        ports = node.vsctl("list-ports", lab.topology.bridge).split()
        have_ports = {x for x in ports if x.startswith(pl.HOST_VETH_PREFIX)}
        report.leaks += [f"{node.name}: OVS port {x} left" for x in sorted(have_ports - want_veths)]
        report.errors += [f"{node.name}: OVS port {x} missing" for x in sorted(want_veths - have_ports)]
        pports = pod_ports(node)
        report.leaks += [f"{node.name}: Pod-owned OVS interface {x} left" for x in sorted(set(pports) - want_veths)]
        counts = pod_flow_counts(node)
        gw = (node.state() or {}).get("gateway", {})
        gw_mac, gw_ofport = gw.get("mac", ""), gw.get("ofport")
        want_cookies = {}
        for p in mine:
            ofport = pports.get(p.host_veth, {}).get("ofport", -1)
            port = PodPort(pl.pod_cookie(p.cid, IFNAME), ofport, p.mac, tuple(p.ips))
            want_cookies[port.cookie.value] = (p, len(_plan(port, gw_mac, gw_ofport)))
        for cookie, n in sorted(counts.items()):
            if cookie not in want_cookies:
                report.leaks.append(f"{node.name}: flows only: {n} per-Pod flows with cookie {cookie:#x} "
                                    "of no live Pod")
        for cookie, (p, n) in want_cookies.items():
            if counts.get(cookie, 0) != n:
                report.flow_mismatches.append(f"{node.name}: Pod {p.cid} has {counts.get(cookie, 0)} flows, "
                                              f"planned {n}")
        rows = ipam_rows(lab, node)
        want_keys = {(p.cid, IFNAME) for p in mine}
        have_keys = {(r["containerID"], r["ifname"]) for r in rows}
        report.leaks += [f"{node.name}: IPAM record {k[0]}/{k[1]} left" for k in sorted(have_keys - want_keys)]
        report.errors += [f"{node.name}: IPAM record of live {k[0]} missing" for k in sorted(want_keys - have_keys)]
        for r in rows:
            addr = r["address"].split("/")[0]
            holder = f"{node.name}/{r['containerID']}"
            if addr in owners and owners[addr] != holder:
                report.duplicate_addresses.append(f"{addr}: {owners[addr]} and {holder}")
            owners[addr] = holder
        for p in mine:
            for a in p.ips:
                if owners.get(a.split("/")[0]) != f"{node.name}/{p.cid}":
                    report.errors.append(f"{p.cid}: address {a} not recorded in IPAM for it")
    _reachability(pods, report)


def _ping(src: LivePod, dst: str) -> bool:
    for _ in range(3):
        if _run(["ip", "netns", "exec", src.netns, "ping", "-n", "-q", "-c", "1", "-W", "5", dst]).returncode == 0:
            return True
    return False


def _reachability(pods: list[LivePod], report: Report) -> None:
    pairs = [(a, b, fam) for a in pods for b in pods if a is not b for fam in (4, 6)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda t: _ping(t[0], t[1].address(t[2])), pairs))
    report.pairs_pinged = len(pairs)
    report.unreachable = [f"{a.node}/{a.cid} -> {b.node}/{b.cid} v{fam}"
                          for (a, b, fam), ok in zip(pairs, results, strict=True) if not ok]


# ------------------------------------------------------------------------------- entry point


def run_chaos(settings: Settings, log: Callable[[str], None] = lambda s: None) -> Report:
    """Build a lab, run the chaos, audit, tear everything down; the report says what was found."""
    from lab.api import Lab, ensure_cni_bin

    tag = f"{os.getpid() % 0xFFFF:x}{random.randrange(16):x}"
    cni_bin = ensure_cni_bin(settings.cni_bin or str(REPO / "build" / "cni-bin"))
    lab = Lab.up(topology(), name=f"tx{tag}"[:12], cni_bin=cni_bin)
    chaos = Chaos(lab, settings, tag, log)
    try:
        return chaos.run()
    finally:
        if not settings.keep:
            chaos.cleanup()
            lab.down()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--route-sync-restarts", type=int, default=4)
    ap.add_argument("--no-vswitchd-restart", action="store_true")
    ap.add_argument("--pods-per-node", type=int, default=8)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--cni-bin", default=os.environ.get("FERRY_CNI_BIN", ""))
    ap.add_argument("--keep", action="store_true", help="leave the lab up afterwards")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    a = ap.parse_args(argv)
    s = Settings(ops=a.ops, workers=a.workers, kills=a.kills, route_sync_restarts=a.route_sync_restarts,
                 vswitchd_restart=not a.no_vswitchd_restart, pods_per_node=a.pods_per_node, seed=a.seed,
                 cni_bin=a.cni_bin, keep=a.keep)
    t0 = time.monotonic()
    report = run_chaos(s, log=lambda m: print(f"[{time.monotonic() - t0:7.1f}s] {m}", file=sys.stderr, flush=True))
    doc = dict(asdict(report), ok=report.ok, missing_events=report.missing_events, seed=s.seed)
    if a.json:
        print(json.dumps(doc, indent=2))
    else:
        for k, v in doc.items():
            print(f"{k:32} {v}")
    for line in report.missing_events:
        print(f"FAILED: scheduled event missing: {line}", file=sys.stderr)
    if report.kills != s.kills:
        print(f"FAILED: {report.kills} SIGKILLs landed, {s.kills} wanted", file=sys.stderr)
    return 0 if report.ok and report.kills == s.kills else 1


if __name__ == "__main__":
    raise SystemExit(main())
