"""What BGP costs a Node: route-sync's speaker, ExaBGP and its relay, holding a session while the
router announces N Nodes' worth of Pod CIDRs (N IPv4 /24 + N IPv6 /64) to it.

    python -m bench.bench_bgp [--nodes 1000,10000] [--idle 20] [--json OUT] [--cni-bin DIR]

A ferry-lab from ``lab/topologies/bgp.yaml`` (FRR on the router, route-sync + ExaBGP on every
Node); on the router, N blackhole routes per family are added to its kernel table and bgpd
redistributes them to every Node.  For node-1's route-sync, its ExaBGP and the relay (ExaBGP's
API process): RSS (``VmRSS``) and CPU seconds (utime + stime) idle before, while taking the
prefixes in (from the redistribution until the router counts them sent, plus 3 s), idle while
holding them, and after they are withdrawn.  Not a ratio against a reference: a cost in MiB and
CPU seconds on this machine, printed beside the idle baseline of the same run."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE, NODE_ADDR = "node-1", "192.168.77.11"
HZ = os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def snapshot(pids: dict[str, int]) -> dict[str, tuple[float, float]]:
    return {k: (_rss_mib(p), _cpu_s(p)) for k, p in pids.items()}


def delta(a: dict[str, tuple[float, float]], b: dict[str, tuple[float, float]]) -> dict[str, dict[str, float]]:
    return {k: {"rssMiB": round(b[k][0], 1), "rssDeltaMiB": round(b[k][0] - a[k][0], 1),
                "cpuS": round(b[k][1] - a[k][1], 3)} for k in a}


def run(sizes: list[int], idle: float, cni_bin: str | None) -> dict[str, Any]:
    sys.path.insert(0, ROOT)
    from lab import frr
    from lab.api import Lab
    from lab.sh import ip_batch
    from lab.sh import run as sh
    from routesync.bgp import status as bgp_status

    topo = os.path.join(ROOT, "lab", "topologies", "bgp.yaml")
    lab = Lab.up(topo, name=f"bb{secrets.token_hex(3)}", cni_bin=cni_bin)
    try:
        node = lab.node(NODE)
        run_dir = os.path.join(os.path.dirname(node.paths.state_file), "bgp")

        def speaker() -> bgp_status.BgpStatus | None:
            st = bgp_status.read(run_dir)
            return st if st and st.speaker_pid and st.peers[0].state == "established" else None

        deadline = time.monotonic() + 60
        while (st := speaker()) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{NODE}'s BGP session did not come up; see {run_dir}")
            time.sleep(0.05)
        exa = int(st.speaker_pid or 0)
        with open(f"/proc/{exa}/task/{exa}/children") as f:
            relay = int(f.read().split()[0])
        pids = {"route-sync": int(lab.route_sync_pid(NODE) or 0), "exabgp": exa, "relay": relay}

        def vty(*cmds: str) -> None:
            argv = ["vtysh", "--vty_socket", os.path.join(frr.frr_dir(lab.dir), "vty")]
            for c in cmds:
                argv += ["-c", c]
            sh(argv, netns=lab.router.netns)

        def redistribute(on: bool) -> None:
            no = "" if on else "no "
            vty("configure terminal", "router bgp 65000", "address-family ipv4 unicast", f"{no}redistribute kernel",
                "exit-address-family", "address-family ipv6 unicast", f"{no}redistribute kernel")

        def sent() -> int:
            raw = json.loads(frr.vtysh(lab.dir, lab.router.netns, f"show bgp neighbors {NODE_ADDR} json"))
            return sum(v.get("sentPrefixCounter", 0) for v in raw[NODE_ADDR]["addressFamilyInfo"].values())

        def wait(cond: Any, what: str) -> None:
            end = time.monotonic() + 120  # bounds a hang only
            while not cond():
                if time.monotonic() > end:
                    raise RuntimeError(f"not within 120 s: {what}")
                time.sleep(0.02)

        a = snapshot(pids)
        time.sleep(idle)
        out: dict[str, Any] = {"pids": pids, "idleSeconds": idle, "idle": delta(a, snapshot(pids)), "sizes": {}}
        for n in sizes:
            ip_batch(lab.router.netns, [f"route add blackhole 10.{100 + i // 256}.{i % 256}.0/24" for i in range(n)]
                     + [f"route add blackhole fd00:200:{i:x}::/64" for i in range(n)])
            base = sent()
            c, t0 = snapshot(pids), time.monotonic()
            redistribute(True)
            wait(lambda want=base + 2 * n: sent() >= want, f"the router to send {2 * n} prefixes")
            took = time.monotonic() - t0
            time.sleep(3)
            e = snapshot(pids)
            time.sleep(idle)
            f = snapshot(pids)
            redistribute(False)
            wait(lambda want=base: sent() <= want, "the router to withdraw them")
            time.sleep(3)
            g = snapshot(pids)
            sh(["ip", "route", "flush", "type", "blackhole"], netns=lab.router.netns)
            sh(["ip", "-6", "route", "flush", "type", "blackhole"], netns=lab.router.netns)
            out["sizes"][str(n)] = {"prefixes": 2 * n, "routerSentSeconds": round(took, 3),
                                    "receive": delta(c, e), "holdingIdle": delta(e, f), "withdrawn": delta(f, g)}
        return out
    finally:
        lab.down()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1000,10000", help="Nodes' worth of Pod CIDRs the router announces")
    ap.add_argument("--idle", type=float, default=20.0, help="seconds of each idle measurement")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--cni-bin", default=None)
    args = ap.parse_args(argv)
    res = run([int(x) for x in args.nodes.split(",")], args.idle, args.cni_bin)
    text = json.dumps(res, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
