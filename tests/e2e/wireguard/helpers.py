"""What the WireGuard suites share (issue 30): ``lab/topologies/wireguard.yaml`` in each traffic
mode, encrypted or not; whether this machine can run an encrypted lab; when a lab has settled;
DF probes that tell a black hole from a refusal.  Lab names start with "tw" (this area's prefix).

The modes: encap (VXLAN, Geneve, GRE), noEncap, hybrid, noEncap with the fast path, noEncap with
the router learning the Pod CIDRs over BGP; node-1 and node-2 share segment a, node-3 is behind
the router on segment b."""

from __future__ import annotations

import copy
import importlib.util
import ipaddress
import itertools
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import yaml

from cni.pipeline.modes import ENCRYPTION_NONE, ENCRYPTION_WIREGUARD, PATH_WIREGUARD
from lab import build, frr, layout, overrides, tools
from lab.api import Lab
from lab.topology import DEFAULT_TOPOLOGY
from routesync.config import WireGuardConfig
from routesync.wireguard.model import PUBLIC_KEY_ANNOTATION
from routesync.wireguard.uapi import Uapi
from tests.e2e.bgp.helpers import all_learned
from tests.e2e.fastpath.helpers import settled as fast_settled
from tests.e2e.wireguard.diagnose import Pair, diagnose
from tests.support.labs import PODS, can_run, start_lab
from tests.support.waiting import until

WG_TOPOLOGY = os.path.join(os.path.dirname(DEFAULT_TOPOLOGY), "wireguard.yaml")
# the core route-sync needs to encrypt (the lead's, issue 30): until it is there nothing encrypts
CORE_MODULE = "routesync.wireguard.device"
_counter = itertools.count()


def lab_name() -> str:
    return f"tw{os.getpid() % 100000:x}{next(_counter)}"[:12]


@dataclass(frozen=True)
class Mode:
    name: str
    flags: overrides.Overrides  # the mode flags, as ``ferry-lab up`` takes them
    bgp: bool = False  # the router learns the Pod CIDRs over BGP (router.routePodCIDRs: bgp)
    clear_inside: frozenset[str | None] = frozenset()  # unencrypted: where Pod addresses are seen

    @property
    def fast_path(self) -> bool:
        return self.flags.fast_path


MODES = (
    Mode("encap-vxlan", overrides.Overrides(mode="encap", tunnel="vxlan"), clear_inside=frozenset({"vxlan"})),
    Mode("encap-geneve", overrides.Overrides(mode="encap", tunnel="geneve"), clear_inside=frozenset({"geneve"})),
    Mode("encap-gre", overrides.Overrides(mode="encap", tunnel="gre"), clear_inside=frozenset({"gre"})),
    Mode("noEncap", overrides.Overrides(mode="noEncap"), clear_inside=frozenset({None})),
    # routed on segment a (node-1 <-> node-2), tunnelled across the router
    Mode("hybrid", overrides.Overrides(mode="hybrid", tunnel="vxlan"), clear_inside=frozenset({None, "vxlan"})),
    Mode("noEncap-fastPath", overrides.Overrides(mode="noEncap", fast_path=True), clear_inside=frozenset({None})),
    Mode("noEncap-bgp", overrides.Overrides(mode="noEncap"), bgp=True, clear_inside=frozenset({None})),
)


def mode(name: str) -> Mode:
    return next(m for m in MODES if m.name == name)


def mode_doc(m: Mode, encryption: str, family: str | None = None) -> dict:
    """wireguard.yaml in mode ``m``, ``encryption`` on or off (``family``: ``--family``'s)."""
    with open(WG_TOPOLOGY) as f:
        doc = copy.deepcopy(yaml.safe_load(f))
    if m.bgp:  # before the mode flags: noEncap keeps a router that speaks BGP
        doc["router"] = {"routePodCIDRs": "bgp", "bgp": {"holdTime": 3}}
    flags = overrides.Overrides(m.flags.mode, m.flags.tunnel, m.flags.fast_path, family, encryption=encryption)
    return overrides.apply(doc, flags)


def prerequisites(encryption: str, m: Mode | None = None) -> str | None:
    """Why this machine cannot run such a lab (a skip reason), or None."""
    reason = can_run()
    if reason:
        return reason
    if m is not None and m.bgp and not shutil.which(frr.DAEMONS[0], path=frr.FRR_DIR):
        return "frr not installed"
    if encryption == ENCRYPTION_NONE:
        return None
    wg = tools.wireguard_go()
    if not os.access(wg, os.X_OK) and not os.path.isdir(build.KERNEL_WIREGUARD):
        return (f"no userspace WireGuard at {wg} (bash tools/build-go-tools.sh wireguard-go, or "
                f"${tools.WIREGUARD_GO_ENV})")
    if importlib.util.find_spec(CORE_MODULE) is None:
        return f"route-sync does not encrypt yet ({CORE_MODULE} is not there: issue 30's core)"
    return None


def start(cni_bin: str, m: Mode, encryption: str, pods: tuple[tuple[str, str], ...] = PODS,
          family: str | None = None) -> Lab:
    reason = prerequisites(encryption, m)
    if reason:
        pytest.skip(reason)
    return start_lab(cni_bin, mode_doc(m, encryption, family), pods, name=lab_name())


# ------------------------------------------------------------------ settled

def published_keys(lab: Lab) -> dict[str, str | None]:
    """Each Node's public key as its registry record publishes it (None: not yet)."""
    out = {}
    for n in lab.nodes:
        with open(os.path.join(layout.registry_dir(lab.dir), f"{n.name}.yaml")) as f:
            rec = yaml.safe_load(f) or {}
        out[n.name] = (rec.get("annotations") or {}).get(PUBLIC_KEY_ANNOTATION)
    return out


def wireguard_to_every_peer(lab: Lab) -> bool:
    """Every Node's state file sends every other Node's Pod CIDRs, both families, through WireGuard."""
    for n in lab.nodes:
        st = n.state() or {}
        paths = {(p["name"], c): p.get("path") for p in st.get("peers", []) for c in p.get("podCIDRs", [])}
        want = {(m.name, c) for m in lab.nodes if m.name != n.name for c in m.spec.pod_cidrs}
        if st.get("encryption") != ENCRYPTION_WIREGUARD or any(paths.get(k) != PATH_WIREGUARD for k in want):
            return False
    return True


def _every_device_has(lab: Lab, handshaken: bool) -> bool:
    """Every Node's WireGuard device (read over its UAPI socket) has every other Node's published
    public key as a peer (``handshaken``: one it made a handshake with)."""
    keys = published_keys(lab)
    for n in lab.nodes:
        try:
            state = Uapi(n.paths.wireguard_run).read(WireGuardConfig().interface)
        except (LookupError, OSError):
            return False
        want = {k for m, k in keys.items() if m != n.name}
        if None in want or not want <= {p.public_key for p in state.peers if not handshaken or p.last_handshake > 0}:
            return False
    return True


def devices_hold_every_peer(lab: Lab) -> bool:
    """Every Node's WireGuard device has every other Node's published public key as a peer."""
    return _every_device_has(lab, handshaken=False)


def sessions_up(lab: Lab) -> bool:
    """Every Node's WireGuard device has made a handshake with every other Node's published key."""
    return _every_device_has(lab, handshaken=True)


def warm_sessions(lab: Lab) -> None:
    """A WireGuard session between every two Nodes, made by a Pod's ping in each direction: with
    no persistent keepalive the first packet to a peer waits for a handshake, whose time is the
    machine's (two userspace wireguard-go processes, under load a second and more), and a probe
    with its own timeout must not race it."""
    firsts = {n.name: pods[0] for n in lab.nodes if (pods := n.pods())}

    def poke() -> bool:
        for a, pa in firsts.items():
            for b, pb in firsts.items():
                dst = pb.ipv4 or pb.ipv6
                if a != b and dst:
                    lab.ping(pa, dst, timeout=1.0)  # the answer does not matter: the handshake does
        return sessions_up(lab)

    until(poke, "a WireGuard session between every two Nodes")


def settle_encrypted(lab: Lab) -> None:
    """Every peer published its key, every state file sends every peer through WireGuard, every
    device holds every peer, and every two Nodes have a session (:func:`warm_sessions`).  Not
    settled: the AssertionError carries the lab's state (:func:`.diagnose.diagnose`)."""
    try:
        until(lambda: all(published_keys(lab).values()), "every Node's public key in the registry")
        until(lambda: wireguard_to_every_peer(lab), "every Node's state file: every peer through WireGuard")
        until(lambda: devices_hold_every_peer(lab), "every Node's WireGuard device: every peer's key")
        warm_sessions(lab)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{diagnose(lab, what='not settled')}") from None


def settle_clear(lab: Lab, m: Mode) -> None:
    """An unencrypted lab's paths as the mode gives them: the router learnt the Pod CIDRs (BGP),
    every Node off the fast path's gateway fallback."""
    if m.bgp:
        until(lambda: all_learned(lab), "the router's BGP routes to every Pod CIDR")
    if m.fast_path:
        until(lambda: all(fast_settled(n, [p.name for p in lab.nodes if p.name != n.name]) for n in lab.nodes),
              "every Node off the gateway fallback to every peer")


# ------------------------------------------------------------------ DF probes

DF_HEADERS = {4: 28, 6: 48}  # IP + ICMP echo header
LOCAL = re.compile(r"message too long, mtu[=:] ?(\d+)")
RETURNED = re.compile(r"Frag needed and DF set \(mtu = (\d+)\)|Packet too big: mtu=(\d+)")


@dataclass(frozen=True)
class Df:
    """One DF ping's outcome: crossed (answered), refused (the sender knew its route's MTU: ping's
    local EMSGSIZE), returned (an ICMP "fragmentation needed" / "packet too big" came back), or
    lost: a black hole (no answer, no error)."""

    outcome: str  # crossed | refused | returned | lost
    mtu: int | None = None  # refused / returned: the MTU the error named
    output: str = ""

    @property
    def black_hole(self) -> bool:
        return self.outcome == "lost"


def classify(rc: int, output: str) -> Df:
    if rc == 0:
        return Df("crossed", output=output)
    m = LOCAL.search(output)
    if m:
        return Df("refused", int(m.group(1)), output)
    m = RETURNED.search(output)
    if m:
        return Df("returned", int(m.group(1) or m.group(2)), output)
    return Df("lost", output=output)


def df_ping(netns: str, dst: str, size: int) -> Df:
    """``size`` bytes of IP packet to ``dst`` with DF set, twice (a returned error's MTU applies to
    the second)."""
    family = 6 if ":" in dst else 4
    cp = subprocess.run(["ip", "netns", "exec", netns, "ping", f"-{family}", "-n", "-c", "2", "-i", "0.1", "-W", "2",
                         "-M", "do", "-s", str(size - DF_HEADERS[family]), dst],
                        capture_output=True, text=True, check=False, timeout=30)
    return classify(cp.returncode, cp.stdout + cp.stderr)


def route_mtu(netns: str, dst: str) -> int | None:
    """The MTU of the route ``netns`` takes to ``dst`` (None: the route names none: the device's)."""
    cp = subprocess.run(["ip", "netns", "exec", netns, "ip", "route", "get", dst], capture_output=True, text=True,
                        check=True)
    m = re.search(r" mtu (\d+)", cp.stdout)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class DfPath:
    label: str  # "node-1/a -> node-3/a"
    kind: str  # pod-pod-same-node | pod-pod-remote | pod-node | pod-external | node-pod
    netns: str
    dst: str


def df_paths(lab: Lab, kinds: tuple[str, ...] | None = None) -> list[DfPath]:
    """Every path of the lab, each family: a Pod to a Pod on its Node and on every other Node, a
    Pod to every other Node and to the external host, a Node to the Pods of every other Node."""
    out: list[DfPath] = []
    pods = {n.name: n.pods() for n in lab.nodes}
    for n in lab.nodes:
        for src in pods[n.name][:1]:
            for fam in (4, 6):
                a = src.address(fam)
                if a is None:
                    continue
                for b in pods[n.name][1:2]:
                    out.append(DfPath(f"{src.node}/{src.name} -> {b.node}/{b.name}", "pod-pod-same-node", src.netns,
                                      b.address(fam) or ""))
                for m in lab.nodes:
                    if m.name == n.name:
                        continue
                    for b in pods[m.name][:1]:
                        out.append(DfPath(f"{src.node}/{src.name} -> {b.node}/{b.name}", "pod-pod-remote",
                                          src.netns, b.address(fam) or ""))
                    if m.address(fam):
                        out.append(DfPath(f"{src.node}/{src.name} -> {m.name}", "pod-node", src.netns,
                                          m.address(fam) or ""))
                        for b in pods[m.name][:1]:
                            out.append(DfPath(f"{n.name} -> {b.node}/{b.name}", "node-pod", n.netns,
                                              b.address(fam) or ""))
                if lab.external.address(fam):
                    out.append(DfPath(f"{src.node}/{src.name} -> external", "pod-external", src.netns,
                                      lab.external.address(fam) or ""))
    out = [p for p in out if p.dst]
    return [p for p in out if kinds is None or p.kind in kinds]


@dataclass(frozen=True)
class DfRow:
    path: DfPath
    full: Df  # the 1500-byte probe
    at_mtu: Df | None  # at the MTU the full one was refused or returned with (None: it crossed)


def probe_paths(paths: list[DfPath], size: int = 1500) -> list[DfRow]:
    """Each path: a ``size``-byte DF ping, and when it did not cross, one at the MTU it was told."""

    def one(p: DfPath) -> DfRow:
        full = df_ping(p.netns, p.dst, size)
        return DfRow(p, full, df_ping(p.netns, p.dst, full.mtu) if full.mtu else None)

    with ThreadPoolExecutor(max_workers=6) as pool:
        return list(pool.map(one, paths))


def df_failure_pairs(rows: list[DfRow]) -> list[Pair]:
    """The DF rows :func:`df_failures` names, as pairs for :func:`.diagnose.diagnose` to probe again."""
    bad = [r for r in rows if r.full.black_hole or (r.at_mtu is not None and r.at_mtu.outcome != "crossed")]
    return [Pair(src, dst, r.path.dst) for r in bad for src, _, dst in [r.path.label.partition(" -> ")]]


def df_failures(rows: list[DfRow]) -> list[str]:
    """The rows that black-holed, or whose probe at the MTU they were told did not cross."""
    bad = []
    for r in rows:
        if r.full.black_hole:
            bad.append(f"{r.path.label} ({r.path.dst}): 1500-byte DF ping lost without an error: {r.full.output!r}")
        elif r.at_mtu is not None and r.at_mtu.outcome != "crossed":
            bad.append(f"{r.path.label} ({r.path.dst}): told mtu {r.full.mtu}, a DF ping of that size "
                       f"{r.at_mtu.outcome}: {r.at_mtu.output!r}")
    return bad


# ------------------------------------------------------------------ tcpdump's own reading

def tcpdump_addresses(pcap_file: str, inside: Callable[[ipaddress.IPv4Address | ipaddress.IPv6Address], bool]
                      ) -> set[str]:
    """The addresses ``tcpdump -nn -r`` prints for a capture (it decodes VXLAN, Geneve and GRE
    itself) that ``inside`` accepts: a reading of the file independent of lab.pcap's."""
    text = subprocess.run(["tcpdump", "-nn", "-r", pcap_file], capture_output=True, text=True, check=True).stdout
    out = set()
    for token in re.findall(r"[0-9a-f:.]{7,}", text):
        for cand in (token.rstrip(":.,"), token.rstrip(":.,").rsplit(".", 1)[0]):
            try:
                a = ipaddress.ip_address(cand)
            except ValueError:
                continue
            if inside(a):
                out.add(str(a))
            break
    return out
