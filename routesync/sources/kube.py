"""Kubernetes Node source: list + watch Node objects with the official client.

A background thread (:class:`routesync.sources.reflector.Reflector`: list, then watch from the
listed version with bookmarks, resume after a break with backoff, re-list on 410 Gone, like
client-go's reflector, so an API server restart does not make every Node re-list at once)
keeps a cache of :class:`NodeRecord` by Node name.

Objects are read as plain JSON dicts (``return_type=object``): the model classes cost far more
than the three fields Ferry reads (``spec.podCIDRs``, ``status.addresses``, annotations)."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from ..model import TRANSPORT_ANNOTATION, NodeRecord
from .base import NodeSource, SourceError, validate_record
from .reflector import Reflector
from .sortedrecords import SortedRecords

log = logging.getLogger(__name__)

FERRY_ANNOTATION_PREFIX = "ferry.io/"
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
    """Nodes through a :class:`Reflector` (list + watch, resumes, re-lists on 410)."""

    def __init__(self, node_name: str, api_client: Any) -> None:
        from kubernetes import client

        self.node_name = node_name
        self.api = client.CoreV1Api(api_client)
        self._changed = threading.Event()
        self.reflector: Reflector[NodeRecord] = Reflector("Node", self.api.list_node, record_from_node,
                                                          on_change=self._changed.set, journal=True)
        self._sorted: SortedRecords | None = None  # what list() hands out, changed by the journal
        # ferry.io/* annotations this source patched, with the record the watch had then
        self._published: dict[str, tuple[NodeRecord | None, dict[str, str | None]]] = {}

    @classmethod
    def from_kubeconfig(cls, node_name: str, kubeconfig: str | None) -> KubeSource:
        return cls(node_name, api_client(kubeconfig))

    # observable for tests and `show`
    @property
    def resource_version(self) -> str | None:
        return self.reflector.resource_version

    @property
    def relists(self) -> int:
        return self.reflector.relists

    @property
    def errors(self) -> int:  # failed lists and watches (a 410 is not one)
        return self.reflector.errors

    @property
    def expired(self) -> int:  # watches answered 410 Gone
        return self.reflector.expired

    def start(self) -> None:
        self.reflector.start()

    def reconnect(self) -> None:
        self.reflector.reconnect()

    def close(self) -> None:
        self.reflector.stop()
        self.api.api_client.close()

    # -- NodeSource ---------------------------------------------------------------------------
    def list(self) -> list[NodeRecord]:
        self.start()
        if not self.reflector.synced.wait(timeout=10):
            raise SourceError("Kubernetes Nodes not listed yet")
        self._changed.clear()
        _gen, changes, nodes = self.reflector.drain(snapshot=self._sorted is None)
        if self._sorted is None:
            self._sorted = SortedRecords(nodes or ())
        else:
            self._sorted.change(changes)
        return self._sorted.list()

    def wait_for_change(self, timeout: float) -> bool:
        return self._changed.wait(timeout)

    def wake(self) -> None:
        self._changed.set()

    def publish_self(self, record: NodeRecord) -> None:
        """Patch this Node's ``ferry.io/*`` annotations (merge patch: other keys untouched); those
        the record retracted (``NodeRecord.retracted``) are deleted where the Node has them."""
        if record.name != self.node_name:
            raise ValueError(f"this source publishes {self.node_name!r} only, not {record.name!r}")
        want: dict[str, str | None] = {k: v for k, v in record.annotations if k.startswith(FERRY_ANNOTATION_PREFIX)}
        with self.reflector.lock:
            seen = self.reflector.items.get(record.name)
        have = dict(seen.annotations) if seen is not None else None
        published = self._published.get(record.name)
        if have is not None and published is not None and published[0] is seen:
            # patched since the watch last said anything about this Node: what we sent stands
            # (a later event of the Node is the server's word, and wins)
            for k, v in published[1].items():
                if v is None:
                    have.pop(k, None)
                else:
                    have[k] = v
        # null deletes a key in a merge patch; only what the Node has (an unknown Node: nothing)
        want.update((k, None) for k in sorted(record.retracted) if have is not None and k in have and k not in want)
        if have is not None and all(have.get(k) == v for k, v in want.items()):
            return
        if not want:
            return
        self.api.patch_node(record.name, {"metadata": {"annotations": want}},
                            _content_type=PATCH_CONTENT_TYPE, _request_timeout=30,
                            _preload_content=False)
        self._published[record.name] = (seen, want)
