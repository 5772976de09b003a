"""Simulated Nodes and Pods for the scale runs (issue 46): objects in the lab's real API server
(its etcd, its watch cache, its label filter) that no kubelet backs, beside the lab's real Nodes.

Why objects whose status is set here, not kwok: what the scale runs measure is what the API server
sends Ferry's watchers, and a kwok Node or Pod is, to the API server, exactly such an object (kwok
too only writes their status); kwok's own work (heartbeats, Pod phases on a schedule) would add
writes Ferry never reads and a Go build to CI.  A simulated Pod is bound by ``spec.nodeName`` (the
scheduler never sees it), tolerates every taint (the Node lifecycle controller taints a Node with no
kubelet unreachable, and would evict), and gets ``status.podIPs`` from :func:`pod_status`, as a
kubelet would after an ADD.

Addresses: simulated Nodes' transport addresses from 198.18.0.0/15 (RFC 2544's benchmarking range:
no lab segment uses it, nothing is sent there that leaves a namespace of the lab), their Pod CIDRs
/27s of the cluster CIDR's upper half (10.244.128.0/17: the controller-manager hands the real
Nodes /24s from the bottom), 29 Pods each at most (:data:`PODS_PER_NODE`).

Pure planning (:func:`node_objects`, :func:`pod_objects`, :func:`pod_status`) and a thin applier
(:class:`Simulator`, the kubernetes client with a thread pool)."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from routesync.model import TRANSPORT_ANNOTATION

NODE_PREFIX = "sim-"
TRANSPORT_NET = ipaddress.ip_network("198.18.0.0/15")
POD_NET = ipaddress.ip_network("10.244.128.0/17")
POD_PREFIX = 27
PODS_PER_NODE = 2 ** (32 - POD_PREFIX) - 3  # 29: the /27 but its network, broadcast and gateway addresses
SIM_LABEL = "ferry-lab/simulated"  # "yes" on every simulated object, to find and delete them
IMAGE = "registry.invalid/simulated:0"  # never pulled: no kubelet runs a simulated Pod


@dataclass(frozen=True)
class SimPod:
    """One simulated Pod: where it is, what it is labelled, its address."""

    namespace: str
    name: str
    node: str
    labels: Mapping[str, str]
    ip: str
    ports: tuple[tuple[str, int], ...] = ()  # named container ports (name, TCP port)


def node_name(i: int) -> str:
    return f"{NODE_PREFIX}{i:04d}"


def node_objects(count: int) -> list[dict[str, Any]]:
    """``count`` Node objects, each with a transport address and a /27 Pod CIDR of its own."""
    subnets = POD_NET.subnets(new_prefix=POD_PREFIX)
    if count > 2 ** (POD_PREFIX - POD_NET.prefixlen):
        raise ValueError(f"nodes: {count} simulated Nodes do not fit {POD_NET} in /{POD_PREFIX}s")
    out = []
    for i in range(count):
        cidr = str(next(subnets))
        out.append({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": node_name(i), "labels": {SIM_LABEL: "yes"},
                                 "annotations": {TRANSPORT_ANNOTATION: str(TRANSPORT_NET[i + 1])}},
                    "spec": {"podCIDR": cidr, "podCIDRs": [cidr]}})
    return out


def node_pod_ips(index: int) -> Iterator[str]:
    """The addresses of simulated Node ``index``'s Pods, in order: its /27's but the first, which
    route-sync takes for the Node's gateway (as on a real Node)."""
    net = ipaddress.ip_network((int(POD_NET.network_address) + index * 2 ** (32 - POD_PREFIX), POD_PREFIX))
    return (str(a) for a in list(net.hosts())[1:])


def pod_object(pod: SimPod) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": pod.namespace, "name": pod.name, "labels": {SIM_LABEL: "yes", **pod.labels}},
            "spec": {"nodeName": pod.node,
                     "containers": [{"name": "c", "image": IMAGE,
                                     "ports": [{"name": n, "containerPort": p} for n, p in pod.ports]}],
                     "tolerations": [{"operator": "Exists"}]}}


def pod_status(pod: SimPod) -> dict[str, Any]:
    """What a kubelet would write after the CNI's ADD: Running, with its address."""
    return {"status": {"phase": "Running", "podIP": pod.ip, "podIPs": [{"ip": pod.ip}]}}


def pod_objects(nodes: int, per_node: int, namespaces: Iterable[str],
                labels: Any, ports: tuple[tuple[str, int], ...] = ()) -> list[SimPod]:
    """``per_node`` Pods on each of ``nodes`` simulated Nodes, dealt round the ``namespaces``;
    ``labels(i)`` gives the i-th Pod's labels (the caller's shapes), ``ports`` every Pod's."""
    if per_node > PODS_PER_NODE:
        raise ValueError(f"per_node: {per_node} Pods do not fit a /{POD_PREFIX}")
    nss = list(namespaces)
    out = []
    i = 0
    for n in range(nodes):
        ips = node_pod_ips(n)
        for _ in range(per_node):
            out.append(SimPod(nss[i % len(nss)], f"sim-{i:06d}", node_name(n), dict(labels(i)), next(ips), ports))
            i += 1
    return out


@contextmanager
def api_netns(netns_name: str) -> Iterator[None]:
    """This thread (and the threads it starts) in the API server's network namespace."""
    from pyroute2 import netns

    netns.pushns(netns_name)
    try:
        yield
    finally:
        netns.popns()


class Simulator:
    """Writes simulated objects through the kubernetes client (``api_client``: the lab's admin
    kubeconfig, used from the API server's network namespace), ``workers`` requests at a time."""

    def __init__(self, api_client: Any, workers: int = 8) -> None:
        from kubernetes import client

        self.core: Any = client.CoreV1Api(api_client)
        self.workers = workers

    def each(self, fn: Any, items: Iterable[Any]) -> None:
        """``fn`` of every item, ``workers`` at a time."""
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            list(pool.map(fn, items))

    def create_namespaces(self, names: Iterable[str], labels: Any = lambda _n: {}) -> None:
        self.each(lambda n: self.core.create_namespace(
            {"metadata": {"name": n, "labels": {SIM_LABEL: "yes", **labels(n)}}}), names)

    def create_nodes(self, objects: Iterable[dict[str, Any]]) -> None:
        self.each(self.core.create_node, objects)

    def create_pod(self, pod: SimPod) -> None:
        self.core.create_namespaced_pod(pod.namespace, pod_object(pod))
        self.core.patch_namespaced_pod_status(pod.name, pod.namespace, pod_status(pod))

    def create_pods(self, pods: Iterable[SimPod]) -> None:
        self.each(self.create_pod, pods)

    def delete_pod(self, pod: SimPod) -> None:
        self.core.delete_namespaced_pod(pod.name, pod.namespace, grace_period_seconds=0)

    def label_pod(self, pod: SimPod, labels: Mapping[str, str | None]) -> None:
        """Merge ``labels`` into the Pod's (None: remove the key)."""
        self.core.patch_namespaced_pod(pod.name, pod.namespace, {"metadata": {"labels": dict(labels)}})

    def delete_all(self, timeout: float = 300.0) -> None:
        """Every simulated Pod, Node and Namespace (by :data:`SIM_LABEL`); returns once the
        Namespaces are gone, so that the same names can be written again.  The Pods go first, at
        once (no kubelet would confirm a graceful deletion: the namespace controller would wait
        for the Pod garbage collector)."""
        sel = f"{SIM_LABEL}=yes"
        for ns in self.core.list_namespace(label_selector=sel).items:
            if ns.metadata.deletion_timestamp is None:
                self.core.delete_collection_namespaced_pod(ns.metadata.name, grace_period_seconds=0)
                self.core.delete_namespace(ns.metadata.name)
        self.core.delete_collection_node(label_selector=sel)
        deadline = time.monotonic() + timeout
        while left := [ns.metadata.name for ns in self.core.list_namespace(label_selector=sel).items]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"simulated Namespaces not gone after {timeout:.0f} s: {', '.join(left)}")
            time.sleep(0.5)  # polling the API server for a condition; nothing is timed
