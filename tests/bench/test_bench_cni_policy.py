"""bench_cni's policy phase (issue 27, the per-Pod ADD stays fast), the pure parts: the two state
files are one Node's, as the plugin reads them, differing only in policyNamespaces; the calls
take turns with the order alternating; a Pod's expected pending drops are the plugin's plan on the
policy side and none on the other; the check against a dump catches a missing, an extra or a
left-over drop; the ratios and the target's verdict; and the report's goal row."""

from __future__ import annotations

import pytest

from bench import cni_policy as pol
from bench import report
from cni.lean.record import as_dict
from cni.node import nodestate
from cni.ovs.openflow.ofctl import parse_dump
from cni.pipeline.tables import pod_cookie

MAC = "02:00:00:aa:bb:cc"
# ovs-ofctl -O OpenFlow13 dump-flows lines (durations left out), the second with its match items in
# another order than the plugin's text: the check compares them as a set
DUMP = """OFPST_FLOW reply (OF1.3) (xid=0x2):
 cookie=0x{c:x}, table=26, n_packets=0, n_bytes=0, priority=230,ct_state=+new+trk,ip,nw_src=10.245.0.7 actions=drop
 cookie=0x{c:x}, table=26, n_packets=0, n_bytes=0, priority=230,ip,ct_state=+new+trk,nw_dst=10.245.0.7 actions=drop
 cookie=0x{c:x}, table=26, n_packets=3, n_bytes=180, priority=200,ct_state=+est+rpl+trk,ip actions=goto_table:45
 cookie=0x100000000000000, table=26, n_packets=0, n_bytes=0, priority=0 actions=goto_table:40
"""


def _dumped(text: str) -> list[object]:
    return parse_dump(text)


def test_the_state_files_are_one_node_with_and_without_the_pods_namespace() -> None:
    read = {side: nodestate.parse(pol.node_state(side, MAC, 2, "unix:/tmp/x/db.sock", "/tmp/x").to_json())
            for side in pol.SIDES}  # what the plugin reads
    none, policy = read["none"], read["policy"]
    assert (none.policyNamespaces, policy.policyNamespaces) == ([], [pol.NAMESPACE])
    assert none.mode == "noEncap" and none.encryption == "none" and none.gateway.mac == MAC
    same = {k: v for k, v in as_dict(none).items() if k != "policyNamespaces"}
    assert same == {k: v for k, v in as_dict(policy).items() if k != "policyNamespaces"}


def test_the_sides_take_turns_and_neither_always_goes_first() -> None:
    calls = pol.order(4)
    assert calls == [("none", 0), ("policy", 0), ("policy", 1), ("none", 1),
                     ("none", 2), ("policy", 2), ("policy", 3), ("none", 3)]
    samples = [10.0, 20.0, 21.0, 11.0, 12.0, 22.0, 23.0, 13.0]
    assert pol.by_side(samples, calls) == {"none": [10.0, 11.0, 12.0, 13.0], "policy": [20.0, 21.0, 22.0, 23.0]}


def test_a_policy_side_pod_expects_its_two_drops_per_address_and_the_other_side_none() -> None:
    cookie = pod_cookie("c1", "eth0").value
    got = pol.expected_pending("policy", "c1", "eth0", ["10.245.0.7/21", "fd00::7/64"])
    assert got[0] == cookie and len(got[1]) == 4
    assert all(table == 26 and prio == 230 and actions == "drop" for table, prio, _, actions in got[1])
    assert {m for _, _, match, _ in got[1] for m in match if m.startswith(("nw_", "ipv6_"))} == \
        {"nw_src=10.245.0.7", "nw_dst=10.245.0.7", "ipv6_src=fd00::7", "ipv6_dst=fd00::7"}
    assert pol.expected_pending("none", "c1", "eth0", ["10.245.0.7/21"]) == (cookie, frozenset())


def test_the_dump_check_accepts_the_plan_and_catches_what_differs() -> None:
    c = pod_cookie("c1", "eth0").value
    other = pod_cookie("c2", "eth0").value
    want = dict([pol.expected_pending("policy", "c1", "eth0", ["10.245.0.7/21"]),
                 pol.expected_pending("none", "c2", "eth0", ["10.245.0.8/21"])])
    installed = pol.installed_pending(_dumped(DUMP.format(c=c)))
    assert set(installed) == {c} and len(installed[c]) == 2  # the Pod's other flow and the miss flow left out
    assert pol.pending_problems(want, installed) == []
    # a policy-side Pod missing one of its drops
    half = pol.installed_pending(_dumped(DUMP.format(c=c).replace("nw_dst", "nw_tos=0,nw_dst", 1)))
    assert any("missing" in p and "nw_dst=10.245.0.7" in p for p in pol.pending_problems(want, half))
    # a Pod of the other side holding drops
    swapped = pol.installed_pending(_dumped(DUMP.format(c=c) + DUMP.format(c=other)))
    problems = pol.pending_problems(want, swapped)
    assert len(problems) == 1 and problems[0].startswith(f"cookie 0x{other:x}: 2 pending drops, 0 expected")
    # after the DELs nothing is expected: any drop is left over
    assert pol.pending_problems({}, {}) == []
    assert "2 pending drops under 1 cookies of no Pod" in pol.pending_problems({}, installed)[0]


def test_ratios_are_policy_over_none_with_the_issue_target() -> None:
    ms: dict[str, dict[pol.Side, list[float]]] = {
        "add": {"none": [40.0, 50.0, 60.0], "policy": [42.0, 52.0, 66.0]},
        "del": {"none": [30.0, 30.0, 30.0], "policy": [33.0, 33.0, 33.0]}}
    r = pol.ratios(ms)
    assert r["ADD p50"] == pytest.approx(52 / 50) and r["pass"] is True and r["target"] == "ADD p50 <= 1.05x"
    assert r["ADD p99"] == pytest.approx(66 / 60) and r["DEL p50"] == pytest.approx(1.1)
    assert r["ADD per pair, median"] == pytest.approx(1.05)
    ms["add"]["policy"] = [45.0, 55.0, 66.0]
    assert pol.ratios(ms)["pass"] is False  # 1.10x


def test_the_report_has_issue_27s_goal_from_the_policy_phase() -> None:
    cni = {"policy": {"add": {"none": {"p50": 20.0}, "policy": {"p50": 22.0}}}}
    rows = {r.figure: r for r in report.goal_rows({"meta": {}, "benchmarks": {"cni": {"status": "ok", "data": cni}}})}
    row = rows["ADD p50, namespace with policies / without"]
    assert row.issue == 27 and row.target == "<= 1.05x" and row.ratio == pytest.approx(1.1) and row.verdict == "short"
