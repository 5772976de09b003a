"""A tagged underlay segment (``vlan`` in the topology, ``ferry-lab up --vlan 100``): the segment's
switch is an OVS bridge of the lab's own (its own ovsdb-server and ovs-vswitchd in the segment's
namespace, like a Node's), not a Linux bridge: this kernel has no 802.1Q module and its bridge no
VLAN filtering.  The Nodes' ports are trunks carrying only the VLAN (an untagged frame from a Node
is on VLAN 0 there and reaches nobody), the router's port is an access port of the VLAN (the
switch pops the tag towards it and pushes it from it).  So a Node reaches the router and its
peers only when its own OVS tags what it sends (route-sync's ``transportVLAN``).

The plan (the ports and their settings, the ovs-vsctl arguments) is pure; :func:`start` applies it."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from lab import ovs
from lab.layout import NodePaths
from lab.manifest import Manifest
from lab.netplan import SEGMENT_BRIDGE
from lab.topology import Topology, segment_netns

SWITCH_BRIDGE = SEGMENT_BRIDGE
ROUTER_PORT = "router"  # the router's port on every segment (lab.netplan names it so)
# (lab.netplan turns IPv6 off in a tagged segment's namespace: its kernel, holding no address,
# then sends nothing of its own (router solicitations, MLD) out of the switch's ports, so a
# capture there sees only what the switch forwards)


@dataclass(frozen=True)
class SwitchPlan:
    segment: str
    netns: str
    vlan: int
    trunks: tuple[str, ...]  # the Nodes' ports: 802.1Q trunks carrying only ``vlan``
    access: tuple[str, ...]  # the router's port: untagged, in ``vlan``
    # the Nodes' ports start native-untagged (the Kubernetes lab: a kubelet must reach the API
    # server before Ferry's DaemonSet, which tags, runs on its Node; see :func:`trunk_when_tagged`)
    bootstrap: bool = False


def plan(lab: str, topo: Topology) -> list[SwitchPlan]:
    """One switch per segment when the topology has a ``vlan``; none otherwise."""
    if topo.vlan is None:
        return []
    return [SwitchPlan(s.name, segment_netns(lab, s.name), topo.vlan,
                       tuple(n.name for n in topo.nodes if n.segment == s.name), (ROUTER_PORT,),
                       bootstrap=topo.kubernetes is not None)
            for s in topo.segments]


def trunk_settings(vlan: int) -> tuple[str, ...]:
    return ("vlan_mode=trunk", f"trunks={vlan}")


def bootstrap_settings(vlan: int) -> tuple[str, ...]:
    """Untagged frames in and out on ``vlan`` (its native VLAN), tagged ones in too: a Node whose
    kernel cannot tag reaches the VLAN (and the Kubernetes API server) before route-sync runs."""
    return ("vlan_mode=native-untagged", f"tag={vlan}", f"trunks={vlan}")


def access_settings(vlan: int) -> tuple[str, ...]:
    return ("vlan_mode=access", f"tag={vlan}")


def vsctl_args(sp: SwitchPlan) -> list[str]:
    """One ovs-vsctl transaction: the bridge (netdev, standalone: NORMAL switching) and its ports."""
    args = ["--may-exist", "add-br", SWITCH_BRIDGE, "--", "set", "bridge", SWITCH_BRIDGE, "datapath_type=netdev"]
    for port in sp.trunks:
        args += ["--", "--may-exist", "add-port", SWITCH_BRIDGE, port, "--", "set", "port", port,
                 *(bootstrap_settings(sp.vlan) if sp.bootstrap else trunk_settings(sp.vlan))]
    for port in sp.access:
        args += ["--", "--may-exist", "add-port", SWITCH_BRIDGE, port, "--", "set", "port", port,
                 *access_settings(sp.vlan)]
    return args


def paths(lab_directory: str, segment: str) -> NodePaths:
    """The switch's OVS files, under ``<lab>/segments/<segment>/ovs``."""
    return NodePaths(os.path.join(lab_directory, "segments", segment))


def start(sp: SwitchPlan, lab_directory: str, manifest: Manifest) -> None:
    """The switch's OVS instance and bridge (after the segment's veths exist)."""
    p = paths(lab_directory, sp.segment)
    ovs.start(sp.netns, p, manifest)
    ovs.vsctl(p, *vsctl_args(sp))


def set_port(lab_directory: str, segment: str, port: str, *settings: str) -> None:
    """Change one port of a segment's switch (``tag=200``, ``trunks=100,200``...), at runtime."""
    ovs.vsctl(paths(lab_directory, segment), "set", "port", port, *settings)


def uplink_tagged(state_dir: str, vlan: int) -> bool:
    """route-sync has moved the Node's uplink onto its bridge with ``vlan`` (its uplink.json)."""
    import json

    try:
        with open(os.path.join(state_dir, "uplink.json")) as f:
            st = json.load(f)
    except (OSError, ValueError):
        return False
    return st.get("phase") == "moved" and st.get("vlan") == vlan


def trunk_when_tagged(lab_directory: str, plans: list[SwitchPlan], state_dirs: dict[str, str],
                      stop: threading.Event, step: float = 0.02) -> None:
    """The Kubernetes lab's operator: turn each Node's bootstrap port into a strict trunk as soon
    as its route-sync tags (its uplink.json), until every port is one or ``stop`` is set.  Between
    the two the Node misses what the switch sends it untagged (its OVS takes in only tagged frames)."""
    todo = {(sp.segment, port, sp.vlan) for sp in plans if sp.bootstrap for port in sp.trunks}
    while todo and not stop.is_set():
        for seg, port, vlan in sorted(todo):
            if uplink_tagged(state_dirs[port], vlan):
                ovs.vsctl(paths(lab_directory, seg), "set", "port", port, *trunk_settings(vlan),
                          "--", "clear", "port", port, "tag")  # one transaction
                todo.discard((seg, port, vlan))
        stop.wait(step)
