"""The chaos driver's schedule and op stream (pure, no root): every event runs at its mark, with
no op running and none started past the mark until it has run, however fast the ops are."""

from __future__ import annotations

import threading
import time

import pytest

from tests.e2e.chaos.run_chaos import (
    ROUTE_SYNC_KILL,
    ROUTE_SYNC_START,
    VSWITCHD_NODE,
    VSWITCHD_RESTART,
    Event,
    OpStream,
    Report,
    Settings,
    schedule,
)

NODES = ["node-1", "node-2", "node-3"]
HANG = 30.0  # s: bounds a hang only


def _run(stream: OpStream, workers: int, on_event, on_op=lambda i: None) -> list[str]:  # type: ignore[no-untyped-def]
    """Drive ``stream`` as the chaos driver does; returns the log of ops and events, in order."""
    log: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        while (i := stream.claim()) is not None:
            with lock:
                log.append(f"op{i}")
            on_op(i)
            stream.finish()

    def events() -> None:
        while (ev := stream.next_event()) is not None:
            try:
                on_event(ev)
                with lock:
                    log.append(f"{ev.what}@{stream.finished}")
                ev.happened = True
            finally:
                stream.event_done(ev)

    threads = [threading.Thread(target=worker) for _ in range(workers)] + [threading.Thread(target=events)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG)
        assert not t.is_alive(), "the op stream hung"
    return log


def _wait_until(cond, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + HANG
    while not cond():
        assert time.monotonic() < deadline, f"not within {HANG} s: {what}"
        time.sleep(0.001)


def test_ci_size_schedule() -> None:
    s = Settings(ops=150, route_sync_restarts=2, vswitchd_restart=True)
    assert [(e.mark, e.what, e.node) for e in schedule(s, NODES)] == [
        (50, ROUTE_SYNC_KILL, "node-1"), (62, ROUTE_SYNC_START, "node-1"),
        (75, VSWITCHD_RESTART, "node-1"),
        (100, ROUTE_SYNC_KILL, "node-2"), (112, ROUTE_SYNC_START, "node-2")]


def test_vswitchd_restart_waits_for_its_nodes_route_sync() -> None:
    """Half-time inside node-1's route-sync outage: the restart moves to right after its start."""
    evs = schedule(Settings(ops=150, route_sync_restarts=1, vswitchd_restart=True), NODES)
    assert [(e.mark, e.what) for e in evs] == [(75, ROUTE_SYNC_KILL), (93, ROUTE_SYNC_START),
                                               (93, VSWITCHD_RESTART)]
    assert evs[-1].node == VSWITCHD_NODE


def test_full_size_schedule_has_every_event_inside_the_run() -> None:
    s = Settings(ops=1000, route_sync_restarts=4, vswitchd_restart=True)
    evs = schedule(s, NODES)
    assert [e.what for e in evs].count(ROUTE_SYNC_KILL) == 4 and [e.what for e in evs].count(VSWITCHD_RESTART) == 1
    assert all(0 < e.mark < s.ops for e in evs)


def test_each_event_runs_at_its_mark_with_the_stream_held() -> None:
    """Instant ops (the fastest machine): every event still runs after exactly ``mark`` ops, and
    while it runs all workers are held at the mark."""
    evs = schedule(Settings(ops=150, route_sync_restarts=2, vswitchd_restart=True), NODES)
    stream = OpStream(150, evs)
    workers = 4

    def on_event(ev: Event) -> None:  # the stream holds every worker until this returns
        _wait_until(lambda: stream.waiting == workers, f"all workers held at {ev.what}'s mark")

    log = _run(stream, workers, on_event)
    assert all(e.happened for e in evs) and Report(events=evs).missing_events == []
    for ev in evs:
        at = log.index(f"{ev.what}@{ev.mark}")  # ran when exactly `mark` ops had finished
        ops_before = {x for x in log[:at] if x.startswith("op")}
        assert ops_before == {f"op{i}" for i in range(ev.mark)}
    assert sorted(x for x in log if x.startswith("op")) == sorted(f"op{i}" for i in range(150))


def test_slow_ops_hold_the_event_until_they_finish() -> None:
    """An event waits for the ops before its mark to finish, not only to start."""
    stream = OpStream(4, [Event(2, ROUTE_SYNC_KILL, "node-2")])
    release = threading.Event()

    def on_op(i: int) -> None:
        if i == 1:
            release.wait(HANG)

    def on_event(ev: Event) -> None:
        assert stream.finished == 2

    t = threading.Thread(target=lambda: _wait_until(lambda: stream.waiting == 1, "worker held") or release.set())
    t.start()
    log = _run(stream, 2, on_event, on_op)
    t.join()
    assert log.index(f"{ROUTE_SYNC_KILL}@2") > log.index("op1")
    assert log.index(f"{ROUTE_SYNC_KILL}@2") < log.index("op2")


def test_a_stopped_run_reports_the_events_it_did_not_reach() -> None:
    evs = [Event(1, ROUTE_SYNC_KILL, "node-2"), Event(3, VSWITCHD_RESTART, "node-1")]
    stream = OpStream(5, evs)

    def on_op(i: int) -> None:
        if i == 1:
            stream.stop()  # an error: the workers stop claiming

    _run(stream, 1, lambda ev: None, on_op)
    r = Report(events=evs)
    assert [e.happened for e in evs] == [True, False]
    assert r.missing_events == ["ovs-vswitchd restart on node-1 at op 3 did not happen: never reached"]
    assert not r.ok


def test_a_mark_past_the_end_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        OpStream(10, [Event(11, VSWITCHD_RESTART, "node-1")])
