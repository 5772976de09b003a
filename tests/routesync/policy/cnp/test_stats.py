"""What the tiers' counters say: each ClusterNetworkPolicy rule's count from its conj_id flow,
in ``show policy``'s table (evaluation order) and in the Prometheus exposition."""

from __future__ import annotations

from cni.ovs.openflow.ofctl import parse_dump
from cni.pipeline.tables import Table
from routesync.metrics import Observer, RouteSyncMetrics
from routesync.policy import stats
from routesync.policy.cnp.plan import TierPlan, TierRule
from routesync.policy.plan import Plan

DENY = TierRule(1 << 24, "deny-db", "Admin", 10, "ingress", 0, "no-db", "Deny", ("a/x",))
BASE = TierRule((1 << 24) + 1, "base", "Baseline", 0, "egress", 2, "", "Accept", ("a/x",))
DUMP = f"""\
 cookie=0x5000000000000a1, duration=3s, table={int(Table.INGRESS_ADMIN)}, n_packets=9, n_bytes=666, \
priority=59740,conj_id={DENY.conj_id} actions=drop
 cookie=0x5000000000000a2, duration=3s, table={int(Table.INGRESS_RULE)}, n_packets=4, n_bytes=1, \
priority=200,conj_id={BASE.conj_id} actions=goto_table:60
"""


def flows() -> list:
    return parse_dump(DUMP)


def test_a_tier_rule_counts_its_own_tables_conj_id_flow_only() -> None:
    # BASE's id is in a NetworkPolicy table (OpenFlow scopes conjunction ids per table): not its count
    assert [(c.packets, c.bytes) for c in stats.tier_rule_counts([DENY, BASE], flows())] == [(9, 666), (0, 0)]


def test_show_policy_lists_the_tiers_in_evaluation_order() -> None:
    tiers = TierPlan(rules=[DENY, BASE], tiers_of={"a/x": ["Admin/10/deny-db", "Baseline/0/base"]})
    doc = stats.report(Plan(), tiers)
    doc["pods"] = {"a/x": ["10.0.0.1"]}
    text = stats.pod_table("a/x", doc, flows())
    assert "cluster policies in evaluation order: Admin/10/deny-db > NetworkPolicy > Baseline/0/base" in text
    row = next(line for line in text.splitlines() if line.startswith("Admin"))
    assert row.split() == ["Admin", "10", "deny-db", "ingress", "0", "(no-db)", "Deny", "-", "9", "666"]
    assert "cluster policies (none)" in stats.pod_table("a/x", {**stats.report(Plan()), "pods": doc["pods"]}, [])


def test_the_exposition_carries_each_rules_count() -> None:
    m = RouteSyncMetrics()
    Observer(m).tier_counters(TierPlan(rules=[DENY, BASE]), flows())
    body = m.exposition()[0].decode()
    assert ('ferry_route_sync_cluster_policy_rule_packets_total{action="Deny",direction="ingress",policy="deny-db",'
            'rule="no-db",tier="Admin"} 9.0') in body
    assert ('ferry_route_sync_cluster_policy_rule_bytes_total{action="Accept",direction="egress",policy="base",'
            'rule="2",tier="Baseline"} 0.0') in body
