"""The embedded registry: two route-syncs on one directory see each other; writes are atomic."""

from __future__ import annotations

import os
import threading
import time

from routesync.model import MAC_ANNOTATION, NodeRecord
from routesync.sources.registry import RegistrySource, parse_record, render_record
from tests.support.waiting import HANG

A = NodeRecord("node-a", ("192.168.77.11",), ("10.244.1.0/24",), ((MAC_ANNOTATION, "02:00:00:00:00:0a"),))
B = NodeRecord("node-b", ("192.168.77.12", "fd00:77::12"), ("10.244.2.0/24", "fd00:10:244:2::/64"))


def test_two_sources_see_each_other(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Each sees the other's writes (how fast is printed: a bound would depend on the machine)."""
    a = RegistrySource(str(tmp_path), "node-a", poll_interval=0.1)
    b = RegistrySource(str(tmp_path), "node-b", poll_interval=0.1)
    a.publish_self(A)
    assert b.list() == [A]
    b.list()
    latencies = []
    for i in range(5):
        rec = NodeRecord("node-a", (f"192.168.77.{20 + i}",), A.pod_cidrs, A.annotations)
        t0 = time.monotonic()
        a.publish_self(rec)
        assert b.wait_for_change(HANG)
        latencies.append(time.monotonic() - t0)
        assert b.list() == [rec]
    print(f"registry change seen after at most {max(latencies) * 1e3:.0f} ms (poll interval 100 ms)")
    b.publish_self(B)
    assert a.wait_for_change(HANG)
    assert [r.name for r in a.list()] == ["node-a", "node-b"]
    assert a.list()[1] == B
    assert not a.wait_for_change(0.3)  # nothing changed: times out


def test_publish_is_atomic_and_skips_identical_writes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    a = RegistrySource(str(tmp_path), "node-a")
    reader = RegistrySource(str(tmp_path), "node-r")
    a.publish_self(A)
    ino = os.stat(tmp_path / "node-a.yaml").st_ino
    a.publish_self(A)
    assert os.stat(tmp_path / "node-a.yaml").st_ino == ino  # unchanged record: no rewrite
    stop = threading.Event()
    seen_bad: list[str] = []

    def read_loop() -> None:
        while not stop.is_set():
            text = (tmp_path / "node-a.yaml").read_text()
            try:
                parse_record(text, "node-a")
            except ValueError as e:
                seen_bad.append(str(e))

    t = threading.Thread(target=read_loop)
    t.start()
    for i in range(200):
        a.publish_self(NodeRecord("node-a", (f"10.0.{i // 250}.{i % 250 + 1}",), A.pod_cidrs,
                                  (("ferry.io/filler", "x" * (i * 37 % 5000)),)))
    stop.set()
    t.join()
    assert seen_bad == []  # a reader never saw half a record
    assert [f for f in os.listdir(tmp_path) if f.startswith(".")] == []  # no temp files left
    assert reader.list()[0].transport_addresses == ("10.0.0.200",)


def test_malformed_record_is_skipped_not_fatal(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    src = RegistrySource(str(tmp_path), "node-a")
    src.publish_self(A)
    (tmp_path / "node-b.yaml").write_text(render_record(B))
    (tmp_path / "node-c.yaml").write_text("name: node-c\ntransportAddresses: [not-an-ip]\npodCIDRs: []\n")
    (tmp_path / "node-d.yaml").write_text("{{{ not yaml")
    (tmp_path / "node-e.yaml").write_text("name: someone-else\n")
    (tmp_path / "node-f.yaml").write_text("name: node-f\npodCIDRs: [10.244.6.1/24]\n")  # host bits set
    (tmp_path / "notes.txt").write_text("ignored")
    assert [r.name for r in src.list()] == ["node-a", "node-b"]
    bad = {f"node-{c}.yaml" for c in "cdef"}
    assert {m for m in bad if any(m in r.getMessage() for r in caplog.records)} == bad
    caplog.clear()
    src.list()
    assert caplog.records == []  # logged once per version of the file, not per scan
    (tmp_path / "node-c.yaml").write_text(render_record(NodeRecord("node-c", ("192.168.88.13",),
                                                                   ("10.244.3.0/24",))))
    assert [r.name for r in src.list()] == ["node-a", "node-b", "node-c"]  # fixed file counts again
    os.unlink(tmp_path / "node-b.yaml")
    assert src.wait_for_change(1.0)
    assert [r.name for r in src.list()] == ["node-a", "node-c"]
