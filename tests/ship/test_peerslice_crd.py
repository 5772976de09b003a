"""The PeerSlice CRD deploy/ ships (deploy/crds/ferry.io_peerslices.yaml; the chart's crds/ holds
the same bytes, test_cnp_crd.py checks the folder) serves the objects controller/slices.py writes:
its names are the module's, its schema is structural (a type on every node, nothing kept unknown),
names every field an object has (the API server would prune one it does not, silently), admits the
objects the controller writes and refuses malformed ones."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from controller import slices
from routesync.policy import peerslice
from routesync.policy.model import NamedPort, Pod
from routesync.policy.spanindex import GroupReach, GroupView

CRD = Path(__file__).resolve().parents[2] / "deploy" / "crds" / "ferry.io_peerslices.yaml"


def crd() -> dict[str, Any]:
    doc = yaml.safe_load(CRD.read_text())
    assert isinstance(doc, dict)
    return doc


def schema() -> dict[str, Any]:
    (version,) = crd()["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def nodes(s: dict[str, Any], where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield where, s
    for name, sub in (s.get("properties") or {}).items():
        yield from nodes(sub, f"{where}.{name}")
    if isinstance(s.get("items"), dict):
        yield from nodes(s["items"], f"{where}[]")
    if isinstance(s.get("additionalProperties"), dict):
        yield from nodes(s["additionalProperties"], f"{where}{{}}")


def objects() -> list[dict[str, Any]]:
    pods = {f"a/p{i}": Pod("a", f"p{i}", "n1", (("app", "web"),), ("10.0.0.1", "fd00::1"),
                           (NamedPort("http", "TCP", 80), NamedPort("dns", "UDP", 53), NamedPort("m3ua", "SCTP", 2905)))
            for i in range(5)}
    groups = {"g0": GroupView(frozenset({"a/p0"}), GroupReach(everywhere=True)),
              "g1": GroupView(frozenset({"a/p1", "a/p0"}), GroupReach(frozenset({"n2", "n3"}))),
              "g2": GroupView(frozenset({"a/p2"}), GroupReach(populated=True)),
              "g3": GroupView(frozenset({"a/p3"}), GroupReach(frozenset({"x" * 80})))}
    return [peerslice.to_object(name, spec) for by_subscription in (False, True)
            for name, spec in slices.plan_slices(pods, groups, by_subscription=by_subscription).items()]


def test_the_crd_names_what_the_controller_writes() -> None:
    doc = crd()
    spec = doc["spec"]
    assert doc["metadata"]["name"] == f"{peerslice.PLURAL}.{peerslice.GROUP}"
    assert (spec["group"], spec["names"]["kind"], spec["names"]["plural"], spec["scope"]) == \
        (peerslice.GROUP, peerslice.KIND, peerslice.PLURAL, "Cluster")
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == (peerslice.VERSION, True, True)
    assert schema()["properties"]["pods"]["maxItems"] == peerslice.MAX_PODS_LIMIT


def test_the_schema_is_structural_and_keeps_nothing_unknown() -> None:
    for where, node in nodes(schema()):
        assert "type" in node, f"{where or '.'}: no type"
        assert "x-kubernetes-preserve-unknown-fields" not in node, where
        if node.get("x-kubernetes-list-type") == "map":
            assert set(node["x-kubernetes-list-map-keys"]) <= set(node["items"]["required"]), where


def test_the_schema_names_every_field_of_an_object() -> None:
    s = schema()
    pods_items = s["properties"]["pods"]["items"]
    audience_fields: set[str] = set()
    for obj in objects():
        assert set(obj) <= set(s["properties"])
        audience_fields.update(obj["audience"])
        for entry in obj["pods"]:
            assert set(entry) == set(pods_items["properties"])
            for port in entry["ports"]:
                assert set(port) == set(pods_items["properties"]["ports"]["items"]["properties"])
    assert audience_fields == set(s["properties"]["audience"]["properties"])


def test_the_schema_admits_the_controllers_objects() -> None:
    objs = objects()
    assert len(objs) == 8  # one per group: everyone twice, {n2, n3}, the long Node's; then each for its subscribers
    for obj in objs:
        jsonschema.validate(obj, schema())


@pytest.mark.parametrize(("change", "field"), [
    (lambda o: o["pods"][0]["ports"][0].update(protocol="ICMP"), "protocol"),
    (lambda o: o["pods"][0]["ports"][0].update(number=0), "number"),
    (lambda o: o["pods"][0].pop("ips"), "ips"),
    (lambda o: o["pods"][0].update(labels={"app": 1}), "labels"),
    (lambda o: o.pop("audience"), "audience"),
    (lambda o: o.update(pods=[o["pods"][0]] * (peerslice.MAX_PODS_LIMIT + 1)), "pods"),
])
def test_the_schema_refuses_malformed_objects(change: Any, field: str) -> None:
    obj = objects()[0]
    change(obj)
    with pytest.raises(jsonschema.ValidationError) as e:
        jsonschema.validate(obj, schema())
    assert field in str(e.value.message) or field in e.value.json_path, e.value
