"""The steps every verb shares, plain and chained alike: opening the Pod's namespace, the OVS
clients, naming the step a failure happened at (and timing the steps), the OVS port's
external_ids, forgetting a Pod's neighbours on the gateway port, CHECK's look at the sandbox,
keeping the Node's stack off a netdev port's host end, a fresh MAC, the IPAM config and the
Pod's MTU and routes.

The verbs (``cni.commands.add``, ``delete``, ``check``, ``status``, ``gc``, ``gateway``) and
``cni.commands.chained`` (networkPolicyOnly) import this module; none imports another's
internals. Standard library only: this runs once per Pod."""

from __future__ import annotations

import _socket  # the C module socket wraps: loaded already (cni.kernel.netlink)
import os
from time import perf_counter as _now  # time is loaded already (cni.spec.log)

from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Protocol

    from cni.ipam.api import IpamConfig
    from cni.kernel.netlink import Netlink
    from cni.node.nodestate import NodeState
    from cni.ovs.openflow.bridge import OpenFlow
    from cni.ovs.ovsdb import Ovsdb
    from cni.pipeline.podnet import PodNet
    from cni.pipeline.tables import Flow
    from cni.spec.request import Request
    from cni.spec.result import IPConfig, Result

    class Ipam(Protocol):
        """What the verbs call of IPAM, with the config :func:`ipam_for` parsed: ``cni.ipam.api`` is one
        (mypy checks the module against it); a type only, so the per-Pod path never imports typing."""

        def allocate(self, conf: IpamConfig, container_id: str, ifname: str,
                     requested: Sequence[str] = ()) -> list[IPConfig]: ...

        def check(self, conf: IpamConfig, container_id: str, ifname: str, addresses: list[str]) -> None: ...

        def release(self, conf: IpamConfig, container_id: str, ifname: str) -> None: ...

        def gc(self, conf: IpamConfig, valid: set[tuple[str, str]]) -> list[tuple[str, str]]: ...

        def status(self, conf: IpamConfig) -> None: ...

from cni.lean import addr
from cni.node import config as cfg
from cni.pipeline import tables as pl
from cni.spec.errors import IO_FAILURE, NETLINK_FAILURE, NETNS_GONE, OVS_FAILURE, CniError


def open_pod_netns(path: str) -> int:
    from cni.kernel.netns import open_netns

    try:
        return open_netns(path)
    except (FileNotFoundError, NotADirectoryError):
        raise CniError(NETNS_GONE, f"CNI_NETNS {path!r} does not exist") from None
    except OSError as e:
        raise CniError(NETNS_GONE, f"CNI_NETNS {path!r} cannot be opened: {e.strerror}") from None


def ovs_clients(node: cfg.NodeContext) -> tuple[Ovsdb, OpenFlow]:
    from cni.ovs.openflow.bridge import OpenFlow
    from cni.ovs.ovsdb import Ovsdb

    return Ovsdb(node.ovsdb), OpenFlow(node.bridge, node.ovs_run_dir)


def random_mac() -> str:
    b = bytearray(os.urandom(6))
    b[0] = (b[0] & 0xFC) | 0x02  # unicast, locally administered
    return ":".join(f"{x:02x}" for x in b)


def ipam_for(conf_dict: dict, node: cfg.NodeContext) -> tuple[Ipam, IpamConfig]:
    from cni.ipam import api as ipam_api

    return ipam_api, ipam_api.parse_config(conf_dict, node.pod_cidrs)


def pod_net(node: cfg.NodeContext, conf: cfg.PluginConfig, ips: list[IPConfig]) -> PodNet:
    """The Pod's interface MTU and routes (``cni.pipeline.podnet``: per-path MTUs)."""
    from cni.pipeline import podnet

    gateways = {ip.family: ip.gateway for ip in ips if ip.gateway}
    return podnet.for_state(node.state, gateways, conf.mtu, fallback_mtu=node.mtu)


def system_error(step: str, e: Exception) -> CniError:
    """Wrap a system-layer failure in a CNI error that says which step failed."""
    if isinstance(e, CniError):
        return e
    name = type(e).__name__
    code = OVS_FAILURE if name.startswith(("Ovsdb", "Ofctl", "OpenFlow")) \
        else NETLINK_FAILURE if name.startswith("Netlink") else IO_FAILURE
    return CniError(code, f"{step}: {e}")


class Step:
    """The step a command is at, so a system-layer failure says where it happened.

    With ``logLevel: debug`` it also times each step and :meth:`report` logs one line of
    durations: how an operator (or a benchmark) sees where an ADD or DEL spends its time."""

    __slots__ = ("_marks", "name")

    def __init__(self, log: Any = None) -> None:
        self.name = "start"
        timed = log is not None and getattr(log, "level", 100) <= 10
        self._marks: list[tuple[str, float]] | None = [("start", _now())] if timed else None

    def __call__(self, name: str) -> None:
        self.name = name
        if self._marks is not None:
            self._marks.append((name, _now()))

    def report(self, log: Any, what: str) -> None:
        marks = self._marks
        if not marks:
            return
        marks.append(("end", _now()))
        parts = [f"{marks[i][0]} {1000 * (marks[i + 1][1] - marks[i][1]):.1f}" for i in range(len(marks) - 1)]
        log.debug(f"{what} timing (ms): " + ", ".join(parts) + f"; total {1000 * (marks[-1][1] - marks[0][1]):.1f}")


class reported:
    """Turn any failure below into a CNI error naming the step (CniErrors pass unchanged)."""

    def __init__(self, step: Step) -> None:
        self.step = step

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None or isinstance(exc, CniError) or not isinstance(exc, Exception):
            return
        raise system_error(self.step.name, exc) from None


def external_ids(req: Request, ips: list[IPConfig], mac: str) -> dict[str, str]:
    ids = {
        pl.EXT_OWNER: pl.OWNER_POD,
        pl.EXT_CONTAINER_ID: req.container_id,
        pl.EXT_IFNAME: req.ifname,
        pl.EXT_IPS: ",".join(i.address for i in ips),
        pl.EXT_MAC: mac,
        pl.EXT_NETNS: req.netns,
    }
    if req.args.get("K8S_POD_NAME"):
        ids[pl.EXT_POD_NAME] = req.args["K8S_POD_NAME"]
    if req.args.get("K8S_POD_NAMESPACE"):
        ids[pl.EXT_POD_NAMESPACE] = req.args["K8S_POD_NAMESPACE"]
    return ids


def forget_neighbours(host_nl: Netlink, gateway: str, addresses: list[str]) -> None:
    """Drop the Node's cached MACs for these Pod addresses on the gateway port: an address that
    comes back with a new Pod (new MAC) is resolved afresh, through OVS's ARP/ND responder."""
    index = host_nl.link_index(gateway)
    if index is None:
        return
    for a in addresses:
        host_nl.neigh_del(index, addr.host(a))


def check_sandbox(req: Request, prev: Result, pod_nl: Netlink) -> list[str]:
    problems = []
    link = pod_nl.link_get(req.ifname)
    sandbox = next((i for i in prev.interfaces if i.name == req.ifname and i.sandbox), None)
    if link is None:
        return [f"interface {req.ifname} is missing from {req.netns}"]
    if sandbox is not None and sandbox.mac and link.mac.lower() != sandbox.mac.lower():
        problems.append(f"interface {req.ifname} has MAC {link.mac}, prevResult says {sandbox.mac}")
    if not link.up:
        problems.append(f"interface {req.ifname} is down")
    have = set(pod_nl.addrs(link.index))
    for ip in prev.ips:
        if ip.address not in have:
            problems.append(f"address {ip.address} is missing from {req.ifname}")
    for r in prev.routes:
        family = _socket.AF_INET if addr.family(r.dst) == 4 else _socket.AF_INET6
        want = addr.canonical_network(r.dst)
        found = [x for x in pod_nl.routes(family=family, index=link.index)
                 if addr.canonical_network(x.dst) == want and (not r.gw or (x.gw and addr.same_ip(x.gw, r.gw)))]
        if not found:
            problems.append(f"route {r.dst}" + (f" via {r.gw}" if r.gw else "") + f" is missing from {req.ifname}")
    return problems


# The host end's sysctls a netdev datapath needs (see isolate_host_end), in the order they are
# set; chained mode restores them in reverse (IPv6 first: re-enabling it precedes its addresses).
HOST_END_ISOLATION = (("ipv4", "arp_ignore", "8"), ("ipv4", "rp_filter", "1"), ("ipv6", "disable_ipv6", "1"))


def isolate_host_end(host: str) -> None:
    """Keep the Node's own stack out of the Pod's traffic on the userspace datapath.

    ovs-vswitchd reads a ``netdev`` bridge's veth ports with AF_PACKET, but the kernel still
    processes every frame that arrives on the host end: it would answer the Pod's ARP for the
    gateway address with the veth's own MAC and take the Pod's packets itself, around OVS and
    its SpoofGuard. With ARP replies off (arp_ignore=8), IPv6 off and strict reverse-path
    filtering on the host end, every frame the Pod sends is addressed to a MAC that is not
    the veth's, and the kernel drops it as "other host" (a kernel OVS datapath steals frames
    before the stack sees them, so ``system`` needs none of this)."""
    for family, key, value in HOST_END_ISOLATION:
        try:
            with open(f"/proc/sys/net/{family}/conf/{host}/{key}", "w") as f:
                f.write(value)
        except FileNotFoundError:
            if family != "ipv6":
                raise
            # No IPv6 on this link (an MTU below 1280, or IPv6 off in the kernel): none to turn off.


def policy_pending(req: Request, state: NodeState | None, cookie: pl.Cookie, addresses: tuple[str, ...]) -> list[Flow]:
    """A Pod in a namespace that has NetworkPolicies starts with no new connection in or out
    (:func:`cni.pipeline.flows.pending_flows`): its policy may select it, and route-sync, which
    knows its labels, lifts the block once the policy is in force.  Fails closed: the flows go in
    with the Pod's own, in one bundle, before the Pod has an address to be reached at."""
    namespace = req.args.get("K8S_POD_NAMESPACE")
    if state is None or not namespace or namespace not in state.policyNamespaces:
        return []
    from cni.pipeline.flows import pending_flows

    return pending_flows(cookie, addresses)
