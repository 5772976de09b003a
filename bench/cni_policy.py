"""bench_cni's policy phase (issue 27: "the per-Pod ADD stays fast", <= 1.05x), its pure parts: the
two node state files, the order of the interleaved calls, the pending drops each Pod must hold
afterwards, and the ratios.

The plugin's only NetworkPolicy-dependent work in an ADD is the Pod's pending drops
(``cni.pipeline.flows.pending_flows``): when route-sync's state file lists the Pod's namespace in
``policyNamespaces``, the ADD installs them in the same OpenFlow bundle as the Pod's other flows
(``cni.commands.add``), so no new connection reaches or leaves the Pod before its policy is in
force.  The two state files are the encryption phase's Node in clear
(``bench.cni_encryption.node_state``, noEncap) and differ only in ``policyNamespaces``: none, or
the namespace every Pod of the phase is in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypeAlias

from bench import cni_encryption as enc
from bench.util import ab_by_side, ab_order, ab_ratios
from cni.node import nodestate
from cni.pipeline.flows import pending_flows
from cni.pipeline.modes import ENCRYPTION_NONE
from cni.pipeline.tables import ConntrackState, Table, pod_cookie

Side: TypeAlias = Literal["none", "policy"]
NONE: Side = "none"
POLICY: Side = "policy"
SIDES: tuple[Side, ...] = (NONE, POLICY)
NAMESPACE = "fbn-policy"  # the namespace of every Pod of the phase (K8S_POD_NAMESPACE), on both sides
TARGET = 1.05  # issue 27: ADD p50 with policies in the namespace / without
# A pending drop as compared: (table, priority, match items in any order, actions).
Canon: TypeAlias = tuple[int, int, frozenset[str], str]


def node_state(side: Side, gateway_mac: str, gateway_ofport: int, ovsdb: str,
               ovs_run_dir: str) -> nodestate.NodeState:
    """The state file route-sync would write for the phase's Node: the encryption phase's Node in
    clear, with :data:`NAMESPACE` among the namespaces that have NetworkPolicies on the policy side."""
    return enc.node_state(ENCRYPTION_NONE, gateway_mac, gateway_ofport, ovsdb, ovs_run_dir,
                          policy_namespaces=[NAMESPACE] if side == POLICY else [])


def order(pairs: int) -> list[tuple[Side, int]]:
    """The interleaved calls (:func:`bench.util.ab_order`), the side without policies first in
    even pairs, as the encryption phase's."""
    return ab_order(SIDES, pairs)


def by_side(samples: Sequence[float], calls: Sequence[tuple[Side, int]]) -> dict[Side, list[float]]:
    return ab_by_side(samples, calls, SIDES)


def canon(table: int, priority: int, match: str, actions: str) -> Canon:
    """One flow in a form the plugin's own text and ovs-ofctl's dump agree on (OVS may print the
    match items in another order)."""
    return table, priority, frozenset(item for item in match.split(",") if item), actions


def expected_pending(side: Side, container_id: str, ifname: str,
                     addresses: Sequence[str]) -> tuple[int, frozenset[Canon]]:
    """The cookie of one Pod's flows and the pending drops that ADD must have left under it: the
    plugin's own plan (``pending_flows``) on the policy side, none on the other."""
    cookie = pod_cookie(container_id, ifname)
    flows = pending_flows(cookie, addresses) if side == POLICY else []
    return cookie.value, frozenset(canon(int(f.table), f.priority, f.match_text(), f.actions_text()) for f in flows)


def installed_pending(flows: Iterable[Any]) -> dict[int, frozenset[Canon]]:
    """The pending drops among dumped flows (``cni.ovs.openflow.ofctl.DumpedFlow``: ``table``,
    ``priority``, ``cookie``, ``match``, ``actions``), per cookie."""
    out: dict[int, set[Canon]] = {}
    for f in flows:
        if f.table == int(Table.CONNTRACK_STATE) and f.priority == ConntrackState.PENDING:
            out.setdefault(f.cookie, set()).add(canon(f.table, f.priority, f.match, f.actions))
    return {cookie: frozenset(s) for cookie, s in out.items()}


def pending_problems(expected: Mapping[int, frozenset[Canon]], installed: Mapping[int, frozenset[Canon]]) -> list[str]:
    """What differs between the pending drops the Pods must hold (``expected``, per cookie; an
    empty set: none) and those on the bridge: a Pod missing some or holding others, and drops
    under a cookie of no Pod (after the DELs ``expected`` is empty, so any drop is left over)."""
    problems = []
    for cookie, want in expected.items():
        have = installed.get(cookie, frozenset())
        if have != want:
            problems.append(f"cookie 0x{cookie:x}: {len(have)} pending drops, {len(want)} expected"
                            + (f" (missing {sorted(map(_text, want - have))})" if want - have else "")
                            + (f" (unexpected {sorted(map(_text, have - want))})" if have - want else ""))
    stray = sorted(set(installed) - set(expected))
    if stray:
        problems.append(f"{sum(len(installed[c]) for c in stray)} pending drops under {len(stray)} cookies of no "
                        f"Pod: {', '.join(f'0x{c:x}' for c in stray[:5])}")
    return problems


def _text(c: Canon) -> str:
    table, priority, match, actions = c
    return f"table={table},priority={priority},{','.join(sorted(match))},actions={actions}"


def ratios(ms: Mapping[str, Mapping[Side, list[float]]]) -> dict[str, Any]:
    """policy / none (:func:`bench.util.ab_ratios`)."""
    return ab_ratios(ms, POLICY, NONE, TARGET)
