"""Services: the flows that keep a Service connection's two directions on one path, in one room.

kube-proxy DNATs a Service connection in the client Node's stack, so that stack must see the reply
too (it undoes the NAT), or the client gets the backend's address back and resets.  Ferry's own
Pod-to-Pod paths bypass the host, so OVS keeps a conntrack zone of its own (:data:`CT_ZONE`) and
remembers, in each connection's ``ct_mark``, which host port its first packets came in through.

How a Service packet and its reply cross the pipeline (client Pod C, Service S, backend B; the
tables: :mod:`cni.pipeline.tables`; the walks per mode: ``docs/design/services.md``):

1. C → S: SpoofGuard → Conntrack (:func:`conntrack_flows`: looked up, ``+new``) → ConntrackState
   (its miss: on to policy) → policy, where egress to a Service CIDR is not judged on the ClusterIP
   (:func:`to_service_cidr`) → ConntrackCommit (committed, unmarked) → L3Forwarding's miss →
   L2Forwarding (the gateway's MAC) → the gateway port → the host, where kube-proxy DNATs S → B.
2. B's address, back into OVS: through the gateway port (:func:`conntrack_flows`) or, on the fast
   path, out of the host's uplink port (:func:`host_uplink_flows`): a local Pod's source there is
   flagged in reg0 (:func:`via_flag`), looked up, judged by policy on B, and committed with that
   port's mark (:func:`commit_flows`) → on to B (L3Forwarding: a local Pod, a tunnel; or the uplink).
3. B's reply: looked up, ``+rpl`` with the mark → ConntrackState sends it back to the host's port
   it came from (:func:`host_return_flow`), which undoes the DNAT (source S) and routes it to C.
4. The un-DNATed reply enters from the host, ``+rpl`` of C's first connection (C → S): a reply that
   comes from the host never goes back to it (:func:`from_host_reply_flow`) → ConntrackCommit →
   L3Forwarding → C.

A Pod-to-Pod connection (no Service) takes steps 1 and 3 without a mark: one lookup and one commit
per Node, which NetworkPolicy needs to be stateful; a known connection's reply skips policy.

Pure functions, standard library only: the plugin loads this on a lone Node when it creates the
bridge's base flows (:func:`cni.pipeline.flows.base_flows`), route-sync for every plan."""

from __future__ import annotations

from cni.lean import addr
from cni.lean.typecheck import TYPE_CHECKING
from cni.pipeline import match as m
from cni.pipeline.actions import Ct, Load, SetField, goto, output, tagged_output
from cni.pipeline.match import IN_PORT, IP, IPV6
from cni.pipeline.tables import (
    BASE_COOKIE,
    CT_MARK_VIA_GATEWAY,
    CT_MARK_VIA_MASK,
    CT_MARK_VIA_UPLINK,
    CT_ZONE,
    NODE_COOKIE,
    Classifier,
    Conntrack,
    ConntrackCommit,
    ConntrackState,
    Cookie,
    Flow,
    Table,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from cni.pipeline.actions import Action
    from cni.pipeline.flows import GatewayPort


def conntrack_flows(gw: GatewayPort, flagged: Sequence[str]) -> list[Flow]:
    """Conntrack, ConntrackState and ConntrackCommit, under the base cookie (their misses:
    :func:`cni.pipeline.flows.miss_flows`).  Every IP packet is looked up in :data:`CT_ZONE`; a
    reply of a known connection skips policy; a new connection is committed after it.  A local
    Pod's packets the host forwards back into OVS through the gateway (kube-proxy's DNAT: to a
    local Pod, a tunnel, the fast path), those from the networks among ``flagged`` (CIDRs; plain
    addresses name none), are committed with :data:`CT_MARK_VIA_GATEWAY`, and a reply of such a
    connection goes to the host, which undoes its NAT, instead of straight to the Pod (that would
    see the backend's address)."""
    port = int(gw.ofport)
    c = BASE_COOKIE
    lookup = Ct(CT_ZONE, table=Table.CONNTRACK_STATE)
    to_commit, to_l3 = (goto(Table.CONNTRACK_COMMIT),), (goto(Table.L3_FORWARDING),)
    flows = [
        Flow(Table.CONNTRACK, Conntrack.LOOKUP, (IP,), (lookup,), c),
        Flow(Table.CONNTRACK, Conntrack.LOOKUP, (IPV6,), (lookup,), c),
        # replies of a known connection skip policy; its original direction crosses policy on
        # every packet (the switch caches the verdict per megaflow), so a policy that starts to
        # deny a connection stops it, not only new ones
        Flow(Table.CONNTRACK_STATE, ConntrackState.KNOWN, (m.ct_state(m.CT_TRK | m.CT_EST | m.CT_RPL),), to_commit, c),
        Flow(Table.CONNTRACK_STATE, ConntrackState.KNOWN, (m.ct_state(m.CT_TRK | m.CT_REL),), to_commit, c),
        Flow(Table.CONNTRACK_COMMIT, ConntrackCommit.COMMIT, (IP, m.ct_state(m.CT_NEW | m.CT_TRK)),
             (Ct(CT_ZONE, commit=True), *to_l3), c),
        Flow(Table.CONNTRACK_COMMIT, ConntrackCommit.COMMIT, (IPV6, m.ct_state(m.CT_NEW | m.CT_TRK)),
             (Ct(CT_ZONE, commit=True), *to_l3), c),
    ]
    sources = [_source(cidr) for cidr in flagged if "/" in cidr]
    if not sources:
        return flows
    for family, proto, field in sources:
        flows.append(Flow(Table.CONNTRACK, Conntrack.VIA_GATEWAY, (IN_PORT(port), proto, field),
                          (via_flag(CT_MARK_VIA_GATEWAY), lookup), c))
    flows += commit_flows(CT_MARK_VIA_GATEWAY, to_l3, c)
    for family in sorted({f for f, _p, _s in sources}):
        flows.append(host_return_flow(family, CT_MARK_VIA_GATEWAY, gw.mac, port, c))
    flows.append(from_host_reply_flow(port, c))
    return flows


def host_uplink_flows(host_ofport: int, uplink_ofport: int, uplink_mac: str, local_pod_cidrs: Sequence[str],
                      vlan: int | None = None) -> list[Flow]:
    """The fast path's half of Conntrack, under the Node's cookie: a local Pod's packet that the
    host routes out of its uplink port (``host_ofport``, the internal port that took the uplink's
    name and MAC; kube-proxy DNATed it to a fast peer's Pod) is flagged :data:`CT_MARK_VIA_UPLINK`
    and goes through Conntrack and policy like any other; ConntrackCommit commits it with that mark
    and outputs it to the physical uplink (``uplink_ofport``, tagged with the transport ``vlan``
    if any: the host already addressed it to the next hop).  The reply, which the peer sends on its
    own fast path and which enters from the uplink, goes back to the host's port, not to the Pod."""
    host, ofport = int(host_ofport), int(uplink_ofport)
    to_uplink = tagged_output(ofport, vlan)
    flows: list[Flow] = []
    families = set()
    for cidr in local_pod_cidrs:
        family, proto, field = _source(cidr)
        families.add(family)
        flows.append(Flow(Table.CLASSIFIER, Classifier.HOST_OUT, (IN_PORT(host), proto, field),
                          (via_flag(CT_MARK_VIA_UPLINK), goto(Table.CONNTRACK)), NODE_COOKIE))
    if not flows:
        return flows
    flows += commit_flows(CT_MARK_VIA_UPLINK, to_uplink, NODE_COOKIE)
    # a known connection's later packets: out the same way, nothing to commit
    flows.append(Flow(Table.CONNTRACK_COMMIT, ConntrackCommit.VIA_KNOWN,
                      (m.masked(m.REG0, CT_MARK_VIA_UPLINK, CT_MARK_VIA_MASK),), to_uplink, NODE_COOKIE))
    flows += [host_return_flow(f, CT_MARK_VIA_UPLINK, uplink_mac, host, NODE_COOKIE) for f in sorted(families)]
    flows.append(from_host_reply_flow(host, NODE_COOKIE))
    return flows


def via_flag(mark: int) -> Action:
    """Conntrack: note in reg0 which host port a local Pod's packet came through (``mark``)."""
    return Load(mark, m.REG0)


def commit_flows(mark: int, then: tuple[Action, ...], cookie: Cookie) -> list[Flow]:
    """ConntrackCommit: a new connection flagged ``mark`` in reg0 is committed with that mark
    (ct() needs the packet's family in the match: one flow each)."""
    commit = Ct(CT_ZONE, commit=True, exec=(SetField(m.CT_MARK, mark),))
    return [Flow(Table.CONNTRACK_COMMIT, ConntrackCommit.COMMIT_VIA,
                 (proto, m.ct_state(m.CT_NEW | m.CT_TRK), m.masked(m.REG0, mark, CT_MARK_VIA_MASK)),
                 (commit, *then), cookie) for proto in (IP, IPV6)]


def host_return_flow(family: int, mark: int, gateway_mac: str, ofport: int, cookie: Cookie) -> Flow:
    """ConntrackState: a reply of a connection whose first packets came from the host through
    ``ofport`` (``mark``) goes back there, addressed to that port's MAC."""
    return Flow(Table.CONNTRACK_STATE, ConntrackState.HOST_RETURN,
                (IP if family == 4 else IPV6, m.ct_state(m.CT_TRK | m.CT_RPL),
                 m.masked(m.CT_MARK, mark, CT_MARK_VIA_MASK)),
                (SetField(m.ETH_DST, m.mac_value(gateway_mac)), output(ofport)), cookie)


def from_host_reply_flow(ofport: int, cookie: Cookie) -> Flow:
    """ConntrackState: a reply that comes *from* the host (through ``ofport``) has crossed the
    host already: it never goes back to it, whatever port its connection was marked with (on
    an asymmetric path, a reply the host routed in through the gateway for a connection that left
    through the uplink port would otherwise bounce between the two)."""
    return Flow(Table.CONNTRACK_STATE, ConntrackState.FROM_HOST,
                (IN_PORT(int(ofport)), m.ct_state(m.CT_TRK | m.CT_RPL)), (goto(Table.CONNTRACK_COMMIT),), cookie)


def to_service_cidr() -> tuple[Action, ...]:
    """Policy (``EgressAdmin.SERVICE``, ``EgressRule.SERVICE``: the route-sync planners' flow for
    each Service CIDR): egress to a ClusterIP is not judged on it, but straight on to
    ConntrackCommit; the host DNATs it and it comes back in flagged (step 2), to be judged on the
    backend's address."""
    return (goto(Table.CONNTRACK_COMMIT),)


def _source(cidr: str) -> tuple[int, m.MatchItem, m.Field]:
    """(family, protocol, source-network field) of a CIDR (a plain address: its host prefix)."""
    value, plen, bits = addr.parse_interface(cidr)
    field = m.Field(m.IPV4_SRC if bits == 32 else m.IPV6_SRC, addr.network(value, plen, bits), plen)
    return (4, IP, field) if bits == 32 else (6, IPV6, field)
