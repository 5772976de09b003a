"""What NetworkPolicy did, from the switch's own counters: per rule (its ``conj_id`` flow counts
every new connection the rule allowed) and per isolated Pod (its Default-table drop counts the
packets of new connections no rule allowed).

The daemon writes the plan's summary beside the state file (:func:`write_report`:
``policy.json``), so ``ferry-route-sync show policy NS/POD`` (another process) can name the
rules in force for a Pod and read their counters from one ``ovs-ofctl dump-flows``; the
Prometheus collector and the denied-connection log read the same counters."""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from cni.ovs.openflow.ofctl import DumpedFlow
from cni.pipeline.tables import Cookie, EgressDefault, Owner, Table

from .cnp.plan import TierPlan, TierRule
from .plan import EGRESS, INGRESS, Plan, RuleInfo

REPORT_NAME = "policy.json"
POLICY_COOKIE = Cookie.owner_match(Owner.POLICY)


@dataclass(frozen=True)
class RuleCount:
    rule: RuleInfo
    packets: int
    bytes: int


def report_path(state_file: str) -> str:
    return os.path.join(os.path.dirname(state_file) or ".", REPORT_NAME)


def _rule_doc(r: RuleInfo) -> dict[str, Any]:
    """``asdict`` of a RuleInfo (flat: its fields as they are), without ``asdict``'s deep copy
    of each value (thousands of rules, written whenever the plan moves)."""
    return dict(vars(r))


def report(plan: Plan, tiers: TierPlan | None = None) -> dict[str, Any]:
    t = tiers or TierPlan()
    return {"rules": [_rule_doc(r) for r in plan.rules],
            # the ClusterNetworkPolicy tiers: each local Pod's policies in evaluation order, their rules
            "tiersOf": dict(sorted(t.tiers_of.items())), "tierRules": [asdict(r) for r in t.rules],
            "tierErrors": t.errors,
            "isolated": {k: {"ingress": i, "egress": e} for k, (i, e) in sorted(plan.isolated.items())},
            "policiesOf": dict(sorted(plan.policies_of.items())),
            "pods": {p.key: list(p.ips) for p in plan.local_pods},
            "errors": plan.errors,
            # remote clients' egress judged here (their Pods are not this Node's)
            "remoteRules": [_rule_doc(r) for r in plan.remote_rules], "remoteIsolated": plan.remote_isolated}


def write_report(plan: Plan, state_file: str, tiers: TierPlan | None = None) -> None:
    from cni.node.atomicfile import write_atomic

    # not fsynced: a view of the plan for ``show policy``, written again by every pass that moved
    # it (two fsyncs were a third of a Pod event's pass at 30,000 Pods); after a power cut the
    # first pass rewrites it
    write_atomic(report_path(state_file), json.dumps(report(plan, tiers), sort_keys=True).encode(), sync=False)


def read_report(state_file: str) -> dict[str, Any]:
    with open(report_path(state_file), encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict):
        raise ValueError(f"{report_path(state_file)}: not an object")  # noqa: TRY004 - a bad file, as json's own
    return doc


def conj_id_flows(flows: Iterable[DumpedFlow], tables: Iterable[Table]) -> dict[int, DumpedFlow]:
    """The ``conj_id`` flows of ``tables`` by id (a rule's: its counters are the rule's)."""
    ours = set(tables)
    return {int(f.match.split("=", 1)[1].split(",")[0]): f for f in flows
            if f.table in ours and f.match.startswith("conj_id=")}


def rule_counts(rules: Iterable[RuleInfo], flows: Iterable[DumpedFlow]) -> list[RuleCount]:
    """Each rule with its ``conj_id`` flow's counters (0 when the flow is not installed)."""
    by_id = conj_id_flows(flows, (Table.INGRESS_RULE, Table.EGRESS_RULE))
    out = []
    for r in rules:
        hit = by_id.get(r.conj_id)
        out.append(RuleCount(r, hit.n_packets if hit else 0, hit.n_bytes if hit else 0))
    return out


TIER_TABLES = (Table.EGRESS_ADMIN, Table.INGRESS_ADMIN, Table.EGRESS_BASELINE, Table.INGRESS_BASELINE)


@dataclass(frozen=True)
class TierRuleCount:
    rule: TierRule
    packets: int
    bytes: int


def tier_rule_counts(rules: Iterable[TierRule], flows: Iterable[DumpedFlow]) -> list[TierRuleCount]:
    """Each ClusterNetworkPolicy rule with its ``conj_id`` flow's counters: the packets it
    accepted, denied or passed (0 when the flow is not installed)."""
    by_id = conj_id_flows(flows, TIER_TABLES)
    out = []
    for r in rules:
        hit = by_id.get(r.conj_id)
        out.append(TierRuleCount(r, hit.n_packets if hit else 0, hit.n_bytes if hit else 0))
    return out


def tier_rule_from(d: dict[str, Any]) -> TierRule:
    return TierRule(int(d["conj_id"]), str(d["policy"]), str(d["tier"]), int(d["priority"]), str(d["direction"]),
                    int(d["index"]), str(d.get("name") or ""), str(d["action"]), tuple(d.get("pods") or ()),
                    str(d.get("port") or ""))


def denied(pods: dict[str, list[str]], flows: Iterable[DumpedFlow]) -> dict[tuple[str, str], int]:
    """(Pod, direction) -> packets dropped by its isolation (the Default tables)."""
    owner: dict[str, str] = {}
    for key, ips in pods.items():
        for ip in ips:
            owner[str(ipaddress.ip_address(ip))] = key
    out: dict[tuple[str, str], int] = {}
    for f in flows:
        if (f.table not in (Table.INGRESS_DEFAULT, Table.EGRESS_DEFAULT)
                or f.table == Table.EGRESS_DEFAULT
                and f.priority in (EgressDefault.REMOTE_ISOLATED, EgressDefault.REMOTE_ISOLATED_NEW)):
            continue  # a remote Pod's isolation names a local Pod as its destination: not that Pod's drops
        for part in f.match.split(","):
            k, _, v = part.partition("=")
            if k in ("nw_dst", "ipv6_dst", "nw_src", "ipv6_src") and v in owner:
                where = (owner[v], INGRESS if f.table == Table.INGRESS_DEFAULT else EGRESS)
                out[where] = out.get(where, 0) + f.n_packets
    return out


def remote_denied(conj_id: int | None, flows: Iterable[DumpedFlow]) -> int:
    """Packets the remote isolation (remote Pods' egress, judged here: ``conj_id``) dropped, its
    new-connection flow's with the rest's: one count for every remote Pod (the flows are shared;
    the per-connection log names each)."""
    if conj_id is None:
        return 0
    ours = (f"conj_id={conj_id}", f"conj_id={conj_id},")
    return sum(f.n_packets for f in flows if f.table == Table.EGRESS_DEFAULT
               and (f.match == ours[0] or f.match.startswith(ours[1])))


def rule_from(d: dict[str, Any]) -> RuleInfo:
    return RuleInfo(int(d["conj_id"]), str(d["policy"]), str(d["direction"]), int(d["index"]),
                    tuple(d.get("pods") or ()), str(d.get("port") or ""))


def pod_table(pod: str, doc: dict[str, Any], flows: list[DumpedFlow]) -> str:
    """``show policy NS/POD``: the policies selecting the Pod, its isolation, each rule in force
    for it with its counters, and what its isolation dropped."""
    if pod not in doc.get("pods", {}):
        return f"{pod}: not a Pod of this Node with an address (or route-sync has not seen it)\n"
    iso = doc.get("isolated", {}).get(pod, {})
    lines = [f"pod {pod}  addresses {', '.join(doc['pods'][pod])}",
             f"policies {', '.join(doc.get('policiesOf', {}).get(pod, [])) or '(none: not isolated)'}",
             (f"isolated: ingress {'yes' if iso.get('ingress') else 'no'}, "
              f"egress {'yes' if iso.get('egress') else 'no'}")]
    rules = [rule_from(r) for r in doc.get("rules", []) if pod in r.get("pods", [])]
    cells = [("POLICY", "DIRECTION", "RULE", "PORT", "CONJ_ID", "PACKETS", "BYTES")]
    for c in rule_counts(rules, flows):
        cells.append((c.rule.policy, c.rule.direction, str(c.rule.index), c.rule.port or "-", str(c.rule.conj_id),
                      str(c.packets), str(c.bytes)))
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    if len(cells) == 1:
        lines.append("(no rule allows anything for this Pod)")
    for (p, direction), n in sorted(denied({pod: doc["pods"][pod]}, flows).items()):
        lines.append(f"denied {direction}: {n} packets of new connections")
    lines += _tier_lines(pod, doc, flows)
    return "\n".join(lines) + "\n"


def _tier_lines(pod: str, doc: dict[str, Any], flows: list[DumpedFlow]) -> list[str]:
    """The ClusterNetworkPolicies in force for ``pod``, in evaluation order (Admin by priority,
    NetworkPolicy, Baseline), and each of their rules with its counters."""
    tiers = doc.get("tiersOf", {}).get(pod, [])
    if not tiers:
        return ["cluster policies (none)"]
    admin = [t for t in tiers if t.startswith("Admin/")]
    order = [*admin, "NetworkPolicy", *[t for t in tiers if not t.startswith("Admin/")]]
    lines = [f"cluster policies in evaluation order: {' > '.join(order)}"]
    rules = [tier_rule_from(r) for r in doc.get("tierRules", []) if pod in r.get("pods", [])]
    cells = [("TIER", "PRIORITY", "POLICY", "DIRECTION", "RULE", "ACTION", "PORT", "PACKETS", "BYTES")]
    for c in tier_rule_counts(rules, flows):
        r = c.rule
        cells.append((r.tier, str(r.priority), r.policy, r.direction, f"{r.index}" + (f" ({r.name})" if r.name else ""),
                      r.action, r.port or "-", str(c.packets), str(c.bytes)))
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return lines


class DeniedLog:
    """A bounded, rate-limited log of what isolation dropped: fed the counters every interval,
    it gives one line per Pod and direction whose drops grew (at most ``limit`` lines, the
    largest first, then a line saying how many more), naming the policies that isolate it."""

    def __init__(self, limit: int = 20) -> None:
        self.limit = limit
        self._last: dict[tuple[str, str], int] = {}

    def lines(self, pods: dict[str, list[str]], policies_of: dict[str, list[str]],
              flows: Iterable[DumpedFlow]) -> list[str]:
        now = denied(pods, flows)
        grown = sorted(((n - self._last.get(k, 0), k) for k, n in now.items() if n > self._last.get(k, 0)),
                       reverse=True)
        self._last = now
        out = [f"NetworkPolicy denied {d} packets of new {direction} connections of {pod} "
               f"(isolated by {', '.join(policies_of.get(pod, [])) or '?'})"
               for d, (pod, direction) in grown[:self.limit]]
        if len(grown) > self.limit:
            out.append(f"NetworkPolicy denied new connections of {len(grown) - self.limit} more Pods")
        return out
