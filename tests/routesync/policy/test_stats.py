"""What the policy counters say: rules' counts from their conj_id flows, isolation drops per Pod,
the bounded denied log, and ``show policy``'s table, from flows as ``ovs-ofctl`` dumps them."""

from __future__ import annotations

from cni.ovs.openflow.ofctl import parse_dump
from routesync.policy import stats
from routesync.policy.plan import Plan, RuleInfo

DUMP = """\
 cookie=0x5000000000000a1, duration=3s, table=50, n_packets=7, n_bytes=518, priority=200,conj_id=4 actions=goto_table:60
 cookie=0x5000000000000a2, duration=3s, table=51, n_packets=3, n_bytes=222, priority=200,ip,nw_dst=10.0.0.1 actions=drop
 cookie=0x5000000000000a3, duration=3s, table=41, n_packets=2, n_bytes=120, priority=200,ipv6,ipv6_src=fd00::1 \
actions=drop
"""


def flows(text: str = DUMP) -> list:
    return parse_dump(text)


def test_rule_and_denied_counts_come_from_the_switch() -> None:
    r = RuleInfo(4, "a/web", "ingress", 0, ("a/x",))
    missing = RuleInfo(5, "a/web", "ingress", 1, ("a/x",))
    counts = stats.rule_counts([r, missing], flows())
    assert [(c.packets, c.bytes) for c in counts] == [(7, 518), (0, 0)]
    assert stats.denied({"a/x": ["10.0.0.1", "fd00::1"]}, flows()) == {("a/x", "ingress"): 3, ("a/x", "egress"): 2}


def test_denied_log_says_what_grew_and_stays_bounded() -> None:
    log = stats.DeniedLog(limit=1)
    pods = {"a/x": ["10.0.0.1", "fd00::1"]}
    first = log.lines(pods, {"a/x": ["a/deny"]}, flows())
    assert first == ["NetworkPolicy denied 3 packets of new ingress connections of a/x (isolated by a/deny)",
                     "NetworkPolicy denied new connections of 1 more Pods"]
    assert log.lines(pods, {}, flows()) == []  # nothing new since


def test_show_policy_table_names_rules_and_counters() -> None:
    plan = Plan(rules=[RuleInfo(4, "a/web", "ingress", 0, ("a/x",), "http=80/TCP")],
                isolated={"a/x": (True, False)}, policies_of={"a/x": ["a/web"]})
    doc = stats.report(plan)
    doc["pods"] = {"a/x": ["10.0.0.1"]}
    text = stats.pod_table("a/x", doc, flows())
    assert "policies a/web" in text and "isolated: ingress yes, egress no" in text
    assert "a/web   ingress    0     http=80/TCP  4        7        518" in text
    assert "denied ingress: 3 packets" in text
    assert "not a Pod of this Node" in stats.pod_table("a/y", doc, flows())


def test_a_remote_pods_isolation_is_not_counted_on_the_local_destination() -> None:
    remote = """\
 cookie=0x5000000000000b1, duration=3s, table=41, n_packets=0, n_bytes=0, priority=190,ip,nw_dst=10.0.0.1 \
actions=conjunction(9,2/2)
 cookie=0x5000000000000b2, duration=3s, table=41, n_packets=4, n_bytes=296, priority=190,conj_id=9 actions=drop
"""
    assert stats.denied({"a/x": ["10.0.0.1", "fd00::1"]}, flows(DUMP + remote)) == {
        ("a/x", "ingress"): 3, ("a/x", "egress"): 2}
