"""What a Node's watches receive, counted from outside route-sync (issue 46's scale runs): the
PeerSlice watches of one Node (the label selectors route-sync opens with ``policyPeers:
peerSlices``, :func:`routesync.policy.peerslice.node_selectors`) and, for today's design beside
it, a watch of every Pod.  Each runs on a thread of its own with the kubernetes client (made in the
API server's network namespace: the threads inherit it), lists, then watches from that list's
resourceVersion; every event is kept with the Pods it changed and its size on the wire.

``Received.changed`` is what a Node's planner would see move: the keys (namespace/name) whose entry
appeared, went or changed in one slice event, the slice's previous content against its new one."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from routesync.policy import peerslice
from routesync.policy.model import namespace_from, pod_from, policy_from
from routesync.policy.plan import Inputs


def inputs_of(api: Any) -> Inputs:
    """Every Pod, Namespace and NetworkPolicy the API has, as the planners read them (what
    :func:`routesync.policy.subscription.subscribed` and :func:`routesync.policy.relevance.reads`
    take, to name the groups a Node asks for and the Pods it reads)."""
    from kubernetes import client

    core, net = client.CoreV1Api(api), client.NetworkingV1Api(api)
    raw = api.sanitize_for_serialization
    pods = tuple(p for o in core.list_pod_for_all_namespaces().items if (p := pod_from(raw(o))) is not None)
    nss = dict(namespace_from(raw(o)) for o in core.list_namespace().items)
    pols = tuple(policy_from(raw(o)) for o in net.list_network_policy_for_all_namespaces().items)
    return Inputs(pods, nss, pols)


@dataclass(frozen=True)
class Received:
    at: float  # time.monotonic() when it arrived
    kind: str  # ADDED, MODIFIED, DELETED
    name: str
    changed: frozenset[str]
    size: int  # bytes of the object as JSON (what the watch carried, near enough)


def _entries(obj: dict[str, Any]) -> dict[str, Any]:
    try:
        return {p.key: p for p in peerslice.from_object(obj).spec.pods}
    except ValueError:
        return {}


@dataclass
class _Stream:
    thread: threading.Thread
    watch: Any


@dataclass
class Watches:
    """Watches started by :meth:`slices_of` / :meth:`every_pod`; :meth:`stop` ends them all."""

    api_client: Any
    events: dict[str, list[Received]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # a watch that broke before stop(): its counts are short
    _stopped: threading.Event = field(default_factory=threading.Event)
    _streams: list[_Stream] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def slices_of(self, node: str) -> None:
        """Record, under ``node``, the events of the PeerSlices labelled for it."""
        self.selected(node, peerslice.node_selectors(node))

    def selected(self, node: str, selectors: list[str]) -> None:
        """Record, under ``node``, the events of the PeerSlices each of ``selectors`` selects (one
        list and watch per selector, as route-sync's Reflectors)."""
        from kubernetes import client

        api: Any = client.CustomObjectsApi(self.api_client)
        self.events.setdefault(node, [])
        for selector in selectors:
            lst = api.list_cluster_custom_object(peerslice.GROUP, peerslice.VERSION, peerslice.PLURAL,
                                                 label_selector=selector)
            seen = {o["metadata"]["name"]: _entries(o) for o in lst["items"]}
            rv = lst["metadata"]["resourceVersion"]
            self._start(node, seen, lambda w, sel=selector, rv=rv: w.stream(
                api.list_cluster_custom_object, peerslice.GROUP, peerslice.VERSION, peerslice.PLURAL,
                label_selector=sel, resource_version=rv, timeout_seconds=3600))

    def groups_of(self, node: str, groups: frozenset[str]) -> None:
        """Record, under ``node``, the events of the PeerSlices of ``groups`` (delivery by
        subscription: the selectors a Node's route-sync asks for them with)."""
        self.selected(node, peerslice.group_selectors(groups))

    def every_pod(self, key: str = "every-pod") -> None:
        """Record, under ``key``, every Pod event of the cluster (today's design: each Node's)."""
        from kubernetes import client

        core: Any = client.CoreV1Api(self.api_client)
        self.events.setdefault(key, [])
        rv = core.list_pod_for_all_namespaces(limit=1).metadata.resource_version
        self._start(key, None, lambda w: w.stream(core.list_pod_for_all_namespaces, resource_version=rv,
                                                  timeout_seconds=3600))

    def _start(self, key: str, seen: dict[str, dict[str, Any]] | None, stream: Any) -> None:
        from kubernetes import watch

        w = watch.Watch()

        def run() -> None:
            from kubernetes.client.exceptions import ApiException
            from urllib3.exceptions import HTTPError

            try:
                consume()
            except (OSError, ValueError, HTTPError, ApiException) as e:  # closed under a stopped watch: its end
                if not self._stopped.is_set():
                    with self._lock:
                        self.errors.append(f"{key}: {type(e).__name__}: {e}")

        def consume() -> None:
            for ev in stream(w):
                obj = ev["raw_object"] if "raw_object" in ev else ev["object"]
                if not isinstance(obj, dict):
                    obj = self.api_client.sanitize_for_serialization(obj)
                meta = obj.get("metadata") or {}
                name = f"{meta.get('namespace', '')}/{meta.get('name', '')}".lstrip("/")
                if seen is None:
                    changed = frozenset({name})
                else:
                    old = seen.pop(name, {})
                    new = {} if ev["type"] == "DELETED" else _entries(obj)
                    if new:
                        seen[name] = new
                    changed = frozenset(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
                rec = Received(time.monotonic(), ev["type"], name, changed, len(json.dumps(obj)))
                with self._lock:
                    self.events[key].append(rec)

        t = threading.Thread(target=run, daemon=True, name=f"watch-{key}")
        self._streams.append(_Stream(t, w))
        t.start()

    def since(self, key: str, t0: float) -> list[Received]:
        with self._lock:
            return [e for e in self.events.get(key, []) if e.at >= t0]

    def stop(self) -> None:
        self._stopped.set()
        for s in self._streams:
            s.watch.stop()
