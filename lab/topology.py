"""A lab's topology as plain data: parsed from YAML, defaults filled in, addresses derived.

Pure: nothing here touches the system.  ``load``/``parse`` turn YAML into a :class:`Topology`;
everything ``up`` needs (namespace names, addresses, Pod CIDRs, routes) is computed from it by
the functions below, so tests can check the plan without root.

YAML (every key optional; ``lab/topologies/default.yaml`` is the default)::

    datapath: netdev                     # netdev | system (per Node overridable)
    clusterCIDRs: [10.244.0.0/16, fd00:10:244::/48]   # the Pods' families: one or both
    segments:
      a: {ipv4: 192.168.77.0/24, ipv6: fd00:77::/64, mtu: 1500}
      b: {ipv4: 192.168.88.0/24, ipv6: fd00:88::/64, mtu: 1500}
    router:
      routePodCIDRs: false               # true: static routes to each Node's Pod CIDRs via the Node;
                                         # bgp: FRR's bgpd learns them from route-sync (lab.frr)
      bgp: {asn: 65000, nodeASN: 64512, holdTime: 9, gracefulRestart: 0}   # with routePodCIDRs: bgp
      external: {ipv4: 192.168.99.0/24, ipv6: fd00:99::/64}
    nodes:
      - {name: node-1, segment: a}       # optional: datapath, podCIDRs, address index, vlan
    vlan: null                           # or 100: every segment is an 802.1Q switch (an OVS bridge of
                                         # the lab's own: trunk ports to the Nodes, an access port
                                         # with the tag to the router), route-sync's transportVLAN;
                                         # a Node's ``vlan: none`` leaves it untagged (misconfigured)
    routeSync: null                      # or {trafficEncapMode: encap, tunnelType: vxlan, ...}
    encryption: none                     # or wireguard: route-sync's trafficEncryptionMode (every
                                         # Node's Pod traffic to its peers through its WireGuard
                                         # device, the userspace wireguard-go here; needs routeSync,
                                         # not networkPolicyOnly, not kubernetes yet)
    nodePodRoutes: false                 # each Node routes the Pod CIDRs of the other Nodes on its
                                         # segment via them (the primary CNI's routing when Ferry
                                         # runs chained, trafficEncapMode networkPolicyOnly)

Families: the underlay gets only the families the topology names.  A segment (or
``router.external``) that names ``ipv4`` and/or ``ipv6`` gets exactly those; one that names
neither gets the defaults of the cluster's families (those of ``clusterCIDRs``; the external
link: those of the segments).  So ``clusterCIDRs: [10.244.0.0/16]`` with ``segments: {a: {},
b: {}}`` is IPv4-only throughout.  ``lab.overrides`` rewrites a document for ``--family``
and the mode flags.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Any

from cni.pipeline.modes import (
    DATAPATHS,
    ENCAP,
    ENCRYPTION_NONE,
    ENCRYPTION_WIREGUARD,
    ENCRYPTIONS,
    FAST_PATH_MODES,
    GRE,
    MODES,
    NETDEV,
    NETDEV_TUNNEL_TYPES,
    NETWORK_POLICY_ONLY,
    NO_ENCAP,
    STT,
    SYSTEM,
    TUNNEL_TYPES,
    VXLAN,
)
from lab.kube import spec as kube_spec
from lab.kube.spec import KubeSpec
from routesync.config import PEERS_SLICES
from routesync.policy.peerslice import DELIVERY_LABELS

DEFAULT_TOPOLOGY = os.path.join(os.path.dirname(__file__), "topologies", "default.yaml")
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
MAX_LAB_NAME = 12
MAX_NODE_NAME = 15  # the Node's name is its veth name inside the segment namespace
FAMILIES = (4, 6)
DEFAULT_CLUSTER_CIDRS = {4: "10.244.0.0/16", 6: "fd00:10:244::/48"}
DEFAULT_EXTERNAL = {4: "192.168.99.0/24", 6: "fd00:99::/64"}
ROUTER_ON_SEGMENT = 1  # host index of the router on every segment / the external link
EXTERNAL_HOST = 2  # host index of the external host on the external link
UNTAGGED = "none"  # a Node's ``vlan`` on a tagged lab: its route-sync tags nothing
NODE_HOST_BASE = 10  # node i (1-based, lab-wide) is host NODE_HOST_BASE + i on its segment


class TopologyError(ValueError):
    """The topology file is malformed or inconsistent."""


@dataclass(frozen=True)
class Segment:
    name: str
    ipv4: str | None  # "192.168.77.0/24"; None: no IPv4 on this segment
    ipv6: str | None  # "fd00:77::/64"; None: no IPv6
    mtu: int = 1500

    def cidr(self, family: int) -> str | None:
        return self.ipv4 if family == 4 else self.ipv6

    @property
    def families(self) -> tuple[int, ...]:
        return tuple(f for f in FAMILIES if self.cidr(f))


@dataclass(frozen=True)
class NodeSpec:
    name: str
    segment: str
    index: int  # 1-based, lab-wide: gives the host part and the Pod CIDRs
    datapath: str
    pod_cidrs: tuple[str, ...]
    vlan: int | None = None  # the transport VLAN this Node's route-sync is configured with


@dataclass(frozen=True)
class RouteSyncSpec:
    """The ``routeSync`` block; keys are passed on to route-sync's config file."""

    trafficEncapMode: str = ENCAP
    tunnelType: str = VXLAN
    tunnelPort: int | None = None  # None: the tunnel type's default (vxlan 4789, geneve 6081; gre has none)
    noSNAT: bool = False
    fastPath: bool = False
    macSource: str = "annotation"  # fast path next-hop MACs: annotation | neighbor | both
    resyncSeconds: float = 60.0  # route-sync's periodic re-assertion (tests make it short)
    startTimeout: float = 60.0  # s: bounds a hang only (a loaded machine starts it slowly)
    policyPeers: str = "cluster"  # route-sync's: cluster | peerSlices (a Kubernetes lab, with ferry-controller)


@dataclass(frozen=True)
class RouterBgp:
    """``router.routePodCIDRs: bgp``: the router runs FRR (bgpd + zebra) and learns every Node's
    Pod CIDRs from its route-sync over eBGP; ``router.bgp`` sets the numbers."""

    asn: int = 65000  # the router's
    node_asn: int = 64512  # every Node's (route-sync's bgp.localASN)
    hold_time: int = 9  # s, on both sides (route-sync's bgp.peers[].holdTime; FRR's timers)
    graceful_restart: int = 0  # s: route-sync's bgp.gracefulRestart (FRR is a helper by default)


BGP_KEYS = {"asn": "asn", "nodeASN": "node_asn", "holdTime": "hold_time", "gracefulRestart": "graceful_restart"}


@dataclass(frozen=True)
class Topology:
    segments: tuple[Segment, ...]
    nodes: tuple[NodeSpec, ...]
    cluster_cidrs: tuple[str, ...] = ("10.244.0.0/16", "fd00:10:244::/48")
    route_pod_cidrs: bool = False
    external_ipv4: str | None = "192.168.99.0/24"
    external_ipv6: str | None = "fd00:99::/64"
    route_sync: RouteSyncSpec | None = None
    bridge: str = "br-int"
    node_pod_routes: bool = False
    kubernetes: KubeSpec | None = None  # a real Kubernetes cluster (lab/kube): Ferry from its DaemonSet
    router_bgp: RouterBgp | None = None  # routePodCIDRs: bgp (route_pod_cidrs is then False: nothing static)
    vlan: int | None = None  # every segment carries this 802.1Q VLAN (lab.segswitch); None: plain bridges
    encryption: str = ENCRYPTION_NONE  # route-sync's trafficEncryptionMode (modes.ENCRYPTIONS)

    @property
    def encrypted(self) -> bool:
        """Pod traffic between Nodes through WireGuard (``encryption: wireguard``)."""
        return self.encryption != ENCRYPTION_NONE

    @property
    def chained(self) -> bool:
        """networkPolicyOnly: the Nodes' conflist is [ptp + host-local, ferry]."""
        return self.route_sync is not None and self.route_sync.trafficEncapMode == NETWORK_POLICY_ONLY

    @property
    def pod_families(self) -> tuple[int, ...]:
        """The Pods' address families (those of the cluster CIDRs)."""
        return families_of(self.cluster_cidrs)

    @property
    def underlay_families(self) -> tuple[int, ...]:
        """The families any segment carries."""
        return tuple(f for f in FAMILIES if any(s.cidr(f) for s in self.segments))

    def external_cidr(self, family: int) -> str | None:
        return self.external_ipv4 if family == 4 else self.external_ipv6

    def segment(self, name: str) -> Segment:
        for s in self.segments:
            if s.name == name:
                return s
        raise TopologyError(f"no segment {name!r}")

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise TopologyError(f"no node {name!r} (nodes: {', '.join(n.name for n in self.nodes)})")


# ---------------------------------------------------------------- addressing (pure)

def host(cidr: str, index: int) -> str:
    """The ``index``-th address of ``cidr``, without prefix length."""
    net = ipaddress.ip_network(cidr, strict=False)
    if index >= net.num_addresses:
        raise TopologyError(f"host index {index} outside {cidr}")
    return str(net.network_address + index)


def with_prefix(cidr: str, index: int) -> str:
    return f"{host(cidr, index)}/{ipaddress.ip_network(cidr, strict=False).prefixlen}"


def families_of(cidrs: tuple[str, ...] | list[str]) -> tuple[int, ...]:
    """The address families among ``cidrs`` (addresses or networks), in order 4, 6."""
    present = {6 if ":" in c else 4 for c in cidrs}
    return tuple(f for f in FAMILIES if f in present)


def _hosts(v4: str | None, v6: str | None, index: int) -> tuple[str | None, str | None]:
    return (host(v4, index) if v4 else None), (host(v6, index) if v6 else None)


def node_addresses(topo: Topology, node: NodeSpec) -> tuple[str | None, str | None]:
    """The Node's transport addresses (IPv4, IPv6), without prefix length; None for a family
    its segment does not carry."""
    seg = topo.segment(node.segment)
    return _hosts(seg.ipv4, seg.ipv6, NODE_HOST_BASE + node.index)


def router_address(topo: Topology, segment: str) -> tuple[str | None, str | None]:
    seg = topo.segment(segment)
    return _hosts(seg.ipv4, seg.ipv6, ROUTER_ON_SEGMENT)


def external_address(topo: Topology) -> tuple[str | None, str | None]:
    return _hosts(topo.external_ipv4, topo.external_ipv6, EXTERNAL_HOST)


def default_segment_cidr(name: str, position: int, family: int) -> str:
    """The address range a segment gets for ``family`` when it names none: a and b have their
    own, the segment at ``position`` (0-based) otherwise 192.168.(100+position).0/24 / fd00:(100+position)::/64."""
    named = {"a": ("192.168.77.0/24", "fd00:77::/64"), "b": ("192.168.88.0/24", "fd00:88::/64")}
    d4, d6 = named.get(name, (f"192.168.{100 + position}.0/24", f"fd00:{100 + position:x}::/64"))
    return d4 if family == 4 else d6


def default_pod_cidrs(cluster_cidrs: tuple[str, ...], index: int) -> tuple[str, ...]:
    """Node ``index``'s Pod CIDRs: the index-th /24 (IPv4) and /64 (IPv6) of the cluster CIDRs."""
    out = []
    for c in cluster_cidrs:
        net = ipaddress.ip_network(c, strict=False)
        new_prefix = 24 if net.version == 4 else 64
        if new_prefix <= net.prefixlen:
            raise TopologyError(f"cluster CIDR {c} too small to split into per-Node /{new_prefix}")
        size = 1 << ((32 if net.version == 4 else 128) - new_prefix)
        sub = ipaddress.ip_network((int(net.network_address) + index * size, new_prefix))
        if not sub.subnet_of(net):  # type: ignore[arg-type]
            raise TopologyError(f"node index {index} outside cluster CIDR {c}")
        out.append(str(sub))
    return tuple(out)


def gateway_address(pod_cidr: str) -> str:
    return host(pod_cidr, 1)


# ---------------------------------------------------------------- names (pure)

def node_netns(lab: str, node: str) -> str:
    return f"{lab}-{node}"


def segment_netns(lab: str, segment: str) -> str:
    return f"{lab}-seg-{segment}"


def router_netns(lab: str) -> str:
    return f"{lab}-router"


def external_netns(lab: str) -> str:
    return f"{lab}-ext"


def pod_netns(lab: str, node: str, pod: str) -> str:
    return f"{lab}-{node}-{pod}"


def check_name(kind: str, name: str, limit: int) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > limit:
        raise TopologyError(f"{kind} name {name!r}: lowercase letters, digits and '-', at most {limit}")
    return name


# ---------------------------------------------------------------- parsing (pure)

def _cidr(value: Any, version: int, where: str) -> str:
    try:
        net = ipaddress.ip_network(str(value), strict=True)
    except ValueError as e:
        raise TopologyError(f"{where}: {e}") from None
    if net.version != version:
        raise TopologyError(f"{where}: {value} is not IPv{version}")
    return str(net)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TopologyError(f"{where}: expected a mapping")
    return value


def parse(data: Any) -> Topology:
    d = _mapping(data, "topology")
    known = {"datapath", "clusterCIDRs", "segments", "router", "nodes", "routeSync", "bridge", "name",
             "nodePodRoutes", "kubernetes", "vlan", "encryption"}
    unknown = set(d) - known
    if unknown:
        raise TopologyError(f"topology: unknown keys {sorted(unknown)}")
    datapath = d.get("datapath", NETDEV)
    if datapath not in DATAPATHS:
        raise TopologyError(f"datapath {datapath!r}: one of {DATAPATHS}")
    cluster_in = d.get("clusterCIDRs", [DEFAULT_CLUSTER_CIDRS[f] for f in FAMILIES])
    if not isinstance(cluster_in, list) or not cluster_in:
        raise TopologyError("clusterCIDRs: expected a non-empty list")
    cluster = tuple(_cidr(c, 6 if ":" in str(c) else 4, "clusterCIDRs") for c in cluster_in)
    if len(families_of(cluster)) != len(cluster):
        raise TopologyError(f"clusterCIDRs {list(cluster)}: at most one per address family")
    segs_in = _mapping(d.get("segments") or {"a": {}, "b": {}}, "segments")
    segments = []
    for i, (name, s) in enumerate(segs_in.items()):
        check_name("segment", str(name), 8)
        s = _mapping(s, f"segments.{name}")
        mtu = int(s.get("mtu", 1500))
        if not 1280 <= mtu <= 9000:
            raise TopologyError(f"segments.{name}.mtu {mtu}: 1280..9000")
        unknown = set(s) - {"ipv4", "ipv6", "mtu"}
        if unknown:
            raise TopologyError(f"segments.{name}: unknown keys {sorted(unknown)}")
        # the families it names; naming none: the cluster's families, with the defaults
        named = {f: s.get(f"ipv{f}") for f in FAMILIES if s.get(f"ipv{f}") is not None}
        if not named:
            named = {f: default_segment_cidr(str(name), i, f) for f in families_of(cluster)}
        v4, v6 = (_cidr(named[f], f, f"segments.{name}.ipv{f}") if f in named else None for f in FAMILIES)
        segments.append(Segment(str(name), v4, v6, mtu))
    router = _mapping(d.get("router"), "router")
    ext = _mapping(router.get("external"), "router.external")
    ext_named = {f: ext.get(f"ipv{f}") for f in FAMILIES if ext.get(f"ipv{f}") is not None}
    if not ext_named:  # the families of the underlay it hangs off
        ext_named = {f: DEFAULT_EXTERNAL[f] for f in FAMILIES if any(seg.cidr(f) for seg in segments)}
    ext4, ext6 = (_cidr(ext_named[f], f, f"router.external.ipv{f}") if f in ext_named else None
                  for f in FAMILIES)
    vlan = _vlan(d.get("vlan"), "vlan")
    nodes_in = d.get("nodes")
    if nodes_in is None:
        nodes_in = [{"name": "node-1", "segment": "a"}, {"name": "node-2", "segment": "a"},
                    {"name": "node-3", "segment": "b"}]
    if not isinstance(nodes_in, list) or not nodes_in:
        raise TopologyError("nodes: expected a non-empty list")
    seg_names = {s.name for s in segments}
    nodes: list[NodeSpec] = []
    for i, n in enumerate(nodes_in, start=1):
        n = _mapping(n, f"nodes[{i - 1}]")
        name = check_name("node", str(n.get("name", f"node-{i}")), MAX_NODE_NAME)
        if name == "router":
            raise TopologyError("node name 'router' is reserved")
        seg = str(n.get("segment", segments[0].name))
        if seg not in seg_names:
            raise TopologyError(f"node {name}: unknown segment {seg!r}")
        dp = n.get("datapath", datapath)
        if dp not in DATAPATHS:
            raise TopologyError(f"node {name}: datapath {dp!r}: one of {DATAPATHS}")
        index = int(n.get("index", i))
        pod_cidrs = tuple(str(ipaddress.ip_network(str(c), strict=True)) for c in n["podCIDRs"]) \
            if "podCIDRs" in n else default_pod_cidrs(cluster, index)
        node_vlan = vlan
        if "vlan" in n:
            if vlan is None:
                raise TopologyError(f"node {name}: vlan only with a top-level vlan (the segments' tag)")
            node_vlan = None if n["vlan"] == UNTAGGED else _vlan(n["vlan"], f"node {name}: vlan")
        nodes.append(NodeSpec(name, seg, index, dp, pod_cidrs, node_vlan))
    if len({n.name for n in nodes}) != len(nodes):
        raise TopologyError("nodes: duplicate names")
    if len({n.index for n in nodes}) != len(nodes):
        raise TopologyError("nodes: duplicate index")
    rs_in = d.get("routeSync")
    route_sync = None
    if rs_in:
        rs = _mapping(rs_in, "routeSync")
        allowed = set(RouteSyncSpec.__dataclass_fields__)
        if set(rs) - allowed:
            raise TopologyError(f"routeSync: unknown keys {sorted(set(rs) - allowed)}")
        route_sync = RouteSyncSpec(**rs)
        check_route_sync(route_sync, {n.datapath for n in nodes})
        if route_sync.policyPeers != "cluster" and "kubernetes" not in d:
            raise TopologyError("routeSync.policyPeers: peerSlices only on a Kubernetes lab (kubernetes: {...}): "
                                "the slices go through the API server")
    unknown = set(router) - {"routePodCIDRs", "external", "bgp"}
    if unknown:
        raise TopologyError(f"router: unknown keys {sorted(unknown)}")
    rpc = router.get("routePodCIDRs", False)
    if rpc not in (True, False, "bgp"):
        raise TopologyError(f"router.routePodCIDRs {rpc!r}: true (static routes), false, or bgp")
    router_bgp = _router_bgp(router.get("bgp"), rpc == "bgp", route_sync, d.get("kubernetes"), segments)
    if vlan is not None and route_sync is None:
        raise TopologyError("vlan: needs a routeSync block (route-sync tags the Nodes' traffic; a Node "
                            "without it cannot reach a tagged segment)")
    if "kubernetes" in d and len({n.datapath for n in nodes}) > 1:
        raise TopologyError("nodes[].datapath: one on a Kubernetes lab (every Node's route-sync reads one "
                            f"ConfigMap): {', '.join(f'{n.name} {n.datapath}' for n in nodes)}")
    return Topology(
        segments=tuple(segments), nodes=tuple(nodes), cluster_cidrs=cluster,
        route_pod_cidrs=rpc is True, router_bgp=router_bgp,
        external_ipv4=ext4, external_ipv6=ext6,
        route_sync=route_sync, bridge=str(d.get("bridge", "br-int")),
        node_pod_routes=bool(d.get("nodePodRoutes", False)),
        kubernetes=_kubernetes(d.get("kubernetes"), route_sync, tuple(n.name for n in nodes)),
        vlan=vlan,
        encryption=_encryption(d.get("encryption", ENCRYPTION_NONE), route_sync, d.get("kubernetes")),
    )


def _encryption(value: Any, route_sync: RouteSyncSpec | None, kubernetes: Any) -> str:
    """The ``encryption`` key: refused where nothing would encrypt (no route-sync), where route-sync
    refuses it (networkPolicyOnly).  On a Kubernetes lab the DaemonSet's ConfigMap turns it on
    (``lab.kube.lab_cluster.route_sync_keys``)."""
    if value not in ENCRYPTIONS:
        raise TopologyError(f"encryption {value!r}: one of {', '.join(ENCRYPTIONS)}")
    if value == ENCRYPTION_NONE:
        return ENCRYPTION_NONE
    if route_sync is None:
        raise TopologyError(f"encryption: {value} needs a routeSync block (route-sync runs the WireGuard device; "
                            "lone Nodes would send Pod traffic in clear)")
    if route_sync.trafficEncapMode == NETWORK_POLICY_ONLY:
        raise TopologyError(f"encryption: {value} is not valid with routeSync.trafficEncapMode {NETWORK_POLICY_ONLY} "
                            "(the primary CNI carries Pod traffic between Nodes; encrypt there)")
    return ENCRYPTION_WIREGUARD


def _vlan(value: Any, where: str) -> int | None:
    """An 802.1Q VLAN ID (1..4094), or None for ``null``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4094:
        raise TopologyError(f"{where} {value!r}: a VLAN ID in [1, 4094] (0 is a priority tag, 4095 reserved)"
                            + (", or none" if where != "vlan" else ""))
    return value


def _router_bgp(value: Any, on: bool, route_sync: RouteSyncSpec | None, kubernetes: Any,
                segments: list[Segment]) -> RouterBgp | None:
    if not on:
        if value is not None:
            raise TopologyError("router.bgp: only with router.routePodCIDRs: bgp")
        return None
    if route_sync is None:
        raise TopologyError("router.routePodCIDRs: bgp needs a routeSync block (route-sync advertises the "
                            "Pod CIDRs)")
    # ``kubernetes: {}`` (what --kubernetes writes) is a Kubernetes lab too: one ConfigMap for every
    # Node, whose peer is ``defaultGateway`` (IPv4) and whose router ID is the Node's IPv4 address
    if kubernetes is not None and not all(s.ipv4 for s in segments):
        raise TopologyError("router.routePodCIDRs: bgp on a Kubernetes lab needs IPv4 on every segment (the "
                            "DaemonSet's one config peers with each Node's IPv4 default gateway and takes the "
                            "Node's IPv4 address as its BGP router ID)")
    v = _mapping(value, "router.bgp")
    unknown = set(v) - set(BGP_KEYS)
    if unknown:
        raise TopologyError(f"router.bgp: unknown keys {sorted(unknown)}")
    out: dict[str, int] = {}
    limits = {"asn": (1, 4294967295), "nodeASN": (1, 4294967295), "holdTime": (3, 65535),
              "gracefulRestart": (0, 4095)}
    for key, attr in BGP_KEYS.items():
        if key in v:
            x = v[key]
            lo, hi = limits[key]
            if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
                raise TopologyError(f"router.bgp.{key} {x!r}: an integer in [{lo}, {hi}]")
            out[attr] = x
    rb = RouterBgp(**out)
    if rb.asn == rb.node_asn:
        raise TopologyError("router.bgp: asn and nodeASN must differ (the lab peers over eBGP; iBGP "
                            "would need the Nodes fully meshed or a route reflector)")
    return rb


def _kubernetes(value: Any, route_sync: RouteSyncSpec | None, node_names: tuple[str, ...]) -> KubeSpec | None:
    try:
        spec = kube_spec.parse(value)
    except kube_spec.KubeSpecError as e:
        raise TopologyError(str(e)) from None
    if spec is not None and route_sync is None:
        raise TopologyError("kubernetes: needs a routeSync block (route-sync runs in Ferry's DaemonSet)")
    unknown = [n for n in (spec.join_later if spec else ()) if n not in node_names]
    if unknown:
        raise TopologyError(f"kubernetes.joinLater: no Node named {', '.join(unknown)}")
    if spec is not None and len(spec.join_later) >= len(node_names):
        raise TopologyError("kubernetes.joinLater: at least one Node must start with the cluster")
    if (spec is not None and route_sync is not None and spec.controller_delivery != DELIVERY_LABELS
            and route_sync.policyPeers != PEERS_SLICES):
        raise TopologyError(f"kubernetes.controllerDelivery {spec.controller_delivery}: only with "
                            f"routeSync.policyPeers {PEERS_SLICES} (ferry-controller runs only then)")
    return spec


def check_route_sync(rs: RouteSyncSpec, datapaths: set[str]) -> None:
    """Refuse ``routeSync`` keys that do not go together (route-sync would refuse them at start),
    naming the key and the reason.  ``datapaths``: those of the Nodes."""
    mode = rs.trafficEncapMode
    problem = None
    if mode not in MODES:
        problem = "trafficEncapMode", f"{mode!r} is not one of {', '.join(MODES)}"
    elif rs.tunnelType == STT and datapaths != {SYSTEM}:
        problem = "tunnelType", "stt needs datapath system on every Node (the netdev datapath has no STT)"
    elif rs.tunnelType not in TUNNEL_TYPES:
        problem = "tunnelType", f"{rs.tunnelType!r} is not one of {', '.join(NETDEV_TUNNEL_TYPES)}"
    elif rs.fastPath and mode not in FAST_PATH_MODES:
        why = "every peer is tunnelled" if mode == ENCAP else "the primary CNI routes"
        problem = "fastPath", (f"only with trafficEncapMode {' or '.join(FAST_PATH_MODES)} (mode is {mode}: "
                               f"{why}, no routed peer to take a fast path)")
    elif rs.noSNAT and mode != NO_ENCAP:
        problem = "noSNAT", f"only with trafficEncapMode noEncap (mode is {mode})"
    elif rs.tunnelPort is not None and rs.tunnelType == GRE:
        problem = "tunnelPort", "gre has no UDP port"
    elif rs.policyPeers not in ("cluster", "peerSlices"):
        problem = "policyPeers", f"{rs.policyPeers!r} is not one of cluster, peerSlices"
    if problem:
        raise TopologyError(f"routeSync.{problem[0]}: {problem[1]}")


def load(path: str | None = None) -> Topology:
    import yaml

    with open(path or DEFAULT_TOPOLOGY) as f:
        return parse(yaml.safe_load(f))


@dataclass(frozen=True)
class Expectation:
    """Which connectivity categories the configuration promises (``check`` runs only these)."""

    configured: frozenset[str] = field(default_factory=frozenset)
    reason: dict[str, str] = field(default_factory=dict)


CATEGORIES = ("same-node", "pod-to-node", "same-subnet", "other-subnet", "pod-to-remote-node",
              "pod-to-external")


def router_routes(topo: Topology) -> str:
    """How the router learns the Pod CIDRs, in words: "bgp" | "static" | "no"."""
    return "bgp" if topo.router_bgp else ("static" if topo.route_pod_cidrs else "no")


def expectation(topo: Topology, route_sync_running: bool) -> Expectation:
    """Same-Node and Pod→own-Node always work (the Node's gateway); everything that leaves the
    Node needs a way back to the Pod CIDR: route-sync (tunnels/routes/masquerade) or the router's
    routes to every Pod CIDR (``routePodCIDRs``)."""
    configured = {"same-node", "pod-to-node"}
    reason: dict[str, str] = {}  # (routePodCIDRs: bgp needs route-sync: it is what advertises)
    cross = ("same-subnet", "other-subnet", "pod-to-remote-node", "pod-to-external")
    if route_sync_running or topo.route_pod_cidrs:
        configured.update(cross)
    else:
        for c in cross:
            reason[c] = "not configured: no route-sync and router.routePodCIDRs is false"
    return Expectation(frozenset(configured), reason)


def to_doc(topo: Topology) -> dict[str, Any]:
    """The YAML document that ``parse`` turns back into ``topo`` (stored in the lab dir)."""
    rs = topo.route_sync
    return {
        "bridge": topo.bridge,
        "clusterCIDRs": list(topo.cluster_cidrs),
        "segments": {s.name: {**{f"ipv{f}": s.cidr(f) for f in s.families}, "mtu": s.mtu}
                     for s in topo.segments},
        "router": {"routePodCIDRs": "bgp" if topo.router_bgp else topo.route_pod_cidrs,
                   **({"bgp": {k: getattr(topo.router_bgp, a) for k, a in BGP_KEYS.items()}}
                      if topo.router_bgp else {}),
                   "external": {f"ipv{f}": topo.external_cidr(f) for f in FAMILIES if topo.external_cidr(f)}},
        "nodes": [{"name": n.name, "segment": n.segment, "index": n.index, "datapath": n.datapath,
                   "podCIDRs": list(n.pod_cidrs),
                   **({"vlan": n.vlan if n.vlan is not None else UNTAGGED} if topo.vlan is not None else {})}
                  for n in topo.nodes],
        "routeSync": None if rs is None else {k: getattr(rs, k) for k in RouteSyncSpec.__dataclass_fields__},
        "nodePodRoutes": topo.node_pod_routes,
        "kubernetes": None if topo.kubernetes is None else topo.kubernetes.to_doc(),
        "vlan": topo.vlan,
        "encryption": topo.encryption,
    }
