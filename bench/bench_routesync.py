"""route-sync reconcile cost: full reconcile for N synthetic peers, and one Node change → applied.

    python -m bench.bench_routesync [--peers 100,1000,5000] [--changes 50] [--change-peers 1000]
                                    [--quick] [--json OUT] [--tag fbk-XXXX]

Each size runs in a fresh worker process (so its peak RSS is its own): a network namespace
``<tag>-n`` with a private OVS instance (``tests.support.ovs_instance.OvsInstance``, netdev) and an uplink
``eth0`` (a veth to a router namespace ``<tag>-r``); route-sync's real daemon
(``routesync.daemon.Daemon``) with its real appliers (``routesync.apply.make_appliers``: ovsdbapp,
OpenFlow bundles (ovs-ofctl for a first pass), netlink routes, libnftables, the uplink move, the tunnel
neighbour cache) in encap/vxlan, fed by an in-memory Node source that holds N synthetic peers behind the router
(transport 172.16.0.0/12, one /24 Pod CIDR each from 10.0.0.0/8).

* **full reconcile**: the first ``Daemon.reconcile()`` (empty Node → N peers: bridge, gateway,
  tunnel port, uplink move, every peer's flows, routes, the nft set, the state file); then a
  second one (nothing changed: the periodic re-assertion's cost).  Checked afterwards: N proto-102
  routes, N per-peer flow groups in OVS, N peers in the state file.
* **peak RSS**: ``VmHWM`` of the worker (route-sync's whole process: imports, ovsdbapp's IDL
  cache, pyroute2, the plan); ovs-vswitchd's RSS is reported beside it.
* **one change → applied** (on the ``--change-peers`` set): the daemon's own loop runs in a
  thread; one peer changes in the source (``CHANGE_KINDS`` in turn: its Pod CIDR re-assigned
  inside the cluster CIDR, its transport address changed, the Node gone, the Node back), and the
  time until the appliers finished applying a snapshot that contains it is taken, with the
  daemon thread's CPU over that time (``pthread_getcpuclockid``) and the flow-mods it sent to
  OVS; after each change the routes are checked (the new one installed, the old one gone).  The
  thread's CPU over the whole series, the state file's coalesced writes included, is reported
  per change beside it.

Targets (issue 6): 1,000 peers <= 1 s, 5,000 <= 5 s, <= 150 MB, one change p99 <= 100 ms.
Everything created carries the tag and is removed at the end, also on failure."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.util import percentile
from routesync.sources.base import NodeSource

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "fbk"
LOCAL = "bench-node"
LOCAL_CIDR = "10.0.0.0/24"
UPLINK_ADDR, ROUTER_ADDR = "192.168.250.1/24", "192.168.250.254/24"
PEER_TRANSPORT = ipaddress.IPv4Network("172.16.0.0/12")
CHANGED_CIDRS = ipaddress.IPv4Network("10.128.0.0/9")  # inside the cluster CIDR, above every peer's


def log(msg: str) -> None:
    print(f"[bench_routesync] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------
# Plain data: the synthetic cluster.

def peer_cidr(i: int) -> str:
    """Peer i's Pod CIDR: the (i+1)-th /24 of 10.0.0.0/8 (10.0.0.0/24 is the local Node's)."""
    return str(ipaddress.IPv4Network((int(ipaddress.IPv4Address("10.0.0.0")) + (i + 1) * 256, 24)))


def peer_address(i: int) -> str:
    return str(PEER_TRANSPORT.network_address + i + 1)


def changed_address(n: int) -> str:
    """A transport address no synthetic peer has (the top half of 172.16.0.0/12)."""
    return str(PEER_TRANSPORT.network_address + (1 << 19) + n + 1)


def changed_cidr(n: int) -> str:
    return str(ipaddress.IPv4Network((int(CHANGED_CIDRS.network_address) + n * 256, 24)))


def synthetic_peers(count: int) -> list[Any]:
    from routesync.model import NodeRecord

    return [NodeRecord(f"peer-{i:05d}", (peer_address(i),), (peer_cidr(i),)) for i in range(count)]


def vm_kb(key: str, pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


# ------------------------------------------------------------------------------------------
# The worker: one size, one process.

class MemorySource(NodeSource):
    """An in-memory Node source with a version counter (what the daemon listed last is known,
    so the bench knows when a change has been applied)."""

    def __init__(self, records: list[Any]) -> None:
        from routesync.sources.sortedrecords import SortedRecords

        self._lock = threading.Lock()
        self._changed = threading.Event()
        self.records = {r.name: r for r in records}
        self._sorted = SortedRecords(records)  # handed out as the Kubernetes source hands its records
        self.version = 0
        self.listed_version = 0

    def list(self) -> list[Any]:
        with self._lock:
            self._changed.clear()  # what changes from here on wakes the next wait (as the Kubernetes source)
            self.listed_version = self.version
            return self._sorted.list()

    def wait_for_change(self, timeout: float) -> bool:
        # not cleared here: an update between a timed-out wait and a clear was lost, and the
        # change never applied (the bench failed "change N not applied within 30 s" now and then)
        return self._changed.wait(timeout)

    def publish_self(self, record: Any) -> None:
        with self._lock:
            self.records[record.name] = record
            self._sorted.change({record.name: record})

    def update(self, record: Any) -> int:
        with self._lock:
            self.records[record.name] = record
            self._sorted.change({record.name: record})
            self.version += 1
            v = self.version
        self._changed.set()
        return v

    def remove(self, name: str) -> int:
        with self._lock:
            del self.records[name]
            self._sorted.change({name: None})
            self.version += 1
            v = self.version
        self._changed.set()
        return v

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass


class TimedAppliers:
    """The real appliers (``routesync.daemon.Appliers``, every method passed on), noting which
    source version each finished ``apply`` carried."""

    def __init__(self, inner: Any, source: MemorySource) -> None:
        self.inner = inner
        self.source = source
        self.cond = threading.Condition()
        self.applied_version = -1
        self.applied_at = 0.0
        self.applies = 0  # applies finished

    @property
    def next_hops(self) -> Any:
        return self.inner.next_hops

    def prepare(self, config: Any, tunnel: Any, uplink: Any, gateway_addresses: Any) -> Any:
        return self.inner.prepare(config, tunnel, uplink, gateway_addresses)

    def apply(self, desired: Any) -> None:
        version = self.source.listed_version
        self.inner.apply(desired)
        with self.cond:
            self.applied_version, self.applied_at = version, time.perf_counter()
            self.applies += 1
            self.cond.notify_all()

    def wait_applied(self, version: int, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.applied_version < version:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"change {version} not applied within {timeout} s")
                self.cond.wait(left)
            return self.applied_at

    def wait_applies(self, count: int, timeout: float) -> None:
        """Until ``count`` applies have finished."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.applies < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"no apply within {timeout} s")
                self.cond.wait(left)

    def release_pending(self, pods: Any, full: bool) -> int:
        return int(self.inner.release_pending(pods, full))

    def sync_pods(self, state: Any, full: bool) -> Any:
        return self.inner.sync_pods(state, full)

    def restore_host_path(self, uplink: Any) -> bool:
        return bool(self.inner.restore_host_path(uplink))

    def policy_flows(self) -> Any:
        return self.inner.policy_flows()

    def retry_tunnel_neighbours(self, now: float | None = None) -> list[tuple[str, str]]:
        return list(self.inner.retry_tunnel_neighbours(now))

    def ovs_generation(self) -> int:
        return int(self.inner.ovs_generation())

    def ovs_restoring(self) -> bool:
        return bool(self.inner.ovs_restoring())

    def wireguard_generation(self) -> int:
        return int(self.inner.wireguard_generation())

    def wireguard_implementation(self) -> str | None:
        return self.inner.wireguard_implementation()

    def switch_wireguard(self, spec: Any) -> None:
        self.inner.switch_wireguard(spec)

    def rehandshake_wireguard(self, since: float, among: Any = None) -> tuple[str, ...]:
        return self.inner.rehandshake_wireguard(since, among)

    def kick_wireguard(self, since: float, among: Any) -> tuple[str, ...]:
        return self.inner.kick_wireguard(since, among)

    def wireguard_awaited(self) -> tuple[tuple[float, tuple[str, ...]], ...]:
        return self.inner.wireguard_awaited()

    def teardown(self, config: Any) -> None:
        self.inner.teardown(config)

    def close(self) -> None:
        self.inner.close()


class BenchError(RuntimeError):
    pass


def sh(*argv: str, check: bool = True) -> str:
    p = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=120)
    if check and p.returncode != 0:
        raise BenchError(f"{' '.join(argv)}: {p.stderr.strip()}")
    return p.stdout


def build_underlay(node_ns: str, router_ns: str, tag: str) -> None:
    a, b = f"{tag}-a"[:15], f"{tag}-b"[:15]
    sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
    sh("ip", "link", "set", a, "netns", node_ns, "name", "eth0")
    sh("ip", "link", "set", b, "netns", router_ns, "name", "r0")
    for ns, dev, addr in ((node_ns, "eth0", UPLINK_ADDR), (router_ns, "r0", ROUTER_ADDR)):
        sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "-n", node_ns, "route", "add", "default", "via", ROUTER_ADDR.split("/")[0])


def alias_unixctl(run_dir: str) -> None:
    """OvsInstance names vswitchd's control socket ``ovs-vswitchd.ctl``; route-sync's tunnel
    neighbour cache looks for OVS's default ``ovs-vswitchd.<pid>.ctl`` (as on a real Node and in
    the lab).  A symlink gives it the default name."""
    with open(os.path.join(run_dir, "ovs-vswitchd.pid")) as f:
        pid = int(f.read().strip())
    link = os.path.join(run_dir, f"ovs-vswitchd.{pid}.ctl")
    if not os.path.exists(link):
        os.symlink(os.path.join(run_dir, "ovs-vswitchd.ctl"), link)


def count_routes(ns: str) -> int:
    return len(sh("ip", "-n", ns, "route", "show", "proto", "102").splitlines())


def worker(peers: int, changes: int, tag: str) -> dict[str, Any]:
    """Set up one Node, reconcile ``peers`` peers, optionally time ``changes`` changes."""
    from cni.node import nodestate
    from cni.pipeline.tables import Owner
    from routesync.apply import make_appliers
    from routesync.apply.ovs import group_installed, owner_of
    from routesync.config import Config
    from routesync.daemon import Daemon
    from routesync.model import NodeRecord
    from tests.support.ovs_instance import OvsInstance, netns

    rss_floor_kb = vm_kb("VmHWM")
    node_ns, router_ns = f"{tag}-n", f"{tag}-r"
    out: dict[str, Any] = {"peers": peers}
    with tempfile.TemporaryDirectory(prefix=f"{tag}-") as work, netns(node_ns), netns(router_ns), \
            OvsInstance(tag, netns=node_ns) as ovs:
        build_underlay(node_ns, router_ns, tag)
        alias_unixctl(ovs.run_dir)
        cfg = Config(node_name=LOCAL, mode="encap", tunnel_type="vxlan", ovsdb=ovs.db, ovs_run_dir=ovs.run_dir,
                     state_file=os.path.join(work, "node-state.json"), pod_cidrs=(LOCAL_CIDR,),
                     cluster_cidrs=("10.0.0.0/8",), resync_seconds=3600.0)
        source = MemorySource([NodeRecord(LOCAL, (UPLINK_ADDR.split("/")[0],), (LOCAL_CIDR,)),
                               *synthetic_peers(peers)])
        appliers = TimedAppliers(make_appliers(cfg, netns=node_ns), source)
        daemon = Daemon(cfg, source, appliers, settle_heap=True)  # type: ignore[arg-type]  # as the CLI's
        try:
            first = daemon.reconcile()
            if not first.ok:
                raise BenchError(f"full reconcile failed: {first.error}")
            out["rss_after_imports_mb"] = rss_floor_kb / 1024
            out["peak_rss_mb"] = vm_kb("VmHWM") / 1024
            out["reconcile_s"] = first.duration
            again = daemon.reconcile()
            if not again.ok:
                raise BenchError(f"second reconcile failed: {again.error}")
            out["noop_reconcile_s"] = again.duration
            vswitchd = ovs._pids[-1] if getattr(ovs, "_pids", None) else None
            out["vswitchd_rss_mb"] = vm_kb("VmRSS", vswitchd) / 1024 if vswitchd else None
            # verification: every peer is installed, in OVS, in the routing table, in the state file
            groups = group_installed(appliers.inner.ovs.dump_flows())
            out["peer_flow_groups"] = sum(1 for c in groups if owner_of(c) == Owner.PEER)
            out["routes"] = count_routes(node_ns)
            out["state_peers"] = len(nodestate.read(cfg.state_file).peers)
            for key in ("peer_flow_groups", "routes", "state_peers"):
                if out[key] != peers:
                    raise BenchError(f"{peers} peers but {out[key]} {key} installed")
            if changes:
                out["change"] = time_changes(daemon, source, appliers, node_ns, peers, changes)
            out["peak_rss_end_mb"] = vm_kb("VmHWM") / 1024
        finally:
            daemon.stop.set()
            appliers.close()
    return out


# The kinds of Node change timed, in turn: a Pod CIDR re-assigned (inside the cluster CIDR, as
# Kubernetes' IPAM hands them out), a transport address changed, a Node gone, the same Node back.
CHANGE_KINDS = ("pod CIDR", "address", "leave", "join")


def time_changes(daemon: Any, source: MemorySource, appliers: TimedAppliers, node_ns: str, peers: int,
                 changes: int) -> dict[str, Any]:
    """One peer changed at a time (``CHANGE_KINDS`` in turn); time source update → applied by the
    daemon's loop, and the daemon thread's CPU over it."""
    thread = threading.Thread(target=daemon.run, name="route-sync", daemon=True)
    first = appliers.applies + 1
    thread.start()
    samples: list[float] = []
    cpu_ms: list[float] = []  # the daemon thread's CPU from the update to the apply that carried it
    by_kind: dict[str, list[float]] = {k: [] for k in CHANGE_KINDS}
    mods: list[int] = []  # flow-mods sent to OVS for it
    ovs = appliers.inner.ovs
    try:
        # the loop's own first reconcile (a full pass, a no-op here) must be over: a change
        # timed while it runs would measure the full pass (a fixed 0.2 s sleep did not always
        # cover it on a busy machine: the first sample was then ~200-300 ms)
        appliers.wait_applies(first, timeout=60)
        wait_state_written(daemon)
        wait_settled(daemon)  # and the heap it settles after that pass (routesync.heap)
        clock = time.pthread_getcpuclockid(thread.ident or 0)
        series0 = time.clock_gettime(clock)
        left: Any = None  # the record of the Node that left, until it joins again
        for n in range(changes):
            kind = CHANGE_KINDS[n % len(CHANGE_KINDS)]
            i = (n * 7919) % peers  # spread over the set
            if kind == "join":
                old, name = left, left.name
            else:
                old = source.records[f"peer-{i:05d}"]
                name = old.name
            c0, m0, t0 = time.clock_gettime(clock), ovs.flow_mods, time.perf_counter()
            if kind == "pod CIDR":
                want: Any = type(old)(name, old.transport_addresses, (changed_cidr(n),), old.annotations)
                version = source.update(want)
            elif kind == "address":
                want = type(old)(name, (changed_address(n),), old.pod_cidrs, old.annotations)
                version = source.update(want)
            elif kind == "leave":
                left, want = old, None
                version = source.remove(name)
            else:
                want = old
                version = source.update(old)
            done = appliers.wait_applied(version, timeout=30)
            samples.append((done - t0) * 1000)
            cpu_ms.append((time.clock_gettime(clock) - c0) * 1000)
            by_kind[kind].append(cpu_ms[-1])
            mods.append(ovs.flow_mods - m0)
            check_route(node_ns, n, kind, old, want)
            time.sleep(0.02)
        wait_state_written(daemon)  # the last state write (a burst's) counts into the series
        series_ms = (time.clock_gettime(clock) - series0) * 1000
    finally:
        daemon.stop.set()
        thread.join(timeout=30)
    return {"peers": peers, "n": len(samples), "p50_ms": percentile(samples, 50),
            "p99_ms": percentile(samples, 99), "max_ms": max(samples), "samples_ms": samples,
            "cpu_p50_ms": percentile(cpu_ms, 50), "cpu_p99_ms": percentile(cpu_ms, 99), "cpu_max_ms": max(cpu_ms),
            "cpu_p50_ms_by_kind": {k: percentile(v, 50) for k, v in by_kind.items() if v},
            "cpu_per_change_with_writes_ms": series_ms / len(samples),
            "flow_mods_max": max(mods), "flow_mods_p50": percentile([float(m) for m in mods], 50),
            "loop_latencies_ms": [x * 1000 for x in daemon.change_latencies]}


def wait_state_written(daemon: Any, timeout: float = 30) -> None:
    """Until the state file a pass left pending was written (the loop writes it once idle)."""
    deadline = time.monotonic() + timeout
    while daemon.state.flush_at() is not None:
        if time.monotonic() > deadline:
            raise BenchError(f"the state file stayed pending for {timeout} s")
        time.sleep(0.01)


def wait_settled(daemon: Any, timeout: float = 30) -> None:
    """Until the daemon's loop has settled its heap after its first full pass."""
    deadline = time.monotonic() + timeout
    while daemon.heap is not None and not daemon.heap.settles:
        if time.monotonic() > deadline:
            raise BenchError(f"the heap was not settled {timeout} s after the first full pass")
        time.sleep(0.01)


def check_route(node_ns: str, n: int, kind: str, old: Any, new: Any) -> None:
    """The change reached the routing table: the Pod CIDR's route where the Node is, none where
    it is not."""
    there = [] if new is None else list(new.pod_cidrs)
    gone = [c for c in old.pod_cidrs if c not in there]
    for cidr in there:
        if not sh("ip", "-n", node_ns, "route", "show", cidr, "proto", "102").strip():
            raise BenchError(f"change {n} ({kind}): no route for {cidr}")
    for cidr in gone:
        if sh("ip", "-n", node_ns, "route", "show", cidr, "proto", "102").strip():
            raise BenchError(f"change {n} ({kind}): the route for {cidr} is still there")


# ------------------------------------------------------------------------------------------
# The driver: one worker process per size.

@dataclass(frozen=True)
class Plan:
    sizes: tuple[int, ...]
    change_peers: int
    changes: int


def plan_runs(sizes: Sequence[int], change_peers: int, changes: int) -> list[tuple[int, int]]:
    """(peers, changes) per worker: the change series runs in the worker of its size (a size of
    its own when it is not among the sizes)."""
    runs = [(n, changes if n == change_peers else 0) for n in sizes]
    if changes and change_peers not in sizes:
        runs.append((change_peers, changes))
    return runs


def run_worker(peers: int, changes: int, tag: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.bench_routesync", "--worker", "--peers", str(peers),
            "--changes", str(changes), "--tag", tag]
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False, timeout=1800)
    sys.stderr.write(p.stderr[-4000:])
    if p.returncode != 0:
        raise BenchError(f"worker for {peers} peers failed (rc {p.returncode}): {p.stderr.strip()[-800:]}")
    result: dict[str, Any] = json.loads(p.stdout)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--peers", default="100,1000,5000", help="comma-separated peer counts")
    ap.add_argument("--changes", type=int, default=50, help="Node changes timed (0: none)")
    ap.add_argument("--change-peers", type=int, default=1000, help="peer count the changes run on")
    ap.add_argument("--quick", action="store_true", help="100 peers, 10 changes on them")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--tag", help=f"name prefix of everything created (default {PREFIX}-<random>)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_routesync needs root (network namespaces, OVS)", file=sys.stderr)
        return 2
    tag = args.tag or f"{PREFIX}-{secrets.token_hex(2)}"
    if len(tag) > 11:
        print("--tag: at most 11 characters (link names)", file=sys.stderr)
        return 2
    if args.worker:
        if ROOT not in sys.path:
            sys.path.insert(0, ROOT)
        try:
            res = worker(int(args.peers), args.changes, tag)
        except BenchError as e:
            print(f"bench_routesync worker: {e}", file=sys.stderr)
            return 1
        json.dump(res, sys.stdout)
        return 0
    sizes = (100,) if args.quick else tuple(int(x) for x in args.peers.split(","))
    change_peers, changes = (100, min(args.changes, 10)) if args.quick else (args.change_peers, args.changes)
    results: list[dict[str, Any]] = []
    change: dict[str, Any] | None = None
    try:
        for peers, n in plan_runs(sizes, change_peers, changes):
            log(f"{peers} peers{f', {n} changes' if n else ''} ...")
            r = run_worker(peers, n, f"{tag}{len(results)}")
            if "change" in r:
                change = r.pop("change")
            if peers in sizes:
                results.append(r)
            log(f"{peers} peers: full reconcile {r['reconcile_s']:.3f} s, re-assert {r['noop_reconcile_s']:.3f} s, "
                f"peak RSS {r['peak_rss_mb']:.0f} MB")
    except BenchError as e:
        print(f"bench_routesync: {e}", file=sys.stderr)
        return 1
    res = {"benchmark": "routesync", "mode": "encap/vxlan, netdev", "sizes": results, "change": change,
           "loadavg": os.getloadavg()}
    print(f"{'peers':>6} {'reconcile s':>12} {'re-assert s':>12} {'peak RSS MB':>12} {'vswitchd MB':>12}")
    for r in results:
        print(f"{r['peers']:>6} {r['reconcile_s']:>12.3f} {r['noop_reconcile_s']:>12.3f} "
              f"{r['peak_rss_mb']:>12.1f} {r['vswitchd_rss_mb'] or 0:>12.1f}")
    if change:
        print(f"one change -> applied on {change['peers']} peers: p50 {change['p50_ms']:.1f} ms, "
              f"p99 {change['p99_ms']:.1f} ms (n={change['n']}); route-sync CPU p50 {change['cpu_p50_ms']:.2f} ms, "
              f"p99 {change['cpu_p99_ms']:.2f} ms; flow-mods per change p50 {change['flow_mods_p50']:.0f}, "
              f"max {change['flow_mods_max']} (a full pass on the same peers: see reconcile s above)")
        kinds = ", ".join(f"{k} {v:.2f}" for k, v in change["cpu_p50_ms_by_kind"].items())
        print(f"route-sync CPU p50 by kind of change, ms: {kinds}; per change with the state file's "
              f"(coalesced) writes: {change['cpu_per_change_with_writes_ms']:.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
