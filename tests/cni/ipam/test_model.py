"""Randomized model test: 16 real processes doing 2,000 ADD/DEL/GC operations in total on one store.

Each worker owns its attachments. A shared registry says which attachments "exist" (like the
kubelet's Pods): an attachment is registered before its ADD and unregistered after its DEL, so a
GC with the registry as its valid set must never release a live attachment.  Workers also "leak"
attachments (unregister without DEL: a lost DEL) that a later GC must release.  A shared ledger of
addresses handed out catches any address given to two live attachments at once; after every
operation the worker checks the store's invariants under its lock.  At the end the store equals
the model exactly."""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import random
from pathlib import Path
from typing import Any

from cni.ipam import api
from cni.ipam.store import Store
from cni.spec.errors import IPAM_EXHAUSTED, CniError

WORKERS = 16
OPS_PER_WORKER = 125  # 2,000 in total
RANGES = [[{"subnet": "10.77.0.0/26"}], [{"subnet": "fd77::/122"}]]  # 61 and 62 usable: exhaustion happens


def _conf(data: str) -> api.IpamConfig:
    return api.parse_config({"name": "fi-model", "ipam": {"dataDir": data, "ranges": RANGES}}, [])


class _RW:
    """Readers (ADD/DEL) share, GC excludes them: the registry snapshot GC uses stays true."""

    def __init__(self, path: str, mode: int) -> None:
        self.path, self.mode = path, mode

    def __enter__(self) -> None:
        self.f = open(self.path, "a")
        fcntl.flock(self.f, self.mode)

    def __exit__(self, *exc: object) -> None:
        self.f.close()


def _worker(w: int, data: str, rwlock: str, registry: Any, ledger: Any, ledger_lock: Any,
            out: Any) -> None:
    try:
        _work(w, data, rwlock, registry, ledger, ledger_lock, out)
    except BaseException as e:  # noqa: BLE001 - report it, never leave the parent waiting
        out.put((w, {}, [f"worker {w} crashed: {e!r}"], {}))


def _work(w: int, data: str, rwlock: str, registry: Any, ledger: Any, ledger_lock: Any,
          out: Any) -> None:
    rnd = random.Random(1000 + w)
    conf = _conf(data)
    live: dict[tuple[str, str], list[str]] = {}
    errors: list[str] = []
    counts = {"add": 0, "exhausted": 0, "del": 0, "leak": 0, "gc": 0, "gc_released": 0, "readd": 0}
    serial = 0

    def claim(key: tuple[str, str], addrs: list[str]) -> None:
        with ledger_lock:
            for a in addrs:
                other = ledger.get(a)
                if other is not None and tuple(other) != key:
                    errors.append(f"{a} handed to {key} while {other} holds it")
                ledger[a] = key

    def unclaim(addrs: list[str]) -> None:
        with ledger_lock:
            for a in addrs:
                ledger.pop(a, None)

    for _ in range(OPS_PER_WORKER):
        r = rnd.random()
        if r < 0.45 or not live:
            serial += 1
            key = (f"w{w}-c{serial}", rnd.choice(["eth0", "net1"]))
            with _RW(rwlock, fcntl.LOCK_SH):
                registry[key] = w
                try:
                    ips = [i.address for i in api.allocate(conf, *key)]
                except CniError as e:
                    if e.code != IPAM_EXHAUSTED:
                        raise
                    counts["exhausted"] += 1
                    del registry[key]
                    with Store(conf.store_dir).locked() as txn:
                        if txn.get(key) is not None:
                            errors.append(f"{key}: failed ADD left a record")
                    continue
            claim(key, ips)
            live[key] = ips
            counts["add"] += 1
        elif r < 0.78:
            key = rnd.choice(sorted(live))
            with _RW(rwlock, fcntl.LOCK_SH):
                unclaim(live.pop(key))
                api.release(conf, *key)
                del registry[key]
            counts["del"] += 1
        elif r < 0.83:
            key = rnd.choice(sorted(live))
            unclaim(live.pop(key))
            del registry[key]  # a lost DEL: only GC can free it now
            counts["leak"] += 1
        elif r < 0.93:
            with _RW(rwlock, fcntl.LOCK_EX):
                valid = {tuple(k) for k in registry.copy()}
                released = api.gc(conf, valid)  # type: ignore[arg-type]
            for k in released:
                if k in valid:
                    errors.append(f"gc released live {k}")
            counts["gc"] += 1
            counts["gc_released"] += len(released)
        else:
            key = rnd.choice(sorted(live))
            again = [i.address for i in api.allocate(conf, *key)]
            if again != live[key]:
                errors.append(f"{key}: re-ADD gave {again}, first ADD {live[key]}")
            counts["readd"] += 1
        with Store(conf.store_dir).locked() as txn:
            errors.extend(txn.verify())
            for key, ips in live.items():
                rec = txn.get(key)
                if rec is None or [i.address for i in rec.ips] != ips:
                    errors.append(f"{key}: store has {rec}, model {ips}")
        if errors:
            break
    out.put((w, {f"{k[0]}|{k[1]}": v for k, v in live.items()}, errors, counts))


def test_sixteen_processes_two_thousand_ops(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    data = str(tmp_path / "data")
    rwlock = str(tmp_path / "rw.lock")
    with ctx.Manager() as manager:
        registry, ledger, ledger_lock = manager.dict(), manager.dict(), manager.Lock()
        out = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(w, data, rwlock, registry, ledger, ledger_lock, out))
                 for w in range(WORKERS)]
        for p in procs:
            p.start()
        results = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=30)
        registered = {tuple(k) for k in registry.copy()}
    errors = [e for _, _, errs, _ in results for e in errs]
    assert errors == []
    assert all(p.exitcode == 0 for p in procs)
    totals = {k: sum(c[k] for *_, c in results) for k in results[0][3]}
    assert sum(totals[k] for k in ("add", "exhausted", "del", "leak", "gc", "readd")) == WORKERS * OPS_PER_WORKER
    assert totals["exhausted"] > 0 and totals["gc_released"] > 0 and totals["leak"] > 0, totals
    model = {tuple(k.split("|")): v for _, live, _, _ in results for k, v in live.items()}
    assert set(model) == registered
    conf = _conf(data)
    api.gc(conf, registered)  # leaks nobody collected yet
    with Store(conf.store_dir).locked() as txn:
        assert txn.verify() == []
        assert {r.key: [i.address for i in r.ips] for r in txn.records()} == model
        assert set(txn.claims()) == {a.split("/")[0] for ips in model.values() for a in ips}
    print("model totals:", totals)
