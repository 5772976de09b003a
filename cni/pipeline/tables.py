"""Ferry's OpenFlow pipeline, declared once for the plugin and route-sync.

Everything both processes must agree on lives here: table numbers and names, each table's miss
and priority ladder (:class:`Ladder`, :data:`PIPELINE`), the cookie layout (who owns a flow,
which Pod or peer it belongs to), register bits, the virtual MAC of the tunnel path, the names of
the ports Ferry creates and the ``external_ids`` it writes on them (the traffic modes and peer
paths: :mod:`cni.pipeline.modes`).  Standard library only: the plugin imports this on every
ADD/DEL.

Packet walk (IPv4 and IPv6 alike):

    Classifier ──pod port──► SpoofGuard ──ARP / NS──► NeighborResponder
         │                      └─IP──► Conntrack ─ct()─► ConntrackState ─+est/+rel─► ConntrackCommit
         ├─gateway port: ARP/NS ► NeighborResponder,        │ reply of a host-forwarded connection ► its port
         │               IP ► Conntrack                     └─+new─► EgressRule ─miss─► EgressDefault
         ├─tunnel port: dst MAC := gateway MAC ► Conntrack                │ allowed            │ not isolated
         └─uplink (fast path): local Pod CIDR ─► Conntrack                ▼                    ▼
                                                   IngressRule ─miss─► IngressDefault ─not isolated─►
                                                   ConntrackCommit ──► L3Forwarding ──► L2Forwarding ──► port

* SpoofGuard admits a Pod's packet only with the Pod's own MAC and addresses (IP, ARP sender,
  NA target), and drops router advertisements from Pods.
* NeighborResponder answers ARP for the gateway and each local Pod (so nothing floods), and
  steers IPv6 neighbour solicitations to the port that owns the target.
* Conntrack looks every IP packet up in zone :data:`CT_ZONE`; ConntrackState passes a reply of
  a known connection (``+est+rpl``, ``+rel``) on to ConntrackCommit without a policy lookup; a
  packet in a connection's original direction goes through NetworkPolicy (below: a policy that
  starts to deny a connection stops it), and a ``+new`` one is committed after it.
* NetworkPolicy (route-sync, ``routesync/policy``): EgressRule and IngressRule hold each rule
  as an OVS conjunction (the Pods it applies to, its peers, its ports: one flow per element of
  each, plus one ``conj_id`` flow that counts the rule's connections); EgressDefault and
  IngressDefault drop a new connection of a Pod a policy isolates that no rule allowed.  A Pod
  the plugin plugs in a namespace that has policies gets a *pending* drop in ConntrackState
  (:func:`cni.pipeline.flows.pending_flows`) until route-sync has its policy in force.
* Conntrack and ConntrackState keep the Node's own conntrack in both directions of every connection
  the host forwarded for a local Pod (kube-proxy's Service DNAT): what a local Pod sends that
  enters OVS from the host (the gateway port; on the fast path also the host's uplink port) is
  flagged in reg0 and committed (ConntrackCommit) with a mark saying which port; a
  reply of a marked connection goes back to the host through that port (the host undoes its
  NAT and routes it on) instead of to the Pod (:mod:`cni.pipeline.services`).
* L3Forwarding rewrites routed packets (dst MAC = gateway MAC): to a local Pod, to a tunnel,
  or (fast path) to the uplink.  What it does not match falls through unchanged.
* L2Forwarding outputs by destination MAC: each Pod's MAC to its port, the gateway MAC to the
  gateway port (host routing: the Node, external hosts, underlay-routed peers).
"""

from __future__ import annotations

from cni.lean.record import record
from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from cni.pipeline.actions import Action
    from cni.pipeline.match import MatchItem

try:  # the C builtin; ``hashlib`` would also load OpenSSL (~4 ms per exec)
    from _sha256 import sha256
except ImportError:  # Python >= 3.12 calls it _sha2
    try:
        from _sha2 import sha256  # type: ignore[no-redef]
    except ImportError:
        from hashlib import sha256  # type: ignore[no-redef]


# Tables and owners are int subclasses with named constants rather than enum.IntEnum: ``enum``
# costs ~8 ms to import, paid on every ADD/DEL.  ``Table(30)`` and ``int(Table.X)`` work as before.
class Table(int):
    """OpenFlow tables, named for what they do (Antrea's convention)."""

    CLASSIFIER: Table
    SPOOF_GUARD: Table
    NEIGHBOR_RESPONDER: Table
    CONNTRACK: Table
    CONNTRACK_STATE: Table
    EGRESS_ADMIN: Table
    EGRESS_RULE: Table
    EGRESS_DEFAULT: Table
    EGRESS_BASELINE: Table
    INGRESS_ADMIN: Table
    INGRESS_RULE: Table
    INGRESS_DEFAULT: Table
    INGRESS_BASELINE: Table
    CONNTRACK_COMMIT: Table
    L3_FORWARDING: Table
    L2_FORWARDING: Table


Table.CLASSIFIER = Table(0)
Table.SPOOF_GUARD = Table(10)
Table.NEIGHBOR_RESPONDER = Table(20)
Table.CONNTRACK = Table(25)
Table.CONNTRACK_STATE = Table(26)
Table.EGRESS_ADMIN = Table(36)
Table.EGRESS_RULE = Table(40)
Table.EGRESS_DEFAULT = Table(41)
Table.EGRESS_BASELINE = Table(44)
Table.INGRESS_ADMIN = Table(46)
Table.INGRESS_RULE = Table(50)
Table.INGRESS_DEFAULT = Table(51)
Table.INGRESS_BASELINE = Table(54)
Table.CONNTRACK_COMMIT = Table(60)
Table.L3_FORWARDING = Table(70)
Table.L2_FORWARDING = Table(80)


class Ladder:
    """One table, declared once: its number, what happens to a packet no flow matches (its miss
    flow goes on to ``MISS_GOTO``; None: dropped, Antrea's ``defaultDrop``), and its priority
    ladder: one named rung (a class attribute) per reason a flow sits where it does.  Planners
    name a rung, never a number (``Classifier.TUNNEL_IN``), so a table's order reads here whole;
    rungs sharing a value hold flows whose matches are disjoint.  The miss flows are built from
    this (:func:`cni.pipeline.flows.miss_flows`).  Each table's class says what it is for in a
    comment, not a docstring: this module is on the per-Pod path, and so is its size."""

    TABLE: Table
    MISS_GOTO: Table | None = None
    MISS = 0  # the miss flow, every table's lowest rung


# Where a packet came in: a Pod, the gateway, the tunnel, the uplink.
class Classifier(Ladder):
    TABLE = Table.CLASSIFIER
    TUNNEL_IN = 210  # NODE: from the tunnel: dst MAC := gateway MAC, to Conntrack (above the gateway's)
    POD = 200  # a Pod's port, to SpoofGuard
    GATEWAY_NEIGHBOR = 200  # the gateway's ARP and neighbour solicitations, to NeighborResponder
    GATEWAY_REDIRECT = 200  # the host's ICMP redirects, dropped
    GATEWAY = 190  # the rest of the gateway's traffic, to Conntrack
    FAST_IN = 20  # PEER: from the uplink, a fast peer's Pods to ours (above the pass-through)
    HOST_OUT = 15  # NODE: a local Pod's packet the host routes out of its uplink port (above the pass-through)
    UPLINK_PASS = 10  # NODE (UPLINK_COOKIE): host traffic between the moved uplink and its internal port


# A Pod's packet passes only with the Pod's own MAC and addresses.
class SpoofGuard(Ladder):
    TABLE = Table.SPOOF_GUARD
    DROP_RA = 210  # router advertisements and redirects from a Pod
    ALLOW_NA = 205  # a neighbour advertisement for one of the Pod's own addresses
    DROP_NA = 204  # any other neighbour advertisement
    ALLOW_NS = 203  # a neighbour solicitation from one of the Pod's own addresses, to NeighborResponder
    POD = 200  # ARP and IP from the Pod's own MAC and address


# ARP answered, neighbour solicitations steered to the port that owns the target.
class NeighborResponder(Ladder):
    TABLE = Table.NEIGHBOR_RESPONDER
    GRATUITOUS = 210  # a Pod's gratuitous ARP, to the gateway port (the Node's cache)
    NEXT_HOP = 205  # a chained Pod's next hops, answered with the gateway's MAC (above ANSWER)
    ANSWER = 200  # the gateway's, each local Pod's and each tunnel peer's gateway address


# Every IP packet looked up in :data:`CT_ZONE`; what is not IP goes on unchanged.
class Conntrack(Ladder):
    TABLE = Table.CONNTRACK
    MISS_GOTO = Table.L3_FORWARDING
    VIA_GATEWAY = 210  # a local Pod's packet the host forwards in through the gateway: flagged in reg0
    LOOKUP = 200


# Known connections' replies skip policy; the rest goes through it.
class ConntrackState(Ladder):
    TABLE = Table.CONNTRACK_STATE
    MISS_GOTO = Table.EGRESS_ADMIN
    PENDING = 230  # POD: a Pod whose policy is not in force yet, no new connection
    FROM_HOST = 215  # a reply that comes from the host never goes back to it
    HOST_RETURN = 210  # a reply of a connection the host forwarded goes back through its port
    KNOWN = 200  # +est+rpl / +rel: past policy to ConntrackCommit


# The policy tiers, in evaluation order per direction: the administrator's ClusterNetworkPolicies
# (Admin tier), NetworkPolicy, ClusterNetworkPolicies of the Baseline tier (route-sync,
# ``routesync/policy``).  A tier's rule is a conjunction at the rung of its policy's priority and
# its place in the policy (TOP - 26 * priority - index: lower priority values first); its
# conj_id flow accepts (on to the next direction), denies (drop) or passes (on to the next tier).
class EgressAdmin(Ladder):
    TABLE = Table.EGRESS_ADMIN
    MISS_GOTO = Table.EGRESS_RULE
    SERVICE = 65000  # to a Service CIDR: judged after the host's DNAT (as in EgressRule)
    TOP = 60000  # the first rule of a priority-0 policy


# NetworkPolicy egress rules as conjunctions.
class EgressRule(Ladder):
    TABLE = Table.EGRESS_RULE
    MISS_GOTO = Table.EGRESS_DEFAULT
    SERVICE = 220  # to a Service CIDR: judged after the host's DNAT
    CONJ = 200  # a rule's clauses and its conj_id flow


class EgressDefault(Ladder):
    TABLE = Table.EGRESS_DEFAULT
    MISS_GOTO = Table.EGRESS_BASELINE
    ISOLATED_NEW = 210  # its new connection's packet also goes up to route-sync (metered): the denied log
    ISOLATED = 200  # a Pod a policy isolates for egress: what no rule allowed is dropped
    REMOTE_ISOLATED_NEW = 195  # the remote drop's conj_id with ct +new: up to route-sync too (the denied log)
    REMOTE_ISOLATED = 190  # a remote Pod isolated for egress, to a local Pod: the same (below: never a local source)


# What NetworkPolicy does not isolate: the Baseline tier.
class EgressBaseline(Ladder):
    TABLE = Table.EGRESS_BASELINE
    MISS_GOTO = Table.INGRESS_ADMIN
    TOP = 60000


class IngressAdmin(Ladder):
    TABLE = Table.INGRESS_ADMIN
    MISS_GOTO = Table.INGRESS_RULE
    TOP = 60000


class IngressRule(Ladder):
    TABLE = Table.INGRESS_RULE
    MISS_GOTO = Table.INGRESS_DEFAULT
    HOST = 220  # from the Node's own addresses (kubelet probes)
    CONJ = 200


class IngressDefault(Ladder):
    TABLE = Table.INGRESS_DEFAULT
    MISS_GOTO = Table.INGRESS_BASELINE
    ISOLATED_NEW = 210
    ISOLATED = 200


class IngressBaseline(Ladder):
    TABLE = Table.INGRESS_BASELINE
    MISS_GOTO = Table.CONNTRACK_COMMIT
    TOP = 60000


# A new connection committed, with the mark of the host port it came through, if any.
class ConntrackCommit(Ladder):
    TABLE = Table.CONNTRACK_COMMIT
    MISS_GOTO = Table.L3_FORWARDING
    COMMIT_VIA = 210  # flagged in reg0: committed with that mark
    VIA_KNOWN = 209  # NODE: a known connection's later packets from the host's uplink port, out the uplink
    COMMIT = 200


# Routed packets (dst MAC = gateway MAC) rewritten for their next hop; the rest unchanged.
class L3Forwarding(Ladder):
    TABLE = Table.L3_FORWARDING
    MISS_GOTO = Table.L2_FORWARDING
    POD = 200  # to a local Pod
    PEER = 200  # PEER: to a tunnel or fast-path peer's Pod CIDR


class L2Forwarding(Ladder):
    TABLE = Table.L2_FORWARDING
    POD = 200  # a Pod's MAC to its port
    GATEWAY = 200  # the gateway's MAC, and unsolicited NAs, to the gateway port


# In packet order; each table exactly once.
PIPELINE: tuple[type[Ladder], ...] = (Classifier, SpoofGuard, NeighborResponder, Conntrack, ConntrackState,
                                      EgressAdmin, EgressRule, EgressDefault, EgressBaseline,
                                      IngressAdmin, IngressRule, IngressDefault, IngressBaseline, ConntrackCommit,
                                      L3Forwarding, L2Forwarding)


def ladder(table: Table) -> type[Ladder]:
    """The declaration of ``table``."""
    for decl in PIPELINE:
        if decl.TABLE == table:
            return decl
    raise KeyError(f"no table {int(table)} in the pipeline")

# The OpenFlow meter (route-sync's) that bounds the packet-ins of NetworkPolicy's denied log.
DENIED_LOG_METER = 1

# Ferry's conntrack zone in OVS (apart from the host's zone 0 on the kernel datapath, where both
# share one table), and the ct_mark bits of a connection the host forwarded: which port of the
# bridge its first packets came from, so its replies go back there.
CT_ZONE = 0xFE00
CT_MARK_VIA_GATEWAY = 0x1
CT_MARK_VIA_UPLINK = 0x2
CT_MARK_VIA_MASK = 0x3
# reg0 (``cni.pipeline.match.REG0``) carries the same bits from Conntrack, where the port is
# known, to ConntrackCommit, which writes them into the connection's mark.


class Owner(int):
    """Top byte of a flow's cookie: which part of Ferry installed the flow."""

    BASE: Owner  # per-bridge flows (table-miss, gateway); route-sync, or the plugin on a lone Node
    POD: Owner  # per-Pod flows; the plugin
    PEER: Owner  # per-peer flows (tunnel, fast path); route-sync
    NODE: Owner  # per-Node flows that depend on mode (tunnel/uplink classifier); route-sync
    POLICY: Owner  # NetworkPolicy flows (one cookie per flow: its match's hash); route-sync


Owner.BASE = Owner(0x01)
Owner.POD = Owner(0x02)
Owner.PEER = Owner(0x03)
Owner.NODE = Owner(0x04)
Owner.POLICY = Owner(0x05)


OWNER_SHIFT = 56
ID_MASK = (1 << OWNER_SHIFT) - 1
FULL_MASK = (1 << 64) - 1


@record(frozen=True)
class Cookie:
    """A flow cookie: ``owner`` in the top byte, a 56-bit ``ident`` below.

    ``match`` gives the ``cookie=V/M`` text that selects exactly the flows of one owner+ident
    (install and delete are built on the same value, so they cannot disagree)."""

    owner: Owner
    ident: int = 0

    @property
    def value(self) -> int:
        v: int | None = self.__dict__.get("_value")
        if v is None:  # memoized: route-sync compares thousands of flows per pass
            v = (int(self.owner) << OWNER_SHIFT) | (self.ident & ID_MASK)
            object.__setattr__(self, "_value", v)
        return v

    def match(self) -> str:
        return f"0x{self.value:x}/0x{FULL_MASK:x}"

    @staticmethod
    def owner_match(owner: Owner) -> str:
        """``cookie=V/M`` selecting every flow of one owner (e.g. all per-Pod flows)."""
        return f"0x{int(owner) << OWNER_SHIFT:x}/0x{0xFF << OWNER_SHIFT:x}"

    @staticmethod
    def parse(value: int) -> Cookie:
        return Cookie(Owner(value >> OWNER_SHIFT), value & ID_MASK)


def _hash56(*parts: str) -> int:
    digest = sha256("\x00".join(parts).encode()).digest()
    return int.from_bytes(digest[:7], "big")


def pod_cookie(container_id: str, ifname: str) -> Cookie:
    """Cookie of one attachment's flows; a stale sandbox (other container ID) never matches."""
    return Cookie(Owner.POD, _hash56(container_id, ifname))


def peer_cookie(peer_name: str) -> Cookie:
    return Cookie(Owner.PEER, _hash56(peer_name))


def policy_cookie(key: str) -> Cookie:
    """Cookie of one NetworkPolicy flow, from its identity (table, priority, match)."""
    return Cookie(Owner.POLICY, _hash56("policy", key))


BASE_COOKIE = Cookie(Owner.BASE, 0)
NODE_COOKIE = Cookie(Owner.NODE, 0)
UPLINK_COOKIE = Cookie(Owner.NODE, 1)  # route-sync's uplink bridge <-> br-int flows (routesync/apply/uplink.py)

# Destination MAC of packets that cross a tunnel; the receiving Node rewrites it to its own
# gateway MAC in the Classifier, so L3Forwarding sees one "routed" MAC. Locally administered.
VIRTUAL_MAC = "aa:bb:cc:dd:ee:ff"

# Port and interface names (at most MAX_IFNAME bytes).
DEFAULT_BRIDGE = "br-int"
GATEWAY_PORT = "ferry-gw0"
TUNNEL_PORT = "ferry-tun0"
HOST_VETH_PREFIX = "fry"  # + 12 hex digits of a hash of (container ID, ifname)
MAX_IFNAME = 15  # the longest name the kernel takes: IFNAMSIZ (16, cni.spec.protocol) less the NUL

# OVS external_ids keys written on each Pod's Port (route-sync replays Pod flows from them).
EXT_CONTAINER_ID = "ferry-container-id"
EXT_IFNAME = "ferry-ifname"
EXT_POD_NAME = "ferry-pod-name"
EXT_POD_NAMESPACE = "ferry-pod-namespace"
EXT_IPS = "ferry-ips"  # comma-separated CIDRs
EXT_MAC = "ferry-mac"
EXT_NETNS = "ferry-netns"
EXT_OWNER = "ferry-owner"  # OWNER_POD on Pod ports, OWNER_NODE on gateway/tunnel/uplink ports
OWNER_POD = "pod"
OWNER_NODE = "node"
# On the gateway Interface (route-sync): the MAC it keeps across a recreation of the port.
EXT_GATEWAY_MAC = "ferry-gateway-mac"
# What a chained (networkPolicyOnly) ADD changed on the primary CNI's objects, kept on the Pod's
# port for its DEL (cni/commands/chained.py); route-sync's replay and GC read the first two.
EXT_CHAINED = "ferry-chained"  # "1": this port belongs to a chained attachment
EXT_CHAINED_GATEWAYS = "ferry-chained-gateways"  # the Pod's next hops OVS answers for: "10.244.1.1,fd00::1"
EXT_CHAINED_ROUTES = "ferry-chained-routes"  # host routes moved to the gateway port: "dst|proto|metric;..."
EXT_CHAINED_SYSCTLS = "ferry-chained-sysctls"  # the host end's values before: "arp_ignore=0,rp_filter=2,..."
EXT_CHAINED_V6ADDRS = "ferry-chained-v6addrs"  # global IPv6 addresses disable_ipv6 removed from the host end
EXT_CHAINED_TXCSUM = "ferry-chained-txcsum"  # the Pod interface's TX checksum offload before ("1"/"0")


# ofport_request values for Pod ports: above what vswitchd hands out by itself (it counts up from
# 1 for route-sync's few ports), below OFPP_MAX (0xff00).
POD_OFPORT_MIN, POD_OFPORT_MAX = 1024, 65279


def pod_ofports(container_id: str, ifname: str, count: int = 8) -> tuple[int, ...]:
    """Candidate ofports for one attachment, in order: the plugin asks OVS for the first one that
    is free, so it knows the port number, and can install the Pod's flows, before vswitchd has
    opened the interface."""
    digest = sha256(f"{container_id}\x00{ifname}\x00ofport".encode()).digest()
    span = POD_OFPORT_MAX - POD_OFPORT_MIN + 1
    return tuple(POD_OFPORT_MIN + int.from_bytes(digest[4 * i:4 * i + 4], "big") % span for i in range(count))


def host_veth_name(container_id: str, ifname: str, salt: int = 0) -> str:
    """Host end of a Pod's veth: ``fry`` + 12 hex digits. ``salt`` > 0 resolves a collision."""
    h = sha256(f"{container_id}\x00{ifname}\x00{salt}".encode()).hexdigest()
    return f"{HOST_VETH_PREFIX}{h[:12]}"


@record(frozen=True)
class Flow:
    """One OpenFlow flow as typed values: ``match`` (:mod:`cni.pipeline.match` fields and protocol
    shorthands) and ``actions`` (:mod:`cni.pipeline.actions`; empty: drop).  The OpenFlow codec
    (:mod:`cni.ovs.openflow.codec`) encodes these values; ``text()`` renders ovs-ofctl syntax for
    logs, dumps and tests.  Values are validated when they are built (MACs, addresses, ofports)."""

    table: Table
    priority: int
    match: tuple[MatchItem, ...]
    actions: tuple[Action, ...]
    cookie: Cookie = BASE_COOKIE

    def match_text(self) -> str:
        return ",".join(m.text() for m in self.match)

    def actions_text(self) -> str:
        return ",".join(a.text() for a in self.actions) or "drop"

    def text(self) -> str:
        t: str | None = self.__dict__.get("_text")
        if t is None:  # memoized (frozen, so it cannot go stale)
            match = self.match_text()
            match = f",{match}" if match else ""
            t = (f"table={int(self.table)},priority={self.priority},cookie=0x{self.cookie.value:x}"
                 f"{match},actions={self.actions_text()}")
            object.__setattr__(self, "_text", t)
        return t

    def key(self) -> tuple[int, int, str]:
        """Identity in OpenFlow's sense: a second flow with the same key replaces this one."""
        return (int(self.table), self.priority, self.match_text())
