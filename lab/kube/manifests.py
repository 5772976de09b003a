"""``deploy/ferry.yaml`` as the lab applies it: the shipped manifest, changed only where the lab
really differs from a production cluster (pure functions over the parsed documents).

What the overlay changes, and why:

* route-sync's config (the ConfigMap): ``datapathType: netdev`` (no OVS kernel module here), the
  lab's cluster CIDRs and traffic mode (from the topology's ``routeSync`` block);
* ``KUBERNETES_SERVICE_HOST``/``PORT`` on both DaemonSets' containers that run Ferry (route-sync's
  ``ferry`` and the Node's Open vSwitch, ``ferry-openvswitch``, as the chart's ``extraEnv``), only in
  a lab without kube-proxy (``kubeProxy: none``): there the ``kubernetes`` Service's ClusterIP leads nowhere and
  the API server's own address does (the override deploy/ferry.yaml documents for clusters whose
  Service proxy needs the CNI first).  With kube-proxy, Ferry reaches the API server through the
  ``kubernetes`` Service, as on a kubeadm cluster;
* the image reference, when the lab built another tag (rolling-update tests).

With route-sync's ``policyPeers: peerSlices`` the lab also applies ``deploy/ferry-controller.yaml``
(ferry-controller, which writes the PeerSlices route-sync then reads: ``docs/design/scale.md``),
with the same image and API server override, and the topology's ``--delivery``
(``kubernetes.controllerDelivery``) (:func:`controller_docs`).

Everything else (RBAC, ServiceAccount, volumes, probes, install-cni) is applied as shipped.

With ``kubernetes.installer: helm`` the lab installs the chart (``deploy/helm/ferry``) instead, the
same overlay expressed as its values (:func:`helm_values`); tests/ship/test_helm_chart.py holds
the chart rendered with them equal to :func:`apply_overlay`'s documents."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from cni.pipeline.modes import NETDEV
from routesync.config import PEERS_SLICES
from routesync.policy.peerslice import DELIVERY_LABELS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MANIFEST = os.path.join(REPO, "deploy", "ferry.yaml")
CRDS = os.path.join(REPO, "deploy", "crds")  # the ClusterNetworkPolicy CRD (tools/sync-cnp-crd.sh)
CONTROLLER_MANIFEST = os.path.join(REPO, "deploy", "ferry-controller.yaml")  # with policyPeers: peerSlices
CONFIG_KEY = "route-sync.yaml"
CHART = os.path.join(REPO, "deploy", "helm", "ferry")  # the same objects, as a Helm chart
RELEASE = "ferry"  # the Helm release's name
NAMESPACE = "kube-system"
API_ENV = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")


@dataclass(frozen=True)
class Overlay:
    api_host: str
    api_port: int
    cluster_cidrs: tuple[str, ...]
    route_sync: Mapping[str, Any]  # trafficEncapMode, tunnelType, ... as route-sync's config keys
    image: str | None = None
    api_override: bool = True  # the API server by its address (no kube-proxy), not by its Service
    controller_delivery: str = DELIVERY_LABELS  # ferry-controller's --delivery (peerslice.DELIVERIES)


def load(path: str = MANIFEST) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


ROUTE_SYNC_DAEMONSET = "ferry"  # route-sync's Pods (install-cni, the wait for Open vSwitch, route-sync)
OVS_DAEMONSET = "ferry-openvswitch"  # the Node's Open vSwitch, apart so that a rollout leaves it running


def shipped_image(docs: list[dict[str, Any]]) -> str:
    return daemonset_image(daemonset(docs))


def daemonset_image(ds: dict[str, Any]) -> str:
    """The image of a DaemonSet's (first) container."""
    return str(ds["spec"]["template"]["spec"]["containers"][0]["image"])


def daemonsets(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == "DaemonSet"]


def daemonset(docs: list[dict[str, Any]], name: str = ROUTE_SYNC_DAEMONSET) -> dict[str, Any]:
    for d in daemonsets(docs):
        if d["metadata"]["name"] == name:
            return d
    raise ValueError(f"deploy manifest has no DaemonSet {name}")


def apply_overlay(docs: list[dict[str, Any]], overlay: Overlay) -> list[dict[str, Any]]:
    out = copy.deepcopy(docs)
    for d in out:
        if d.get("kind") == "ConfigMap" and CONFIG_KEY in (d.get("data") or {}):
            conf = yaml.safe_load(d["data"][CONFIG_KEY]) or {}
            conf.update(datapathType=NETDEV, clusterCIDRs=list(overlay.cluster_cidrs))
            conf.update(dict(overlay.route_sync))
            d["data"][CONFIG_KEY] = yaml.safe_dump(conf, sort_keys=False)
    for ds in daemonsets(out):
        pod = ds["spec"]["template"]["spec"]
        for c in (*pod.get("initContainers", []), *pod["containers"]):
            if "env" in c:  # the containers that run Ferry (the wait for Open vSwitch has none: a shell loop)
                c["env"] = [e for e in c["env"] if e["name"] not in API_ENV] + _api_env(overlay)
            if overlay.image:
                c["image"] = overlay.image
    return out


def wants_controller(overlay: Overlay) -> bool:
    """route-sync reads PeerSlices, so ferry-controller must write them."""
    return overlay.route_sync.get("policyPeers") == PEERS_SLICES


def controller_docs(overlay: Overlay, path: str = CONTROLLER_MANIFEST) -> list[dict[str, Any]]:
    """``deploy/ferry-controller.yaml`` with the overlay's image and API server override on the
    Deployment's containers (as :func:`apply_overlay` does for the DaemonSet), and its
    ``--delivery``."""
    out = load(path)
    for d in out:
        if d.get("kind") != "Deployment":
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            c["env"] = [e for e in c.get("env", []) if e["name"] not in API_ENV] + _api_env(overlay)
            if overlay.image:
                c["image"] = overlay.image
            c["command"] = with_flag(c["command"], "--delivery", overlay.controller_delivery)
    return out


def with_flag(command: list[str], flag: str, value: str) -> list[str]:
    """``command`` with ``flag value`` in place of the flag's shipped value (appended if it has none)."""
    if flag not in command:
        return [*command, flag, value]
    i = command.index(flag)
    return [*command[:i + 1], value, *command[i + 2:]]


def _api_env(overlay: Overlay) -> list[dict[str, str]]:
    host, port = API_ENV
    return ([{"name": host, "value": overlay.api_host}, {"name": port, "value": str(overlay.api_port)}]
            if overlay.api_override else [])


def helm_values(overlay: Overlay) -> dict[str, Any]:
    """The overlay as the chart's values: route-sync's keys merged over the chart's ``config``
    (as :func:`apply_overlay` updates the ConfigMap), the API override as ``extraEnv``."""
    values: dict[str, Any] = {
        "config": {"datapathType": NETDEV, "clusterCIDRs": list(overlay.cluster_cidrs), **dict(overlay.route_sync)},
        "extraEnv": _api_env(overlay),
    }
    if overlay.image:
        repository, tag = overlay.image.rsplit(":", 1)
        values["image"] = {"repository": repository, "tag": tag}
    if wants_controller(overlay):
        values["controller"] = {"enabled": True, "delivery": overlay.controller_delivery}
    return values


def dump(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)
