"""Latency of the lean system layer vs pyroute2 / ovsdbapp / ovs-vsctl (imports excluded).

    sudo .venv/bin/python -m tests.cni.bench_system [N]

Prints min/median ms per operation.  Not collected by pytest (file name).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from cni.kernel.netlink import Netlink
from cni.kernel.netns import open_netns
from cni.ovs.openflow.bridge import OpenFlow
from cni.ovs.ovsdb import Ovsdb
from cni.pipeline import match as m
from cni.pipeline.actions import output
from cni.pipeline.tables import Flow, Table, pod_cookie
from tests.support.ovs_instance import OvsInstance, netns


def timed(label: str, n: int, setup: Callable[[int], None], op: Callable[[int], None],
          teardown: Callable[[int], None]) -> None:
    samples = []
    for i in range(n):
        setup(i)
        t = time.perf_counter()
        op(i)
        samples.append((time.perf_counter() - t) * 1000)
        teardown(i)
    print(f"{label:55s} min {min(samples):7.2f}  median {statistics.median(samples):7.2f} ms")


def nothing(_i: int) -> None:
    pass


def main(n: int) -> None:
    from pyroute2 import IPRoute

    with netns("fs-bench-node") as node, netns("fs-bench-pod") as pod, OvsInstance("fs-bench", netns=node) as ovs:
        nodep, podp = f"/run/netns/{node}", f"/run/netns/{pod}"
        fd = open_netns(podp)
        nl = Netlink.in_netns(nodep)
        from pyroute2 import NetNS
        pr = NetNS(node)
        timed("veth create (peer in netns): lean", n, nothing,
              lambda i: nl.create_veth(f"fs-b{i}", f"e{i}", fd, 1500), lambda i: nl.link_del(f"fs-b{i}"))
        timed("veth create (peer in netns): pyroute2", n, nothing,
              lambda i: pr.link("add", ifname=f"fs-b{i}", kind="veth", peer={"ifname": f"e{i}", "net_ns_fd": podp}),
              lambda i: nl.link_del(f"fs-b{i}"))
        timed("veth delete: lean", n, lambda i: nl.create_veth(f"fs-b{i}", f"e{i}", fd, 1500),
              lambda i: nl.link_del(f"fs-b{i}"), nothing)
        nl.create_veth("fs-bx", "ex", fd, 1500)
        idx = nl.link_index("fs-bx")
        assert idx
        timed("link_get by name: lean", n, nothing, lambda i: nl.link_get("fs-bx"), nothing)
        timed("link_get by name: pyroute2", n, nothing, lambda i: pr.link("get", ifname="fs-bx"), nothing)
        timed("addr_add v4: lean", n, nothing, lambda i: nl.addr_add(idx, "10.5.0.1/24"),
              lambda i: nl.addr_del(idx, "10.5.0.1/24"))
        timed("addr_add v4: pyroute2", n, nothing, lambda i: pr.addr("add", index=idx, address="10.5.0.1", prefixlen=24),
              lambda i: nl.addr_del(idx, "10.5.0.1/24"))
        nl.link_set(idx, up=True)
        nl.addr_add(idx, "10.5.0.1/24")
        timed("route_add: lean", n, nothing, lambda i: nl.route_add("10.6.0.0/16", "10.5.0.254", idx),
              lambda i: nl.route_del("10.6.0.0/16"))
        timed("route_add: pyroute2", n, nothing,
              lambda i: pr.route("add", dst="10.6.0.0/16", gateway="10.5.0.254", oif=idx),
              lambda i: nl.route_del("10.6.0.0/16"))
        pr.close()
        with IPRoute():
            pass

        db = Ovsdb(ovs.db)
        db.ensure_bridge("br-b", "netdev")
        for i in range(n):
            nl.create_veth(f"fs-p{i}", f"q{i}", fd, 1500)
        ext = {"ferry-owner": "pod", "ferry-container-id": "x" * 64, "ferry-ifname": "eth0"}
        timed("add_port incl. ofport wait: lean OVSDB", n, nothing, lambda i: db.add_port("br-b", f"fs-p{i}", ext),
              lambda i: db.del_port("br-b", f"fs-p{i}"))
        timed("del_port: lean OVSDB", n, lambda i: db.add_port("br-b", f"fs-p{i}", ext),
              lambda i: db.del_port("br-b", f"fs-p{i}"), nothing)
        timed("port(name): lean OVSDB", n, nothing, lambda i: db.port("br-b"), nothing)
        timed("add_port: ovs-vsctl (waits for vswitchd)", n, nothing,
              lambda i: ovs.vsctl("add-port", "br-b", f"fs-p{i}", "--", "set", "port", f"fs-p{i}",
                                  "external_ids:ferry-owner=pod", "--", "set", "interface", f"fs-p{i}",
                                  "external_ids:ferry-owner=pod"),
              lambda i: db.del_port("br-b", f"fs-p{i}"))
        from ovsdbapp.backend.ovs_idl import connection
        from ovsdbapp.schema.open_vswitch import impl_idl
        t = time.perf_counter()
        conn = connection.Connection(idl=connection.OvsdbIdl.from_server(ovs.db, "Open_vSwitch"), timeout=10)
        api = impl_idl.OvsdbIdl(conn)
        print(f"{'ovsdbapp connect + schema + IDL sync':55s} once    {(time.perf_counter() - t) * 1000:7.2f} ms")

        def ovsdbapp_add(i: int) -> None:
            with api.transaction(check_error=True) as txn:
                txn.add(api.add_port("br-b", f"fs-p{i}"))
                txn.add(api.db_set("Port", f"fs-p{i}", ("external_ids", ext)))
                txn.add(api.db_set("Interface", f"fs-p{i}", ("external_ids", ext)))
        timed("add_port (no ofport wait): ovsdbapp", n, nothing, ovsdbapp_add, lambda i: db.del_port("br-b", f"fs-p{i}"))
        conn.stop()

        of = OpenFlow("br-b", ovs.run_dir)
        flows = [Flow(Table.L2_FORWARDING, 100, (m.ETH_DST(f"02:00:00:00:00:{j:02x}"),), (output(j + 1),),
                      pod_cookie("c", "eth0")) for j in range(5)]
        c = pod_cookie("c", "eth0")
        timed("add_flows 5 flows: native", n, nothing, lambda i: of.add_flows(flows), lambda i: of.del_flows(c))
        timed("del_flows by cookie: native", n, lambda i: of.add_flows(flows), lambda i: of.del_flows(c), nothing)
        timed("replace_flows 5 flows, one bundle: native", n, nothing, lambda i: of.replace_flows(c, flows), nothing)
        timed("replace_flows 5 flows no bundle: native", n, nothing,
              lambda i: of.replace_flows(c, flows, atomic=False), nothing)
        timed("dump_flows by cookie: ovs-ofctl", n, nothing, lambda i: of.dump_flows(c), nothing)
        nl.close()
        os.close(fd)
    for mod in ("cni.kernel.netlink, cni.ovs.ovsdb, cni.ovs.openflow.bridge, cni.kernel.netns, cni.kernel.ethtool, cni.kernel.announce", "pyroute2",
                "ovsdbapp.backend.ovs_idl.connection, ovsdbapp.schema.open_vswitch.impl_idl"):
        best = min(_import_ms(mod) for _ in range(5))
        print(f"{'import ' + mod[:47]:55s} min {best:7.2f} ms (fresh interpreter, -X importtime sum)")


def _import_ms(mod: str) -> float:
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {mod}"], capture_output=True,
                         text=True, check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    total = 0
    for line in out.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[2].startswith(" ") and not parts[2].startswith("  "):
            try:
                total += int(parts[1])  # cumulative of top-level imports
            except ValueError:
                pass
    return total / 1000


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
