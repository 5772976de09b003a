"""Per-path MTU in the Pod: its interface MTU and the routes it holds, each route carrying the
MTU of the path behind it.  Pure and standard-library only: ADD and CHECK (per Pod) and
route-sync (every running Pod, when a path or the underlay changes) call the same function.

The Pod's interface carries the transport (underlay) MTU.  Its routes, per family it has an
address of (``gw`` = the Node's gateway address of that family):

    mode               routes (besides the kernel's connected route to the Node's own Pod CIDR)
    noEncap            default via gw, full MTU
    encap              default via gw, full MTU; each cluster prefix via gw, tunnel MTU
    hybrid             as encap, plus each routed (same-subnet) peer's Pod CIDR via gw, full MTU
    networkPolicyOnly  (chained: the primary CNI's routes, not these)
    any, encrypted     as encap (WireGuard carries every peer: its MTU is "tunnel")

"Full" is the transport MTU (capped at 65000), "tunnel" that minus the tunnel's overhead
(``routesync/mtu.py``).  Same-Node Pods use the connected route: the interface's (full) MTU.
The cluster prefixes are the state file's ``clusterCIDRs`` with every prefix inside another one,
inside this Node's Pod CIDRs, or equal to a routed peer's CIDR dropped: with the cluster CIDRs
configured that is one route per family however many Nodes join.

Bound, per family: 1 + ``CLUSTER_ROUTES_MAX`` + ``ROUTED_ROUTES_MAX`` routes (1 + 8 + 32).
* More than ``ROUTED_ROUTES_MAX`` routed peers (hybrid): the first ones by address keep a
  full-MTU route, the others are reached through the cluster prefix at the tunnel MTU (safe:
  smaller than their path carries, never larger).
* More than ``CLUSTER_ROUTES_MAX`` cluster prefixes (no ``clusterCIDRs`` configured, so every
  peer's Pod CIDR is listed alone): no cluster routes, the default route takes the tunnel MTU
  (again only ever smaller than a path carries); routed peers keep their full-MTU routes.

Single MTU (every route and the interface at ``mtu``, and no per-route MTU in the result): a
lone Node (no state file), a state file of an older route-sync (no ``transportMTU``), the
conf's ``mtu`` or route-sync's ``defaultMTU`` set (the operator chose one MTU)."""

from __future__ import annotations

from cni.lean import addr
from cni.lean.record import record
from cni.lean.typecheck import TYPE_CHECKING
from cni.pipeline.modes import ENCAP, ENCRYPTION_NONE, HYBRID, ROUTED_PATHS, TUNNELLED_MODES

if TYPE_CHECKING:
    from cni.node.nodestate import NodeState
    from cni.pipeline.modes import Mode

CLUSTER_ROUTES_MAX = 8
ROUTED_ROUTES_MAX = 32
DEFAULT = {4: "0.0.0.0/0", 6: "::/0"}


@record(frozen=True)
class PodRoute:
    dst: str  # canonical CIDR
    gw: str
    mtu: int  # 0: none on the route (the interface's)


@record(frozen=True)
class PodNet:
    """What a Pod should hold: its interface MTU and its routes (both families, sorted)."""

    mtu: int
    routes: tuple[PodRoute, ...]


def _key(cidr: str) -> tuple[int, int, int]:
    value, plen, bits = addr.parse_cidr(cidr)
    return bits, addr.network(value, plen, bits), plen


def _inside(inner: tuple[int, int, int], outer: tuple[int, int, int]) -> bool:
    bits, value, plen = inner
    obits, ovalue, oplen = outer
    return bits == obits and plen >= oplen and addr.network(value, oplen, bits) == ovalue


def aggregate(cidrs: list[str], local: list[str]) -> list[str]:
    """``cidrs`` canonical, without those inside another one or inside a ``local`` CIDR."""
    keys = sorted({_key(c) for c in cidrs}, key=lambda k: (k[0], k[2], k[1]))
    locals_ = [_key(c) for c in local]
    kept: list[tuple[int, int, int]] = []
    for k in keys:  # shorter prefixes first: a later one inside a kept one is dropped
        if any(_inside(k, o) for o in kept) or any(_inside(k, o) for o in locals_):
            continue
        kept.append(k)
    return sorted(f"{addr.format_ip(v, b)}/{p}" for b, v, p in kept)


def plan(mode: Mode | None, tunnel_mtu: int, full_mtu: int, gateways: dict[int, str], cluster_cidrs: list[str],
         local_cidrs: list[str], routed_cidrs: list[str]) -> PodNet:
    """The Pod's interface MTU and routes.  ``gateways``: family -> the gateway address the Pod
    uses (only those families get routes); ``routed_cidrs``: the Pod CIDRs of peers whose path
    is never encapsulated (hybrid's routed peers); ``full_mtu`` 0: single MTU ``tunnel_mtu``."""
    if not full_mtu or mode not in TUNNELLED_MODES or full_mtu <= tunnel_mtu:
        single = full_mtu or tunnel_mtu
        mtu = single if full_mtu else 0
        return PodNet(single, tuple(PodRoute(DEFAULT[f], gateways[f], mtu) for f in sorted(gateways)))
    routes: list[PodRoute] = []
    for family in sorted(gateways):
        gw = gateways[family]
        mine = [c for c in local_cidrs if addr.family(c) == family]
        routed = sorted({addr.canonical_network(c) for c in routed_cidrs if addr.family(c) == family} if
                        mode == HYBRID else set(), key=_key)
        routed = aggregate(routed, mine)
        if len(routed) > ROUTED_ROUTES_MAX:
            routed = sorted(routed, key=_key)[:ROUTED_ROUTES_MAX]
        cluster = aggregate([c for c in cluster_cidrs if addr.family(c) == family], mine)
        cluster = [c for c in cluster if c not in routed]
        default_mtu = full_mtu
        if len(cluster) > CLUSTER_ROUTES_MAX:
            cluster, default_mtu = [], tunnel_mtu
        routes.append(PodRoute(DEFAULT[family], gw, default_mtu))
        routes += [PodRoute(c, gw, tunnel_mtu) for c in cluster]
        routes += [PodRoute(c, gw, full_mtu) for c in routed]
    return PodNet(full_mtu, tuple(routes))


@record(frozen=True)
class PodInputs:
    """What of the node state decides any Pod's :class:`PodNet`, already reduced the way
    :func:`plan` reduces it: route-sync re-converges its Pods when this changes, and converges
    each Pod from it (:func:`plan_for`) without reducing the state's every peer again.  The
    cluster prefixes are aggregated (5,000 Nodes' Pod CIDRs inside the configured cluster CIDR:
    that one CIDR), routed CIDRs are kept only where :func:`plan` reads them (hybrid)."""

    mode: Mode | None  # the mode the routes follow (encrypted: encap)
    mtu: int  # the tunnel (or single) MTU
    full_mtu: int  # the transport MTU; 0: single MTU
    cluster: tuple[str, ...]  # aggregate(clusterCIDRs, podCIDRs)
    local: tuple[str, ...]  # this Node's Pod CIDRs
    routed: tuple[str, ...]  # hybrid: aggregate(the routed peers' Pod CIDRs, podCIDRs); else ()
    gateways: tuple[str, ...]  # the Node's gateway addresses (CIDRs)


def routes_mode(state: NodeState) -> Mode:
    """The mode a Pod's routes follow: encrypted, every other Node's Pods are behind WireGuard's
    MTU, as behind encap's tunnel."""
    return ENCAP if state.encryption != ENCRYPTION_NONE else state.mode


def pod_inputs(state: NodeState, cluster: tuple[str, ...] | None = None) -> PodInputs:
    """:class:`PodInputs` of ``state``; ``cluster``: ``aggregate(state.clusterCIDRs,
    state.podCIDRs)`` when the caller kept it (the reduction of every peer's CIDR is the cost)."""
    mode = routes_mode(state)
    local = list(state.podCIDRs)
    if cluster is None:
        cluster = tuple(aggregate(list(state.clusterCIDRs), local))
    routed: tuple[str, ...] = ()
    if mode == HYBRID:
        routed = tuple(aggregate([addr.canonical_network(c) for p in state.peers if p.path in ROUTED_PATHS
                                  for c in p.podCIDRs], local))
    return PodInputs(mode, state.mtu, state.transportMTU, cluster, tuple(local), routed,
                     tuple(state.gateway.addresses))


def plan_for(inputs: PodInputs, gateways: dict[int, str]) -> PodNet:
    """:func:`plan` from :class:`PodInputs` (what :func:`for_state` gives for the same state)."""
    return plan(inputs.mode, inputs.mtu, inputs.full_mtu, gateways, list(inputs.cluster), list(inputs.local),
                list(inputs.routed))


def for_state(state: NodeState | None, gateways: dict[int, str], conf_mtu: int = 0,
              fallback_mtu: int = 1500) -> PodNet:
    """:func:`plan` from the node state file (None: a lone Node).  ``conf_mtu`` > 0 (the conf's
    ``mtu``) forces a single MTU."""
    if state is None or conf_mtu:
        return plan(None, conf_mtu or fallback_mtu, 0, gateways, [], [], [])
    return plan_for(pod_inputs(state), gateways)


def gateways_of(state: NodeState | None, ips: list[str]) -> dict[int, str]:
    """family -> gateway address for a Pod holding ``ips`` (CIDRs): the Node's gateway address
    of each family the Pod has an address of."""
    fams = {addr.family(i) for i in ips}
    out: dict[int, str] = {}
    if state is not None:
        for g in state.gateway.addresses:
            f = addr.family(g)
            if f in fams and f not in out:
                out[f] = addr.host(g)
    return out


@record(frozen=True)
class PodChanges:
    """What to do to a Pod so that it holds :class:`PodNet`: the interface MTU (None: keep), then
    the routes to add or replace, then the routes to delete (``(dst, gw)``)."""

    mtu: int | None
    put: tuple[PodRoute, ...]
    delete: tuple[tuple[str, str], ...]

    @property
    def empty(self) -> bool:
        return self.mtu is None and not self.put and not self.delete


def changes(want: PodNet, have_mtu: int, have: list[tuple[str, str, int]]) -> PodChanges:
    """The difference between ``want`` and what the Pod's interface holds: ``have_mtu`` and
    ``have``, its routes through a gateway ``(dst, gw, mtu)`` (the plugin's: default, cluster,
    routed peers; the kernel's connected routes are never touched).  Addresses compared in
    canonical form."""
    wanted = {(addr.canonical_network(r.dst), addr.host(r.gw)): r for r in want.routes}
    present: dict[tuple[str, str], int] = {}
    for dst, gw, mtu in have:
        present[(addr.canonical_network(dst), addr.host(gw))] = mtu
    put = tuple(r for k, r in sorted(wanted.items()) if present.get(k) != r.mtu)
    delete = tuple(k for k in sorted(present) if k not in wanted)
    return PodChanges(want.mtu if have_mtu != want.mtu else None, put, delete)
