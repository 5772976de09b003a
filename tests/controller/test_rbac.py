"""The RBAC of deploy/ferry-controller.yaml is exactly what ferry-controller calls: no more, no less.

A scripted run of the controller's own code over the kubernetes client, whose transport (the
``rest_client`` under ``ApiClient``) is replaced by an in-memory API server that records every
request.  A double of the transport is acceptable here because what is asserted is our own calls
(which resources, which verbs, which names), not how a real API server behaves; the run goes
through the real client, the real Reflectors and Watch, and the library's LeaseLock:

- the Lease: a candidate takes it (read: 404, create), renews it (read, update), and a second
  candidate finds it held (read only);
- the leader (:func:`controller.process.lead`): lists the PeerSlices, lists and watches every
  resource, and once all have listed writes what differs: one slice created (answered 409: it was
  made after the listing; read and replaced), one updated, one deleted (answered 404: gone already).

Each request maps to (API group, resource, verb[, namespace, name]); the set used equals the
ClusterRole's rules expanded, and the Lease calls are those the Role allows, by name where RBAC can
restrict by name."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml
from kubernetes import client
from kubernetes.client import rest

from controller import leader
from controller.process import lead
from controller.slices import plan_slices
from routesync.policy import peerslice, spanindex
from routesync.policy.model import pod_from, policy_from
from routesync.policy.peerslice import SliceSpec, to_object
from routesync.policy.plan import Inputs

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "ferry-controller.yaml"
WAIT = 60.0  # a failsafe only: every wait ends on a condition


class Resp:
    """What urllib3 answers, as much of it as the client reads."""

    def __init__(self, status: int, doc: Any = None, watch: threading.Event | None = None) -> None:
        self.status = status
        self.reason = "OK" if status < 300 else "Error"
        self.data = json.dumps(doc).encode() if doc is not None else b""
        self.headers = {"content-type": "application/json"}
        self._closed = watch

    def stream(self, amt: Any = None, decode_content: Any = None) -> Iterator[bytes]:
        assert self._closed is not None
        self._closed.wait(WAIT)  # a watch that stays open, quiet, until closed
        return iter(())

    def getheaders(self) -> dict[str, str]:
        return self.headers

    def getheader(self, name: str, default: Any = None) -> Any:
        return self.headers.get(name, default)

    def close(self) -> None:
        if self._closed is not None:
            self._closed.set()

    release_conn = shutdown = close


def parse(method: str, url: str) -> tuple[tuple[str, str, str, str, str], dict[str, list[str]]]:
    """(group, resource, verb, namespace, name) of a request, and its query."""
    u = urlparse(url)
    segs = [s for s in u.path.split("/") if s]
    if segs[0] == "api":
        group, rest_ = "", segs[2:]
    else:
        group, rest_ = segs[1], segs[3:]
    ns = ""
    if rest_[0] == "namespaces" and len(rest_) >= 3:
        ns, rest_ = rest_[1], rest_[2:]
    resource, name = rest_[0], (rest_[1] if len(rest_) > 1 else "")
    query = parse_qs(u.query)
    verb = {"POST": "create", "PUT": "update", "DELETE": "delete", "PATCH": "patch"}.get(method)
    if verb is None:
        verb = "get" if name else ("watch" if query.get("watch") == ["true"] else "list")
    return (group, resource, verb, ns, name), query


class ApiServer:
    """Objects by (group, resource, namespace, name); list, watch (quiet), get, create, update
    with resourceVersion checks, delete; every request recorded."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str, str, str, str]] = []
        self.rv = 1
        self.changed = threading.Condition()
        self.watches: list[threading.Event] = []
        self.after: dict[tuple[str, str, str], Callable[[], None]] = {}  # (group, resource, verb) -> hook

    def put(self, group: str, resource: str, obj: dict[str, Any], ns: str = "") -> None:
        self.rv += 1
        obj = json.loads(json.dumps(obj))
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        self.objects[(group, resource, ns, obj["metadata"]["name"])] = obj

    def of(self, group: str, resource: str) -> dict[str, dict[str, Any]]:
        return {k[3]: v for k, v in self.objects.items() if k[:2] == (group, resource)}

    def request(self, method: str, url: str, headers: Any = None, body: Any = None, post_params: Any = None,
                _request_timeout: Any = None) -> rest.RESTResponse:
        call, _query = parse(method, url)
        group, resource, verb, ns, name = call
        with self.changed:
            self.calls.append(call)
            resp = self._serve(group, resource, verb, ns, name, body)
            self.changed.notify_all()
        hook = self.after.pop((group, resource, verb), None)
        if hook is not None:
            hook()
        return rest.RESTResponse(resp)

    def _serve(self, group: str, resource: str, verb: str, ns: str, name: str, body: Any) -> Resp:
        key = (group, resource, ns, name)
        if verb == "list":
            items = [v for k, v in sorted(self.objects.items()) if k[:2] == (group, resource)]
            return Resp(200, {"kind": "List", "metadata": {"resourceVersion": str(self.rv)}, "items": items})
        if verb == "watch":
            closed = threading.Event()
            self.watches.append(closed)
            return Resp(200, watch=closed)
        if verb == "get":
            return Resp(200, self.objects[key]) if key in self.objects else gone(name)
        if verb == "delete":
            if self.objects.pop(key, None) is None:
                return gone(name)
            return Resp(200, {"kind": "Status", "status": "Success", "code": 200})
        name = body["metadata"]["name"]
        key = (group, resource, ns, name)
        if verb == "create":
            if key in self.objects:
                return Resp(409, {"kind": "Status", "code": 409, "reason": "AlreadyExists"})
            self.put(group, resource, body, ns)
            return Resp(201, self.objects[key])
        assert verb == "update", verb
        if key not in self.objects:
            return gone(name)
        if body["metadata"].get("resourceVersion") != self.objects[key]["metadata"]["resourceVersion"]:
            return Resp(409, {"kind": "Status", "code": 409, "reason": "Conflict"})
        self.put(group, resource, body, ns)
        return Resp(200, self.objects[key])


def gone(name: str) -> Resp:
    return Resp(404, {"kind": "Status", "code": 404, "reason": "NotFound", "message": f"{name} not found"})


def api_client(server: ApiServer) -> Any:
    c = client.ApiClient(client.Configuration())
    c.rest_client = server  # type: ignore[assignment]  # the recording double
    return c


def pod(ns: str, name: str, node: str, ip: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name, "labels": labels}, "spec": {"nodeName": node},
            "status": {"phase": "Running", "podIPs": [{"ip": ip}]}}


def allow_from(ns: str, name: str, subject: str, peer: str) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name},
            "spec": {"podSelector": {"matchLabels": {"app": subject}}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": peer}}}]}]}}


def cluster(server: ApiServer) -> dict[str, SliceSpec]:
    """A small cluster (two groups: web read on n1, web2 on n2); the slices it should have."""
    for ns in ("a", "b"):
        server.put("", "namespaces", {"metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}})
    pods = [pod("a", "db", "n1", "10.0.1.2", app="db"), pod("a", "web", "n2", "10.0.2.2", app="web"),
            pod("a", "web-b", "n3", "10.0.3.2", app="web"), pod("b", "db2", "n2", "10.0.2.3", app="db2"),
            pod("b", "web2", "n1", "10.0.1.3", app="web2")]
    for p in pods:
        server.put("", "pods", p, p["metadata"]["namespace"])
    policies = [allow_from("a", "db", "db", "web"), allow_from("b", "db2", "db2", "web2")]
    for p in policies:
        server.put("networking.k8s.io", "networkpolicies", p, p["metadata"]["namespace"])
    parsed = {p.key: p for p in (pod_from(o) for o in pods) if p is not None}
    inputs = Inputs(tuple(parsed.values()), {"a": (("kubernetes.io/metadata.name", "a"),),
                                             "b": (("kubernetes.io/metadata.name", "b"),)},
                    tuple(policy_from(p) for p in policies))
    views = spanindex.group_views(inputs, remote_egress=False)
    return plan_slices(parsed, {peerslice.group_name(g): v for g, v in views.items()})


def rbac() -> tuple[set[tuple[str, str, str]], list[dict[str, Any]]]:
    """The ClusterRole's rules expanded to (group, resource, verb); the Role's rules as written."""
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    (cr,) = [d for d in docs if d["kind"] == "ClusterRole"]
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert role["metadata"]["namespace"] == "kube-system"
    cluster_rules = {(g, r, v) for rule in cr["rules"] for g in rule["apiGroups"] for r in rule["resources"]
                     for v in rule["verbs"]}
    assert not any("resourceNames" in rule for rule in cr["rules"])
    return cluster_rules, role["rules"]


def allowed(rules: list[dict[str, Any]], group: str, resource: str, verb: str, name: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
               and ("resourceNames" not in r or name in r["resourceNames"]) for r in rules)


def test_the_rbac_is_exactly_what_the_controller_calls() -> None:
    server = ApiServer()
    want = cluster(server)
    assert len(want) == 2
    (web_slice, web2_slice) = sorted(want, key=lambda n: [p.key for p in want[n].pods])
    # listed: web2's slice with a stale record (updated), and one nobody reads any more (deleted)
    stale = want[web2_slice]
    readdressed = tuple(p.__class__(p.namespace, p.name, p.node, p.labels, ("10.9.9.9",), p.ports) for p in stale.pods)
    old = SliceSpec(stale.group, stale.audience, readdressed)
    server.put("ferry.io", "peerslices", to_object(web2_slice, old))
    nobody = peerslice.Audience(frozenset({"gone-node"}))
    server.put("ferry.io", "peerslices", to_object(peerslice.slice_name("gnobody", 0),
                                                   SliceSpec("gnobody", nobody, want[web2_slice].pods[:1])))

    def race() -> None:  # after the leader's listing: web's slice appears, the unread one goes
        one = SliceSpec(want[web_slice].group, want[web_slice].audience, want[web_slice].pods[:1])
        server.put("ferry.io", "peerslices", to_object(web_slice, one))
        del server.objects[("ferry.io", "peerslices", "", peerslice.slice_name("gnobody", 0))]
    server.after[("ferry.io", "peerslices", "list")] = race

    # the Lease: taken, renewed, and held against a second candidate
    def nothing() -> None:
        return None

    me = leader.election(api_client(server), "kube-system", "ferry-controller", "me", nothing, nothing)
    assert me.try_acquire_or_renew() and me.try_acquire_or_renew()
    other = leader.election(api_client(server), "kube-system", "ferry-controller", "other", nothing, nothing)
    assert not other.try_acquire_or_renew()
    assert server.of("coordination.k8s.io", "leases")["ferry-controller"]["spec"]["holderIdentity"] == "me"

    # the leader's run, until the slices are what they should be
    stop, wake = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def leading() -> None:
        try:
            lead(api_client(server), lambda: True, stop, wake)
        except BaseException as e:  # noqa: BLE001  # reported below
            with server.changed:
                failed.append(e)
                server.changed.notify_all()

    t = threading.Thread(target=leading, daemon=True)
    t.start()
    expected = {name: to_object(name, spec) for name, spec in want.items()}

    def done() -> bool:
        got = {n: {k: v for k, v in o.items() if k != "metadata"} | {"metadata": {
            k: v for k, v in o["metadata"].items() if k != "resourceVersion"}}
            for n, o in server.of("ferry.io", "peerslices").items()}
        return got == expected or bool(failed)

    with server.changed:
        assert server.changed.wait_for(done, WAIT), server.of("ferry.io", "peerslices")
    stop.set()
    wake.set()
    t.join(WAIT)
    assert not t.is_alive() and not failed, failed
    assert all(w.is_set() for w in server.watches)  # every watch closed on stop

    calls = set(server.calls)
    ferry = {c for c in calls if c[:2] == ("ferry.io", "peerslices")}
    # the run went through every path: created (409, read, replaced), updated, deleted (404)
    assert {c[2] for c in ferry} == {"list", "create", "get", "update", "delete"}, ferry
    cluster_rules, role_rules = rbac()
    leases = {c for c in calls if c[:2] == ("coordination.k8s.io", "leases")}
    used = {c[:3] for c in calls - leases}
    assert all(c[3] == "" for c in calls - leases)  # cluster-wide: the ClusterRole's business
    assert used == cluster_rules, f"used, not granted: {used - cluster_rules}; granted, unused: {cluster_rules - used}"
    assert {c[3] for c in leases} == {"kube-system"}
    assert [c for c in leases if not allowed(role_rules, *c[:3], c[4])] == []
    granted = {(g, r, v) for rule in role_rules for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert {c[:3] for c in leases} == granted
