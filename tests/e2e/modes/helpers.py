"""What the e2e tests observe on a running lab: flow counters by cookie, routes, probes.

Pure helpers plus thin readers of a lab Node (``ovs-ofctl dump-flows``, ``ip route``)."""

from __future__ import annotations

import ipaddress
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cni.pipeline.tables import NODE_COOKIE, Cookie, Owner, peer_cookie
from lab.api import Lab, Node, Pod

_PKTS = re.compile(r"n_packets=(\d+)")


def packets(dump: str) -> int:
    """Sum of ``n_packets`` over the flows of a ``dump-flows`` output."""
    return sum(int(m) for m in _PKTS.findall(dump))


def flow_lines(dump: str) -> list[str]:
    return [line for line in dump.splitlines() if "cookie=" in line]


def dump_flows(node: Node, *match: str) -> str:
    """``ovs-ofctl -O OpenFlow13 dump-flows`` (set_field/tun_dst syntax, as route-sync writes)."""
    target = f"unix:{os.path.join(node.paths.ovs, node.lab.topology.bridge)}.mgmt"
    return node.exec(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", target, *match], check=True).stdout


def cookie_dump(node: Node, cookie: Cookie) -> str:
    return dump_flows(node, f"cookie={cookie.match()}")


def peer_packets(node: Node, peer: str) -> int:
    """Packets ``node`` sent into the tunnel towards ``peer`` (its PEER cookie's flows)."""
    return packets(cookie_dump(node, peer_cookie(peer)))


def tunnel_in_packets(node: Node) -> int:
    """Packets ``node`` received from its tunnel port (the NODE classifier flow)."""
    return packets(cookie_dump(node, NODE_COOKIE))


def owner_flow_count(node: Node, owner: Owner) -> int:
    return len(flow_lines(dump_flows(node, f"cookie={Cookie.owner_match(owner)}")))


def ferry_routes(node: Node) -> list[str]:
    """route-sync's routes (proto 102), both families, as ``ip route`` prints them."""
    out = []
    for fam in ("-4", "-6"):
        cp = node.exec(["ip", fam, "route", "show", "proto", "102"], check=True)
        out += [line.strip() for line in cp.stdout.splitlines() if line.strip()]
    return sorted(out)


@dataclass(frozen=True)
class PathSample:
    """Counters around one probe: tunnel-out on the source Node, tunnel-in on the destination."""

    out_delta: int
    in_delta: int


def settle(*nodes: Node) -> None:
    """OpenFlow counters are pushed from the datapath by revalidator threads (up to ~1 s late):
    wait until each Node's revalidators finished a full pass."""
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        list(pool.map(lambda n: n.exec(["ovs-appctl", "revalidator/wait"], check=True), nodes))


def measure(lab: Lab, src: Pod, dst_node: str, probe: Callable[[], object]) -> PathSample:
    s, d = lab.node(src.node), lab.node(dst_node)
    settle(s, d)
    out0, in0 = peer_packets(s, dst_node), tunnel_in_packets(d)
    probe()
    settle(s, d)
    return PathSample(peer_packets(s, dst_node) - out0, tunnel_in_packets(d) - in0)


def tunnel_neighbours(lab: Lab, node: str) -> set[tuple[str, str]]:
    """OVS's tunnel neighbour cache on ``node`` (ip, mac) for underlay addresses: what its userspace
    tunnels need to send, which an ovs-vswitchd restart empties and route-sync refills after the
    flows (entries OVS snooped from Pods' ARP are left out: nothing refills them)."""
    from routesync.apply.tnlneigh import parse_show

    out = lab.node(node).exec(["ovs-appctl", "tnl/neigh/show"], check=True).stdout
    pods = [ipaddress.ip_network(c) for c in lab.topology.cluster_cidrs]
    return {(ip, mac) for ip, mac in parse_show(out, lab.topology.bridge).items()
            if not any(ipaddress.ip_address(ip) in c for c in pods)}


def wait_for(cond: Callable[[], bool], timeout: float, step: float = 0.005) -> float:
    """Seconds until ``cond()`` held; raises AssertionError after ``timeout``."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(step)
    return time.monotonic() - t0
