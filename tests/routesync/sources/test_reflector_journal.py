"""The Reflector's journal (what the incremental policy planner applies): a re-list notes the keys
whose parsed value it changed, and :meth:`Reflector.drain` hands them over once, with or without
a snapshot taken at the same instant.  Watch events are noted on the same path
(tests/routesync/sources/test_kube.py runs the watch against a fake API server)."""

from __future__ import annotations

import json
from typing import Any

from routesync.sources.reflector import Reflector


class Lister:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.version = 0

    def __call__(self, **_kw: Any) -> Any:
        self.version += 1
        body = {"metadata": {"resourceVersion": str(self.version)}, "items": self.items}
        return type("Resp", (), {"data": json.dumps(body).encode()})()


def obj(name: str, value: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name}, "spec": {"v": value}}


def test_a_relist_journals_what_it_changed_and_drain_hands_it_over_once() -> None:
    lister = Lister()
    r: Reflector[str] = Reflector("Thing", lister, lambda o: o["spec"]["v"] or None, journal=True)
    lister.items = [obj("a", "1"), obj("b", "1")]
    r._relist()
    assert r.drain() == (1, {"ns/a": "1", "ns/b": "1"}, None)
    lister.items = [obj("a", "1"), obj("b", "2"), obj("c", "")]  # b changed; c parses to nothing
    r._relist()
    lister.items = [obj("b", "2")]  # a gone
    r._relist()
    gen, changes, items = r.drain(snapshot=True)
    assert (gen, changes, items) == (3, {"ns/a": None, "ns/b": "2"}, ["2"])
    assert r.drain() == (3, {}, None)
    plain: Reflector[str] = Reflector("Thing", lister, lambda o: o["spec"]["v"])
    plain._relist()
    assert plain.drain() == (1, {}, None)  # no journal: nothing noted
