"""Data-plane throughput: iperf3 Pod↔Pod across Nodes, per traffic path, in the lab.

    python -m bench.bench_dataplane [--seconds 10] [--reps 3] [--rtts 2000]
                                    [--paths vxlan,geneve,gre,gateway,fast,wg-vxlan,wg-gateway]
                                    [--quick] [--json OUT] [--cni-bin DIR]

One ``lab.api.Lab`` per path (the default three-Node topology, netdev, route-sync on every Node,
with that path's ``routeSync`` settings) is brought up first, all at once; Pod ``a`` on node-1
and Pod ``b`` on node-2 (same segment) are added through the real plugin.  Then the repetitions
are **interleaved**: repetition *r* runs every path once, in an order rotated by *r*, so a
burst of load from elsewhere on the machine hits all paths alike instead of one path's block.
Every run uses the same iperf3 parameters (one TCP stream a → b for ``--seconds``, iperf3's
defaults otherwise).  The server is started and waited for until its socket listens (``ss`` in
its namespace) before the client connects, so no run meets "connection refused".  Right after
its iperf3 run, each repetition of a path also times ``--rtts`` TCP request/response round trips
a → b (``bench/tcprr.py``: one connection, 64 bytes each way, closed loop as netperf's TCP_RR,
after 50 untimed ones): the latency figure, p50 and p99 of every round trip of the path's
repetitions pooled.

Per path: the receiver's rate per run (median, min, max, spread = (max - min) / median), the
sender's TCP retransmissions, the frames node-1's and node-2's AF_PACKET sockets dropped (where
ovs-vswitchd reads veths and the moved uplink: a full 208 KiB receive buffer drops, TCP then
retransmits), and the **CPU cost**: CPU seconds of the two Nodes'
ovs-vswitchd (and, on an encrypted path, of the two Nodes' wireguard-go, found by their Nodes'
namespaces) and of both iperf3 processes (softirq work they trigger is accounted to them)
per Gbit moved, a figure that load from other processes on a shared machine disturbs far less
than the rate.  The top-level ``ratios`` (:data:`PAIRS`) give fast/gateway, wg-vxlan/vxlan (and
the others) from the medians and per repetition (paired runs): throughput, CPU per Gbit and
latency p50/p99.

Paths:

* ``vxlan`` / ``geneve`` / ``gre``: encap with that tunnel type;
* ``gateway``: noEncap, routed through the gateway port and the Node's stack;
* ``fast``: noEncap with ``fastPath: true`` (issue 7).  When route-sync refuses the key, or
  node-1's state file does not give node-2 the ``fast`` path, it is reported "not available";
* ``wg-vxlan`` / ``wg-gateway``: encap vxlan / noEncap with ``encryption: wireguard`` (issue 30:
  route-sync's trafficEncryptionMode, every peer through the Node's WireGuard device, the
  userspace wireguard-go here), against ``vxlan`` / ``gateway`` in clear.  Reported "not
  available" when route-sync refuses the key or no WireGuard can run here.

The path is checked, not assumed: during the runs the tunnel port's counters on node-1 must rise
for a tunnel path, and the gateway port's must rise for the gateway path (and stay flat for the
fast path).  On an encrypted path node-1's WireGuard device (its UAPI, at the runDir of node-1's
route-sync config) must have carried at least the bytes iperf3 delivered, and the tunnel port,
where there is one, nothing (encryption replaces the tunnel): :func:`path_problem`.
Targets: fast path >= 1.5x the gateway path (issue 7); the cost of encryption is reported (30)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench.util import percentile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TCPRR = os.path.join(ROOT, "bench", "tcprr.py")
PREFIX = "tb"
IPERF_PORT = 5201
RR_PORT = 5202
RR_SIZE = 64  # bytes each way: a small request and its answer
RR_WARMUP = 50  # untimed round trips first (the connection's slow start, caches)
# Deadlines on observable conditions: they bound a hang only, a loaded machine must never reach them.
LISTEN_TIMEOUT_S = 60.0
FAST_PATH_WAIT_S = 60.0
RR_TIMEOUT_S = 120.0
# The path checks: a run of iperf moves far more than a few thousand packets through its path;
# a port beside it sees at most a few stray ones (ARP, ND, a keepalive).
RISE_PACKETS = 1000
FLAT_PACKETS = 100
# (path, reference): the top-level ratios, path / reference, both measured in the same run.
PAIRS = (("fast", "gateway"), ("vxlan", "gateway"), ("geneve", "vxlan"), ("gre", "vxlan"),
         ("wg-vxlan", "vxlan"), ("wg-gateway", "gateway"))


@dataclass(frozen=True)
class PathSpec:
    key: str
    label: str
    route_sync: dict[str, Any]
    counter_port: str  # the OVS port whose counters show the path
    expect_rise: bool  # True: its counters must rise; False: stay flat (or the port is absent, encrypted)
    encrypted: bool = False  # the lab's encryption: wireguard (route-sync's trafficEncryptionMode)


def path_specs() -> dict[str, PathSpec]:
    from cni.pipeline.tables import GATEWAY_PORT, TUNNEL_PORT

    return {
        "vxlan": PathSpec("vxlan", "encap vxlan", {"trafficEncapMode": "encap", "tunnelType": "vxlan"},
                          TUNNEL_PORT, True),
        "geneve": PathSpec("geneve", "encap geneve", {"trafficEncapMode": "encap", "tunnelType": "geneve"},
                           TUNNEL_PORT, True),
        "gre": PathSpec("gre", "encap gre", {"trafficEncapMode": "encap", "tunnelType": "gre"},
                        TUNNEL_PORT, True),
        "gateway": PathSpec("gateway", "noEncap via gateway", {"trafficEncapMode": "noEncap"},
                            GATEWAY_PORT, True),
        "fast": PathSpec("fast", "noEncap fast path", {"trafficEncapMode": "noEncap", "fastPath": True},
                         GATEWAY_PORT, False),
        "wg-vxlan": PathSpec("wg-vxlan", "encap vxlan + WireGuard",
                             {"trafficEncapMode": "encap", "tunnelType": "vxlan"}, TUNNEL_PORT, False, True),
        "wg-gateway": PathSpec("wg-gateway", "noEncap + WireGuard", {"trafficEncapMode": "noEncap"},
                               TUNNEL_PORT, False, True),
    }


def topology(route_sync: dict[str, Any], encrypted: bool = False) -> dict[str, Any]:
    """The default three-Node lab (node-1 and node-2 on segment a, node-3 behind the router);
    ``encrypted``: with ``encryption: wireguard`` (every Node's route-sync runs a WireGuard device)."""
    from cni.pipeline.modes import ENCRYPTION_WIREGUARD

    return {"datapath": "netdev", "clusterCIDRs": ["10.244.0.0/16", "fd00:10:244::/48"],
            "segments": {"a": {"ipv4": "192.168.77.0/24", "ipv6": "fd00:77::/64"},
                         "b": {"ipv4": "192.168.88.0/24", "ipv6": "fd00:88::/64"}},
            "router": {"routePodCIDRs": False},
            "nodes": [{"name": "node-1", "segment": "a"}, {"name": "node-2", "segment": "a"},
                      {"name": "node-3", "segment": "b"}],
            "routeSync": route_sync, **({"encryption": ENCRYPTION_WIREGUARD} if encrypted else {})}


def summary(gbps: list[float]) -> dict[str, float]:
    med = statistics.median(gbps)
    return {"median": med, "min": min(gbps), "max": max(gbps),
            "spread": (max(gbps) - min(gbps)) / med if med else 0.0}


def interleaved_order(keys: list[str], rep: int) -> list[str]:
    """Repetition ``rep`` runs every path once, starting one further along each time."""
    if not keys:
        return []
    k = rep % len(keys)
    return keys[k:] + keys[:k]


def iperf_args(seconds: float) -> list[str]:
    """The client's parameters, the same for every path."""
    return ["-p", str(IPERF_PORT), "-t", f"{seconds:g}", "-J"]


def rr_args(addr: str, count: int) -> list[str]:
    """The round-trip client's parameters (bench/tcprr.py), the same for every path."""
    return ["client", addr, str(RR_PORT), str(count), str(RR_SIZE), str(RR_WARMUP), "10"]


def latency_summary(rtt_us: list[float]) -> dict[str, float]:
    """p50/p99 (nearest rank) and the mean of round-trip times, in µs."""
    return {"n": len(rtt_us), "p50": percentile(rtt_us, 50), "p99": percentile(rtt_us, 99),
            "mean": statistics.fmean(rtt_us) if rtt_us else 0.0}


def path_problem(spec: PathSpec, port_moved: int | None, wg_moved: int | None, payload_bytes: int) -> str | None:
    """Why the runs did not take ``spec``'s path (None: they did), from node-1's counters over the
    runs: ``port_moved`` packets (tx + rx) of ``spec.counter_port`` (None: no such port),
    ``wg_moved`` bytes (tx + rx) of its WireGuard device's peers (None: no device), and the
    ``payload_bytes`` iperf3 delivered.  Pure."""
    if spec.encrypted:
        if wg_moved is None:
            return "node-1 has no WireGuard device to read (UAPI): not the encrypted path"
        if wg_moved < payload_bytes:  # WireGuard counts every packet it carried, headers and tags too
            return (f"node-1's WireGuard device carried {wg_moved:,} bytes, less than the {payload_bytes:,} iperf3 "
                    "delivered: the traffic went around it")
        if port_moved is not None and port_moved >= FLAT_PACKETS:
            return (f"{spec.counter_port} moved {port_moved:,} packets during the runs (expected none: encryption "
                    "replaces the tunnel)")
        return None
    if port_moved is None:
        return f"node-1 has no port {spec.counter_port}"
    if spec.expect_rise and port_moved <= RISE_PACKETS:
        return f"{spec.counter_port} moved {port_moved:,} packets during the runs (expected a rise): wrong path"
    if not spec.expect_rise and port_moved >= FLAT_PACKETS:
        return f"{spec.counter_port} moved {port_moved:,} packets during the runs (expected none): wrong path"
    return None


def log(msg: str) -> None:
    print(f"[bench_dataplane] {msg}", file=sys.stderr, flush=True)


class Unavailable(Exception):
    """The path does not exist (yet) in this tree."""


def _wait_ping(lab: Any, src: Any, dst: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not lab.ping(src, dst, count=1, timeout=1.0):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{src.name} cannot reach {dst} after {timeout} s")
        time.sleep(0.2)


def listening(netns: str, port: int) -> bool:
    cp = subprocess.run(["ip", "netns", "exec", netns, "ss", "-ltnH", f"sport = :{port}"],
                        capture_output=True, text=True, check=False)
    return "LISTEN" in cp.stdout


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def packet_socket_drops(netns: str) -> int:
    """Frames dropped by the AF_PACKET sockets in ``netns`` (ovs-vswitchd reads its veth ports and
    the moved uplink with them: a full receive buffer drops, and TCP retransmits)."""
    cp = subprocess.run(["ip", "netns", "exec", netns, "ss", "-0", "-a", "-m"], capture_output=True, text=True,
                        check=False)
    total = 0
    for part in cp.stdout.split("skmem:(")[1:]:
        for item in part.split(")", 1)[0].split(","):
            if item.startswith("d") and item[1:].isdigit():
                total += int(item[1:])
    return total


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@dataclass
class Run:
    gbps: float
    retransmits: int
    cpu_s: float  # the Nodes' ovs-vswitchd (+ wireguard-go) + both iperf3
    gbit: float  # received
    socket_drops: int = 0  # AF_PACKET drops on node-1 and node-2 during the run
    wg_cpu_s: float = 0.0  # the part of cpu_s that is the Nodes' wireguard-go
    rtt_us: list[float] = field(default_factory=list)  # the round trips timed after it (tcprr)

    @property
    def cpu_s_per_gbit(self) -> float:
        return self.cpu_s / self.gbit if self.gbit else 0.0


def iperf_once(a: Any, b: Any, seconds: float, vswitchd_pids: tuple[int, ...] = (),
               node_netns: tuple[str, ...] = (), dst: str | None = None, wg_pids: tuple[int, ...] = ()) -> Run:
    """One iperf3 run a → b, the server listening before the client starts; ``dst``: the client
    connects there instead of b's IPv4 address (a Service in front of b); ``wg_pids``: the
    userspace WireGuard processes whose CPU time counts too."""
    drops0 = sum(packet_socket_drops(n) for n in node_netns)
    cpu0 = _children_cpu_s() + sum(_proc_cpu_s(p) for p in vswitchd_pids)
    wg0 = sum(_proc_cpu_s(p) for p in wg_pids)
    server = subprocess.Popen(["ip", "netns", "exec", b.netns, "iperf3", "-s", "-1", "-p", str(IPERF_PORT)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + LISTEN_TIMEOUT_S
        while not listening(b.netns, IPERF_PORT):
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                said = (server.communicate(timeout=5)[0] or "").strip()[-300:]
                raise RuntimeError(f"iperf3 server in {b.netns} is not listening; it said: {said!r}")
            time.sleep(0.02)
        cp = a.exec(["iperf3", "-c", dst or b.ipv4, *iperf_args(seconds)], timeout=seconds + 30)
        if cp.returncode != 0:
            server.kill()
            said = (server.communicate(timeout=5)[0] or "").strip()[-300:]
            raise RuntimeError(f"iperf3 failed: {(cp.stdout + cp.stderr).strip()[-300:]}; server said: {said!r}")
        res = json.loads(cp.stdout)
        if res.get("error"):
            raise RuntimeError(f"iperf3: {res['error']}")
        end = res.get("end", {})
        summed = end.get("sum_received") or end.get("sum")
        if not summed:
            raise RuntimeError(f"iperf3 gave no summary: {cp.stdout[-400:]}")
        gbps = float(summed["bits_per_second"]) / 1e9
        gbit = float(summed.get("bytes") or 0) * 8 / 1e9
        retr = int((end.get("sum_sent") or {}).get("retransmits") or 0)
    finally:
        try:
            server.communicate(timeout=5)
        except (subprocess.TimeoutExpired, ValueError):
            server.kill()
            server.wait()
    wg = sum(_proc_cpu_s(p) for p in wg_pids) - wg0
    cpu = _children_cpu_s() + sum(_proc_cpu_s(p) for p in vswitchd_pids) - cpu0 + wg
    return Run(gbps, retr, cpu, gbit, sum(packet_socket_drops(n) for n in node_netns) - drops0, wg)


def rr_once(a: Any, b: Any, count: int) -> list[float]:
    """``count`` TCP round trips a → b (bench/tcprr.py), the server ready before the client
    connects; their times in µs."""
    server = subprocess.Popen(["ip", "netns", "exec", b.netns, sys.executable, "-I", "-S", TCPRR, "serve",
                               str(RR_PORT), str(RR_SIZE)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        assert server.stdout is not None
        ready = server.stdout.readline().strip()  # printed once it listens; EOF if it died
        if ready != "ready":
            raise RuntimeError(f"tcprr server in {b.netns} is not listening; it said: {ready!r}")
        cp = a.exec([sys.executable, "-I", "-S", TCPRR, *rr_args(b.ipv4, count)], timeout=RR_TIMEOUT_S)
        try:
            res = json.loads(cp.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            res = {"error": (cp.stdout + cp.stderr).strip()[-300:]}
        if cp.returncode != 0 or "rtt_us" not in res:
            raise RuntimeError(f"tcprr failed: {res.get('error')}")
        server.wait(timeout=RR_TIMEOUT_S)  # it exits when the client closes
        return [float(x) for x in res["rtt_us"]]
    finally:
        if server.poll() is None:
            server.kill()
        server.communicate()


def fast_path_active(lab: Any) -> bool:
    state = lab.node("node-1").state() or {}
    return any(p.get("name") == "node-2" and p.get("path") == "fast" for p in state.get("peers", []))


def config_refuses(route_sync: dict[str, Any]) -> str | None:
    """route-sync's own config parser on these settings: its error, or None when accepted."""
    from routesync.config import ConfigError, from_dict

    try:
        from_dict({"nodeName": "node-1", "podCIDRs": ["10.244.1.0/24"], **route_sync})
    except ConfigError as e:
        return str(e)
    return None


def route_sync_settings(spec: PathSpec) -> dict[str, Any]:
    """What route-sync is asked for on ``spec``'s path (the lab adds the wireguard section itself)."""
    from cni.pipeline.modes import ENCRYPTION_WIREGUARD

    return {**spec.route_sync, **({"trafficEncryptionMode": ENCRYPTION_WIREGUARD} if spec.encrypted else {})}


def wireguard_missing() -> str | None:
    """Why no WireGuard can run in a lab here (None: one can): the lab's own test, as ``up`` does."""
    from lab import build, tools

    wg = tools.wireguard_go()
    if os.access(wg, os.X_OK) or os.path.isdir(build.KERNEL_WIREGUARD):
        return None
    return f"no userspace WireGuard at {wg} and no kernel module (bash tools/build-go-tools.sh wireguard-go)"


def wireguard_bytes(node: Any) -> int | None:
    """tx + rx bytes of every peer of ``node``'s WireGuard device, read over its UAPI at the runDir
    of the Node's route-sync config (None: no device answers there)."""
    from routesync.config import load
    from routesync.wireguard.uapi import Uapi

    wg = load(node.paths.route_sync_config).wireguard
    try:
        dev = Uapi(wg.run_dir).read(wg.interface)
    except (LookupError, OSError):
        return None
    return sum(p.tx_bytes + p.rx_bytes for p in dev.peers)


def port_packets(node: Any, port: str) -> int | None:
    """tx + rx packets of ``port`` on the Node's bridge (None: no such port)."""
    if port not in node.vsctl("list-ports", node.lab.topology.bridge).split():
        return None
    st = node.ovs_port_stats(port)
    return st.tx_packets + st.rx_packets


@dataclass(frozen=True)
class Counters:
    """node-1's counters that tell the path: :func:`path_problem` compares two readings."""

    port_packets: int | None  # the spec's counter port (None: absent)
    wg_bytes: int | None  # its WireGuard device (None: none)


def read_counters(lab: Any, spec: PathSpec) -> Counters:
    n1 = lab.node("node-1")
    return Counters(port_packets(n1, spec.counter_port), wireguard_bytes(n1) if spec.encrypted else None)


def _delta(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


def wireguard_path_active(lab: Any) -> bool:
    from cni.pipeline.modes import PATH_WIREGUARD

    state = lab.node("node-1").state() or {}
    return any(p.get("name") == "node-2" and p.get("path") == PATH_WIREGUARD for p in state.get("peers", []))


@dataclass
class Setup:
    """One path's lab, Pods and counters while the interleaved runs go on."""

    spec: PathSpec
    lab: Any
    a: Any
    b: Any
    vswitchd_pids: tuple[int, ...]
    before: Counters
    wg_pids: tuple[int, ...] = ()  # the Nodes' wireguard-go (an encrypted path)
    runs: list[Run] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    error: str | None = None


def prepare(spec: PathSpec, cni_bin: str, name: str) -> Setup:
    """Bring ``spec``'s lab up with both Pods reachable; raises Unavailable or errors."""
    from lab import wireguard
    from lab.api import Lab
    from lab.ovs import pidfile, read_pid

    settings = route_sync_settings(spec)
    refused = config_refuses(settings)
    if refused:
        raise Unavailable(f"route-sync refuses the settings: {refused}")
    missing = wireguard_missing() if spec.encrypted else None
    if missing:
        raise Unavailable(missing)
    lab = Lab.up(topology(spec.route_sync, spec.encrypted), name=name, cni_bin=cni_bin)
    try:
        if spec.key == "fast":  # the peer's next-hop MAC may take route-sync a moment (neighbour resolution)
            deadline = time.monotonic() + FAST_PATH_WAIT_S
            while not fast_path_active(lab):
                if time.monotonic() > deadline:
                    raise Unavailable(f"route-sync accepted fastPath but node-1's state file gives node-2 no "
                                      f"'fast' path after {FAST_PATH_WAIT_S:g} s")
                time.sleep(0.2)
        a, b = lab.add_pod("node-1", "a"), lab.add_pod("node-2", "b")
        if b.ipv4 is None:
            raise RuntimeError(f"Pod b got no IPv4 address: {b.ips}")
        _wait_ping(lab, a, b.ipv4)  # encrypted: the first ping crosses once the peers' handshake is done
        pids = tuple(p for n in ("node-1", "node-2")
                     if (p := read_pid(pidfile(lab.node(n).paths, "ovs-vswitchd"))) is not None)
        wg_pids: tuple[int, ...] = ()
        if spec.encrypted:
            if not wireguard_path_active(lab):
                raise RuntimeError("node-1's state file does not send node-2's Pods through WireGuard")
            per_node = {n: wireguard.pids(lab.node(n).netns) for n in ("node-1", "node-2")}
            if not all(per_node.values()):
                raise RuntimeError(f"a Node without its wireguard-go process (its CPU would be missed): {per_node}")
            wg_pids = tuple(p for ps in per_node.values() for p in ps)
        return Setup(spec, lab, a, b, pids, read_counters(lab, spec), wg_pids)
    except BaseException:
        lab.down()
        raise


def run_one(s: Setup, seconds: float, rtts: int = 0) -> None:
    """One repetition of ``s``'s path: iperf3, then ``rtts`` round trips; a hiccup of either is
    retried, at most twice per path."""
    while True:
        try:
            run = iperf_once(s.a, s.b, seconds, s.vswitchd_pids,
                             tuple(s.lab.node(n).netns for n in ("node-1", "node-2")), wg_pids=s.wg_pids)
            if rtts:
                run.rtt_us = rr_once(s.a, s.b, rtts)
            s.runs.append(run)
            return
        except RuntimeError as e:
            s.retried.append(str(e)[-200:])
            if len(s.retried) > 2:
                raise


def path_check_text(spec: PathSpec, port_moved: int | None, wg_moved: int | None) -> str:
    """What the path check saw, for the report."""
    port = f"{spec.counter_port} {port_moved:,} pkts" if port_moved is not None else f"no {spec.counter_port}"
    if not spec.encrypted:
        return port
    wg = f"WireGuard {wg_moved / 1e6:,.0f} MB" if wg_moved is not None else "no WireGuard device"
    return f"{wg}, {port}"


def finish(s: Setup) -> dict[str, Any]:
    """The path's figures after its runs, with the check that the path was the one meant."""
    spec = s.spec
    after = read_counters(s.lab, spec)
    moved = _delta(after.port_packets, s.before.port_packets)
    wg_moved = _delta(after.wg_bytes, s.before.wg_bytes)
    payload = int(sum(r.gbit for r in s.runs) * 1e9 / 8)
    problem = path_problem(spec, moved, wg_moved, payload)
    if problem:
        raise RuntimeError(f"{spec.label}: {problem}")
    gbps = [r.gbps for r in s.runs]
    cost = [r.cpu_s_per_gbit for r in s.runs]
    out: dict[str, Any] = {
        "path": spec.key, "label": spec.label, "available": True, "encrypted": spec.encrypted, "gbps": gbps,
        **summary(gbps),
        "retransmits": [r.retransmits for r in s.runs],
        "packet_socket_drops": [r.socket_drops for r in s.runs],
        "cpu_s": [round(r.cpu_s, 3) for r in s.runs],
        "cpu_s_per_gbit": [round(c, 3) for c in cost], "cpu_s_per_gbit_median": statistics.median(cost),
        "counter_port": spec.counter_port, "counter_packets": moved,
        "path_check": path_check_text(spec, moved, wg_moved), "retried": s.retried}
    if spec.encrypted:
        out.update(wireguard_bytes=wg_moved, wireguard_cpu_s=[round(r.wg_cpu_s, 3) for r in s.runs],
                   wireguard_processes=len(s.wg_pids))
    rtts = [x for r in s.runs for x in r.rtt_us]
    if rtts:
        out["latency_us"] = {**latency_summary(rtts),
                             "p50_per_repetition": [round(percentile(r.rtt_us, 50), 1) for r in s.runs]}
    return out


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def ratios(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """path / reference for each of :data:`PAIRS` measured: throughput from the medians
    (``median``) and per repetition (the paired runs of one round); the CPU cost per Gbit as
    reference / path (``cpu_cost``: > 1 is cheaper) and as path / reference (``cpu_per_gbit``:
    > 1 costs more); with round trips timed, latency p50 and p99 (path / reference: > 1 is
    slower) and p50 per repetition."""
    by = {r["path"]: r for r in results if r.get("gbps")}
    out: dict[str, dict[str, Any]] = {}
    for path, ref in PAIRS:
        if path not in by or ref not in by:
            continue
        p, r = by[path], by[ref]
        paired = [x / y for x, y in zip(p["gbps"], r["gbps"], strict=False) if y]
        row: dict[str, Any] = {
            "median": _ratio(p["median"], r["median"]),
            "per_repetition": [round(x, 3) for x in paired],
            "cpu_cost": _ratio(r["cpu_s_per_gbit_median"], p["cpu_s_per_gbit_median"]),
            "cpu_per_gbit": _ratio(p["cpu_s_per_gbit_median"], r["cpu_s_per_gbit_median"])}
        lp, lr = p.get("latency_us"), r.get("latency_us")
        if lp and lr:
            row.update(latency_p50=_ratio(lp["p50"], lr["p50"]), latency_p99=_ratio(lp["p99"], lr["p99"]),
                       latency_p50_per_repetition=[
                           round(x / y, 3) for x, y in zip(lp["p50_per_repetition"], lr["p50_per_repetition"],
                                                           strict=False) if y])
        out[f"{path}/{ref}"] = row
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="iperf3 -t per repetition")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--paths", default="vxlan,geneve,gre,gateway,fast,wg-vxlan,wg-gateway")
    ap.add_argument("--rtts", type=int, default=2000, help="TCP round trips timed after each iperf3 run (0: none)")
    ap.add_argument("--quick", action="store_true", help="2 s per repetition, 300 round trips")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--cni-bin", help="CNI_PATH directory with ferry (default: build/cni-bin or written)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.rtts = 2.0, min(args.rtts, 300)
    if os.geteuid() != 0:
        print("bench_dataplane needs root (the lab)", file=sys.stderr)
        return 2
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from lab.api import default_cni_bin, ensure_cni_bin

    cni_bin = ensure_cni_bin(os.path.abspath(args.cni_bin or default_cni_bin()))
    specs = path_specs()
    wanted = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in specs]
    if unknown:
        print(f"unknown path(s) {unknown}; known: {', '.join(specs)}", file=sys.stderr)
        return 2
    done: dict[str, dict[str, Any]] = {}
    setups: dict[str, Setup] = {}
    failed = False
    t0 = time.monotonic()
    try:
        for i, key in enumerate(wanted):
            spec = specs[key]
            name = f"{PREFIX}{secrets.token_hex(3)}{i}"
            log(f"{spec.label}: lab {name} ...")
            try:
                setups[key] = prepare(spec, cni_bin, name)
            except Unavailable as e:
                done[key] = {"path": key, "label": spec.label, "available": False, "reason": str(e)}
                log(f"{spec.label}: not available ({e})")
            except Exception as e:  # noqa: BLE001 - report, go on with the other paths
                done[key] = {"path": key, "label": spec.label, "available": True, "error": f"{type(e).__name__}: {e}"}
                failed = True
                log(f"{spec.label}: FAILED to set up: {e}")
        keys = [k for k in wanted if k in setups]
        log(f"{len(keys)} path(s), {args.reps} interleaved repetition(s) x {args.seconds:g} s")
        for rep in range(args.reps):
            for key in interleaved_order(keys, rep):
                s = setups[key]
                if s.error:
                    continue
                try:
                    run_one(s, args.seconds, args.rtts)
                    last = s.runs[-1]
                    rtt = f", RTT p50 {percentile(last.rtt_us, 50):.0f} µs" if last.rtt_us else ""
                    log(f"rep {rep + 1} {s.spec.label}: {last.gbps:.3f} Gbit/s, {last.retransmits} retransmits, "
                        f"{last.socket_drops} AF_PACKET drops, {last.cpu_s_per_gbit:.2f} CPU s/Gbit{rtt}")
                except Exception as e:  # noqa: BLE001 - this path failed, the others go on
                    s.error = f"{type(e).__name__}: {e}"
                    log(f"{s.spec.label}: FAILED {e}")
        for key in keys:
            s = setups[key]
            try:
                if s.error:
                    raise RuntimeError(s.error)
                fig = done[key] = finish(s)
                log(f"{s.spec.label}: median {fig['median']:.2f} Gbit/s (min {fig['min']:.2f}, max {fig['max']:.2f})")
            except Exception as e:  # noqa: BLE001 - report, go on with the other paths
                done[key] = {"path": key, "label": s.spec.label, "available": True,
                             "error": f"{type(e).__name__}: {e}"}
                failed = True
    finally:
        for s in setups.values():
            s.lab.down()
    results = [done[k] for k in wanted if k in done]
    res: dict[str, Any] = {
           "benchmark": "dataplane", "seconds": args.seconds, "repetitions": args.reps, "interleaved": True,
           "iperf3": iperf_args(args.seconds),
           "latency": {"method": f"TCP request/response, {RR_SIZE} bytes each way, one connection, closed loop "
                                 f"(bench/tcprr.py), {RR_WARMUP} untimed first", "round_trips": args.rtts},
           "pair": "Pod a on node-1 -> Pod b on node-2 (same segment), IPv4, iperf3 TCP", "paths": results,
           "ratios": ratios(results), "elapsed_s": round(time.monotonic() - t0, 1), "loadavg": os.getloadavg()}
    print(f"{'path':<24} {'median Gb/s':>12} {'min':>8} {'max':>8} {'spread':>7} {'CPU s/Gbit':>11} "
          f"{'RTT p50 µs':>11} {'p99':>8}")
    for r in results:
        if "median" in r:
            lat = r.get("latency_us") or {}
            print(f"{r['label']:<24} {r['median']:>12.2f} {r['min']:>8.2f} {r['max']:>8.2f} "
                  f"{r['spread']:>7.0%} {r['cpu_s_per_gbit_median']:>11.2f} "
                  f"{lat.get('p50', float('nan')):>11.0f} {lat.get('p99', float('nan')):>8.0f}")
        else:
            print(f"{r['label']:<24} {r.get('reason') or r.get('error')}")
    for k, v in res["ratios"].items():
        if v["median"] is not None and v["cpu_per_gbit"] is not None:
            lat = (f", RTT p50 {v['latency_p50']:.2f}x p99 {v['latency_p99']:.2f}x"
                   if v.get("latency_p50") is not None and v.get("latency_p99") is not None else "")
            print(f"{k}: throughput {v['median']:.2f}x (per repetition {v['per_repetition']}), "
                  f"CPU per Gbit {v['cpu_per_gbit']:.2f}x{lat}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
