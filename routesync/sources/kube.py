"""Kubernetes Node source: list + watch Node objects with the official client.

A background thread keeps a cache of :class:`NodeRecord` by Node name:

* list (``GET /api/v1/nodes``), remember ``metadata.resourceVersion``, replace the cache;
* watch from that version with bookmarks (``?watch=true&allowWatchBookmarks=true``):
  ADDED/MODIFIED/DELETED update the cache, BOOKMARK only advances the version;
* a watch that ends (the server's timeout) or breaks (connection reset, refused while the API
  server restarts) is opened again from the last version seen, after exponential backoff
  (0.2 s doubling to 30 s) when it failed: like client-go's reflector, so an API server restart
  does not make every Node re-list at once;
* an ERROR event with code 410 (Gone: that version is compacted away, or older than a restarted
  API server's watch cache) forces a re-list at once: changes in between were never seen;
* a failed list, or the server refusing the watch itself (403, 500, ...), waits with the same
  backoff and re-lists.

Objects are read as plain JSON dicts (``return_type=object``): the model classes cost far more
than the three fields Ferry reads (``spec.podCIDRs``, ``status.addresses``, annotations)."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from ..model import TRANSPORT_ANNOTATION, NodeRecord
from .base import NodeSource, SourceError, validate_record

log = logging.getLogger(__name__)

FERRY_ANNOTATION_PREFIX = "ferry.io/"
BACKOFF_MIN, BACKOFF_MAX = 0.2, 30.0
WATCH_TIMEOUT = 300  # seconds; the server closes the watch, we resume from the last version
PATCH_CONTENT_TYPE = "application/merge-patch+json"


def record_from_node(node: dict[str, Any]) -> NodeRecord:
    """A Node object (JSON) → NodeRecord; ValueError when it lacks what Ferry needs."""
    meta = node.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str):
        raise ValueError("Node without metadata.name")  # noqa: TRY004
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if isinstance(k, str) and k.startswith(FERRY_ANNOTATION_PREFIX) and isinstance(v, str)}
    spec = node.get("spec") or {}
    cidrs = spec.get("podCIDRs") or ([spec["podCIDR"]] if spec.get("podCIDR") else [])
    if TRANSPORT_ANNOTATION in annotations:
        addrs = [a.strip() for a in annotations[TRANSPORT_ANNOTATION].split(",") if a.strip()]
    else:
        addrs = [str(a.get("address")) for a in (node.get("status") or {}).get("addresses") or []
                 if isinstance(a, dict) and a.get("type") == "InternalIP"]
    return validate_record(NodeRecord(
        name=name,
        transport_addresses=tuple(str(a) for a in addrs),
        pod_cidrs=tuple(str(c) for c in cidrs),
        annotations=tuple(sorted(annotations.items())),
    ))


def api_client(kubeconfig: str | None) -> Any:
    """A ``kubernetes.client.ApiClient``: from ``kubeconfig`` when given, else the in-cluster
    service account, else ``~/.kube/config`` (``kubernetes.config.ConfigException`` when none)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
    cfg.socket_options = keepalive_socket_options()
    return client.ApiClient(cfg)


KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 15, 5, 3  # seconds, seconds, probes


def keepalive_socket_options() -> list[tuple[int, int, int]]:
    """urllib3's default socket options plus TCP keepalive: a connection the network dropped
    without a word is closed after ~30 s, and the watch resumes on a new one.

    Why: route-sync reaches the API server through the ``kubernetes`` Service, which kube-proxy
    DNATs and (the source being outside the cluster CIDRs) masquerades. When route-sync moves the
    uplink onto the bridge, the kernel flushes the conntrack entries masqueraded through the
    address that moved; the API server's next packet meets no NAT, the host resets it, and the
    watch socket, which only reads, would wait for the read timeout (5.5 min) seeing no events.
    A keepalive probe gets the server's reset instead."""
    import socket

    import urllib3

    return [*urllib3.connection.HTTPConnection.default_socket_options,
            (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
            (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE),
            (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL),
            (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_COUNT)]


def read_node(kubeconfig: str | None, name: str, timeout: float = 10.0) -> dict[str, Any]:
    """``GET /api/v1/nodes/<name>`` as a JSON dict (one request, no retries)."""
    from kubernetes import client

    api = api_client(kubeconfig)
    try:
        resp: Any = client.CoreV1Api(api).read_node(name, _preload_content=False, _request_timeout=timeout)
        doc = json.loads(resp.data)
    finally:
        api.close()
    if not isinstance(doc, dict):
        raise ValueError(f"Node {name!r}: the API server answered {type(doc).__name__}, not an object")  # noqa: TRY004
    return doc


class KubeSource(NodeSource):
    def __init__(self, node_name: str, api_client: Any) -> None:
        from kubernetes import client

        self.node_name = node_name
        self.api = client.CoreV1Api(api_client)
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._nodes: dict[str, NodeRecord] = {}
        self._annotations: dict[str, dict[str, str]] = {}  # ferry.io/* annotations as the server has them
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        self.resource_version: str | None = None
        self.relists = 0  # observable for tests and `show`
        self.errors = 0  # failed lists and watches (a 410 is not one)
        self.expired = 0  # watches answered 410 Gone

    @classmethod
    def from_kubeconfig(cls, node_name: str, kubeconfig: str | None) -> KubeSource:
        return cls(node_name, api_client(kubeconfig))

    # -- the watch loop --------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kube-nodes", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        w = self._watch
        if w is not None:
            w.stop()
            resp = getattr(w, "_resp", None)
            if resp is not None and hasattr(resp, "shutdown"):  # urllib3 >= 2.3: unblock the read
                try:
                    resp.shutdown()
                except Exception:  # noqa: BLE001, S110
                    pass
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.api.api_client.close()

    def _relist(self) -> None:
        resp: Any = self.api.list_node(_preload_content=False, _request_timeout=30)
        body = json.loads(resp.data)
        nodes: dict[str, NodeRecord] = {}
        anns: dict[str, dict[str, str]] = {}
        for item in body.get("items") or []:
            self._store(item, nodes, anns)
        with self._lock:
            self._nodes, self._annotations = nodes, anns
        self.resource_version = body["metadata"]["resourceVersion"]
        self.relists += 1
        self._synced.set()
        self._changed.set()

    @staticmethod
    def _store(obj: dict[str, Any], nodes: dict[str, NodeRecord], anns: dict[str, dict[str, str]]) -> None:
        try:
            rec = record_from_node(obj)
        except (ValueError, TypeError) as e:
            log.warning("kube: skipping Node %r: %s", (obj.get("metadata") or {}).get("name"), e)
            return
        nodes[rec.name] = rec
        anns[rec.name] = dict(rec.annotations)

    def _watch_once(self) -> int:
        """One watch until the server ends it; the number of events it carried."""
        from kubernetes import watch

        self._watch = w = watch.Watch(return_type=object)
        events = 0
        if self._stop.is_set():
            return events
        for ev in w.stream(self.api.list_node, resource_version=self.resource_version,
                           allow_watch_bookmarks=True, timeout_seconds=WATCH_TIMEOUT,
                           _request_timeout=WATCH_TIMEOUT + 30):
            if self._stop.is_set():
                break
            events += 1
            kind, obj = ev.get("type"), ev.get("raw_object") or {}
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if kind == "BOOKMARK":
                self.resource_version = rv or self.resource_version
                continue
            if kind not in ("ADDED", "MODIFIED", "DELETED"):
                continue
            with self._lock:
                if kind == "DELETED":
                    name = str((obj.get("metadata") or {}).get("name"))
                    self._nodes.pop(name, None)
                    self._annotations.pop(name, None)
                else:
                    self._store(obj, self._nodes, self._annotations)
            if rv:
                self.resource_version = rv
            self._changed.set()
        return events

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        need_list = True
        backoff = BACKOFF_MIN
        while not self._stop.is_set():
            try:
                if need_list:
                    self._relist()
                    need_list = False
                started = time.monotonic()
                if self._watch_once() == 0 and time.monotonic() - started < 1.0:
                    # closed at once with nothing in it (a proxy, a server shutting down): not a
                    # loop that hammers the server, the same backoff as a failure
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)
                else:
                    backoff = BACKOFF_MIN
            except ApiException as e:
                if e.status == 410:
                    self.expired += 1
                    log.info("kube: watch version %s expired (410 Gone), re-listing", self.resource_version)
                    need_list = True
                    continue
                self._fail(e, "re-listing")
                need_list = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
            except Exception as e:  # noqa: BLE001
                if self._stop.is_set():
                    break
                # A list that failed is listed again; a broken watch resumes from its version.
                self._fail(e, "re-listing" if need_list else f"watching again from version {self.resource_version}")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)

    def _fail(self, e: BaseException, then: str) -> None:
        self.errors += 1
        log.warning("kube: Node list/watch failed (%s: %s); %s", type(e).__name__, e, then)

    # -- NodeSource ---------------------------------------------------------------------------
    def list(self) -> list[NodeRecord]:
        self.start()
        if not self._synced.wait(timeout=10):
            raise SourceError("Kubernetes Nodes not listed yet")
        self._changed.clear()
        with self._lock:
            return [self._nodes[n] for n in sorted(self._nodes)]

    def wait_for_change(self, timeout: float) -> bool:
        return self._changed.wait(timeout)

    def publish_self(self, record: NodeRecord) -> None:
        """Patch this Node's ``ferry.io/*`` annotations (merge patch: other keys untouched)."""
        if record.name != self.node_name:
            raise ValueError(f"this source publishes {self.node_name!r} only, not {record.name!r}")
        want = {k: v for k, v in record.annotations if k.startswith(FERRY_ANNOTATION_PREFIX)}
        with self._lock:
            have = self._annotations.get(record.name)
        if have is not None and all(have.get(k) == v for k, v in want.items()):
            return
        if not want:
            return
        self.api.patch_node(record.name, {"metadata": {"annotations": want}},
                            _content_type=PATCH_CONTENT_TYPE, _request_timeout=30,
                            _preload_content=False)
        with self._lock:
            self._annotations.setdefault(record.name, {}).update(want)
