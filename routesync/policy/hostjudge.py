"""NetworkPolicy judged on the host, for the connections kube-proxy's NAT takes past OVS: pure.

OVS judges a Pod's packets where it sees them, but kube-proxy rewrites a Service connection in
the Node's stack, after the packet left OVS through the gateway port:

* **egress after a DNAT.**  A Pod's connection to a ClusterIP (or a NodePort, an external IP)
  is DNATed on its Node's host.  When the backend is a Pod that the host routes back into OVS
  through the gateway, OVS judges the Pod's egress on the backend there.  When it is anything
  else (the API server, a hostNetwork Pod on this or another Node, a selector-less Service's
  external endpoint; in routed modes a Pod on another Node, reached through the uplink) the
  packet never comes back into OVS: the chains ``input`` and ``forward`` (priority ``filter``,
  after kube-proxy's DNAT at ``dstnat``) judge the first packet of every such connection
  (``ct state new``, ``ct status dnat``, not leaving through the gateway) from a local Pod that
  a policy isolates for egress, on its DNATed destination and port, by the same rules OVS uses.
* **ingress after a masquerade.**  A NodePort connection (``externalTrafficPolicy: Cluster``)
  is SNATed to the Node's own address, which OVS lets reach every Pod (kubelet probes).  The
  chain ``postrouting`` (priority ``srcnat + 10``, after kube-proxy's masquerade) judges every
  new SNATed connection entering OVS through the gateway to a local Pod a policy isolates for
  ingress, on its *original* client (``ct original ip saddr``): the Pod's ingress rules, the
  Node's own addresses (a NodePort the Node opens itself) and the Pod itself (a hairpin
  through its own Service) pass, the rest is dropped.

The rules are the plan's own (:class:`routesync.policy.plan.HostRule`, one per local
conjunction): per rule a set of the Pods it applies to and one of its peers (addresses and
blocks), its ports inline.  A Pod no policy isolates in a direction is passed at once by a set
lookup (``return``), so a connection of a Pod without policy costs one lookup, and an
established one nothing (``ct state new`` first).  What the plan does not know yet fails
closed in OVS: a Pod still pending (its namespace has policies, route-sync has not planned it)
is dropped there before its packets reach the host.

A connection from such a Pod to an address of the Service CIDRs that kube-proxy did *not*
DNAT (a ClusterIP no Service holds, or one kube-proxy has not programmed yet) goes through the
same chain, where only an ``ipBlock`` covering that address lets it on: OVS passes every
connection to the Service CIDRs to the host unjudged, so the host must not route it onwards
unjudged either.

Rendered as the body of ``table inet ferry_policy`` (``routesync.apply.nft.POLICY_TABLE``), as
sets and chains (``routesync.nftbody.NftBody``), which :class:`routesync.apply.nft.NftApplier`
writes whole and atomically when its chains or sets' declarations moved, and changes by set
element when only elements did (a Pod event: an address into or out of a few rules' sets, where
the whole body is megabytes at 30,000 Pods); its fingerprint makes an unchanged judge cost no
write."""

from __future__ import annotations

import ipaddress
import socket
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..nftbody import NftBody, NftChain, NftSet
from .cnp.model import ACCEPT, ADMIN, BASELINE, DENY, PASS
from .cnp.plan import TierHostRule, TierPlan
from .deniedlog import EGRESS, INGRESS
from .plan import HostRule, Plan, block_text

FAMILIES = ((4, "ip", "ipv4_addr"), (6, "ip6", "ipv6_addr"))
_L4 = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}


@dataclass(frozen=True)
class HostJudge:
    """What the host's judge needs: the gateway port's name, the Node's own addresses, and
    per direction the local Pods' addresses that a policy isolates, with the rules."""

    gateway: str
    node_addresses: tuple[str, ...]
    egress_isolated: tuple[str, ...]
    ingress_isolated: tuple[str, ...]
    rules: tuple[HostRule, ...]
    service_cidrs: tuple[str, ...] = ()
    tier_rules: tuple[TierHostRule, ...] = ()  # ClusterNetworkPolicy's local rules, in precedence order


def judge(plan: Plan, gateway: str, node_addresses: Iterable[str], service_cidrs: Iterable[str] = (),
          tiers: TierPlan | None = None) -> HostJudge:
    """The host's judge for ``plan`` and the ClusterNetworkPolicy ``tiers``; ``node_addresses``:
    the Node's own (CIDRs or plain)."""
    ips = {p.key: p.ips for p in plan.local_pods}
    egress = sorted({ip for key, (_i, e) in plan.isolated.items() if e for ip in ips.get(key, ())}, key=_order)
    ingress = sorted({ip for key, (i, _e) in plan.isolated.items() if i for ip in ips.get(key, ())}, key=_order)
    own = sorted({str(ipaddress.ip_interface(a).ip) for a in node_addresses}, key=_order)
    rules = tuple(sorted(plan.host_rules, key=lambda r: (r.direction, r.conj_id)))
    services = tuple(str(ipaddress.ip_network(c, strict=False)) for c in service_cidrs)
    return HostJudge(gateway, tuple(own), tuple(egress), tuple(ingress), rules, services,
                     tuple(tiers.host_rules) if tiers is not None else ())


def _order(addr: str) -> tuple[int, bytes]:
    """An address's place: IPv4 first, then by value (the packed bytes, big-endian, compare as the
    numbers do; ``ipaddress`` costs ~10 times as much, and the local Pods' addresses are sorted on
    every judge)."""
    if ":" in addr:
        return 6, socket.inet_pton(socket.AF_INET6, addr)
    return 4, socket.inet_pton(socket.AF_INET, addr)


# a rule's Pods and peers as rendered (held: the memo's keys are their identities) and its sets and lines
_Kept = tuple[Sequence[str], Sequence[str] | None, tuple[tuple[NftSet, ...], list[str]]]


class RenderMemo:
    """What a :func:`render` keeps for the next one (route-sync renders again whenever the plan
    moved): each rule's sets and lines by its inputs (its Pods' and peers' tuples by identity),
    so a rule whose Pods, peers and ports did not move is not made again.  Only the rules of the
    last render are kept."""

    def __init__(self) -> None:
        self.rules: dict[tuple[object, ...], _Kept] = {}


def _elements(items: Iterable[str], version: int) -> list[str]:
    """The addresses and blocks of one family, each once, in the order given: the planners'
    (each peer's addresses in peer order, a function of the state: the full and the incremental
    planner give the same, which the full passes check).  Not sorted again: a changed rule with
    thousands of peers was most of a Pod event's render."""
    if version == 6:
        return list(dict.fromkeys(i for i in items if ":" in i))
    return list(dict.fromkeys(i for i in items if ":" not in i))


def _disjoint(elements: list[str]) -> list[str]:
    """An interval set's elements without overlaps, which nft refuses whole ("conflicting
    intervals specified", and with it the pass's every change): a peer's block and an address or
    block inside it -- a ClusterNetworkPolicy rule's ``networks: [0.0.0.0/0]`` beside its
    ``nodes`` peer, an ipBlock beside a selector's Pods -- collapse into the block, which matches
    the same.  Addresses alone never overlap (they are a set), so they pass untouched."""
    if "/" not in "".join(elements):
        return elements
    nets = [ipaddress.ip_network(e, strict=False) for e in elements]  # one family: _elements' choice
    v4 = ipaddress.collapse_addresses(n for n in nets if isinstance(n, ipaddress.IPv4Network))
    v6 = ipaddress.collapse_addresses(n for n in nets if isinstance(n, ipaddress.IPv6Network))
    return [block_text(n) for n in v4] + [block_text(n) for n in v6]


def _set(name: str, kind: str, elements: Sequence[str], interval: bool = True) -> NftSet:
    return NftSet(name, kind, interval, tuple(elements))


def _ports(ports: tuple[tuple[str, int | None, int | None], ...] | None) -> list[str]:
    """A rule's ports as nft matches, one per protocol ([""]: any port of any protocol)."""
    if ports is None:
        return [""]
    by: dict[str, set[str] | None] = {}
    for proto, first, last in ports:
        have = by.setdefault(proto, set())
        if first is None or have is None:
            by[proto] = None  # the whole protocol
        else:
            have.add(f"{first}-{last}" if last is not None and last != first else str(first))
    out = []
    for proto in sorted(by):
        values = by[proto]
        l4 = _L4[proto]
        if values is None:
            out.append(f"meta l4proto {l4} ")
        else:
            nums = sorted(values, key=lambda v: int(v.split("-")[0]))
            out.append(f"{l4} dport {{ {', '.join(nums)} }} ")
    return out


def render(j: HostJudge, memo: RenderMemo | None = None) -> str:
    """The body of ``table inet ferry_policy`` (inside its braces) as text; ``memo``: what the
    last render with it kept (the same text, sooner)."""
    return render_body(j, memo).text


def render_body(j: HostJudge, memo: RenderMemo | None = None) -> NftBody:
    """The body of ``table inet ferry_policy`` as sets and chains (``routesync.nftbody``: a body
    whose sets alone moved is applied by element); ``memo``: what the last render with it kept,
    whose unchanged rules' sets come back as the very objects of the last body."""
    if memo is None:
        return _body(j, _rule)
    used: dict[tuple[object, ...], _Kept] = {}

    def rule(name: str, direction: str, applied: Sequence[str], peers: Sequence[str] | None,
             ports: tuple[tuple[str, int | None, int | None], ...] | None, verdict: str, comment: str
             ) -> tuple[tuple[NftSet, ...], list[str]]:
        # by the identity of its Pods' and peers' tuples (the planners hand an unchanged rule's
        # over as the same objects, kept alive by the memo): hashing them would cost every
        # rule's every address on each render
        ident = (name, direction, id(applied), id(peers), ports, verdict, comment)
        hit = used.get(ident) or memo.rules.get(ident)
        if hit is None or hit[0] is not applied or hit[1] is not peers:
            hit = (applied, peers, _rule(name, direction, applied, peers, ports, verdict, comment))
        used[ident] = hit
        return hit[2]

    body = _body(j, rule)
    memo.rules = used
    return body


def _body(j: HostJudge, rule: Callable[..., tuple[tuple[NftSet, ...], list[str]]]) -> NftBody:
    sets: list[NftSet] = []
    for v, _ip, kind in FAMILIES:
        sets.append(_set(f"egress{v}", kind, _elements(j.egress_isolated, v), interval=False))
        sets.append(_set(f"ingress{v}", kind, _elements(j.ingress_isolated, v), interval=False))
        sets.append(_set(f"node{v}", kind, _elements(j.node_addresses, v), interval=False))
        selfs = [f"{a} . {a}" for a in _elements(j.ingress_isolated, v)]
        sets.append(_set(f"self{v}", f"{kind} . {kind}", selfs, interval=False))
        sets.append(_set(f"services{v}", kind, _elements(j.service_cidrs, v)))
    chains: dict[str, list[str]] = defaultdict(list)
    for r in j.rules:
        mine, lines = rule(f"r{r.conj_id}", r.direction, r.applied, r.peers, r.ports, "accept", f"rule {r.conj_id}")
        sets += mine
        chains[r.direction] += lines
    for t in j.tier_rules:
        verdict = _TIER_VERDICTS[(t.tier == ADMIN, t.action)].format(direction=t.direction)
        mine, lines = rule(f"t{t.conj_id}", t.direction, t.applied, t.peers, t.ports, verdict,
                           f"{t.tier} rule {t.conj_id}")
        sets += mine
        chains[f"{t.tier}-{t.direction}"] += lines
    return NftBody(tuple(sets), _chains(j, chains))


def _chains(j: HostJudge, chains: dict[str, list[str]]) -> tuple[NftChain, ...]:
    def lines(key: str) -> list[str]:
        return [ln.strip("\t\n") for ln in chains[key]]

    gw = _quoted(j.gateway)
    undnated = [f"ct state new {ip} daddr @services{v} jump egress" for v, ip, _k in FAMILIES]
    out = [NftChain("input", "type filter hook input priority filter; policy accept;",
                    ("ct state new ct status dnat jump egress", *undnated)),
           NftChain("forward", "type filter hook forward priority filter; policy accept;",
                    (f"ct state new ct status dnat oifname != {gw} jump egress", *undnated)),
           NftChain("postrouting", "type filter hook postrouting priority srcnat + 10; policy accept;",
                    (f"ct state new ct status snat oifname {gw} jump ingress",))]
    own = [r for v, ip, _kind in FAMILIES
           for r in (f"ct original {ip} saddr @node{v} return", f"ct original {ip} saddr . {ip} daddr @self{v} return")]
    egress_drop = 'counter drop comment "egress denied after DNAT"'
    ingress_drop = 'counter drop comment "ingress denied after SNAT"'
    if not j.tier_rules:
        out.append(NftChain("egress", "", (*(f"{ip} saddr != @egress{v} return" for v, ip, _k in FAMILIES),
                                           *lines(EGRESS), egress_drop)))
        out.append(NftChain("ingress", "", (*(f"{ip} daddr != @ingress{v} return" for v, ip, _k in FAMILIES),
                                            *own, *lines(INGRESS), ingress_drop)))
        return tuple(out)
    # the tiers: Admin, then NetworkPolicy (a Pod it does not isolate goes on to Baseline), then Baseline
    out.append(NftChain("egress", "", (*lines(f"{ADMIN}-{EGRESS}"), "goto egress_np")))
    out.append(NftChain("egress_np", "", (*(f"{ip} saddr != @egress{v} goto egress_baseline"
                                            for v, ip, _k in FAMILIES), *lines(EGRESS), egress_drop)))
    out.append(NftChain("egress_baseline", "", (*lines(f"{BASELINE}-{EGRESS}"), "accept")))
    out.append(NftChain("ingress", "", (*own, *lines(f"{ADMIN}-{INGRESS}"), "goto ingress_np")))
    out.append(NftChain("ingress_np", "", (*(f"{ip} daddr != @ingress{v} goto ingress_baseline"
                                             for v, ip, _k in FAMILIES), *lines(INGRESS), ingress_drop)))
    out.append(NftChain("ingress_baseline", "", (*lines(f"{BASELINE}-{INGRESS}"), "accept")))
    return tuple(out)


# (Admin tier, action) -> the nft verdict of a ClusterNetworkPolicy rule: a Pass goes on to the
# NetworkPolicy chain of its direction (Admin) or accepts (Baseline: nothing after it)
_TIER_VERDICTS = {(True, ACCEPT): "accept", (True, DENY): "counter drop", (True, PASS): "goto {direction}_np",
                  (False, ACCEPT): "accept", (False, DENY): "counter drop", (False, PASS): "accept"}


def _rule(name: str, direction: str, applied: Sequence[str], peers: Sequence[str] | None,
          ports: tuple[tuple[str, int | None, int | None], ...] | None, verdict: str, comment: str
          ) -> tuple[tuple[NftSet, ...], list[str]]:
    """A conjunction as nft: its sets (the Pods it applies to, its peers; per family) and one
    line per family and protocol that ends in ``verdict``."""
    sets: list[NftSet] = []
    lines: list[str] = []
    for v, ip, kind in FAMILIES:
        mine = _elements(applied, v)
        theirs = None if peers is None else _disjoint(_elements(peers, v))
        if not mine or theirs is not None and not theirs:
            continue  # nothing of this family
        sets.append(_set(f"{name}a{v}", kind, mine))
        if theirs is not None:
            sets.append(_set(f"{name}p{v}", kind, theirs))
        if direction == EGRESS:
            head = f"{ip} saddr @{name}a{v} "
            peer = "" if theirs is None else f"{ip} daddr @{name}p{v} "
        else:
            head = f"{ip} daddr @{name}a{v} "
            peer = "" if theirs is None else f"ct original {ip} saddr @{name}p{v} "
        for port in _ports(ports):
            lines.append(f"\t\t{head}{peer}{port}{verdict} comment \"{comment}\"\n")
    return tuple(sets), lines


def _quoted(name: str) -> str:
    if not name or '"' in name or len(name) > 15:
        raise ValueError(f"bad device name {name!r}")
    return f'"{name}"'
