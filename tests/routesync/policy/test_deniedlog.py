"""The denied log, pure: the userdata a drop flow carries and its reading back, the line, the
per-Node bound (token bucket) and the once-per-connection rule, and the plan's flows for it."""

from __future__ import annotations

import pytest

from cni.ovs.openflow.packetin import Connection
from cni.pipeline.actions import Controller
from cni.pipeline.tables import DENIED_LOG_METER, EgressDefault, IngressDefault, Table
from routesync.policy import deniedlog as dl
from routesync.policy import plan as pp
from routesync.policy.model import Pod, policy_from

TCP = Connection(4, 6, "10.244.1.5", "10.244.2.7", 41234, 80)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_userdata_round_trips_and_stays_short() -> None:
    data = dl.userdata("ingress", "ns/pod", ["ns/policy-b", "ns/policy-a"])
    assert data == b"F1|ingress|ns/pod|ns/policy-a,ns/policy-b"
    assert dl.parse_userdata(data) == dl.Denial("ingress", "ns/pod", ("ns/policy-a", "ns/policy-b"))
    many = [f"ns/policy-{i:03d}" for i in range(200)]
    long = dl.userdata("egress", "ns/pod", many)
    assert len(long) <= dl.MAX_USERDATA
    back = dl.parse_userdata(long)
    assert back is not None and back.more > 0 and len(back.policies) + back.more == 200
    assert back.policies == tuple(many[:len(back.policies)])
    for foreign in (b"", b"F1|sideways|ns/pod|", b"F2|ingress|ns/pod|x", b"\xff|ingress|a|b", b"F1|ingress||x"):
        assert dl.parse_userdata(foreign) is None
    with pytest.raises(ValueError, match="direction"):
        dl.userdata("inbound", "ns/pod", [])


def test_the_line_names_connection_pod_and_policies() -> None:
    d = dl.Denial("ingress", "ns/pod", ("ns/policy-a", "ns/policy-b"))
    assert dl.line(TCP, d) == ("denied: TCP 10.244.1.5:41234 -> 10.244.2.7:80, ingress to ns/pod, "
                               "isolated by ns/policy-a, ns/policy-b")
    e = dl.Denial("egress", "ns/pod", ("ns/p",), more=3)
    assert dl.line(TCP, e).endswith("egress from ns/pod, isolated by ns/p and 3 more")


def test_a_connection_logs_once_and_the_node_at_most_its_bound() -> None:
    clock = Clock()
    log = dl.DeniedLog(rate=2, burst=3, clock=clock)
    data = dl.userdata("ingress", "ns/pod", ["ns/deny"])
    assert log.offer(TCP, data) is not None
    assert log.offer(TCP, data) is None and log.repeats == 1  # a retransmitted SYN
    flood = [Connection(4, 6, "10.244.1.5", "10.244.2.7", port, 80) for port in range(1000, 1100)]
    lines = [log.offer(c, data) for c in flood]
    assert sum(x is not None for x in lines) == 2  # the burst (3) less the first line
    assert log.suppressed == 98 and log.logged == 3
    clock.now += 1.0  # 2 tokens a second
    assert [log.offer(Connection(4, 6, "10.0.0.9", "10.244.2.7", p, 80), data) is not None
            for p in range(3)] == [True, True, False]
    clock.now += dl.REPEAT_SECONDS
    assert log.offer(TCP, data) is not None  # long after: a new connection with the same 5-tuple
    assert log.offer(TCP, b"not ours") is None and log.offer(None, data) is None and log.foreign == 2


def _plan(denied_log: bool) -> pp.Plan:
    pods = (Pod("ns", "b", "n1", (("app", "b"),), ("10.0.0.2", "fd00::2"), ()),
            Pod("ns", "c", "n1", (("app", "c"),), ("10.0.0.3",), ()))
    deny = policy_from({"metadata": {"namespace": "ns", "name": "deny"},
                        "spec": {"podSelector": {"matchLabels": {"app": "b"}}, "policyTypes": ["Ingress"]}})
    out = policy_from({"metadata": {"namespace": "ns", "name": "out"},
                       "spec": {"podSelector": {}, "policyTypes": ["Egress"]}})
    return pp.plan(pp.Inputs(pods, {"ns": ()}, (deny, out)), pp.NodeFacts("n1", denied_log=denied_log))


def test_each_isolation_drop_gets_a_metered_new_connection_flow_above_it() -> None:
    on, off = _plan(True), _plan(False)
    up = [f for f in on.flows if any(isinstance(a, Controller) for a in f.actions)]
    assert not [f for f in off.flows if any(isinstance(a, Controller) for a in f.actions)]
    assert len(on.flows) == len(off.flows) + len(up)
    # b: ingress and egress, both families; c: egress only, one family
    assert sorted((int(f.table), f.priority) for f in up) == sorted(
        [(int(Table.INGRESS_DEFAULT), IngressDefault.ISOLATED_NEW)] * 2
        + [(int(Table.EGRESS_DEFAULT), EgressDefault.ISOLATED_NEW)] * 3)
    for f in up:
        (a,) = f.actions
        assert isinstance(a, Controller) and a.meter_id == DENIED_LOG_METER and a.max_len == pp.DENIED_LOG_MAX_LEN
        assert "ct_state=+new+trk" in f.text()
        d = dl.parse_userdata(a.userdata)
        assert d is not None
        # each direction names the policies that isolate it in that direction
        want = {("ingress", "ns/b"): ("ns/deny",), ("egress", "ns/b"): ("ns/out",), ("egress", "ns/c"): ("ns/out",)}
        assert d.policies == want[(d.direction, d.pod)]
    assert len({f.cookie for f in on.flows}) == len(on.flows)


def test_the_counters_are_in_prometheus() -> None:
    from routesync.metrics import RouteSyncMetrics
    from routesync.policy.listener import DeniedListener

    clock = Clock()
    listener = DeniedListener("br-int", "/nonexistent", dl.DeniedLog(1, 1, clock))
    data = dl.userdata("ingress", "ns/pod", ["ns/deny"])
    for port in (1, 2, 3):
        listener.denied.offer(Connection(4, 6, "10.0.0.1", "10.0.0.2", port, 80), data)
    metrics = RouteSyncMetrics()
    text = metrics.exposition()[0].decode()
    assert "denied_log" not in text  # the log off: no series
    metrics.policy.denied_log = listener
    text = metrics.exposition()[0].decode()
    assert "ferry_route_sync_policy_denied_log_lines_total 1.0" in text
    assert "ferry_route_sync_policy_denied_log_suppressed_total 2.0" in text
    assert "ferry_route_sync_policy_denied_log_listening 0.0" in text


def _remote_plan(denied_log: bool) -> pp.Plan:
    """A client on n2 whose egress two policies isolate, a server here that nothing allows it."""
    pods = (Pod("a", "cli", "n2", (("app", "cli"),), ("10.0.2.5", "fd00:2::0005"), ()),
            Pod("b", "srv", "n1", (("app", "srv"),), ("10.0.1.5",), ()))
    out = [policy_from({"metadata": {"namespace": "a", "name": name},
                        "spec": {"podSelector": {"matchLabels": {"app": "cli"}}, "policyTypes": ["Egress"]}})
           for name in ("out-2", "out-1")]
    return pp.plan(pp.Inputs(pods, {"a": (), "b": ()}, tuple(out)), pp.NodeFacts("n1", denied_log=denied_log))


def test_a_remote_pods_isolation_goes_up_once_for_all_and_names_the_pod_by_its_source() -> None:
    on, off = _remote_plan(True), _remote_plan(False)
    n = on.remote_isolation_id
    assert n is not None and off.remote_isolation_id == n and not off.remote_sources
    up = [f for f in on.flows if any(isinstance(a, Controller) for a in f.actions)]
    assert len(on.flows) == len(off.flows) + 1 == len(off.flows) + len(up)
    (f,) = up
    assert (f.table, f.priority) == (Table.EGRESS_DEFAULT, EgressDefault.REMOTE_ISOLATED_NEW)
    assert EgressDefault.REMOTE_ISOLATED < f.priority < EgressDefault.ISOLATED
    assert f.match_text() == f"conj_id={n},ct_state=+new+trk"
    (a,) = f.actions
    assert isinstance(a, Controller) and a.meter_id == DENIED_LOG_METER
    assert dl.parse_userdata(a.userdata) == dl.Denial("egress", dl.REMOTE, ())
    # the addresses as the packet-in reads them (IPv6 compressed), each to the Pod and its policies
    assert on.remote_sources == {"10.0.2.5": ("a/cli", ("a/out-1", "a/out-2")),
                                 "fd00:2::5": ("a/cli", ("a/out-1", "a/out-2"))}


def test_a_remote_denial_is_logged_with_the_pod_the_plan_names() -> None:
    log = dl.DeniedLog(100, 100, Clock())
    data = dl.userdata("egress", dl.REMOTE, ())
    log.set_remote(_remote_plan(True).remote_sources)
    six = Connection(6, 6, "fd00:2::5", "fd00:1::5", 40000, 80)
    assert log.offer(six, data) == ("denied: TCP [fd00:2::5]:40000 -> [fd00:1::5]:80, egress from a/cli "
                                    "(of another Node, judged here), isolated by a/out-1, a/out-2")
    log.set_remote({})  # a plan without it (the Pod gone since the packet left): the address stands for it
    gone = Connection(4, 6, "10.0.2.5", "10.0.1.5", 40001, 80)
    assert log.offer(gone, data) == ("denied: TCP 10.0.2.5:40001 -> 10.0.1.5:80, egress from a Pod at 10.0.2.5 "
                                     "(of another Node, judged here), isolated by ?")


def test_remote_drops_are_counted_for_prometheus() -> None:
    from cni.ovs.openflow.ofctl import DumpedFlow
    from routesync.metrics import Observer, RouteSyncMetrics
    from routesync.policy import stats

    p = _remote_plan(True)
    n = p.remote_isolation_id
    t = int(Table.EGRESS_DEFAULT)
    new = EgressDefault.REMOTE_ISOLATED_NEW
    flows = [DumpedFlow(t, new, 0, f"conj_id={n},ct_state=+new+trk", "controller", 3, 180),
             DumpedFlow(t, EgressDefault.REMOTE_ISOLATED, 0, f"conj_id={n}", "drop", 4, 240),
             DumpedFlow(t, EgressDefault.REMOTE_ISOLATED, 0, "ip,nw_dst=10.0.1.5", f"conjunction({n},2/2)", 9, 540),
             DumpedFlow(t, EgressDefault.ISOLATED, 0, f"conj_id={n}0", "drop", 100, 6000)]
    assert stats.remote_denied(n, flows) == 7 and stats.remote_denied(None, flows) == 0
    assert stats.denied({"b/srv": ["10.0.1.5"]}, flows) == {}  # not the local server's drops
    metrics = RouteSyncMetrics()
    Observer(metrics).policy_counters(p, flows)
    assert "ferry_route_sync_policy_remote_denied_packets_total 7.0" in metrics.exposition()[0].decode()


def test_a_cluster_policy_denial_is_read_back_and_its_line_names_the_policy_and_rule() -> None:
    data = dl.tier_userdata("egress", "Admin/10/deny-api", 2, "no-api-server")
    assert data == b"T1|egress|Admin/10/deny-api|2|no-api-server"
    assert dl.parse_tier_userdata(data) == dl.TierDenial("egress", "Admin/10/deny-api", 2, "no-api-server")
    assert dl.parse_userdata(data) is None  # not a NetworkPolicy isolation's
    for foreign in (b"T1|egress|x|y|z", b"T1|sideways|Admin/1/p|0|r", b"T1|egress||0|r", b"T2|egress|a|0|r"):
        assert dl.parse_tier_userdata(foreign) is None
    log = dl.DeniedLog(100, 100, Clock())
    assert log.offer(TCP, data) == ("denied: TCP 10.244.1.5:41234 -> 10.244.2.7:80, egress, by ClusterNetworkPolicy "
                                    'deny-api (Admin tier, priority 10), egress rule 2 "no-api-server"')
    assert log.offer(TCP, data) is None and log.repeats == 1  # once per connection, as the others
    unnamed = dl.tier_userdata("ingress", "Baseline/0/base", 0, "")
    assert log.offer(Connection(4, 17, "10.0.0.1", "10.0.0.2", 5, 53), unnamed).endswith(
        "by ClusterNetworkPolicy base (Baseline tier, priority 0), ingress rule 0")
