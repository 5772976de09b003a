"""Data-plane throughput: iperf3 Pod↔Pod across Nodes, per traffic path, in the lab.

    python -m bench.bench_dataplane [--seconds 10] [--reps 3] [--paths vxlan,geneve,gre,gateway,fast]
                                    [--quick] [--json OUT] [--cni-bin DIR]

One ``lab.api.Lab`` per path (the default three-Node topology, netdev, route-sync on every Node,
with that path's ``routeSync`` settings) is brought up first, all at once; Pod ``a`` on node-1
and Pod ``b`` on node-2 (same segment) are added through the real plugin.  Then the repetitions
are **interleaved**: repetition *r* runs every path once, in an order rotated by *r*, so a
burst of load from elsewhere on the machine hits all paths alike instead of one path's block.
Every run uses the same iperf3 parameters (one TCP stream a → b for ``--seconds``, iperf3's
defaults otherwise).  The server is started and waited for until its socket listens (``ss`` in
its namespace) before the client connects, so no run meets "connection refused".

Per path: the receiver's rate per run (median, min, max, spread = (max - min) / median), the
sender's TCP retransmissions, the frames node-1's and node-2's AF_PACKET sockets dropped (where
ovs-vswitchd reads veths and the moved uplink: a full 208 KiB receive buffer drops, TCP then
retransmits), and the **CPU cost**: CPU seconds of the two Nodes'
ovs-vswitchd and of both iperf3 processes (softirq work they trigger is accounted to them)
per Gbit moved, a figure that load from other processes on a shared machine disturbs far less
than the rate.  The top-level ``ratios`` give fast/gateway (and the others) from the medians
and per repetition (paired runs).

Paths:

* ``vxlan`` / ``geneve`` / ``gre``: encap with that tunnel type;
* ``gateway``: noEncap, routed through the gateway port and the Node's stack;
* ``fast``: noEncap with ``fastPath: true`` (issue 7).  When route-sync refuses the key, or
  node-1's state file does not give node-2 the ``fast`` path, it is reported "not available".

The path is checked, not assumed: during the runs the tunnel port's counters on node-1 must rise
for a tunnel path, and the gateway port's must rise for the gateway path (and stay flat for the
fast path).  Target (issue 7): fast path >= 1.5x the gateway path."""

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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "tb"
IPERF_PORT = 5201
# Deadlines on observable conditions: they bound a hang only, a loaded machine must never reach them.
LISTEN_TIMEOUT_S = 60.0
FAST_PATH_WAIT_S = 60.0


@dataclass(frozen=True)
class PathSpec:
    key: str
    label: str
    route_sync: dict[str, Any]
    counter_port: str  # the OVS port whose counters show the path ("" = none)
    expect_rise: bool  # True: its counters must rise; False: stay flat


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
    }


def topology(route_sync: dict[str, Any]) -> dict[str, Any]:
    """The default three-Node lab (node-1 and node-2 on segment a, node-3 behind the router)."""
    return {"datapath": "netdev", "clusterCIDRs": ["10.244.0.0/16", "fd00:10:244::/48"],
            "segments": {"a": {"ipv4": "192.168.77.0/24", "ipv6": "fd00:77::/64"},
                         "b": {"ipv4": "192.168.88.0/24", "ipv6": "fd00:88::/64"}},
            "router": {"routePodCIDRs": False},
            "nodes": [{"name": "node-1", "segment": "a"}, {"name": "node-2", "segment": "a"},
                      {"name": "node-3", "segment": "b"}],
            "routeSync": route_sync}


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
    cpu_s: float  # the Nodes' ovs-vswitchd + both iperf3
    gbit: float  # received
    socket_drops: int = 0  # AF_PACKET drops on node-1 and node-2 during the run

    @property
    def cpu_s_per_gbit(self) -> float:
        return self.cpu_s / self.gbit if self.gbit else 0.0


def iperf_once(a: Any, b: Any, seconds: float, vswitchd_pids: tuple[int, ...] = (),
               node_netns: tuple[str, ...] = (), dst: str | None = None) -> Run:
    """One iperf3 run a → b, the server listening before the client starts; ``dst``: the client
    connects there instead of b's IPv4 address (a Service in front of b)."""
    drops0 = sum(packet_socket_drops(n) for n in node_netns)
    cpu0 = _children_cpu_s() + sum(_proc_cpu_s(p) for p in vswitchd_pids)
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
    cpu = _children_cpu_s() + sum(_proc_cpu_s(p) for p in vswitchd_pids) - cpu0
    return Run(gbps, retr, cpu, gbit, sum(packet_socket_drops(n) for n in node_netns) - drops0)


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


@dataclass
class Setup:
    """One path's lab, Pods and counters while the interleaved runs go on."""

    spec: PathSpec
    lab: Any
    a: Any
    b: Any
    vswitchd_pids: tuple[int, ...]
    before: Any
    runs: list[Run] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    error: str | None = None


def prepare(spec: PathSpec, cni_bin: str, name: str) -> Setup:
    """Bring ``spec``'s lab up with both Pods reachable; raises Unavailable or errors."""
    from lab.api import Lab
    from lab.ovs import pidfile, read_pid

    refused = config_refuses(spec.route_sync)
    if refused:
        raise Unavailable(f"route-sync refuses the settings: {refused}")
    lab = Lab.up(topology(spec.route_sync), name=name, cni_bin=cni_bin)
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
        _wait_ping(lab, a, b.ipv4)
        pids = tuple(p for n in ("node-1", "node-2")
                     if (p := read_pid(pidfile(lab.node(n).paths, "ovs-vswitchd"))) is not None)
        return Setup(spec, lab, a, b, pids, lab.node("node-1").ovs_port_stats(spec.counter_port))
    except BaseException:
        lab.down()
        raise


def run_one(s: Setup, seconds: float) -> None:
    """One repetition of ``s``'s path; an iperf3 hiccup is retried, at most twice per path."""
    while True:
        try:
            s.runs.append(iperf_once(s.a, s.b, seconds, s.vswitchd_pids,
                                     tuple(s.lab.node(n).netns for n in ("node-1", "node-2"))))
            return
        except RuntimeError as e:
            s.retried.append(str(e)[-200:])
            if len(s.retried) > 2:
                raise


def finish(s: Setup) -> dict[str, Any]:
    """The path's figures after its runs, with the check that the path was the one meant."""
    spec = s.spec
    after = s.lab.node("node-1").ovs_port_stats(spec.counter_port)
    moved = (after.tx_packets - s.before.tx_packets) + (after.rx_packets - s.before.rx_packets)
    # a run of iperf moves far more than a few thousand packets through its path
    path_ok = moved > 1000 if spec.expect_rise else moved < 100
    if not path_ok:
        raise RuntimeError(f"{spec.label}: {spec.counter_port} moved {moved} packets during the runs "
                           f"(expected {'a rise' if spec.expect_rise else 'none'}): wrong path")
    gbps = [r.gbps for r in s.runs]
    cost = [r.cpu_s_per_gbit for r in s.runs]
    return {"path": spec.key, "label": spec.label, "available": True, "gbps": gbps, **summary(gbps),
            "retransmits": [r.retransmits for r in s.runs],
            "packet_socket_drops": [r.socket_drops for r in s.runs],
            "cpu_s": [round(r.cpu_s, 3) for r in s.runs],
            "cpu_s_per_gbit": [round(c, 3) for c in cost], "cpu_s_per_gbit_median": statistics.median(cost),
            "counter_port": spec.counter_port, "counter_packets": moved, "retried": s.retried}


def ratios(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """fast/gateway, vxlan/gateway, geneve/vxlan, gre/vxlan: from the medians, and per repetition
    (the paired runs of one round), with the CPU cost ratio (reference / path: > 1 is cheaper)."""
    by = {r["path"]: r for r in results if r.get("gbps")}
    out: dict[str, dict[str, Any]] = {}
    for path, ref in (("fast", "gateway"), ("vxlan", "gateway"), ("geneve", "vxlan"), ("gre", "vxlan")):
        if path not in by or ref not in by:
            continue
        p, r = by[path], by[ref]
        paired = [x / y for x, y in zip(p["gbps"], r["gbps"], strict=False) if y]
        out[f"{path}/{ref}"] = {
            "median": p["median"] / r["median"] if r["median"] else None,
            "per_repetition": [round(x, 3) for x in paired],
            "cpu_cost": (r["cpu_s_per_gbit_median"] / p["cpu_s_per_gbit_median"]
                         if p["cpu_s_per_gbit_median"] else None)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="iperf3 -t per repetition")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--paths", default="vxlan,geneve,gre,gateway,fast")
    ap.add_argument("--quick", action="store_true", help="2 s per repetition")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--cni-bin", help="CNI_PATH directory with ferry (default: build/cni-bin or written)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds = 2.0
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
                    run_one(s, args.seconds)
                    last = s.runs[-1]
                    log(f"rep {rep + 1} {s.spec.label}: {last.gbps:.3f} Gbit/s, {last.retransmits} retransmits, "
                        f"{last.socket_drops} AF_PACKET drops, {last.cpu_s_per_gbit:.2f} CPU s/Gbit")
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
    res = {"benchmark": "dataplane", "seconds": args.seconds, "repetitions": args.reps, "interleaved": True,
           "iperf3": iperf_args(args.seconds),
           "pair": "Pod a on node-1 -> Pod b on node-2 (same segment), IPv4, iperf3 TCP", "paths": results,
           "ratios": ratios(results), "elapsed_s": round(time.monotonic() - t0, 1), "loadavg": os.getloadavg()}
    print(f"{'path':<22} {'median Gb/s':>12} {'min':>8} {'max':>8} {'spread':>7} {'CPU s/Gbit':>11}")
    for r in results:
        if "median" in r:
            print(f"{r['label']:<22} {r['median']:>12.2f} {r['min']:>8.2f} {r['max']:>8.2f} "
                  f"{r['spread']:>7.0%} {r['cpu_s_per_gbit_median']:>11.2f}")
        else:
            print(f"{r['label']:<22} {r.get('reason') or r.get('error')}")
    for k, v in res["ratios"].items():
        if v["median"] is not None and v["cpu_cost"] is not None:
            print(f"{k}: {v['median']:.2f}x (per repetition {v['per_repetition']}), "
                  f"CPU cost per Gbit {v['cpu_cost']:.2f}x lower")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
