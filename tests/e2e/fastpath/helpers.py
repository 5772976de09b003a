"""What the fast-path tests observe: port counters (OVS and kernel), the peer's flows."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from cni.pipeline.tables import peer_cookie
from lab.api import Lab, Node, Pod
from routesync.model import MAC_ANNOTATION, NodeRecord
from routesync.sources.registry import parse_record, render_record, write_atomic
from tests.e2e.modes.helpers import cookie_dump, flow_lines, settle

_ETH_DST = re.compile(r"(?:set_field:([0-9a-f:]{17})->eth_dst|mod_dl_dst:([0-9a-f:]{17}))")


@dataclass(frozen=True)
class Counters:
    gw_ovs: int  # packets ferry-gw0 carried (OVS port counters, rx + tx)
    uplink_ovs: int  # packets the physical uplink (eth0~) carried
    host_uplink: int  # packets the Node's own stack sent/received on its uplink (internal port eth0)


def kernel_packets(node: Node, dev: str) -> int:
    st = json.loads(node.exec(["ip", "-j", "-s", "link", "show", dev], check=True).stdout)[0]["stats64"]
    return int(st["rx"]["packets"]) + int(st["tx"]["packets"])


def counters(node: Node) -> Counters:
    gw, up = node.ovs_port_stats("ferry-gw0"), node.ovs_port_stats("eth0~")
    return Counters(gw.rx_packets + gw.tx_packets, up.rx_packets + up.tx_packets, kernel_packets(node, "eth0"))


def delta(after: Counters, before: Counters) -> Counters:
    return Counters(after.gw_ovs - before.gw_ovs, after.uplink_ovs - before.uplink_ovs,
                    after.host_uplink - before.host_uplink)


def traffic(lab: Lab, src: Pod, dst: Pod, family: int, nodes: tuple[Node, ...]) -> dict[str, Counters]:
    """Counters of ``nodes`` around 20 pings + a 256 KiB TCP exchange from ``src`` to ``dst``."""
    addr = dst.address(family)
    assert addr
    settle(*nodes)
    before = {n.name: counters(n) for n in nodes}
    ping = lab.ping(src, addr, count=20, interval=0.01, timeout=2)
    assert ping, f"{src.node}/{src.name} -> {addr}: {ping.detail}"
    tcp = lab.tcp(src, addr, size=256 * 1024)
    assert tcp, f"tcp {src.node}/{src.name} -> {addr}: {tcp.detail}"
    assert tcp.peer == src.address(family)  # Pod to Pod: no NAT
    settle(*nodes)
    return {n.name: delta(counters(n), before[n.name]) for n in nodes}


def peer_flow_texts(node: Node, peer: str) -> list[str]:
    return flow_lines(cookie_dump(node, peer_cookie(peer)))


def fast_macs(node: Node, peer: str) -> set[str]:
    """Next-hop MACs of ``node``'s fast-path flows to ``peer`` (empty: gateway path)."""
    out = set()
    for line in peer_flow_texts(node, peer):
        if "output:" in line:  # TX flows (RX ones go to L3Forwarding); OpenFlow13 prints set_field
            m = _ETH_DST.search(line.split("actions=", 1)[1])
            if m:
                out.add(m.group(1) or m.group(2))
    return out


def state_peers(node: Node) -> dict[tuple[str, int], dict]:
    st = node.state() or {}
    return {(p["name"], 6 if ":" in p["podCIDRs"][0] else 4): p for p in st.get("peers", [])}


def registry_path(lab: Lab, node: str) -> str:
    return os.path.join(lab.dir, "registry", f"{node}.yaml")


def read_record(lab: Lab, node: str) -> NodeRecord:
    with open(registry_path(lab, node)) as f:
        return parse_record(f.read(), node)


def write_record_without_mac(lab: Lab, node: str) -> None:
    rec = read_record(lab, node)
    ann = tuple((k, v) for k, v in rec.annotations if k != MAC_ANNOTATION)
    write_atomic(registry_path(lab, node), render_record(NodeRecord(rec.name, rec.transport_addresses,
                                                                    rec.pod_cidrs, ann)))

import itertools

from tests.support.labs import topology

_counter = itertools.count()


PODS = (("node-1", "a"), ("node-2", "a"), ("node-3", "a"))


def lab_name() -> str:
    return f"tf{os.getpid() % 100000:x}{next(_counter)}"[:12]


RESYNC = 600  # s: far beyond any wait's deadline (tests.support.waiting.HANG), so what a test sees follow


def fast_topology(mode: str, mac_source: str, **extra: object) -> dict:
    """The default three Nodes, route-sync with the fast path; the router routes Pod CIDRs."""
    rs = {"trafficEncapMode": mode, "fastPath": True, "macSource": mac_source, "resyncSeconds": RESYNC, **extra}
    return topology(rs, route_pod_cidrs=True)


def settled(node: Node, peers: list[str]) -> bool:
    st = node.state() or {}
    paths = {(p["name"], ":" in p["podCIDRs"][0]): p.get("path") for p in st.get("peers", [])}
    return all(paths.get((peer, v6)) in ("fast", "tunnel") for peer in peers for v6 in (False, True))
