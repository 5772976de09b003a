"""Service traffic against Pod traffic on the same Pod pair (issue 26): iperf3 and a small TCP
exchange from a Pod on node-1 to a Pod on node-2, once to the backend's Pod IP and once to the
ClusterIP of a Service whose only backend it is, on a real Kubernetes cluster with stock kube-proxy.

    python -m bench.bench_services [--seconds 5] [--reps 3] [--modes encap,fast] [--proxy iptables]
                                   [--rtt 50] [--json OUT] [--cni-bin DIR]

One ferry-lab cluster per mode (``encap``: VXLAN; ``fast``: noEncap with the fast path), all up
before the first run. Repetitions are interleaved: each runs "Pod IP" then "ClusterIP", the order
swapped every repetition, so machine load hits both alike. Per mode and target: iperf3's receiver
rate (median, min, max) and the median time of ``--rtt`` echo exchanges (connect, 1,000 bytes
each way, close: the lab's echo probe); the ``ratios`` are ClusterIP / Pod IP from the medians.
What the ClusterIP path adds: kube-proxy's DNAT in node-1's stack, the trip through its gateway
port both ways, and Ferry's conntrack commit and lookup (docs/design/services.md)."""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import time
from typing import Any

from bench.bench_dataplane import IPERF_PORT, iperf_once
from lab.api import ECHO_PORT, Lab, ensure_cni_bin
from lab.kube import services as svc

ROUTE_SYNC = {"encap": {"trafficEncapMode": "encap", "tunnelType": "vxlan"},
              "fast": {"trafficEncapMode": "noEncap", "fastPath": True}}  # bench case -> routeSync block
TARGETS = ("pod", "service")


def log(msg: str) -> None:
    print(f"[bench_services] {msg}", file=sys.stderr, flush=True)


def topology(mode: str, proxy: str) -> dict[str, Any]:
    """Three Nodes (node-1, node-2 on one segment, node-3 behind the router), dual-stack."""
    return {"datapath": "netdev", "clusterCIDRs": ["10.244.0.0/16", "fd00:10:244::/48"],
            "segments": {"a": {"ipv4": "192.168.77.0/24", "ipv6": "fd00:77::/64"},
                         "b": {"ipv4": "192.168.88.0/24", "ipv6": "fd00:88::/64"}},
            "router": {"routePodCIDRs": mode == "fast"},
            "nodes": [{"name": "node-1", "segment": "a"}, {"name": "node-2", "segment": "a"},
                      {"name": "node-3", "segment": "b"}],
            "routeSync": ROUTE_SYNC[mode], "kubernetes": {"kubeProxy": proxy}}


def prepare(mode: str, proxy: str, cni_bin: str) -> dict[str, Any]:
    lab = Lab.up(topology(mode, proxy), name=f"bs{secrets.token_hex(3)}", cni_bin=cni_bin)
    cluster = lab.kube()
    client, server = lab.add_pod("node-1", "client"), lab.add_pod("node-2", "server")
    svc.backend(lab, server, "bench")
    iperf = svc.create(cluster, svc.service("bench-iperf", IPERF_PORT, port=IPERF_PORT, selects="bench"), 1)
    echo = svc.create(cluster, svc.service("bench", ECHO_PORT), 1)
    ips = {"pod": (server.ipv4, server.ipv4), "service": (iperf.cluster_ips[0], echo.cluster_ips[0])}
    for target, (_i, e) in ips.items():
        port = 80 if target == "service" else ECHO_PORT
        if not svc.until(lambda a=e, p=port: lab.connect(client, a, p), timeout=180).ok:  # bounds a hang only
            raise RuntimeError(f"{mode}: {target} {e} does not answer")
    return {"lab": lab, "client": client, "server": server, "ips": ips, "runs": {t: [] for t in TARGETS},
            "rtt": {t: [] for t in TARGETS}}


def rtt_ms(s: dict[str, Any], target: str, n: int) -> list[float]:
    lab, client = s["lab"], s["client"]
    addr, port = s["ips"][target][1], (80 if target == "service" else ECHO_PORT)
    out = []
    for _ in range(n):
        p = lab.connect(client, addr, port)
        if p.ok and p.ms is not None:
            out.append(float(p.ms))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_services", description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes", default="encap,fast")
    ap.add_argument("--proxy", default="iptables", choices=("iptables", "nftables"))
    ap.add_argument("--rtt", type=int, default=50, help="echo exchanges per target and repetition")
    ap.add_argument("--json", default=None)
    ap.add_argument("--cni-bin", default=None)
    args = ap.parse_args(argv)
    cni_bin = ensure_cni_bin(args.cni_bin or "build/cni-bin")
    setups: dict[str, dict[str, Any]] = {}
    t0 = time.monotonic()
    try:
        for mode in args.modes.split(","):
            log(f"{mode}: cluster up")
            setups[mode] = prepare(mode, args.proxy, cni_bin)
        for rep in range(args.reps):
            for mode, s in setups.items():
                order = TARGETS if rep % 2 == 0 else TARGETS[::-1]
                for target in order:
                    run = iperf_once(s["client"], s["server"], args.seconds, dst=s["ips"][target][0])
                    s["runs"][target].append(run.gbps)
                    s["rtt"][target] += rtt_ms(s, target, args.rtt)
                    log(f"rep {rep} {mode} {target}: {run.gbps:.3f} Gbit/s")
        out: dict[str, Any] = {"proxy": args.proxy, "seconds": args.seconds, "reps": args.reps, "modes": {}}
        for mode, s in setups.items():
            res = {t: {"gbps_median": statistics.median(s["runs"][t]), "gbps_min": min(s["runs"][t]),
                       "gbps_max": max(s["runs"][t]), "rtt_ms_median": statistics.median(s["rtt"][t])
                       if s["rtt"][t] else None, "rtt_n": len(s["rtt"][t])} for t in TARGETS}
            res["ratios"] = {
                "throughput_service_over_pod": res["service"]["gbps_median"] / res["pod"]["gbps_median"],
                "rtt_service_over_pod": ((res["service"]["rtt_ms_median"] or 0) / res["pod"]["rtt_ms_median"])
                if res["pod"]["rtt_ms_median"] else None,
            }
            out["modes"][mode] = res
        out["total_seconds"] = time.monotonic() - t0
    finally:
        for s in setups.values():
            s["lab"].down()
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
