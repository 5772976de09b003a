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
