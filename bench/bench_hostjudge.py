"""What the host's NetworkPolicy judge (table inet ferry_policy, issue 41) costs the paths it sits on.

    python -m bench.bench_hostjudge [--seconds 5] [--pairs 3] [--connects 2000] [--json OUT]

One Node namespace routes for its Pods behind ``ferry-gw0`` (a Linux bridge: the judge only reads
the gateway's name, and a bridge keeps OVS's own cost out of the ratio) and reaches an external
host on its uplink; kube-proxy's part is two DNAT rules of its shape: a ClusterIP whose endpoint
is a Pod on the Node (the DNATed packet goes back out of the gateway, OVS's to judge) and one
whose endpoint is the external host (off the Pod network: the judge's).  Each figure is measured
with the judge's table absent and present, interleaved in the same run (``bench.util.ab_order``),
the judge holding a 200-rule policy set for the client (egress-isolated, allowed to both
backends) plus 100 other isolated Pods:

* iperf3 throughput through each ClusterIP (one TCP stream; the judge is crossed by its first
  packet only, ``ct state new``), and
* new connections per second through each (a loop of connect + close: every one is judged).

Ratios are present / absent; the issue's goal is >= 0.95 for throughput."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from bench.util import ab_by_side, ab_order, table
from routesync.apply.nft import NftApplier
from routesync.nftbody import NftBody
from routesync.policy import hostjudge as hj
from routesync.policy import plan as pp
from routesync.policy.model import Pod, policy_from

NODE, CLI, SRV, EXT = "bhj-node", "bhj-cli", "bhj-srv", "bhj-ext"
SIDES = ("absent", "present")
KUBE_PROXY = """table ip kp {
	chain pre {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr 10.96.0.10 tcp dport 5201 dnat to 10.244.1.6:5201
		ip daddr 10.96.0.20 tcp dport 5201 dnat to 192.168.77.2:5201
	}
}
"""
CONNECTS = r"""
import socket, sys, time
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t0 = time.perf_counter()
for _ in range(n):
    s = socket.create_connection((addr, port), timeout=10)
    s.close()
print(n / (time.perf_counter() - t0))
"""
ACCEPT = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(512)
print("ready", flush=True)
while True:
    s.accept()[0].close()
"""


def sh(*argv: str, ns: str | None = None, input: str | None = None) -> str:
    full = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    return subprocess.run(full, capture_output=True, text=True, check=True, input=input).stdout


def log(msg: str) -> None:
    print(f"[bench_hostjudge] {msg}", file=sys.stderr, flush=True)


@contextmanager
def topology() -> Iterator[None]:
    made: list[str] = []
    try:
        for ns in (NODE, CLI, SRV, EXT):
            sh("ip", "netns", "add", ns)
            made.append(ns)
            sh("ip", "link", "set", "lo", "up", ns=ns)
        sh("ip", "link", "add", "ferry-gw0", "type", "bridge", ns=NODE)
        sh("ip", "addr", "add", "10.244.1.1/24", "dev", "ferry-gw0", ns=NODE)
        sh("ip", "link", "set", "ferry-gw0", "up", ns=NODE)
        for i, (pod, ip) in enumerate(((CLI, "10.244.1.5"), (SRV, "10.244.1.6"))):
            sh("ip", "link", "add", f"bhj-p{i}", "type", "veth", "peer", "name", f"bhj-q{i}")
            sh("ip", "link", "set", f"bhj-p{i}", "netns", NODE)
            sh("ip", "link", "set", f"bhj-q{i}", "netns", pod, "name", "eth0")
            sh("ip", "link", "set", f"bhj-p{i}", "master", "ferry-gw0", "up", ns=NODE)
            sh("ip", "link", "set", "eth0", "up", ns=pod)
            sh("ip", "addr", "add", f"{ip}/24", "dev", "eth0", ns=pod)
            sh("ip", "route", "add", "default", "via", "10.244.1.1", ns=pod)
        sh("ip", "link", "add", "bhj-u0", "type", "veth", "peer", "name", "bhj-u1")
        sh("ip", "link", "set", "bhj-u0", "netns", NODE, "name", "eth0")
        sh("ip", "link", "set", "bhj-u1", "netns", EXT, "name", "eth0")
        sh("ip", "addr", "add", "192.168.77.1/24", "dev", "eth0", ns=NODE)
        sh("ip", "link", "set", "eth0", "up", ns=NODE)
        sh("ip", "addr", "add", "192.168.77.2/24", "dev", "eth0", ns=EXT)
        sh("ip", "link", "set", "eth0", "up", ns=EXT)
        sh("ip", "route", "add", "10.244.0.0/16", "via", "192.168.77.1", ns=EXT)
        sh("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", ns=NODE)
        sh("nft", "-f", "-", ns=NODE, input=KUBE_PROXY)
        yield
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def listening(ns: str, port: int, timeout: float = 60.0) -> None:
    """Until something listens on ``port`` in ``ns`` (iperf3 -s prints nothing to wait on)."""
    deadline = time.monotonic() + timeout
    while not sh("ss", "-Hltn", f"sport = :{port}", ns=ns).strip():
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing listens on {port} in {ns}")
        time.sleep(0.05)


def judge_body(rules: int) -> NftBody:
    """The judge for the client allowed to both backends, among ``rules`` policies and 100 other
    isolated Pods of the Node."""
    pods = [Pod("a", "cli", "n1", (("app", "cli"),), ("10.244.1.5",))]
    pods += [Pod("a", f"o{i}", "n1", (("app", "other"),), (f"10.244.1.{100 + i}",)) for i in range(100)]
    pols = [{"metadata": {"namespace": "a", "name": f"p{i}"},
             "spec": {"podSelector": {"matchLabels": {"app": "cli" if i == rules - 1 else "other"}},
                      "policyTypes": ["Egress", "Ingress"],
                      "egress": [{"to": [{"ipBlock": {"cidr": f"172.{16 + i // 250}.{i % 250}.0/24"}}],
                                  "ports": [{"port": 1000 + i}]}]}} for i in range(rules - 1)]
    pols.append({"metadata": {"namespace": "a", "name": "cli"},
                 "spec": {"podSelector": {"matchLabels": {"app": "cli"}}, "policyTypes": ["Egress"],
                          "egress": [{"to": [{"ipBlock": {"cidr": "10.244.1.6/32"}},
                                             {"ipBlock": {"cidr": "192.168.77.2/32"}}],
                                      "ports": [{"port": 5201}]}]}})
    plan = pp.plan(pp.Inputs(tuple(pods), {"a": ()}, tuple(policy_from(d) for d in pols)), pp.NodeFacts("n1"))
    return hj.render_body(hj.judge(plan, "ferry-gw0", ["10.244.1.1/24", "192.168.77.1/24"], ["10.96.0.0/16"]))


def iperf(target: str, seconds: float) -> float:
    out = sh("iperf3", "-c", target, "-t", str(seconds), "-J", ns=CLI)
    return float(json.loads(out)["end"]["sum_received"]["bits_per_second"]) / 1e6


def connect_rate(target: str, n: int) -> float:
    return float(sh(sys.executable, "-c", CONNECTS, target, "5201", str(n), ns=CLI).strip())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--connects", type=int, default=2000)
    ap.add_argument("--rules", type=int, default=200)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    targets = {"ClusterIP -> Pod backend (OVS judges)": "10.96.0.10",
               "ClusterIP -> external backend (the host judges)": "10.96.0.20"}
    body = judge_body(args.rules)
    results: dict[str, Any] = {"meta": {"rules": args.rules, "seconds": args.seconds, "pairs": args.pairs,
                                        "connects": args.connects}, "figures": []}
    with topology(), ExitStack() as stack:
        nft = NftApplier(netns=NODE)
        stack.callback(nft.close)
        for ns in (SRV, EXT):
            srv = subprocess.Popen(["ip", "netns", "exec", ns, "iperf3", "-s"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
            stack.callback(srv.wait)
            stack.callback(srv.kill)
        for ns in (SRV, EXT):
            listening(ns, 5201)
        order = ab_order(SIDES, args.pairs)
        for what, target in targets.items():
            for figure, fn in (("throughput_mbit", lambda t=target: iperf(t, args.seconds)),):
                fn()  # a warm-up run, not counted (the first of a path ran ~20% slower either way)
                samples = []
                for side, _i in order:
                    nft.sync_policy(body if side == "present" else None)
                    samples.append(fn())
                by = ab_by_side(samples, order, SIDES)
                results["figures"].append(_figure(what, figure, by))
        # connection rate: iperf3's servers out of the way, an accept loop instead
        stack.close()
        nft = NftApplier(netns=NODE)
        with ExitStack() as acc:
            acc.callback(nft.close)
            for ns in (SRV, EXT):
                p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", ACCEPT, "5201"],
                                     stdout=subprocess.PIPE, text=True)
                acc.callback(p.wait)
                acc.callback(p.kill)
                assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            for what, target in targets.items():
                connect_rate(target, args.connects)  # warm-up, not counted
                samples = []
                for side, _i in order:
                    nft.sync_policy(body if side == "present" else None)
                    sh("conntrack", "-F", ns=NODE)
                    samples.append(connect_rate(target, args.connects))
                by = ab_by_side(samples, order, SIDES)
                results["figures"].append(_figure(what, "connections_per_s", by))
            nft.sync_policy(None)
    rows = [(f["path"], f["figure"], f"{f['absent']:.0f}", f"{f['present']:.0f}", f"{f['ratio']:.3f}")
            for f in results["figures"]]
    print(table(("path", "figure", "judge absent", "judge present", "ratio"), rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def _figure(path: str, figure: str, by: dict[str, list[float]]) -> dict[str, Any]:
    a, p = statistics.median(by["absent"]), statistics.median(by["present"])
    log(f"{path}: {figure} absent {a:.1f} present {p:.1f} (samples {by})")
    return {"path": path, "figure": figure, "absent": a, "present": p, "ratio": p / a if a else None,
            "samples": by, "at": time.time()}


if __name__ == "__main__":
    sys.exit(main())
