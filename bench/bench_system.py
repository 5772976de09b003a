"""Latency of the plugin's lean system layer (``cni.kernel.netlink``, ``cni.ovs.ovsdb``,
``cni.ovs.openflow``) against pyroute2, ovsdbapp and ovs-vsctl, imports excluded; then what each
stack costs to import.

    python -m bench.bench_system [--n 20] [--json OUT]

Needs root: two throwaway namespaces (``<tag>-node``, ``<tag>-pod``) and a private OVS instance
in the first.  Each operation runs ``--n`` times (set up and torn down around each timing);
prints and records min and median ms per operation and implementation, and the import cost of
each stack (the sum of ``-X importtime``'s top-level imports in a fresh interpreter, best of 5)."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.util import table
from cni.kernel.netlink import Netlink
from cni.kernel.netns import open_netns
from cni.ovs.openflow.bridge import OpenFlow
from cni.ovs.ovsdb import Ovsdb
from cni.pipeline import match as m
from cni.pipeline.actions import output
from cni.pipeline.tables import (
    EXT_CONTAINER_ID,
    EXT_IFNAME,
    EXT_OWNER,
    OWNER_POD,
    Flow,
    L2Forwarding,
    Table,
    pod_cookie,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPORTS = {
    "ferry": "cni.kernel.netlink, cni.ovs.ovsdb, cni.ovs.openflow.bridge, cni.kernel.netns, cni.kernel.ethtool, "
             "cni.kernel.announce",
    "pyroute2": "pyroute2",
    "ovsdbapp": "ovsdbapp.backend.ovs_idl.connection, ovsdbapp.schema.open_vswitch.impl_idl",
}


class Timings:
    """Rows of (operation, implementation, n, min ms, median ms), printed as they come."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.rows: list[dict[str, Any]] = []

    def timed(self, label: str, setup: Callable[[int], None], op: Callable[[int], None],
              teardown: Callable[[int], None]) -> None:
        samples = []
        for i in range(self.n):
            setup(i)
            t = time.perf_counter()
            op(i)
            samples.append((time.perf_counter() - t) * 1000)
            teardown(i)
        operation, implementation = label.rsplit(": ", 1)
        self.rows.append({"operation": operation, "implementation": implementation, "n": self.n,
                          "min_ms": min(samples), "median_ms": statistics.median(samples)})
        print(f"{label:55s} min {min(samples):7.2f}  median {statistics.median(samples):7.2f} ms", flush=True)


def nothing(_i: int) -> None:
    pass


def measure(n: int, tag: str) -> dict[str, Any]:
    from pyroute2 import IPRoute

    from tests.support.ovs_instance import OvsInstance, netns

    t = Timings(n)
    timed = t.timed
    with netns(f"{tag}-node") as node, netns(f"{tag}-pod") as pod, OvsInstance(tag, netns=node) as ovs:
        nodep, podp = f"/run/netns/{node}", f"/run/netns/{pod}"
        fd = open_netns(podp)
        nl = Netlink.in_netns(nodep)
        from pyroute2 import NetNS
        pr = NetNS(node)
        timed("veth create (peer in netns): lean", nothing,
              lambda i: nl.create_veth(f"fs-b{i}", f"e{i}", fd, 1500), lambda i: nl.link_del(f"fs-b{i}"))
        timed("veth create (peer in netns): pyroute2", nothing,
              lambda i: pr.link("add", ifname=f"fs-b{i}", kind="veth", peer={"ifname": f"e{i}", "net_ns_fd": podp}),
              lambda i: nl.link_del(f"fs-b{i}"))
        timed("veth delete: lean", lambda i: nl.create_veth(f"fs-b{i}", f"e{i}", fd, 1500),
              lambda i: nl.link_del(f"fs-b{i}"), nothing)
        nl.create_veth("fs-bx", "ex", fd, 1500)
        idx = nl.link_index("fs-bx")
        assert idx
        timed("link_get by name: lean", nothing, lambda i: nl.link_get("fs-bx"), nothing)
        timed("link_get by name: pyroute2", nothing, lambda i: pr.link("get", ifname="fs-bx"), nothing)
        timed("addr_add v4: lean", nothing, lambda i: nl.addr_add(idx, "10.5.0.1/24"),
              lambda i: nl.addr_del(idx, "10.5.0.1/24"))
        timed("addr_add v4: pyroute2", nothing, lambda i: pr.addr("add", index=idx, address="10.5.0.1", prefixlen=24),
              lambda i: nl.addr_del(idx, "10.5.0.1/24"))
        nl.link_set(idx, up=True)
        nl.addr_add(idx, "10.5.0.1/24")
        timed("route_add: lean", nothing, lambda i: nl.route_add("10.6.0.0/16", "10.5.0.254", idx),
              lambda i: nl.route_del("10.6.0.0/16"))
        timed("route_add: pyroute2", nothing,
              lambda i: pr.route("add", dst="10.6.0.0/16", gateway="10.5.0.254", oif=idx),
              lambda i: nl.route_del("10.6.0.0/16"))
        pr.close()
        with IPRoute():
            pass

        db = Ovsdb(ovs.db)
        db.ensure_bridge("br-b", "netdev")
        for i in range(n):
            nl.create_veth(f"fs-p{i}", f"q{i}", fd, 1500)
        ext = {EXT_OWNER: OWNER_POD, EXT_CONTAINER_ID: "x" * 64, EXT_IFNAME: "eth0"}
        timed("add_port incl. ofport wait: lean OVSDB", nothing, lambda i: db.add_port("br-b", f"fs-p{i}", ext),
              lambda i: db.del_port("br-b", f"fs-p{i}"))
        timed("del_port: lean OVSDB", lambda i: db.add_port("br-b", f"fs-p{i}", ext),
              lambda i: db.del_port("br-b", f"fs-p{i}"), nothing)
        timed("port(name): lean OVSDB", nothing, lambda i: db.port("br-b"), nothing)
        timed("add_port: ovs-vsctl (waits for vswitchd)", nothing,
              lambda i: ovs.vsctl("add-port", "br-b", f"fs-p{i}", "--", "set", "port", f"fs-p{i}",
                                  f"external_ids:{EXT_OWNER}={OWNER_POD}", "--", "set", "interface", f"fs-p{i}",
                                  f"external_ids:{EXT_OWNER}={OWNER_POD}"),
              lambda i: db.del_port("br-b", f"fs-p{i}"))
        from ovsdbapp.backend.ovs_idl import connection
        from ovsdbapp.schema.open_vswitch import impl_idl
        t0 = time.perf_counter()
        conn = connection.Connection(idl=connection.OvsdbIdl.from_server(ovs.db, "Open_vSwitch"), timeout=10)
        api = impl_idl.OvsdbIdl(conn)
        connect_ms = (time.perf_counter() - t0) * 1000
        print(f"{'ovsdbapp connect + schema + IDL sync':55s} once    {connect_ms:7.2f} ms")

        def ovsdbapp_add(i: int) -> None:
            with api.transaction(check_error=True) as txn:
                txn.add(api.add_port("br-b", f"fs-p{i}"))
                txn.add(api.db_set("Port", f"fs-p{i}", ("external_ids", ext)))
                txn.add(api.db_set("Interface", f"fs-p{i}", ("external_ids", ext)))
        timed("add_port (no ofport wait): ovsdbapp", nothing, ovsdbapp_add, lambda i: db.del_port("br-b", f"fs-p{i}"))
        conn.stop()

        of = OpenFlow("br-b", ovs.run_dir)
        flows = [Flow(Table.L2_FORWARDING, L2Forwarding.POD, (m.ETH_DST(f"02:00:00:00:00:{j:02x}"),), (output(j + 1),),
                      pod_cookie("c", "eth0")) for j in range(5)]
        c = pod_cookie("c", "eth0")
        timed("add_flows 5 flows: native", nothing, lambda i: of.add_flows(flows), lambda i: of.del_flows(c))
        timed("del_flows by cookie: native", lambda i: of.add_flows(flows), lambda i: of.del_flows(c), nothing)
        timed("replace_flows 5 flows, one bundle: native", nothing, lambda i: of.replace_flows(c, flows), nothing)
        timed("replace_flows 5 flows no bundle: native", nothing,
              lambda i: of.replace_flows(c, flows, atomic=False), nothing)
        timed("dump_flows by cookie: ovs-ofctl", nothing, lambda i: of.dump_flows(c), nothing)
        nl.close()
        os.close(fd)
    imports = {}
    for stack, mod in IMPORTS.items():
        imports[stack] = min(_import_ms(mod) for _ in range(5))
        print(f"{'import ' + mod[:47]:55s} min {imports[stack]:7.2f} ms (fresh interpreter, -X importtime sum)")
    return {"n": n, "operations": t.rows, "ovsdbapp_connect_ms": connect_ms, "import_ms": imports}


def _import_ms(mod: str) -> float:
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {mod}"], capture_output=True,
                         text=True, check=True, cwd=ROOT)
    total = 0
    for line in out.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[2].startswith(" ") and not parts[2].startswith("  "):
            try:
                total += int(parts[1])  # cumulative of top-level imports
            except ValueError:
                pass
    return total / 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20, help="timings per operation")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_system needs root (namespaces, OVS)", file=sys.stderr)
        return 2
    out = measure(args.n, f"fbs{secrets.token_hex(2)}")
    print(table(["operation", "implementation", "min ms", "median ms"],
                [[r["operation"], r["implementation"], r["min_ms"], r["median_ms"]] for r in out["operations"]]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
