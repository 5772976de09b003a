"""WireGuard through ``wg`` (issue 30, routesync.wireguard.wgtool): what one change costs.

    python -m bench.bench_wgtool [--peers 1,10,100] [--reps 20] [--json OUT]

A wireguard-go device (build/tools/wireguard-go) in a fresh namespace stands in for the kernel's
(``wg`` drives a userspace device through its UAPI socket the same way).  Per N in ``--peers``,
per repetition, on the same device: **add** (private key, listen port and N new peers, each with
an endpoint and two allowed IPs: one ``wg set``), **read** (``wg show dump`` of N peers),
**update** (every peer's endpoint and allowed IPs changed: one ``wg set``), **remove** (the N
peers: one ``wg set``); each read back and checked.  Wall time of WgTool's call (fork + exec of
``wg`` + the UAPI exchange), p50/p90/max in ms.  Run as root."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.util import percentile, table
from routesync.wireguard.model import PeerChange, WgChange, WgDeviceState
from routesync.wireguard.wgtool import WgTool

OPS = ("add", "read", "update", "remove")


def log(msg: str) -> None:
    print(f"[bench_wgtool] {msg}", file=sys.stderr, flush=True)


def peers(keys: list[str], round_: int) -> tuple[PeerChange, ...]:
    """N peers: endpoint 192.168.x.y:51820 + round, a /24 and a /64 each (shifted by ``round_``)."""
    out = []
    for i, k in enumerate(keys):
        j = (i + round_) % 60000
        out.append(PeerChange(k, endpoint=f"192.168.{j // 250}.{j % 250 + 1}:{51820 + round_ % 2}",
                              allowed_ips=(f"10.{j // 250}.{j % 250}.0/24", f"fd00:{j + 1:x}::/64")))
    return tuple(out)


def measure(wg: WgTool, dev: str, n: int, reps: int) -> dict[str, list[float]]:
    from tests.routesync.wireguard.keypairs import keypair, public_keys

    private, _public = keypair()
    times: dict[str, list[float]] = {op: [] for op in OPS}

    def timed(op: str, change: WgChange | None = None) -> WgDeviceState | None:
        t0 = time.perf_counter()
        out = wg.read(dev) if change is None else wg.configure(dev, change)
        times[op].append((time.perf_counter() - t0) * 1000)
        return out

    for _rep in range(reps):
        keys = public_keys(n)
        timed("add", WgChange(private_key=private, listen_port=51820, peers=peers(keys, 0)))
        state = timed("read")
        assert state is not None and len(state.peers) == n, (n, state)
        moved = peers(keys, 1)
        timed("update", WgChange(peers=moved))
        assert {p.public_key: p.endpoint for p in wg.read(dev).peers} == {p.public_key: p.endpoint for p in moved}
        timed("remove", WgChange(peers=tuple(PeerChange(k, remove=True) for k in keys)))
        assert wg.read(dev).peers == ()
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", default="1,10,100")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args(argv)
    from tests.support import wireguard_go
    from tests.support.names import uniq
    from tests.support.ovs_instance import netns

    if wireguard_go.binary() is None:
        log("no build/tools/wireguard-go: run tools/build-go-tools.sh wireguard-go")
        return 2
    wg = WgTool()
    results: dict[int, dict[str, list[float]]] = {}
    with netns(uniq("wgb")) as ns:
        dev = uniq("wgb")
        with wireguard_go.device(ns, dev):
            for n in (int(x) for x in args.peers.split(",")):
                log(f"{n} peer(s) x {args.reps}")
                results[n] = measure(wg, dev, n, args.reps)
    rows = [[f"{op} N={n}", len(t[op]), percentile(t[op], 50), percentile(t[op], 90), max(t[op])]
            for n, t in results.items() for op in OPS]
    print(table(["wg (ms)", "runs", "p50", "p90", "max"], rows))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({str(n): {op: {"p50": percentile(t[op], 50), "p90": percentile(t[op], 90), "max": max(t[op]),
                                     "samples": t[op]} for op in OPS} for n, t in results.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
