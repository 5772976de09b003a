"""Services on the lab's Kubernetes cluster: the objects (pure), and the probes that use them.

A Service's backends are lab Pods (busybox, plugged by Ferry) labelled for the Service's selector,
each with the lab's echo server (``lab/echo.py``, TCP and UDP on :data:`lab.api.ECHO_PORT`) running
in its network namespace: kube-proxy only sees Pod IPs and ports, and the echo answer says which
backend answered and which source address it saw (SNAT or not).  Names resolve through CoreDNS
with ``lab/dnsprobe.py`` (UDP and TCP) and, as a Pod's own resolver does, with busybox's
``agnhost connect`` in a Pod of its own (Go's resolver, the Pod's resolv.conf, search path and all)."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lab.api import Host, Lab, Node, Pod, Probe
    from lab.kube.cluster import Cluster

NAMESPACE = "default"
LABEL = "ferry-lab/service"
DNS_PROBE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dnsprobe.py")


def service(name: str, target_port: int, port: int = 80, node_port: bool = False, local: bool = False,
            affinity: bool = False, udp: bool = False, families: tuple[int, ...] = (),
            selects: str | None = None) -> dict[str, Any]:
    """A Service selecting the Pods labelled ``ferry-lab/service=<selects or name>`` (pure).  ``node_port``:
    type NodePort (``local``: externalTrafficPolicy Local); ``affinity``: sessionAffinity ClientIP;
    ``families``: (6,) or (4, 6) ask for IPv6 or dual-stack (PreferDualStack)."""
    ports = [{"name": "tcp", "port": port, "targetPort": target_port, "protocol": "TCP"}]
    if udp:
        ports.append({"name": "udp", "port": port, "targetPort": target_port, "protocol": "UDP"})
    spec: dict[str, Any] = {"selector": {LABEL: selects or name}, "ports": ports}
    if node_port:
        spec["type"] = "NodePort"
        spec["externalTrafficPolicy"] = "Local" if local else "Cluster"
    if affinity:
        spec["sessionAffinity"] = "ClientIP"
    if families:
        spec["ipFamilies"] = [f"IPv{f}" for f in families]
        spec["ipFamilyPolicy"] = "PreferDualStack" if len(families) > 1 else "SingleStack"
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


@dataclass(frozen=True)
class Endpoint:
    """What the API says a Service has: its ClusterIPs, NodePort (TCP) and ready backends."""

    cluster_ips: tuple[str, ...]
    node_port: int | None
    ready: tuple[str, ...]  # backend addresses


def endpoint_of(svc: dict[str, Any], slices: list[dict[str, Any]]) -> Endpoint:
    """(pure) from the Service object and its EndpointSlices."""
    spec = svc["spec"]
    ips = tuple(spec.get("clusterIPs") or [spec["clusterIP"]])
    node_port = next((p.get("nodePort") for p in spec["ports"] if p["protocol"] == "TCP"), None)
    ready = tuple(sorted(a for s in slices for e in s.get("endpoints") or []
                         if (e.get("conditions") or {}).get("ready") for a in e["addresses"]))
    return Endpoint(ips, node_port, ready)


def backend(lab: Lab, pod: Pod, name: str, *more: str) -> None:
    """Make ``pod`` a backend of the Services that select ``name`` (and each of ``more``): its
    labels (``ferry-lab/service=<name>``, ``ferry-lab/service-<m>=yes``), and the echo server in
    its netns."""
    from lab.kube.pods import api_name

    lab.ensure_echo(pod.netns)
    lab.kube().kubectl("label", "pod", "-n", NAMESPACE, api_name(pod.node, pod.name), f"{LABEL}={name}",
                       *(f"{LABEL}-{m}=yes" for m in more), "--overwrite")


def group_selector(group: str) -> dict[str, str]:
    """The selector of the Pods :func:`backend` put in ``group`` (one of its ``more``)."""
    return {f"{LABEL}-{group}": "yes"}


def endpoint(cluster: Cluster, name: str) -> Endpoint | None:
    cp = cluster.kubectl("get", "service", "-n", NAMESPACE, name, "-o", "json", check=False)
    if cp.returncode != 0:
        return None
    sl = cluster.kubectl("get", "endpointslices", "-n", NAMESPACE, "-l", f"kubernetes.io/service-name={name}",
                         "-o", "json", check=False)
    slices = json.loads(sl.stdout)["items"] if sl.returncode == 0 else []
    return endpoint_of(json.loads(cp.stdout), slices)


def create(cluster: Cluster, doc: dict[str, Any], backends: int, timeout: float = 60.0) -> Endpoint:
    """Apply ``doc``; returns once its EndpointSlices list ``backends`` ready addresses per family."""
    from lab.kube.cluster import wait_for

    cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
    name = doc["metadata"]["name"]
    got: list[Endpoint | None] = [None]

    def ready() -> bool:
        got[0] = endpoint(cluster, name)
        ep = got[0]
        return ep is not None and len(ep.ready) >= backends * len(ep.cluster_ips)
    wait_for(f"Service {name} with {backends} ready backends", ready, timeout, lambda: repr(got[0]))
    assert got[0] is not None
    return got[0]


def until(probe_once: Any, timeout: float = 30.0) -> Probe:
    """The first passing probe, or the last failing one when ``timeout`` ran out: kube-proxy programs
    a new Service on its own schedule after the API has it (the deadline only bounds a hang)."""
    deadline = time.monotonic() + timeout
    delay = 0.1
    while True:
        p = probe_once()
        if p.ok or time.monotonic() > deadline:
            return p
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)


def resolve(src: Pod | Host | Node, server: str, name: str, tcp: bool = False, aaaa: bool = False,
            timeout: float = 3.0) -> dict[str, Any]:
    """``lab/dnsprobe.py`` in ``src``'s namespace: {"ok", "rcode", "addresses", "error"}."""
    cp = src.exec([sys.executable, "-I", "-S", DNS_PROBE, server, name, "AAAA" if aaaa else "A",
                   "tcp" if tcp else "udp", str(timeout)], timeout=timeout + 10)
    try:
        return dict(json.loads(cp.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return {"ok": False, "rcode": None, "addresses": [], "error": f"client failed: {cp.stderr.strip()[-200:]}"}


def resolve_in_pod(cluster: Cluster, node: str, name: str, port: int, timeout: float = 60.0) -> tuple[bool, str]:
    """A Pod on ``node`` resolves ``name`` with its own resolver (Go's, reading the resolv.conf the
    kubelet wrote: search path, ndots, kube-dns) and opens a TCP connection to it (``agnhost
    connect``; busybox's nslookup ignores the search path). Returns (exit 0, what it printed)."""
    from lab.kube.cluster import wait_for
    from lab.kube.dns import AGNHOST_IMAGE

    pod = f"resolve-{node}-{int(time.monotonic() * 1000) % 100000}"
    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": NAMESPACE},
           "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", "image": AGNHOST_IMAGE, "imagePullPolicy": "Never",
                                    "args": ["connect", f"{name}:{port}", "--timeout=10s"]}]}}
    cluster.kubectl("create", "-f", "-", input=json.dumps(doc))
    phase = [""]

    def done() -> bool:
        obj = cluster.pod(NAMESPACE, pod)
        phase[0] = ((obj or {}).get("status") or {}).get("phase", "")
        return phase[0] in ("Succeeded", "Failed")
    try:
        wait_for(f"Pod {pod} to finish", done, timeout, lambda: phase[0])
        logs = cluster.kubectl("logs", "-n", NAMESPACE, pod, check=False).stdout.strip()
    finally:
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, pod, "--wait=false", check=False)
    return phase[0] == "Succeeded", logs


def demo(lab: Lab, client: Pod, server: Pod) -> list[tuple[str, bool, str]]:
    """What ``ferry-lab demo --kubernetes`` shows beyond the matrix: ``client`` resolves
    ``kubernetes.default`` in its own resolver, and reaches Service ``demo-echo`` (backend
    ``server``) by the name CoreDNS gives, over TCP and UDP. Rows: (check, ok, detail)."""
    cluster = lab.kube()
    ok, out = resolve_in_pod(cluster, client.node, "kubernetes.default", 443)
    rows = [(f"a Pod on {client.node} resolves kubernetes.default (its resolv.conf) and connects to :443", ok,
             out or "ok")]
    backend(lab, server, "demo-echo")
    from lab.api import ECHO_PORT

    create(cluster, service("demo-echo", ECHO_PORT, udp=True), 1)
    fqdn = f"demo-echo.{NAMESPACE}.svc.cluster.local"
    assert cluster.plan.dns_ip is not None
    r = resolve(client, cluster.plan.dns_ip, fqdn)
    rows.append((f"{fqdn} via kube-dns {cluster.plan.dns_ip}", bool(r["ok"]), " ".join(r["addresses"]) or r["error"]))
    if r["ok"]:
        ip = r["addresses"][0]
        for udp in (False, True):
            p = until(lambda u=udp: lab.connect(client, ip, 80, udp=u))
            rows.append((f"{client.node}/{client.name} -> {ip}:80/{'udp' if udp else 'tcp'} (backend on {server.node})",
                         p.ok, f"answered by {p.server}, saw {p.peer}" if p.ok else p.detail))
    return rows


__all__ = ["Endpoint", "backend", "create", "demo", "endpoint_of", "group_selector", "resolve", "resolve_in_pod",
           "service", "until"]
