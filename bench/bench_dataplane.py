"""Data-plane throughput: iperf3 Pod↔Pod across Nodes, per traffic path, in the lab.

    python -m bench.bench_dataplane [--seconds 10] [--reps 3] [--paths vxlan,geneve,gre,gateway,fast]
                                    [--quick] [--json OUT] [--cni-bin DIR]

For each path a fresh ``lab.api.Lab`` (the default three-Node topology, netdev, route-sync on
every Node) is brought up with that path's ``routeSync`` settings; Pod ``a`` on node-1 and Pod
``b`` on node-2 (same segment) are added through the real plugin; an iperf3 server runs in ``b``
and the client in ``a`` for ``--seconds``, ``--reps`` times (median, min, max of the receiver's
rate).  Paths:

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
import secrets
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "tb"
IPERF_PORT = 5201


@dataclass(frozen=True)
class PathSpec:
    key: str
    label: str
    route_sync: dict[str, Any]
    counter_port: str  # the OVS port whose counters show the path ("" = none)
    expect_rise: bool  # True: its counters must rise; False: stay flat


def path_specs() -> dict[str, PathSpec]:
    from cni.pipeline import GATEWAY_PORT, TUNNEL_PORT

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
    return {"median": statistics.median(gbps), "min": min(gbps), "max": max(gbps)}


def log(msg: str) -> None:
    print(f"[bench_dataplane] {msg}", file=sys.stderr, flush=True)


class Unavailable(Exception):
    """The path does not exist (yet) in this tree."""


def _wait_ping(lab: Any, src: Any, dst: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not lab.ping(src, dst, count=1, timeout=1.0):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{src.name} cannot reach {dst} after {timeout} s")
        time.sleep(0.2)


def iperf_once(a: Any, b: Any, seconds: float) -> float:
    """One iperf3 run a → b; the receiver's rate in Gbit/s."""
    server = subprocess.Popen(["ip", "netns", "exec", b.netns, "iperf3", "-s", "-1", "-p", str(IPERF_PORT)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        cp = None
        for _ in range(50):  # the server needs a moment to listen
            cp = a.exec(["iperf3", "-c", b.ipv4, "-p", str(IPERF_PORT), "-t", f"{seconds:g}", "-J"],
                        timeout=seconds + 30)
            if cp.returncode == 0 or "Connection refused" not in cp.stdout + cp.stderr:
                break
            time.sleep(0.1)
        assert cp is not None
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
        return float(summed["bits_per_second"]) / 1e9
    finally:
        try:
            server.communicate(timeout=5)
        except (subprocess.TimeoutExpired, ValueError):
            server.kill()
            server.wait()


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


def measure_path(spec: PathSpec, seconds: float, reps: int, cni_bin: str, name: str) -> dict[str, Any]:
    from lab.api import Lab

    refused = config_refuses(spec.route_sync)
    if refused:
        raise Unavailable(f"route-sync refuses the settings: {refused}")
    lab = Lab.up(topology(spec.route_sync), name=name, cni_bin=cni_bin)
    try:
        if spec.key == "fast" and not fast_path_active(lab):
            raise Unavailable("route-sync accepted fastPath but node-1's state file gives node-2 no 'fast' path")
        a, b = lab.add_pod("node-1", "a"), lab.add_pod("node-2", "b")
        if b.ipv4 is None:
            raise RuntimeError(f"Pod b got no IPv4 address: {b.ips}")
        _wait_ping(lab, a, b.ipv4)
        n1 = lab.node("node-1")
        before = n1.ovs_port_stats(spec.counter_port)
        gbps: list[float] = []
        retried: list[str] = []
        while len(gbps) < reps:
            try:
                gbps.append(iperf_once(a, b, seconds))
            except RuntimeError as e:  # an iperf3 control-connection hiccup: retried, at most twice
                retried.append(str(e)[-200:])
                if len(retried) > 2:
                    raise
        after = n1.ovs_port_stats(spec.counter_port)
        moved = (after.tx_packets - before.tx_packets) + (after.rx_packets - before.rx_packets)
        # a run of iperf moves far more than a few thousand packets through its path
        path_ok = moved > 1000 if spec.expect_rise else moved < 100
        if not path_ok:
            raise RuntimeError(f"{spec.label}: {spec.counter_port} moved {moved} packets during the runs "
                               f"(expected {'a rise' if spec.expect_rise else 'none'}): wrong path")
        return {"path": spec.key, "label": spec.label, "available": True, "gbps": gbps, **summary(gbps),
                "counter_port": spec.counter_port, "counter_packets": moved, "retried": retried}
    finally:
        lab.down()


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
    results: list[dict[str, Any]] = []
    failed = False
    for i, key in enumerate(wanted):
        spec = specs[key]
        name = f"{PREFIX}{secrets.token_hex(3)}{i}"
        log(f"{spec.label}: lab {name}, {args.reps} x {args.seconds:g} s ...")
        try:
            r = measure_path(spec, args.seconds, args.reps, cni_bin, name)
            log(f"{spec.label}: median {r['median']:.2f} Gbit/s (min {r['min']:.2f}, max {r['max']:.2f})")
        except Unavailable as e:
            r = {"path": key, "label": spec.label, "available": False, "reason": str(e)}
            log(f"{spec.label}: not available ({e})")
        except Exception as e:  # noqa: BLE001 - report, go on with the other paths
            r = {"path": key, "label": spec.label, "available": True, "error": f"{type(e).__name__}: {e}"}
            failed = True
            log(f"{spec.label}: FAILED {e}")
        results.append(r)
    res = {"benchmark": "dataplane", "seconds": args.seconds, "repetitions": args.reps,
           "pair": "Pod a on node-1 -> Pod b on node-2 (same segment), IPv4, iperf3 TCP", "paths": results,
           "loadavg": os.getloadavg()}
    print(f"{'path':<22} {'median Gb/s':>12} {'min':>8} {'max':>8}")
    for r in results:
        if "median" in r:
            print(f"{r['label']:<22} {r['median']:>12.2f} {r['min']:>8.2f} {r['max']:>8.2f}")
        else:
            print(f"{r['label']:<22} {r.get('reason') or r.get('error')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
