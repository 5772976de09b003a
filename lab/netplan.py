"""The underlay as plain data: which namespaces, which iproute2 commands in which namespace,
in which order, and which sysctls.  Pure; ``lab.build`` applies it.

Every link is created inside a lab namespace with its peer created directly in the other
namespace (``peer name eth0 netns N``): nothing ever lands in the root namespace, so deleting
the lab's namespaces deletes every link, and links of two labs can never collide."""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.topology import (
    EXTERNAL_HOST,
    NODE_HOST_BASE,
    ROUTER_ON_SEGMENT,
    Topology,
    external_netns,
    host,
    node_addresses,
    node_netns,
    router_address,
    router_netns,
    segment_netns,
    with_prefix,
)

SEGMENT_BRIDGE = "br0"
NO_IPV6 = ("net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")  # a tagged segment's ns
# No duplicate address detection anywhere in the lab: a tentative link-local address would
# drop the first IPv6 neighbour exchanges right after `up` (addresses are unique by plan).
NO_DAD = ("net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
# sigs.k8s.io/network-policy-api v0.3.0's conformance suite runs hostNetwork servers on the fixed
# ports 34345-34352 (its HostNetworkPortRangeStart default and 8 ports; the test binary has no flag
# for them), inside the ephemeral range: a kubelet's, route-sync's or containerd's outgoing
# connection that happened to take one of them first kept the server from binding (EADDRINUSE), and
# the suite saw REFUSED where a policy allowed (CI, CNPBaselineTierEgressNodePeers).  A Node's
# kernel hands none of them out; ip_local_reserved_ports is per network namespace.
SUITE_HOST_PORTS = ("net.ipv4.ip_local_reserved_ports=34345-34352",)
FORWARDING = ("net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1",
              "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0")


@dataclass(frozen=True)
class NetPlan:
    namespaces: tuple[str, ...]
    # stages run in order; within a stage, each namespace's batch may run in parallel
    stages: tuple[dict[str, list[str]], ...]
    sysctls: dict[str, tuple[str, ...]] = field(default_factory=dict)  # applied before the stages
    # namespace -> links whose TX checksum offload goes off, after the stages (see TX_CSUM_OFF)
    tx_csum_off: dict[str, tuple[str, ...]] = field(default_factory=dict)


def plan(lab: str, topo: Topology) -> NetPlan:
    router = router_netns(lab)
    ext = external_netns(lab)
    segs = {s.name: segment_netns(lab, s.name) for s in topo.segments}
    nodes = {n.name: node_netns(lab, n.name) for n in topo.nodes}
    namespaces = (*segs.values(), router, ext, *nodes.values())

    # Stage 1: bridges and every veth (created from the segment / router side).  A tagged lab
    # (``vlan``) has no Linux bridge: the segment's switch is an OVS bridge (lab.segswitch),
    # built on these veths afterwards.
    create: dict[str, list[str]] = {ns: ["link set lo up"] for ns in namespaces}
    tagged = topo.vlan is not None
    attach = "" if tagged else f" master {SEGMENT_BRIDGE}"
    for s in topo.segments:
        ns = segs[s.name]
        if not tagged:
            create[ns] += [f"link add {SEGMENT_BRIDGE} mtu {s.mtu} type bridge stp_state 0 forward_delay 0",
                           f"link set {SEGMENT_BRIDGE} up"]
        create[ns] += [f"link add router mtu {s.mtu} type veth peer name eth-{s.name} mtu {s.mtu} netns {router}",
                       f"link set router{attach} up"]
    for n in topo.nodes:
        s = topo.segment(n.segment)
        create[segs[s.name]] += [
            f"link add {n.name} mtu {s.mtu} type veth peer name eth0 mtu {s.mtu} netns {nodes[n.name]}",
            f"link set {n.name}{attach} up"]
    create[router] += [f"link add eth-ext type veth peer name eth0 netns {ext}"]

    # Stage 2: addresses and routes, each namespace on its own; only the families each link has.
    config: dict[str, list[str]] = {}
    r = config.setdefault(router, [])
    for s in topo.segments:
        r += [f"link set eth-{s.name} up", *_addresses(f"eth-{s.name}", (s.ipv4, s.ipv6), ROUTER_ON_SEGMENT)]
    ext_cidrs = (topo.external_ipv4, topo.external_ipv6)
    r += ["link set eth-ext up", *_addresses("eth-ext", ext_cidrs, ROUTER_ON_SEGMENT)]
    if topo.route_pod_cidrs and topo.kubernetes is None:  # Kubernetes: from the Node objects (lab.kube)
        for n in topo.nodes:
            r += _pod_routes(node_addresses(topo, n), n.pod_cidrs)
    config[ext] = ["link set eth0 up", *_addresses("eth0", ext_cidrs, EXTERNAL_HOST),
                   *_default_routes(tuple(host(c, ROUTER_ON_SEGMENT) if c else None for c in ext_cidrs))]
    for n in topo.nodes:
        s = topo.segment(n.segment)
        config[nodes[n.name]] = ["link set eth0 up",
                                 *_addresses("eth0", (s.ipv4, s.ipv6), NODE_HOST_BASE + n.index),
                                 *_default_routes(router_address(topo, n.segment))]
        # the underlay routes Pods (networkPolicyOnly): peers on the segment.  Not on Kubernetes,
        # where the controller-manager picks the Pod CIDRs: the router routes them (lab.kube)
        if topo.node_pod_routes and topo.kubernetes is None:
            for m in topo.nodes:
                if m.name != n.name and m.segment == n.segment:
                    config[nodes[n.name]] += _pod_routes(node_addresses(topo, m), m.pod_cidrs)
    sysctls: dict[str, tuple[str, ...]] = {ns: NO_DAD for ns in namespaces}
    if tagged:
        for ns in segs.values():
            sysctls[ns] = NO_DAD + NO_IPV6
    sysctls[router] = NO_DAD + FORWARDING
    for ns in nodes.values():
        sysctls[ns] = NO_DAD + FORWARDING + SUITE_HOST_PORTS
    # The segment's switch ports towards Nodes and the router compute checksums, like real NICs:
    # a veth otherwise hands on CHECKSUM_PARTIAL packets (the external host's or router's TCP),
    # and a netdev OVS that reads a moved uplink with AF_PACKET never fills them in, so the
    # Node's kernel drops them (TCP through masquerade failed while ping worked).
    tx_off = {segs[s.name]: tuple(["router"] + [n.name for n in topo.nodes if n.segment == s.name])
              for s in topo.segments}
    if tagged:  # the switch is a netdev OVS too, reading its ports with AF_PACKET: the router's ends
        tx_off[router] = tuple(f"eth-{s.name}" for s in topo.segments)  # hand it complete checksums
        # and so do the Nodes' eth0, which carry the Node's own TCP before route-sync moves them
        # (a Kubernetes lab's kubelets dial the API server first: SYNs crossed, data did not)
        for n in topo.nodes:
            tx_off[nodes[n.name]] = ("eth0",)
    return NetPlan(namespaces=namespaces, stages=(create, config), sysctls=sysctls, tx_csum_off=tx_off)


def _addresses(dev: str, cidrs: tuple[str | None, ...], index: int) -> list[str]:
    """``addr add`` of the ``index``-th host of each present range (IPv6 without DAD)."""
    return [f"addr add {with_prefix(c, index)} dev {dev}" + (" nodad" if ":" in c else "") for c in cidrs if c]


def _default_routes(gateways: tuple[str | None, ...]) -> list[str]:
    return [f"route add {'::/0' if ':' in g else 'default'} via {g}" for g in gateways if g]


def _pod_routes(via: tuple[str | None, str | None], pod_cidrs: tuple[str, ...]) -> list[str]:
    """Routes to ``pod_cidrs`` via the Node's address of each one's family (none without one)."""
    return [f"route add {c} via {via[1] if ':' in c else via[0]}" for c in pod_cidrs if via[1 if ":" in c else 0]]


