"""The tagged-underlay suites' helpers: their labs (names start with "tv", this area's prefix), a
capture on the segment switch's ports, and a Node's ``ferry.io/transport-vlan`` annotation in the
embedded registry."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Self

import pytest
import yaml

from lab import frr, layout, ovs, segswitch
from lab.api import Lab
from lab.topology import DEFAULT_TOPOLOGY, segment_netns
from routesync.model import VLAN_ANNOTATION
from tests.support.labs import PODS, start_lab, topology
from tests.support.waiting import HANG, until

VLAN = 100
MARK_PAYLOAD = 1111  # the ping that closes a capture (Capture.settle)
_counter = itertools.count()
TOPOLOGIES = os.path.join(os.path.dirname(DEFAULT_TOPOLOGY))


def lab_name() -> str:
    return f"tv{os.getpid() % 100000:x}{next(_counter)}"[:12]


def tagged(doc: dict, vlan: int = VLAN) -> dict:
    return {**doc, "vlan": vlan}


def mode_topology(mode: str) -> dict:
    """The default three-Node lab on VLAN 100 in ``mode``: noEncap, hybrid, fast (noEncap with
    the fast path), bgp (lab/topologies/bgp.yaml: the router learns the Pod CIDRs over BGP), encap
    (Geneve: every peer tunnelled over the tagged network)."""
    if mode == "bgp":
        with open(os.path.join(TOPOLOGIES, "bgp.yaml")) as f:
            return tagged(yaml.safe_load(f))
    rs = {"noEncap": {"trafficEncapMode": "noEncap"}, "hybrid": {"trafficEncapMode": "hybrid", "tunnelType": "vxlan"},
          "fast": {"trafficEncapMode": "noEncap", "fastPath": True},
          "encap": {"trafficEncapMode": "encap", "tunnelType": "geneve"}}[mode]
    return tagged(topology(rs, route_pod_cidrs=mode in ("noEncap", "fast")))


def start(cni_bin: str, doc: dict, pods: tuple[tuple[str, str], ...] = PODS) -> Lab:
    if doc.get("router", {}).get("routePodCIDRs") == "bgp" and not shutil.which(frr.DAEMONS[0], path=frr.FRR_DIR):
        pytest.skip("frr not installed")
    return start_lab(cni_bin, doc, pods, name=lab_name())


# ------------------------------------------------------------------ the Node's annotation

def set_vlan_annotation(lab: Lab, node: str, value: str | None) -> None:
    """Write (None: remove) ``node``'s ``ferry.io/transport-vlan`` in the embedded registry."""
    path = os.path.join(layout.registry_dir(lab.dir), f"{node}.yaml")
    with open(path) as f:
        rec = yaml.safe_load(f)
    ann = dict(rec.get("annotations") or {})
    if value is None:
        ann.pop(VLAN_ANNOTATION, None)
    else:
        ann[VLAN_ANNOTATION] = value
    rec["annotations"] = ann
    layout.write_atomic(path, yaml.safe_dump(rec, sort_keys=False))


def switch_port(lab: Lab, segment: str, port: str, *settings: str) -> None:
    segswitch.set_port(lab.dir, segment, port, *settings)


def uplink_state(lab: Lab, node: str) -> dict | None:
    path = os.path.join(os.path.dirname(lab.node(node).paths.state_file), "uplink.json")
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------ captures

FRAME = re.compile(r"^\S+ (?P<src>[0-9a-f:]{17}) > (?P<dst>[0-9a-f:]{17}), ethertype (?P<type>[^,]+?) \(0x[0-9a-f]+\), "
                   r"length (?P<len>\d+): (?P<rest>.*)$")
VID = re.compile(r"^vlan (\d+), p \d+, ethertype ([^,]+?)(?: \(0x[0-9a-f]+\))?, ")


@dataclass
class Frames:
    """What one port saw: tagged frames per (VID, inner ethertype), untagged ones per ethertype,
    the largest frame, and a sample of the untagged ones."""

    tagged: Counter = field(default_factory=Counter)
    untagged: Counter = field(default_factory=Counter)
    largest: int = 0
    untagged_sample: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.tagged.values()) + sum(self.untagged.values())

    @property
    def vids(self) -> set[int]:
        return {vid for vid, _t in self.tagged}

    def inner_types(self) -> set[str]:
        return {t for _vid, t in self.tagged}


def parse_frames(text: str) -> Frames:
    """``tcpdump -e -nn -r`` lines into :class:`Frames`."""
    out = Frames()
    for line in text.splitlines():
        m = FRAME.match(line)
        if not m:
            continue
        out.largest = max(out.largest, int(m.group("len")))
        if m.group("type") == "802.1Q":
            v = VID.match(m.group("rest"))
            assert v, line
            out.tagged[(int(v.group(1)), v.group(2))] += 1
        else:
            out.untagged[m.group("type")] += 1
            if len(out.untagged_sample) < 5:
                out.untagged_sample.append(line)
    return out


class Capture:
    """tcpdump on ports of segment switches (``{(segment, port), ...}``) from start to :meth:`stop`;
    started once every tcpdump says it listens (its own line on stderr), not after a sleep.
    ``direction`` is tcpdump's ``-Q``: ``in`` keeps what the port's Node sent (the switch receives
    it), ``out`` what the switch sent it (floods of the VLAN included), ``inout`` both."""

    def __init__(self, lab: Lab, ports: list[tuple[str, str]], direction: str = "inout") -> None:
        self.dir = tempfile.mkdtemp(prefix="tv-cap-")
        self.procs: dict[tuple[str, str], subprocess.Popen] = {}
        for seg, port in ports:
            pcap = os.path.join(self.dir, f"{seg}-{port}.pcap")
            p = subprocess.Popen(["ip", "netns", "exec", segment_netns(lab.name, seg), "tcpdump", "-U", "-nn", "-s",
                                  "128", "-Q", direction, "-i", port, "-w", pcap], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
            self.procs[(seg, port)] = p
        for key, p in self.procs.items():
            assert p.stderr is not None
            line = p.stderr.readline()
            assert "listening on" in line, f"tcpdump on {key}: {line}"

    def settle(self, lab: Lab) -> None:
        """Everything sent so far is in the files: each port's Node pings the router once with a
        marker size, and each file is read until it holds the marker (a packet socket hands frames
        over in order; tcpdump stopped before reading them would lose the tail)."""
        for seg, port in self.procs:
            node = lab.node(port)
            family = 4 if node.address(4) else 6
            gw = lab.router.address(family)
            assert gw is not None
            node.exec(["ping", "-n", "-c", "1", "-W", "2", "-s", str(MARK_PAYLOAD), gw])
            pcap = os.path.join(self.dir, f"{seg}-{port}.pcap")
            size = MARK_PAYLOAD + 8 + (20 if family == 4 else 40) + 18  # ICMP, IP, tagged Ethernet

            def marked(pcap: str = pcap, size: int = size) -> bool:
                cp = subprocess.run(["tcpdump", "-nn", "-e", "-r", pcap], capture_output=True, text=True, check=False)
                return f"length {size}:" in cp.stdout
            until(marked, f"the marker in the capture of {seg}/{port}")

    def stop(self) -> dict[tuple[str, str], Frames]:
        out = {}
        for key, p in self.procs.items():
            p.send_signal(signal.SIGINT)
            p.wait(timeout=HANG)
            text = subprocess.run(["tcpdump", "-nn", "-e", "-r", os.path.join(self.dir, f"{key[0]}-{key[1]}.pcap")],
                                  capture_output=True, text=True, check=True).stdout
            out[key] = parse_frames(text)
        shutil.rmtree(self.dir, ignore_errors=True)
        return out

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def trunk_ports(lab: Lab) -> list[tuple[str, str]]:
    """Every Node's port on its segment's switch (what Node-to-Node and Node-to-router frames cross)."""
    return [(n.spec.segment, n.name) for n in lab.nodes]


def flush_neighbours(lab: Lab) -> None:
    """Every Node forgets its neighbours, so the probes after this resolve them again (ARP and ND on
    the wire, inside the capture)."""
    for n in lab.nodes:
        n.exec(["ip", "neigh", "flush", "all"], check=False)
        n.exec(["ip", "-6", "neigh", "flush", "all"], check=False)


def tunnel_next_hops_known(lab: Lab) -> bool:
    """Every Node's OVS knows the MAC of each of its tunnels' next hops (``tnl/neigh/show``): the
    peer on the same segment, the router for the others.  route-sync writes them once the kernel
    resolved them, which on a tagged segment needs the peer to tag already (a lab's Nodes start
    together)."""
    from lab.topology import router_address
    from routesync.apply.tnlneigh import parse_show

    for n in lab.nodes:
        state = n.state() or {}
        want = set()
        for p in state.get("peers", []):
            if p.get("path") != "tunnel":
                continue
            for a in p.get("addresses", []):
                fam = 6 if ":" in a else 4
                peer = lab.node(p["name"])
                router = router_address(lab.topology, n.spec.segment)[fam == 6]
                hop = a if peer.spec.segment == n.spec.segment else router
                want.add(hop)
        if not want:
            continue
        pid = ovs.read_pid(os.path.join(n.paths.ovs, "ovs-vswitchd.pid"))
        cp = n.exec(["ovs-appctl", "-t", os.path.join(n.paths.ovs, f"ovs-vswitchd.{pid}.ctl"), "tnl/neigh/show"])
        if not want <= set(parse_show(cp.stdout, lab.topology.bridge)):
            return False
    return True
