"""IPAM latency on a /16 at 0 %, 50 % and 99 % full: Ferry vs. Debian's host-local, like for like.

    python -m bench.bench_ipam [--iterations 300] [--exec-iterations 60] [--cni-bin DIR] [--json OUT]

For each fill level the same addresses are reserved in both stores (written directly: Ferry's
claims + records + cursor, host-local's one file per IP + ``last_reserved_ip.0``) with the cursor
on the same random reserved address, then each implementation does ADD then DEL of a fresh
attachment, again and again (the fill stays put):

* ``ferry in-process``: ``cni.ipam.api.allocate`` / ``release`` (what the ``ferry`` plugin calls);
* ``ferry-ipam exec``: the ``ferry-ipam`` CNI plugin exec'd (lean launcher), config on stdin;
* ``host-local exec``: ``/usr/lib/cni/host-local`` exec'd with the same ranges.

Wall times include fork+exec for the exec'd ones.  2 noisy vCPUs: trust the ratios."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import random
import shutil
import sys
import tempfile
import time

from bench.util import percentile, table, timed_exec

SUBNET = "10.66.0.0/16"
FILLS = (0, 50, 99)
HOST_LOCAL = "/usr/lib/cni/host-local"


def _usable(subnet: str = SUBNET) -> list[str]:
    net = ipaddress.ip_network(subnet)
    first, last = int(net.network_address) + 2, int(net.broadcast_address) - 1  # .1 is the gateway
    return [str(ipaddress.IPv4Address(a)) for a in range(first, last + 1)]


def _write(path: str, data: str) -> None:
    with open(path, "w") as f:
        f.write(data)


def prefill_ferry(store: str, reserved: list[str], cursor: str | None, subnet: str = SUBNET) -> None:
    from cni.ipam.store import ATTACHMENTS, IPS, record_name

    os.makedirs(os.path.join(store, IPS), mode=0o755, exist_ok=True)
    os.makedirs(os.path.join(store, ATTACHMENTS), mode=0o755, exist_ok=True)
    prefix = subnet.split("/")[1]
    for n, ip in enumerate(reserved):
        key = (f"fill{n}", "eth0")
        _write(os.path.join(store, IPS, ip), f"{key[0]}\n{key[1]}\n")
        _write(os.path.join(store, ATTACHMENTS, record_name(key)),
               json.dumps({"containerID": key[0], "ifname": key[1],
                           "ips": [{"address": f"{ip}/{prefix}", "gateway": "10.66.0.1"}]}))
    if cursor:
        _write(os.path.join(store, "cursor.0"), cursor)


def prefill_host_local(store: str, reserved: list[str], cursor: str | None) -> None:
    os.makedirs(store, mode=0o755, exist_ok=True)
    for n, ip in enumerate(reserved):
        _write(os.path.join(store, ip), f"fill{n}\r\neth0")
    if cursor:
        _write(os.path.join(store, "last_reserved_ip.0"), cursor)


def netconf(kind: str, data_dir: str, subnet: str = SUBNET) -> dict[str, object]:
    return {"cniVersion": "1.0.0", "name": "fi-bench", "type": kind,
            "ipam": {"type": kind, "dataDir": data_dir, "ranges": [[{"subnet": subnet}]]}}


def bench_in_process(data_dir: str, iterations: int, subnet: str = SUBNET) -> tuple[list[float], list[float]]:
    from cni.ipam import api

    conf = api.parse_config(netconf("ferry-ipam", data_dir, subnet), [])
    add, dele = [], []
    for i in range(iterations):
        t = time.perf_counter()
        api.allocate(conf, f"bench{i}", "eth0")
        t2 = time.perf_counter()
        api.release(conf, f"bench{i}", "eth0")
        t3 = time.perf_counter()
        add.append((t2 - t) * 1000)
        dele.append((t3 - t2) * 1000)
    return add, dele


def bench_exec(binary: str, conf: dict[str, object], iterations: int) -> tuple[list[float], list[float]]:
    stdin = json.dumps(conf).encode()
    base = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_IFNAME": "eth0", "CNI_NETNS": "/var/run/netns/fi-bench",
            "CNI_PATH": os.path.dirname(binary)}
    add, dele = [], []
    for i in range(iterations):
        env = {**base, "CNI_CONTAINERID": f"bench{i}"}
        a = timed_exec([binary], {**env, "CNI_COMMAND": "ADD"}, stdin)
        if a.rc != 0 or b'"ips"' not in a.stdout:
            raise SystemExit(f"{binary} ADD failed: {a.stdout.decode()[:300]}")
        d = timed_exec([binary], {**env, "CNI_COMMAND": "DEL"}, stdin)
        if d.rc != 0:
            raise SystemExit(f"{binary} DEL failed: {d.stdout.decode()[:300]}")
        add.append(a.ms)
        dele.append(d.ms)
    return add, dele


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_ipam", description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=300, help="in-process ADD+DEL pairs per fill level")
    p.add_argument("--exec-iterations", type=int, default=60, help="exec'd ADD+DEL pairs per fill level")
    p.add_argument("--cni-bin", default=os.environ.get("FERRY_CNI_BIN", ""),
                   help="directory holding ferry-ipam (default: lean launchers written to a temp dir)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the figures (and the raw samples) to this file")
    p.add_argument("--subnet", default=SUBNET, help=f"the range (inside {SUBNET}; smaller = faster prefill)")
    args = p.parse_args(argv)
    if not os.access(HOST_LOCAL, os.X_OK):
        print(f"{HOST_LOCAL} missing (apt-get install containernetworking-plugins)", file=sys.stderr)
        return 1
    rnd = random.Random(args.seed)
    subnet = args.subnet
    if not ipaddress.ip_network(subnet).subnet_of(ipaddress.ip_network(SUBNET)):
        print(f"--subnet must lie in {SUBNET} (the records name gateway 10.66.0.1)", file=sys.stderr)
        return 2
    usable = _usable(subnet)
    work = tempfile.mkdtemp(prefix="fi-bench-")
    try:
        ferry_ipam = os.path.join(args.cni_bin, "ferry-ipam") if args.cni_bin else ""
        if not ferry_ipam or not os.access(ferry_ipam, os.X_OK):
            from cni.launcher import write_launchers

            write_launchers(os.path.join(work, "bin"))
            ferry_ipam = os.path.join(work, "bin", "ferry-ipam")
        rows = []
        series: list[dict[str, object]] = []
        for fill in FILLS:
            reserved = rnd.sample(usable, len(usable) * fill // 100)
            cursor = rnd.choice(reserved) if reserved else None
            dirs = {k: os.path.join(work, f"{k}-{fill}") for k in ("inproc", "exec", "hl")}
            t = time.perf_counter()
            prefill_ferry(os.path.join(dirs["inproc"], "fi-bench"), reserved, cursor, subnet)
            prefill_ferry(os.path.join(dirs["exec"], "fi-bench"), reserved, cursor, subnet)
            prefill_host_local(os.path.join(dirs["hl"], "fi-bench"), reserved, cursor)
            print(f"fill {fill}%: {len(reserved)} of {len(usable)} reserved in {time.perf_counter() - t:.1f} s",
                  file=sys.stderr)
            results = {
                "ferry in-process": bench_in_process(dirs["inproc"], args.iterations, subnet),
                "ferry-ipam exec": bench_exec(ferry_ipam, netconf("ferry-ipam", dirs["exec"], subnet),
                                              args.exec_iterations),
                "host-local exec": bench_exec(HOST_LOCAL, netconf("host-local", dirs["hl"], subnet),
                                              args.exec_iterations),
            }
            hl_add = percentile(results["host-local exec"][0], 50)
            for name, (add, dele) in results.items():
                rows.append([f"{fill}%", name, len(add), percentile(add, 50), percentile(add, 99),
                             percentile(dele, 50), percentile(dele, 99), f"{hl_add / percentile(add, 50):.2f}x"])
                series.append({"fill": fill, "implementation": name, "n": len(add),
                               "add_p50": percentile(add, 50), "add_p99": percentile(add, 99),
                               "del_p50": percentile(dele, 50), "del_p99": percentile(dele, 99),
                               "add_ms": add, "del_ms": dele})
            for d in dirs.values():
                shutil.rmtree(d, ignore_errors=True)
        print(f"IPAM on {subnet} (ms; ratio = host-local exec ADD p50 / this ADD p50, >1 means faster)")
        print(table(["fill", "implementation", "n", "ADD p50", "ADD p99", "DEL p50", "DEL p99", "vs host-local"],
                    rows))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"benchmark": "ipam", "subnet": subnet, "series": series}, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
