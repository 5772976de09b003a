"""Cluster DNS for the lab's Kubernetes cluster: CoreDNS as ``kube-system/kube-dns``, as kubeadm
deploys it (ServiceAccount, the ``system:coredns`` role, the Corefile ConfigMap, a Deployment of two
replicas on the Pod network, the Service on the 10th address of the Service CIDR), and the images
the lab makes for it and for the Service tests' servers (agnhost), since no registry is reachable.

What differs from kubeadm's, and why: the Corefile has no ``forward`` (no upstream resolver exists
here: names outside the cluster domain get SERVFAIL quickly instead of a timeout), and the images
are busybox-static plus the statically linked binary (tools/build-go-tools.sh ``coredns`` and
``kube-e2e``); CoreDNS's is named as upstream names it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lab.kube.ociimage import APPLETS, BUSYBOX, ImageSpec

COREDNS_VERSION = "1.12.1"  # tools/coredns/go.mod
COREDNS_IMAGE = f"registry.k8s.io/coredns/coredns:v{COREDNS_VERSION}"
# The lab's own agnhost (busybox-static + the binary): a name of its own, so that e2e's agnhost
# (lab.kube.e2eimages: a Debian root file system with dig, curl, nc), imported by `make
# conformance` under upstream's name, never replaces it or is replaced by it.
AGNHOST_IMAGE = "ferry.local/agnhost:2.56"
NAMESPACE = "kube-system"
LABELS = {"k8s-app": "kube-dns"}

COREFILE = """.:53 {{
    errors
    health {{
        lameduck 5s
    }}
    ready
    kubernetes {domain} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    prometheus :9153
    cache 30
    loop
    reload
    loadbalance
}}
"""


def _busybox_with(name: str, files: dict[str, str], entrypoint: tuple[str, ...]) -> ImageSpec:
    return ImageSpec(name=name, files={"bin/busybox": BUSYBOX, **files},
                     symlinks={f"bin/{a}": "busybox" for a in APPLETS}, entrypoint=entrypoint)


def images(tool: Callable[[str], str]) -> dict[str, ImageSpec]:
    """The images, by archive name; ``tool(name)`` is where a built binary lives."""
    return {
        "coredns": _busybox_with(COREDNS_IMAGE, {"coredns": tool("coredns")}, ("/coredns",)),
        "agnhost": _busybox_with(AGNHOST_IMAGE, {"agnhost": tool("agnhost")}, ("/agnhost",)),
    }


def documents(dns_ips: tuple[str, ...], domain: str, replicas: int = 2) -> list[dict[str, Any]]:
    """kubeadm's CoreDNS objects (pure), for ``kubectl apply``; the Service on ``dns_ips`` (one
    per family: a dual-stack cluster's kube-dns is dual-stack)."""
    families = {"clusterIP": dns_ips[0], "clusterIPs": list(dns_ips),
                "ipFamilyPolicy": "RequireDualStack" if len(dns_ips) > 1 else "SingleStack"}
    meta = {"name": "coredns", "namespace": NAMESPACE}
    rules = [
        {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    ]
    container = {
        "name": "coredns", "image": COREDNS_IMAGE, "imagePullPolicy": "IfNotPresent",
        "args": ["-conf", "/etc/coredns/Corefile"],
        "ports": [{"name": "dns", "containerPort": 53, "protocol": "UDP"},
                  {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": 9153, "protocol": "TCP"}],
        "volumeMounts": [{"name": "config-volume", "mountPath": "/etc/coredns", "readOnly": True}],
        "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}, "initialDelaySeconds": 10,
                          "periodSeconds": 10, "failureThreshold": 5},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
        "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}},
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "system:coredns"}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": NAMESPACE}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
         "data": {"Corefile": COREFILE.format(domain=domain)}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {**meta, "labels": LABELS},
         "spec": {"replicas": replicas, "selector": {"matchLabels": LABELS},
                  "template": {"metadata": {"labels": LABELS},
                               "spec": {"serviceAccountName": "coredns", "dnsPolicy": "Default",
                                        "priorityClassName": "system-cluster-critical",
                                        "containers": [container],
                                        "volumes": [{"name": "config-volume",
                                                     "configMap": {"name": "coredns"}}]}}}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": NAMESPACE,
                      "labels": {**LABELS, "kubernetes.io/name": "CoreDNS"}},
         "spec": {"selector": LABELS, **families,
                  "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                            {"name": "metrics", "port": 9153, "protocol": "TCP"}]}},
    ]
