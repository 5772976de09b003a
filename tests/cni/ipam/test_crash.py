"""Crash test: at least 200 ADDs and DELs, each run in a child process SIGKILLed at a random instant.

The kill delay is drawn over the measured duration of an operation, measured from the moment
the child is about to call the API, so kills land before, inside and after the journaled commit
(the test counts how many found a journal in place).  Where the kills land depends on the
machine's speed, so the run goes on past 200 operations until more than 100 children were
killed and 5 inside the commit (MAX_OPS only bounds a hang).  After every kill the store must open,
replay, and pass its invariant check (no torn file, no address leaked or held twice); repeating
the operation must complete it; the store must always equal the model."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

from cni.ipam import api
from cni.ipam.store import JOURNAL, Store

OPS = 200
MAX_OPS = 20 * OPS
MID_COMMIT = 5
RANGES = [[{"subnet": "10.78.0.0/24"}], [{"subnet": "fd78::/120"}]]


def _run_killed(fn, delay: float) -> bool:  # type: ignore[no-untyped-def]
    """Run ``fn`` in a child, SIGKILL it ``delay`` s after it starts; True if it was killed."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.write(w, b"x")
            fn()
        finally:
            os._exit(0)
    os.close(w)
    os.read(r, 1)
    os.close(r)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status)


def test_sigkill_at_random_instants(tmp_path: Path) -> None:
    conf = api.parse_config({"name": "fi-crash", "ipam": {"dataDir": str(tmp_path), "ranges": RANGES}}, [])
    rnd = random.Random(7)
    # How long one operation takes here, so the kills spread over it.
    t0 = time.perf_counter()
    for i in range(20):
        api.allocate(conf, f"warm{i}", "eth0")
        api.release(conf, f"warm{i}", "eth0")
    span = (time.perf_counter() - t0) / 40 * 1.5

    model: dict[tuple[str, str], list[str]] = {}
    killed = mid_commit = 0
    n = 0
    while n < OPS or killed <= OPS // 2 or mid_commit < MID_COMMIT:
        assert n < MAX_OPS, f"after {n} operations only {killed} kills landed, {mid_commit} inside the commit"
        if len(model) < 3 or rnd.random() < 0.6:
            key = (f"c{n}", "eth0")
            op = "add"
            fn = lambda key=key: api.allocate(conf, *key)
        else:
            key = rnd.choice(sorted(model))
            op = "del"
            fn = lambda key=key: api.release(conf, *key)
        killed += _run_killed(fn, rnd.uniform(0, span))
        mid_commit += os.path.exists(os.path.join(conf.store_dir, JOURNAL))

        with Store(conf.store_dir).locked() as txn:  # replays what the kill interrupted
            assert txn.verify() == [], f"op {n} ({op} {key})"
            after_kill = txn.get(key)
        if op == "add":
            ips = [i.address for i in api.allocate(conf, *key)]  # completes the ADD
            if after_kill is not None:  # the killed ADD had committed: the same addresses again
                assert ips == [i.address for i in after_kill.ips]
            model[key] = ips
        else:
            api.release(conf, *key)
            model.pop(key)
        with Store(conf.store_dir).locked() as txn:
            assert txn.verify() == []
            assert {r.key: [i.address for i in r.ips] for r in txn.records()} == model
            claimed = set(txn.claims())
        assert claimed == {a.split("/")[0] for ips in model.values() for a in ips}  # nothing leaked
        n += 1
    print(f"crash test: {killed} of {n} children killed, {mid_commit} inside the journaled commit")
