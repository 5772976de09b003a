"""The router's BGP (``router.routePodCIDRs: bgp``): FRR's bgpd and zebra in the router's
namespace, peering with every Node's route-sync and installing what they advertise into the
router's kernel table (``proto bgp``).

Planning is pure (:func:`plan`: both daemons' configuration and argv from the topology);
:func:`start` writes the files and starts the daemons, :func:`routes` and :func:`summary` read
what they learned.  Nothing of the host's FRR is used: each lab's daemons have their own config,
pid files and vty sockets under ``<lab>/router/frr`` (``-f``, ``-i``, ``-z``, ``--vty_socket``,
no vty TCP port), run as the ``frr`` user the package creates, and live in the router's netns.

Neighbours are dynamic: ``bgp listen range`` per segment (the family the Nodes peer in: IPv4
where the segment has it, else IPv6) into one peer group, so a Node that joins needs nothing on
the router.  Each session carries both families (``address-family ipv6 unicast`` activated on
the same peer group: MP-BGP)."""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import time
from dataclasses import dataclass

from lab.sh import LabError, run
from lab.topology import NodeSpec, RouterBgp, Topology, router_address, router_netns

FRR_DIR = "/usr/lib/frr"
DAEMONS = ("zebra", "bgpd")
USER = "frr"  # Debian's package creates it; the daemons drop to it (root is not in its vty group)
PEER_GROUP = "nodes"
START_TIMEOUT = 20.0  # s: bounds a hang only


@dataclass(frozen=True)
class FrrPlan:
    directory: str
    configs: dict[str, str]  # daemon -> its config text
    argv: dict[str, list[str]]  # daemon -> argv, in start order (zebra first)
    vty_dir: str

    def pidfile(self, daemon: str) -> str:
        return os.path.join(self.directory, f"{daemon}.pid")


def peering_address(topo: Topology, segment: str) -> str | None:
    """The router's address the Nodes of ``segment`` peer with: IPv4 if the segment has it."""
    v4, v6 = router_address(topo, segment)
    return v4 or v6


def peering_range(topo: Topology, segment: str) -> str | None:
    seg = topo.segment(segment)
    return seg.ipv4 or seg.ipv6


def node_router_id(node: NodeSpec) -> str:
    """A Node's BGP router ID where its segment has no IPv4 (a router ID is an IPv4 address)."""
    return str(ipaddress.IPv4Address("10.255.0.0") + node.index)


def router_id(topo: Topology) -> str:
    for s in topo.segments:
        v4, _ = router_address(topo, s.name)
        if v4:
            return v4
    return "10.255.255.254"


def node_bgp_config(topo: Topology, node: NodeSpec) -> dict:
    """route-sync's ``bgp`` section for ``node``: peer with the router on its segment."""
    rb = topo.router_bgp
    assert rb is not None
    seg = topo.segment(node.segment)
    peer: dict = {"address": peering_address(topo, node.segment), "asn": rb.asn, "holdTime": rb.hold_time}
    out: dict = {"localASN": rb.node_asn, "peers": [peer]}
    if not seg.ipv4:
        out["routerID"] = node_router_id(node)
    if rb.graceful_restart:
        out["gracefulRestart"] = rb.graceful_restart
    return out


def bgpd_config(topo: Topology, lab: str, rb: RouterBgp, log_file: str) -> str:
    keepalive = max(1, rb.hold_time // 3)
    lines = ["frr defaults datacenter", f"hostname {lab}-router", f"log file {log_file} informational", "!",
             f"router bgp {rb.asn}",
             f" bgp router-id {router_id(topo)}",
             " no bgp ebgp-requires-policy",  # the lab takes what the Nodes advertise, no route-maps
             " no bgp default ipv4-unicast",
             " bgp log-neighbor-changes",
             f" neighbor {PEER_GROUP} peer-group",
             f" neighbor {PEER_GROUP} remote-as {rb.node_asn}",
             f" neighbor {PEER_GROUP} timers {keepalive} {rb.hold_time}"]
    if rb.graceful_restart:
        lines.append(" bgp graceful-restart")
    for s in topo.segments:
        rng = peering_range(topo, s.name)
        if rng:
            lines.append(f" bgp listen range {rng} peer-group {PEER_GROUP}")
    for fam in ("ipv4", "ipv6"):
        lines += [f" address-family {fam} unicast", f"  neighbor {PEER_GROUP} activate", " exit-address-family"]
    return "\n".join([*lines, "!", ""])


def plan(topo: Topology, lab: str, directory: str) -> FrrPlan:
    """Both daemons' files and argv; ``directory``: ``<lab dir>/router/frr``."""
    rb = topo.router_bgp
    if rb is None:
        raise LabError("the topology has no router.routePodCIDRs: bgp")
    log_file = os.path.join(directory, "frr.log")
    vty = os.path.join(directory, "vty")
    zserv = os.path.join(directory, "zserv.api")
    configs = {"zebra": "\n".join(["frr defaults datacenter", f"hostname {lab}-router",
                                   f"log file {log_file} informational", "!", ""]),
               "bgpd": bgpd_config(topo, lab, rb, log_file)}
    argv = {d: [os.path.join(FRR_DIR, d), "-d", "-f", os.path.join(directory, f"{d}.conf"),
                "-i", os.path.join(directory, f"{d}.pid"), "-z", zserv, "--vty_socket", vty, "-P", "0",
                "-u", USER, "-g", USER] for d in DAEMONS}
    return FrrPlan(directory, configs, argv, vty)


# ------------------------------------------------------------------------------ apply (thin)

def start(p: FrrPlan, netns: str, record_pidfile: object) -> None:
    """Write the files (owned by the ``frr`` user), start zebra then bgpd in ``netns``, and wait
    for their vty sockets.  ``record_pidfile(path)`` is called before each start (the manifest)."""
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        raise LabError(f"user {USER!r} missing: install Debian's frr package (.ci/install.sh)") from None
    if not os.access(p.argv["bgpd"][0], os.X_OK):
        raise LabError(f"{p.argv['bgpd'][0]} missing: install Debian's frr package (.ci/install.sh)")
    os.makedirs(p.vty_dir, exist_ok=True)
    # the frr user must reach its directory: <root>/<lab>/router/frr (a umask of 077 would close it)
    up = os.path.dirname(p.directory)
    for d in (up, os.path.dirname(up), os.path.dirname(os.path.dirname(up))):
        mode = os.stat(d).st_mode
        if mode & 0o001 == 0:
            os.chmod(d, (mode & 0o7777) | 0o011)
    for d, text in p.configs.items():
        with open(os.path.join(p.directory, f"{d}.conf"), "w") as f:
            f.write(text)
    for path in (p.directory, p.vty_dir, *(os.path.join(p.directory, f"{d}.conf") for d in DAEMONS)):
        os.chown(path, pw.pw_uid, pw.pw_gid)
    for d in DAEMONS:
        record_pidfile(p.pidfile(d))  # type: ignore[operator]
        run(p.argv[d], netns=netns)  # -d: returns once the daemon is up
    deadline = time.monotonic() + START_TIMEOUT
    while not all(os.path.exists(os.path.join(p.vty_dir, f"{d}.vty")) for d in DAEMONS):
        if time.monotonic() > deadline:
            raise LabError(f"FRR in {netns} did not open its vty sockets in {p.vty_dir}; see "
                           f"{os.path.join(p.directory, 'frr.log')}")
        time.sleep(0.02)


def frr_dir(lab_directory: str) -> str:
    return os.path.join(lab_directory, "router", "frr")


def vtysh(lab_directory: str, netns: str, command: str) -> str:
    cp = run(["vtysh", "--vty_socket", os.path.join(frr_dir(lab_directory), "vty"), "-c", command],
             netns=netns, check=False)
    if cp.returncode != 0:
        raise LabError(f"vtysh -c {command!r}: {(cp.stdout + cp.stderr).strip()}")
    return cp.stdout


def summary(lab_directory: str, lab: str) -> dict[str, dict]:
    """Neighbour -> {state, asn, prefixes received per family} (``show bgp summary json``)."""
    raw = json.loads(vtysh(lab_directory, router_netns(lab), "show bgp summary json") or "{}")
    out: dict[str, dict] = {}
    for fam_key, fam in (("ipv4Unicast", 4), ("ipv6Unicast", 6)):
        for addr, n in ((raw.get(fam_key) or {}).get("peers") or {}).items():
            e = out.setdefault(addr, {"state": n.get("state"), "asn": n.get("remoteAs"), "received": {}})
            e["received"][fam] = n.get("pfxRcd", 0)
    return out


def routes(netns: str) -> list[dict]:
    """The router's kernel routes that zebra installed from BGP (protocol ``bgp``), both families."""
    out: list[dict] = []
    for fam in ("-4", "-6"):
        cp = run(["ip", "-j", fam, "route", "show"], netns=netns)
        for r in json.loads(cp.stdout or "[]"):
            if r.get("protocol") == "bgp":
                out.append({"dst": r.get("dst"), "via": (r.get("gateway") or ""), "dev": r.get("dev"),
                            "protocol": r.get("protocol")})
    return out
