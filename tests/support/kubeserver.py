"""A tiny Kubernetes API server for Node objects, speaking the real wire format.

Only what route-sync's Kubernetes source and install-cni use: ``GET /api/v1/nodes/<name>``,
``GET /api/v1/nodes`` (NodeList with
``metadata.resourceVersion``), ``GET /api/v1/nodes?watch=true&resourceVersion=..`` as a chunked
stream of JSON lines, ERROR events with a ``Status`` (410 Gone when the version is compacted),
BOOKMARK events, and ``PATCH /api/v1/nodes/<name>`` with a JSON merge patch.

A stand-in, kept only where the real kube-apiserver (which the lab runs: tests/e2e/kube/) cannot
produce the case on demand: a bookmark at a chosen moment, a watch dropped with nothing written,
a change only a re-list shows, lists failing with 500 (tests/routesync/test_kube_source.py), and
install-cni reading Node objects of runtimes the lab does not run (CRI-O, containerd 2;
tests/ship/)."""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlparse


def make_node(name: str, internal_ip: str | list[str], pod_cidrs: list[str],
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node object as a kubelet registers it (fields trimmed to the realistic essentials)."""
    ips = [internal_ip] if isinstance(internal_ip, str) else internal_ip
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"5d0e6b1c-0000-4000-8000-{abs(hash(name)) % 10**12:012d}",
            "creationTimestamp": "2024-05-01T10:00:00Z",
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                            **(annotations or {})},
        },
        "spec": {"podCIDR": pod_cidrs[0] if pod_cidrs else None, "podCIDRs": pod_cidrs,
                 "providerID": f"kind://docker/ferry/{name}"},
        "status": {
            "addresses": [{"type": "InternalIP", "address": ip} for ip in ips]
            + [{"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": "2024-05-01T10:05:00Z",
                            "lastTransitionTime": "2024-05-01T10:00:30Z",
                            "message": "kubelet is posting ready status"}],
            "nodeInfo": {"kubeletVersion": "v1.30.0", "osImage": "Debian GNU/Linux 12 (bookworm)",
                         "containerRuntimeVersion": "containerd://1.7.13", "architecture": "amd64",
                         "operatingSystem": "linux", "kernelVersion": "6.1.0-18-amd64",
                         "kubeProxyVersion": "v1.30.0", "machineID": "3f1c0a4e9b8d4c7f",
                         "systemUUID": "3f1c0a4e-9b8d-4c7f-a1b2-c3d4e5f60718",
                         "bootID": "0b9e3a1d-6c1f-4f0e-9a5b-1c2d3e4f5a6b"},
        },
    }


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


class KubeState:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rv = 100
        self.nodes: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[int, dict[str, Any]]] = []  # (rv, event) since `compacted`
        self.compacted = 100  # watches from an older version get 410
        self.fail_lists = 0  # answer the next N list requests with 500
        self.requests: list[tuple[float, str, str]] = []  # (time, method, path?query)
        self.patches: list[tuple[str, str, dict[str, Any]]] = []  # (name, content type, body)
        self.generation = 0  # bumping it ends every open watch (simulated connection drop)
        self.abrupt = False  # the last drop cuts the connection instead of ending the stream
        self.inject: list[dict[str, Any]] = []  # events for open watches only (BOOKMARK, ERROR)

    def _bump(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def put(self, node: dict[str, Any], record: bool = True) -> None:
        with self.cond:
            node = copy.deepcopy(node)
            kind = "MODIFIED" if node["metadata"]["name"] in self.nodes else "ADDED"
            self._bump(node)
            self.nodes[node["metadata"]["name"]] = node
            if record:
                self.events.append((self.rv, {"type": kind, "object": copy.deepcopy(node)}))
            self.cond.notify_all()

    def delete(self, name: str) -> None:
        with self.cond:
            node = self.nodes.pop(name)
            self._bump(node)
            self.events.append((self.rv, {"type": "DELETED", "object": node}))
            self.cond.notify_all()

    def bookmark(self) -> None:
        with self.cond:
            self.rv += 1
            self.inject.append({"type": "BOOKMARK", "object": {
                "kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)}}})
            self.cond.notify_all()

    def compact(self) -> None:
        """Forget every event so far: a watch from any older version now gets 410."""
        with self.cond:
            self.events.clear()
            self.compacted = self.rv

    def drop_watches(self, abrupt: bool = False) -> None:
        """End every open watch: cleanly (the chunked stream's terminator, as at a server timeout),
        or ``abrupt``ly (the connection cut mid-stream, as when the API server dies)."""
        with self.cond:
            self.abrupt = abrupt
            self.generation += 1
            self.cond.notify_all()

    def expire_watches(self) -> None:
        """What the API server does when etcd compacted past a watcher: ERROR 410, then close."""
        with self.cond:
            self.compact()
            self.inject.append(_status_event(410, "Expired", "too old resource version"))
            self.cond.notify_all()


def _status_event(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                        "status": "Failure", "message": message, "reason": reason,
                                        "code": code}}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: KubeState  # set on the subclass

    def log_message(self, fmt: str, *args: Any) -> None:
        pass

    def _json(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        st = self.state
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        with st.cond:  # what a watch started now must still send: injections from here on
            n_inject = len(st.inject)
            st.requests.append((time.monotonic(), "GET", self.path))
        if url.path.startswith("/api/v1/nodes/"):  # GET one Node
            name = url.path.rsplit("/", 1)[-1]
            with st.cond:
                node = copy.deepcopy(st.nodes.get(name))
            if node is None:
                self._json(404, _status_event(404, "NotFound", f'nodes "{name}" not found')["object"])
            else:
                self._json(200, node)
            return
        if url.path != "/api/v1/nodes":
            self._json(404, _status_event(404, "NotFound", url.path)["object"])
            return
        if q.get("watch") != "true":
            with st.cond:
                if st.fail_lists > 0:
                    st.fail_lists -= 1
                    self._json(500, _status_event(500, "InternalError", "etcd unavailable")["object"])
                    return
                body = {"kind": "NodeList", "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(st.rv)},
                        "items": [copy.deepcopy(n) for _, n in sorted(st.nodes.items())]}
            self._json(200, body)
            return
        self._watch(q, n_inject)

    def _watch(self, q: dict[str, str], n_inject: int) -> None:
        st = self.state
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        since = int(q.get("resourceVersion") or st.rv)
        deadline = time.monotonic() + float(q.get("timeoutSeconds") or 300)
        try:
            with st.cond:
                gen = st.generation
                if since < st.compacted:
                    self._chunk(_status_event(410, "Expired", f"too old resource version: {since}"))
                    return
            while True:
                with st.cond:
                    pending = [e for rv, e in st.events if rv > since]
                    injected = st.inject[n_inject:]
                    if not pending and not injected and gen == st.generation:
                        st.cond.wait(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
                        pending = [e for rv, e in st.events if rv > since]
                        injected = st.inject[n_inject:]
                    closed = gen != st.generation
                    n_inject = len(st.inject)
                    if pending:
                        since = max(rv for rv, _ in st.events if rv > since)
                for e in pending:
                    self._chunk(e)
                for e in injected:
                    self._chunk(e)
                    if e["type"] == "ERROR":
                        return
                if closed or time.monotonic() >= deadline:
                    return
        finally:
            try:
                if st.abrupt and gen != st.generation:
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)  # no terminator: a broken stream
                else:
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
            except OSError:
                pass
            self.close_connection = True

    def do_PATCH(self) -> None:
        st = self.state
        st.requests.append((time.monotonic(), "PATCH", self.path))
        name = self.path.rsplit("/", 1)[-1].split("?")[0]
        ctype = self.headers.get("Content-Type", "")
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        st.patches.append((name, ctype, body))
        if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            self._json(415, _status_event(415, "UnsupportedMediaType", ctype)["object"])
            return
        with st.cond:
            node = st.nodes.get(name)
            if node is None:
                self._json(404, _status_event(404, "NotFound", name)["object"])
                return
            node = copy.deepcopy(node)
            _merge(node, body)
        st.put(node)
        self._json(200, st.nodes[name])


class KubeServer:
    def __init__(self) -> None:
        self.state = KubeState()
        handler = type("H", (_Handler,), {"state": self.state})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.state.drop_watches()
        self.httpd.shutdown()
        self.httpd.server_close()

    def kubeconfig(self, path: str) -> str:
        import yaml

        with open(path, "w") as f:
            yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "lab",
                "clusters": [{"name": "lab", "cluster": {"server": self.url}}],
                "users": [{"name": "route-sync", "user": {"token": "not-checked"}}],
                "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "route-sync"}}],
            }, f)
        return path
