"""route-sync's netlink workloads through pyroute2 and through ``cni.kernel.netlink``, same run.

    python -m bench.bench_netlink [--sizes 1000,5000] [--reps 3] [--singles 200] [--json OUT]

Needs root.  The whole process enters a throwaway network namespace ``fbn-<hex>`` (created at
the start, deleted at the end, also on failure) holding a veth pair ``bgw0``/``bgw1`` (up,
192.168.77.1/24), so both stacks open their sockets the same way and see the same kernel.

Workloads (what route-sync does on a full pass, a change, and its other calls):

* **routes** (per size N): add N /24 host routes ``via 192.168.77.254 dev bgw0 onlink proto
  102`` (create-or-replace), dump the main table's proto-102 routes into (dst, gw, oif, onlink,
  mtu) tuples (what ``RouteApplier.installed`` builds), replace all N (a new route MTU), delete
  all N;
* **neighbours** (1,000): add permanent neighbours on ``bgw0``, dump them, delete them;
* **singles** (median of ``--singles``): one route replace, one route delete (one change),
  a link looked up by name, an MTU set, an address ensured (dump the link's addresses, add one,
  dump, delete it).

Stacks, each given its best API for the job (instances made and warmed before timing; imports
excluded):

* ``ferry``: ``cni.kernel.netlink.Netlink``: single requests, and :meth:`Netlink.batch` (128
  requests a datagram, acknowledged together) for bulk;
* ``pyroute2 IPRoute``: the synchronous API, one request at a time;
* ``pyroute2 AsyncIPRoute``: 256 requests in flight (``asyncio.gather``) on one event loop;
* ``pyroute2 IPBatch``: pyroute2's request compiler (its own encoding, 128 requests a
  datagram) sent on a plain netlink socket whose ACKs are counted with ``struct`` (the cheapest
  possible reading, cheaper than either stack's own), i.e. pyroute2's best case for bulk.

Compared with route-sync's budget (issue 6, bench/report.py): full reconcile of 1,000 peers
<= 1 s and 5,000 <= 5 s (routes are one part of it: OVS flows, nftables and the plan share the
budget), one change applied p99 <= 100 ms, peak RSS <= 150 MB (pyroute2's import and one
instance's resident memory are measured in a child process)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import secrets
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.util import table

PROTO = 102
ONLINK = 4
CHUNK = 128
IN_FLIGHT = 256
GW = "192.168.77.254"


def log(msg: str) -> None:
    print(f"[bench_netlink] {msg}", file=sys.stderr, flush=True)


def sh(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, timeout=60)


def dst(i: int) -> str:
    return f"10.{(i >> 8) & 255}.{i & 255}.0/24"


def neigh_ip(i: int) -> str:
    return f"192.168.{78 + (i >> 8)}.{i & 255}"


def neigh_mac(i: int) -> str:
    return f"02:00:00:00:{(i >> 8) & 255:02x}:{i & 255:02x}"


def clock(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000.0


# ------------------------------------------------------------------------------------------
# The stacks: the same verbs, each through its own library.

class Ferry:
    name = "ferry (cni.kernel.netlink)"

    def __init__(self, index: int) -> None:
        from cni.kernel import neighbours, netlink

        self.nl_mod = netlink
        self.neigh = neighbours
        self.nl = netlink.Netlink()
        self.index = index

    def close(self) -> None:
        self.nl.close()

    def _batch(self, requests: list[tuple[int, int, bytes]]) -> None:
        errors = [e for e in self.nl.batch(requests, "bench") if isinstance(e, Exception)]
        if errors:
            raise errors[0]

    def routes_add(self, n: int, mtu: int = 0) -> None:
        self._batch([self.nl_mod.route_add_request(dst(i), GW, self.index, onlink=True, proto=PROTO, mtu=mtu)
                     for i in range(n)])

    def routes_dump(self) -> list[tuple[Any, ...]]:
        return [(r.dst, r.gw, r.index, bool(r.flags & ONLINK), r.mtu)
                for family in (socket.AF_INET, socket.AF_INET6)
                for r in self.nl.routes(family, None) if r.proto == PROTO]

    def routes_del(self, n: int) -> None:
        self._batch([self.nl_mod.route_del_request(dst(i), GW, proto=PROTO) for i in range(n)])

    def neigh_add(self, n: int) -> None:
        self._batch([self.neigh.add_request(self.index, neigh_ip(i), neigh_mac(i)) for i in range(n)])

    def neigh_dump(self) -> list[tuple[Any, ...]]:
        return [(x.ip, x.mac) for x in self.neigh.dump(self.nl, self.index)
                if x.state & self.neigh.NUD_PERMANENT and x.mac]

    def neigh_del(self, n: int) -> None:
        self._batch([self.neigh.del_request(self.index, neigh_ip(i)) for i in range(n)])

    def route_replace(self) -> None:
        self.nl.route_add("10.254.0.0/24", GW, self.index, onlink=True, proto=PROTO, replace=True)

    def route_delete(self) -> None:
        if not self.nl.route_del("10.254.0.0/24", GW, self.index):
            raise LookupError("route 10.254.0.0/24 was not there")

    def link_lookup(self) -> int:
        link = self.nl.link_get("bgw0")
        assert link is not None
        return link.index

    def set_mtu(self, mtu: int) -> None:
        self.nl.link_set(self.index, mtu=mtu)

    def addresses(self) -> list[str]:
        return self.nl.addrs(self.index)

    def addr_add(self) -> None:
        self.nl.addr_add(self.index, "192.168.76.1/32")

    def addr_del(self) -> None:
        self.nl.addr_del(self.index, "192.168.76.1/32")


def _pyroute2_route_args(i: int, index: int, mtu: int = 0) -> dict[str, Any]:
    args: dict[str, Any] = {"dst": dst(i), "gateway": GW, "oif": index, "proto": PROTO, "flags": ONLINK}
    if mtu:
        args["metrics"] = {"mtu": mtu}
    return args


def _pyroute2_rows(msgs: list[Any]) -> list[tuple[Any, ...]]:
    out = []
    for r in msgs:
        if r["proto"] != PROTO:
            continue
        metrics = r.get_attr("RTA_METRICS")
        out.append((f"{r.get_attr('RTA_DST')}/{r['dst_len']}", r.get_attr("RTA_GATEWAY"), r.get_attr("RTA_OIF"),
                    bool(r["flags"] & ONLINK), (metrics.get_attr("RTAX_MTU") or 0) if metrics is not None else 0))
    return out


class Pyroute2Sync:
    name = "pyroute2 IPRoute"

    def __init__(self, index: int) -> None:
        from pyroute2 import IPRoute

        self.ipr = IPRoute()
        self.index = index

    def close(self) -> None:
        self.ipr.close()

    def routes_add(self, n: int, mtu: int = 0) -> None:
        for i in range(n):
            self.ipr.route("replace", **_pyroute2_route_args(i, self.index, mtu))

    def routes_dump(self) -> list[tuple[Any, ...]]:
        return [row for family in (socket.AF_INET, socket.AF_INET6)
                for row in _pyroute2_rows(list(self.ipr.get_routes(family=family, table=254)))]

    def routes_del(self, n: int) -> None:
        for i in range(n):
            self.ipr.route("del", dst=dst(i), gateway=GW, proto=PROTO)

    def neigh_add(self, n: int) -> None:
        for i in range(n):
            self.ipr.neigh("replace", dst=neigh_ip(i), lladdr=neigh_mac(i), ifindex=self.index, state=0x80)

    def neigh_dump(self) -> list[tuple[Any, ...]]:
        return [(m.get_attr("NDA_DST"), m.get_attr("NDA_LLADDR")) for m in self.ipr.get_neighbours(ifindex=self.index)
                if m["state"] & 0x80 and m.get_attr("NDA_LLADDR")]

    def neigh_del(self, n: int) -> None:
        for i in range(n):
            self.ipr.neigh("del", dst=neigh_ip(i), ifindex=self.index)

    def route_replace(self) -> None:
        self.ipr.route("replace", dst="10.254.0.0/24", gateway=GW, oif=self.index, proto=PROTO, flags=ONLINK)

    def route_delete(self) -> None:
        self.ipr.route("del", dst="10.254.0.0/24", gateway=GW, oif=self.index)

    def link_lookup(self) -> int:
        return int(self.ipr.link_lookup(ifname="bgw0")[0])

    def set_mtu(self, mtu: int) -> None:
        self.ipr.link("set", index=self.index, mtu=mtu)

    def addresses(self) -> list[str]:
        return [f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}" for a in self.ipr.get_addr(index=self.index)]

    def addr_add(self) -> None:
        self.ipr.addr("add", index=self.index, address="192.168.76.1", prefixlen=32)

    def addr_del(self) -> None:
        self.ipr.addr("del", index=self.index, address="192.168.76.1", prefixlen=32)


class Pyroute2Async:
    name = "pyroute2 AsyncIPRoute"

    def __init__(self, index: int) -> None:
        from pyroute2 import AsyncIPRoute

        self.loop = asyncio.new_event_loop()
        self.a = AsyncIPRoute()
        self.loop.run_until_complete(self.a.setup_endpoint())
        self.index = index

    def close(self) -> None:
        self.a.close()
        self.loop.close()

    def _many(self, calls: list[Callable[[], Any]]) -> None:
        async def run(chunk: list[Callable[[], Any]]) -> None:
            await asyncio.gather(*(c() for c in chunk))

        for i in range(0, len(calls), IN_FLIGHT):
            self.loop.run_until_complete(run(calls[i:i + IN_FLIGHT]))

    def _dump(self, coro: Any) -> list[Any]:
        async def collect() -> list[Any]:
            return [m async for m in await coro]
        return self.loop.run_until_complete(collect())

    def routes_add(self, n: int, mtu: int = 0) -> None:
        self._many([lambda i=i: self.a.route("replace", **_pyroute2_route_args(i, self.index, mtu))  # type: ignore[misc]
                    for i in range(n)])

    def routes_dump(self) -> list[tuple[Any, ...]]:
        return [row for family in (socket.AF_INET, socket.AF_INET6)
                for row in _pyroute2_rows(self._dump(self.a.get_routes(family=family, table=254)))]

    def routes_del(self, n: int) -> None:
        self._many([lambda i=i: self.a.route("del", dst=dst(i), gateway=GW, proto=PROTO)  # type: ignore[misc]
                    for i in range(n)])

    def neigh_add(self, n: int) -> None:
        self._many([lambda i=i: self.a.neigh("replace", dst=neigh_ip(i), lladdr=neigh_mac(i),  # type: ignore[misc]
                                             ifindex=self.index, state=0x80) for i in range(n)])

    def neigh_dump(self) -> list[tuple[Any, ...]]:
        return [(m.get_attr("NDA_DST"), m.get_attr("NDA_LLADDR"))
                for m in self._dump(self.a.get_neighbours(ifindex=self.index))
                if m["state"] & 0x80 and m.get_attr("NDA_LLADDR")]

    def neigh_del(self, n: int) -> None:
        self._many([lambda i=i: self.a.neigh("del", dst=neigh_ip(i), ifindex=self.index)  # type: ignore[misc]
                    for i in range(n)])


class Pyroute2Batch:
    """pyroute2's encoder (IPBatch) with the cheapest possible transport: a plain socket, ACKs
    counted and checked with struct.  Dumps are not its job (they go through IPRoute)."""

    name = "pyroute2 IPBatch"

    def __init__(self, index: int) -> None:
        from pyroute2 import IPBatch

        self.ipb = IPBatch()
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        self.sock.bind((0, 0))
        self.index = index

    def close(self) -> None:
        self.sock.close()
        self.ipb.close()

    def _send(self, n: int, compile_one: Callable[[int], Any]) -> None:
        for start in range(0, n, CHUNK):
            self.ipb.reset()
            count = min(CHUNK, n - start)
            for i in range(start, start + count):
                compile_one(i)
            self.sock.send(bytes(self.ipb.batch))
            acked = 0
            while acked < count:
                data = self.sock.recv(1 << 16)
                offset = 0
                while offset + 20 <= len(data):
                    length, mtype = struct.unpack_from("=IH", data, offset)
                    if mtype == 2:  # NLMSG_ERROR: the ACK (0) or an error
                        code = struct.unpack_from("=i", data, offset + 16)[0]
                        if code:
                            raise OSError(-code, os.strerror(-code))
                        acked += 1
                    offset += (length + 3) & ~3

    def routes_add(self, n: int, mtu: int = 0) -> None:
        self._send(n, lambda i: self.ipb.route("replace", **_pyroute2_route_args(i, self.index, mtu)))

    def routes_del(self, n: int) -> None:
        self._send(n, lambda i: self.ipb.route("del", dst=dst(i), gateway=GW, proto=PROTO))

    def neigh_add(self, n: int) -> None:
        self._send(n, lambda i: self.ipb.neigh("replace", dst=neigh_ip(i), lladdr=neigh_mac(i),
                                               ifindex=self.index, state=0x80))

    def neigh_del(self, n: int) -> None:
        self._send(n, lambda i: self.ipb.neigh("del", dst=neigh_ip(i), ifindex=self.index))


# ------------------------------------------------------------------------------------------
# The workloads.

def bulk(stack: Any, sizes: list[int], reps: int, neighbours: int) -> dict[str, float]:
    """Median ms per bulk step (route and neighbour counts checked after each step)."""
    out: dict[str, list[float]] = {}
    dumps = hasattr(stack, "routes_dump")
    check = Ferry(stack.index)
    try:
        for n in sizes:
            for _ in range(reps):
                out.setdefault(f"routes {n}: add", []).append(clock(lambda n=n: stack.routes_add(n)))  # type: ignore[misc]
                assert len(check.routes_dump()) == n
                if dumps:
                    rows: list[Any] = []
                    out.setdefault(f"routes {n}: dump", []).append(
                        clock(lambda rows=rows: rows.extend(stack.routes_dump())))  # type: ignore[misc]
                    assert len(rows) == n, len(rows)
                out.setdefault(f"routes {n}: replace", []).append(
                    clock(lambda n=n: stack.routes_add(n, mtu=1400)))  # type: ignore[misc]
                assert {r[4] for r in check.routes_dump()} == {1400}
                out.setdefault(f"routes {n}: delete", []).append(clock(lambda n=n: stack.routes_del(n)))  # type: ignore[misc]
                assert not check.routes_dump()
        for _ in range(reps):
            out.setdefault(f"neighbours {neighbours}: add", []).append(clock(lambda: stack.neigh_add(neighbours)))
            assert len(check.neigh_dump()) == neighbours
            if dumps:
                got: list[Any] = []
                out.setdefault(f"neighbours {neighbours}: dump", []).append(
                    clock(lambda got=got: got.extend(stack.neigh_dump())))  # type: ignore[misc]
                assert len(got) == neighbours
            out.setdefault(f"neighbours {neighbours}: delete", []).append(clock(lambda: stack.neigh_del(neighbours)))
            assert not check.neigh_dump()
    finally:
        check.close()
    return {k: statistics.median(v) for k, v in out.items()}


def singles(stack: Any, count: int) -> dict[str, float]:
    """Median ms of one request of each kind route-sync makes one at a time."""
    out: dict[str, list[float]] = {}
    for k in range(count):
        out.setdefault("one route replace", []).append(clock(stack.route_replace))
        out.setdefault("one route delete", []).append(clock(stack.route_delete))
        out.setdefault("link lookup by name", []).append(clock(stack.link_lookup))
        out.setdefault("MTU set", []).append(clock(lambda k=k: stack.set_mtu(1400 + k % 2)))  # type: ignore[misc]

        def ensure() -> None:
            if "192.168.76.1/32" not in stack.addresses():
                stack.addr_add()
            assert "192.168.76.1/32" in stack.addresses()
            stack.addr_del()
        out.setdefault("address ensure (dump, add, dump, del)", []).append(clock(ensure))
    return {k: statistics.median(v) for k, v in out.items()}


def pyroute2_rss_mb() -> tuple[float, float]:
    """(peak RSS of a bare interpreter, of one that imported pyroute2 and opened an IPRoute), MB."""
    probe = ("import sys\n{}\nfor l in open('/proc/self/status'):\n"
             "    if l.startswith('VmHWM:'): print(int(l.split()[1]) / 1024)\n")
    bare = subprocess.run([sys.executable, "-c", probe.format("")], capture_output=True, text=True, check=True)
    with_pr = subprocess.run([sys.executable, "-c", probe.format("from pyroute2 import IPRoute; IPRoute().close()")],
                             capture_output=True, text=True, check=True)
    return float(bare.stdout), float(with_pr.stdout)


def run(sizes: list[int], reps: int, count: int, neighbours: int) -> dict[str, Any]:
    from cni.kernel.netns import open_netns, setns

    ns = f"fbn-{secrets.token_hex(3)}"
    origin = open_netns("/proc/thread-self/ns/net")
    sh("ip", "netns", "add", ns)
    try:
        fd = open_netns(f"/run/netns/{ns}")
        setns(fd)
        os.close(fd)
        sh("ip", "link", "add", "bgw0", "type", "veth", "peer", "name", "bgw1")
        sh("ip", "link", "set", "bgw0", "up")
        sh("ip", "link", "set", "bgw1", "up")
        sh("ip", "addr", "add", "192.168.77.1/24", "dev", "bgw0")
        probe = Ferry(0)
        index = probe.link_lookup()  # (/sys shows the namespace it was mounted in)
        probe.close()
        results: dict[str, dict[str, float]] = {}
        for cls in (Ferry, Pyroute2Batch, Pyroute2Async, Pyroute2Sync):
            stack = cls(index)
            try:
                log(f"{cls.name}: bulk")
                stack.routes_add(10)  # warm up (lazy imports, caches)
                stack.routes_del(10)
                figures = bulk(stack, sizes, reps, neighbours)
                if hasattr(stack, "route_replace"):
                    log(f"{cls.name}: singles")
                    figures.update(singles(stack, count))
                results[cls.name] = figures
            finally:
                stack.close()
    finally:
        setns(origin)
        os.close(origin)
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
    bare, with_pr = pyroute2_rss_mb()
    return {"sizes": sizes, "reps": reps, "singles": count, "neighbours": neighbours, "ms": results,
            "rss_mb": {"bare interpreter": bare, "pyroute2 imported, one IPRoute": with_pr}}


def render(res: dict[str, Any]) -> str:
    stacks = list(res["ms"])
    ferry = stacks[0]
    rows = []
    for key in res["ms"][ferry]:
        cells: list[object] = [key]
        for s in stacks:
            v = res["ms"][s].get(key)
            cells.append(v if v is not None else "-")
        best = min((res["ms"][s][key] for s in stacks[1:] if key in res["ms"][s]), default=None)
        cells.append(best / res["ms"][ferry][key] if best else "-")
        rows.append(cells)
    out = [table(["ms (median)", *stacks, "best pyroute2 / ferry"], rows)]
    for n in res["sizes"]:
        budget = n / 1000.0 * 1000.0  # 1 s per 1,000 peers
        for s in stacks:
            ms = res["ms"][s]
            if f"routes {n}: add" in ms:
                # a stack without a dump of its own (IPBatch): pyroute2's best dump
                dump = ms.get(f"routes {n}: dump", min(res["ms"][t].get(f"routes {n}: dump", 1e9) for t in stacks[1:]))
                full = dump + ms[f"routes {n}: add"]
                out.append(f"full pass routes-only, {n} peers (dump + add), {s}: {full:.0f} ms = "
                           f"{100 * full / budget:.0f}% of the {budget / 1000:g} s reconcile budget")
    rss = res["rss_mb"]
    out.append(f"peak RSS: bare interpreter {rss['bare interpreter']:.1f} MB, with pyroute2 and one IPRoute "
               f"{rss['pyroute2 imported, one IPRoute']:.1f} MB (budget 150 MB for all of route-sync)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,5000")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--singles", type=int, default=200)
    ap.add_argument("--neighbours", type=int, default=1000)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        log("needs root (network namespaces)")
        return 2
    res = run([int(s) for s in args.sizes.split(",")], args.reps, args.singles, args.neighbours)
    print(render(res))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
