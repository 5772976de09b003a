"""Chaos run: a 3-Node lab with route-sync, many concurrent ADD/DEL, SIGKILLed plugin processes,
route-sync killed and restarted, ovs-vswitchd restarted once mid-run; then a full audit.

    python -m tests.chaos.run_chaos --ops 1000 --workers 16 --kills 100      # make chaos
    python -m tests.chaos.run_chaos --ops 150 --workers 8 --kills 15 --json  # the CI size

What a runtime would do is what the workers do: exec the plugin (CNI env + stdin, inside the
Node's netns, so the driver holds the plugin's pid), SIGKILL some at a random instant, and
follow every killed or failed ADD with a DEL, repeating a DEL until it succeeds (the kubelet
retries DEL).  At the end (:func:`audit`): every live Pod pings every other (IPv4 and IPv6), no
address is held twice, and no veth, OVS port, per-Pod flow or IPAM record exists for a Pod
that is gone.  During the ovs-vswitchd restart the Node sees no ADD/DEL: its per-peer and
per-Pod flows must come back from route-sync alone (replay from OVS external_ids), and the
traffic gap of a 20 ms ping between two anchor Pods across Nodes is measured.

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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from cni import pipeline as pl
from cni.flows import PodPort, pod_flows

IFNAME = "eth0"


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
    route_sync_restarts: int = 0
    vswitchd_restarts: int = 0
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
    def ok(self) -> bool:
        return not (self.unreachable or self.duplicate_addresses or self.leaks or self.errors
                    or self.flow_mismatches or self.pod_flows_differing_after_restart)


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
    """Per-Node pause: ``hold(node)`` waits until no op is in flight there and keeps new ones out."""

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

    @contextmanager
    def hold(self, node: str) -> Iterator[None]:
        with self._cv:
            self._paused.add(node)
            while self._busy[node]:
                self._cv.wait()
        try:
            yield
        finally:
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
        self.kills_left = settings.kills
        self.report = Report()
        self.gate = Gate(self.nodes)
        self.anchors: dict[str, LivePod] = {}

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
        """A random instant to kill this call at, or None; spreads the wanted kills over the ops."""
        with self.lock:
            left_ops = max(1, self.s.ops - self.ops_started)
            if self.kills_left <= 0 or self.rng.random() > min(1.0, 1.6 * self.kills_left / left_ops):
                return None
            return self.rng.uniform(0.0, 0.25)

    def _delete_until_done(self, node: str, ns: str, cid: str, pod: str) -> None:
        """DEL as the kubelet does: repeated until it succeeds (some of the calls get killed too)."""
        plugin = self.plugins[node]
        for attempt in range(60):
            delay = self._kill_delay() if attempt == 0 else None
            rc, out = plugin.call("DEL", f"/run/netns/{ns}", cid, pod, delay)
            with self.lock:
                self.report.dels += 1
                if rc is None:
                    self.report.kills += 1
                    self.report.kills_del += 1
                    self.kills_left -= 1
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
        with self.lock:
            self.report.adds += 1
            if rc is None:
                self.report.kills += 1
                self.report.kills_add += 1
                self.kills_left -= 1
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
        while True:
            with self.lock:
                if self.ops_started >= self.s.ops or self.report.errors:
                    return
                self.ops_started += 1
            try:
                self._one_op()
            except Exception as e:  # noqa: BLE001 - recorded, ends the run
                with self.lock:
                    self.report.errors.append(f"worker: {type(e).__name__}: {e}")
            with self.lock:
                self.report.ops += 1

    # -- events ---------------------------------------------------------------------------------
    def _events(self, done: threading.Event) -> None:
        """route-sync restarts spread over the run, the ovs-vswitchd restart at half-time."""
        n = self.s.route_sync_restarts
        marks = [(self.s.ops * (k + 1) // (n + 2), "route-sync") for k in range(n)]
        if self.s.vswitchd_restart:
            marks.append((self.s.ops // 2, "vswitchd"))
        for mark, what in sorted(marks):
            while self.report.ops < mark and not done.is_set():
                time.sleep(0.05)
            if done.is_set():
                return
            try:
                if what == "route-sync":
                    self._restart_route_sync(self.nodes[self.report.route_sync_restarts % len(self.nodes)])
                else:
                    self._restart_vswitchd("node-1")
            except Exception as e:  # noqa: BLE001
                with self.lock:
                    self.report.errors.append(f"{what} restart: {type(e).__name__}: {e}")

    def _restart_route_sync(self, node: str) -> None:
        self.log(f"killing route-sync on {node} (SIGKILL) at op {self.report.ops}")
        self.lab.kill_route_sync(node)
        time.sleep(self.rng.uniform(0.3, 1.5))  # ADD/DEL go on meanwhile (the state file stays)
        self.lab.start_route_sync(node)
        with self.lock:
            self.report.route_sync_restarts += 1

    def _restart_vswitchd(self, node: str) -> None:
        src, dst = self.anchors.get(node), self.anchors.get("node-3")
        with self.gate.hold(node):  # no ADD/DEL on this Node until its flows are back by themselves
            self.log(f"restarting ovs-vswitchd on {node} at op {self.report.ops}")
            n = self.lab.node(node)
            want_peer = len(flow_lines(n, pl.Cookie.owner_match(pl.Owner.PEER)))
            live = {pl.pod_cookie(p.cid, IFNAME).value for p in [*self.live.values(), *self.anchors.values()]
                    if p.node == node}
            want_pod = {c: k for c, k in pod_flow_counts(n).items() if c in live}
            with self.lock:  # flows of no live Pod: left behind (the restart would hide them)
                self.report.leaks += [f"{node}: flows only: {k} per-Pod flows with cookie {c:#x} of no live Pod "
                                      "(before the ovs-vswitchd restart)"
                                      for c, k in pod_flow_counts(n).items() if c not in live]
            ping = None
            if src and dst:
                ping = subprocess.Popen(["ip", "netns", "exec", src.netns, "ping", "-n", "-D", "-i", "0.02",
                                         "-c", "400", "-W", "1", dst.address(4)],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                time.sleep(1.0)
            t0 = time.monotonic()
            self.lab.restart_vswitchd(node)
            deadline = t0 + 30
            while True:  # every PEER flow and every Pod's cookie back
                have_peer = len(flow_lines(n, pl.Cookie.owner_match(pl.Owner.PEER)))
                have_pod = pod_flow_counts(n)
                if have_peer == want_peer and set(have_pod) == set(want_pod):
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"{node}: flows not back 30 s after the ovs-vswitchd restart "
                                         f"(PEER {have_peer}/{want_peer}, Pods {len(have_pod)}/{len(want_pod)})")
                time.sleep(0.05)
            settle = time.monotonic() + 2
            while pod_flow_counts(n) != want_pod and time.monotonic() < settle:
                time.sleep(0.05)
            have_pod = pod_flow_counts(n)
            short = [f"{c:#x}: {have_pod.get(c)} of {k}" for c, k in want_pod.items() if have_pod.get(c) != k]
            with self.lock:
                self.report.pod_flows_differing_after_restart = short
            with self.lock:
                self.report.flows_back_s = round(time.monotonic() - t0, 3)
                self.report.vswitchd_restarts += 1
            if ping is not None:
                out, _ = ping.communicate(timeout=60)
                stamps = [float(t) for t in re.findall(r"^\[([\d.]+)\] \d+ bytes from", out, re.MULTILINE)]
                m = re.search(r"(\d+) packets transmitted, (\d+) received", out)
                with self.lock:
                    self.report.traffic_gap_s = round(max((b - a for a, b in itertools.pairwise(stamps)),
                                                          default=0.0), 3)
                    if m:
                        self.report.pings_lost_during_restart = int(m.group(1)) - int(m.group(2))
            self.log(f"{node}: flows back after {self.report.flows_back_s}s, traffic gap {self.report.traffic_gap_s}s")

    # -- the whole run ----------------------------------------------------------------------------
    def run(self) -> Report:
        t0 = time.monotonic()
        for node in self.nodes:  # long-lived Pods: the traffic probe across the vswitchd restart
            if self.add(node, anchor=True) is None:
                raise RuntimeError(f"anchor Pod on {node} could not be added")
        done = threading.Event()
        events = threading.Thread(target=self._events, args=(done,), daemon=True)
        events.start()
        workers = [threading.Thread(target=self._worker) for _ in range(self.s.workers)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        done.set()
        events.join(timeout=120)
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
        if _run(["ip", "netns", "exec", src.netns, "ping", "-n", "-q", "-c", "1", "-W", "2", dst]).returncode == 0:
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
    cni_bin = ensure_cni_bin(settings.cni_bin or os.path.join(ROOT, "build", "cni-bin"))
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
    doc = dict(asdict(report), ok=report.ok, seed=s.seed)
    if a.json:
        print(json.dumps(doc, indent=2))
    else:
        for k, v in doc.items():
            print(f"{k:28} {v}")
    return 0 if report.ok and report.kills >= s.kills else 1


if __name__ == "__main__":
    raise SystemExit(main())
