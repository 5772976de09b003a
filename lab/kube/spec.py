"""The topology's ``kubernetes`` block: whether the lab is a Kubernetes cluster, and its few knobs.

```yaml
kubernetes:
  serviceCIDR: null           # the API server's --service-cluster-ip-range: one CIDR, or an IPv4
                              # and an IPv6 one ("10.96.0.0/16,fd00:10:96::/112"); default: one per
                              # family of the cluster CIDRs, in their order (10.96.0.0/16, fd00:10:96::/112)
  apiPort: 6443
  imageTag: null              # Ferry's image tag (default: the one deploy/ferry.yaml names)
  joinLater: []               # Nodes whose kubelet starts only on `Cluster.join` (a Node joining)
  cni: ferry                  # ferry (the DaemonSet) | bridge (Debian's bridge + host-local, the
                              # reference a benchmark compares with; no cross-Node routing)
  kubeProxy: iptables         # kube-proxy's mode on every Node: iptables | nftables | none (no
                              # kube-proxy, no CoreDNS: Ferry's DaemonSet then reaches the API
                              # server by its address, the override for clusters without a proxy)
  ovsDaemons: host            # who runs each Node's Open vSwitch: host (the lab starts it, as a
                              # host's own packages would) | ferry (the Node has none: Ferry's
                              # openvswitch container runs it, route-sync's ovsDaemons)
  installer: kubectl          # how Ferry goes on the cluster: kubectl (deploy/ferry.yaml, applied)
                              # | helm (`helm install` of deploy/helm/ferry, the same overlay as values)
  release: null               # a release's tag (v0.1.0): the lab installs that release's chart and
                              # image (`make release-image` builds them from the tag) instead of this
                              # tree's; with installer helm, the path an upgrade then takes (helm upgrade)
  controllerDelivery: labels  # ferry-controller's --delivery (with routeSync.policyPeers peerSlices):
                              # labels (the shipped default) | subscription (each Node asks for its groups)
```
``kubernetes: {}`` (or ``ferry-lab up --kubernetes``) takes every default."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from routesync.config import OVS_DAEMONS, OVS_FERRY, OVS_HOST
from routesync.policy.peerslice import DELIVERIES, DELIVERY_LABELS

KEYS = ("serviceCIDR", "apiPort", "imageTag", "joinLater", "cni", "kubeProxy", "ovsDaemons", "installer", "release",
        "controllerDelivery")
CNIS = ("ferry", "bridge")
KUBE_PROXY_MODES = ("iptables", "nftables", "none")  # "none" last: lab.conformance takes the others
INSTALLERS = ("kubectl", "helm")
RELEASE_TAG = re.compile(r"^v\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?$")  # a release's git tag


class KubeSpecError(ValueError):
    """The ``kubernetes`` block is malformed; the message names the key."""


@dataclass(frozen=True)
class KubeSpec:
    service_cidr: str = ""  # comma-separated; "": one per family of the cluster CIDRs (lab.kube.plan)
    api_port: int = 6443
    image_tag: str | None = None
    join_later: tuple[str, ...] = ()
    cni: str = "ferry"
    kube_proxy: str = "iptables"
    ovs_daemons: str = OVS_HOST
    installer: str = "kubectl"
    release: str | None = None  # a release's tag: its chart and image, not this tree's
    controller_delivery: str = DELIVERY_LABELS  # ferry-controller's --delivery (peerslice.DELIVERIES)

    @property
    def ferry_runs_ovs(self) -> bool:
        """The Nodes start no Open vSwitch: Ferry's DaemonSet brings it (its openvswitch container)."""
        return self.ovs_daemons == OVS_FERRY

    @property
    def services(self) -> bool:
        """kube-proxy (and so CoreDNS, which Pods reach through its Service) runs."""
        return self.kube_proxy != "none"

    def to_doc(self) -> dict[str, Any]:
        return {"serviceCIDR": self.service_cidr or None, "apiPort": self.api_port, "imageTag": self.image_tag,
                "joinLater": list(self.join_later), "cni": self.cni, "kubeProxy": self.kube_proxy,
                "ovsDaemons": self.ovs_daemons, "installer": self.installer,
                "release": self.release, "controllerDelivery": self.controller_delivery}


def parse(value: Any) -> KubeSpec | None:
    """``None``/``false`` -> no cluster; a mapping (possibly empty) or ``true`` -> a cluster."""
    if value is None or value is False:
        return None
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise KubeSpecError("kubernetes: expected a mapping (or true)")
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise KubeSpecError(f"kubernetes: unknown keys {unknown} (known: {', '.join(KEYS)})")
    cidrs = _service_cidrs(value.get("serviceCIDR"))
    port = value.get("apiPort", 6443)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise KubeSpecError(f"kubernetes.apiPort {port!r}: a port number")
    tag = value.get("imageTag")
    if tag is not None and (not isinstance(tag, str) or not tag or "/" in tag or ":" in tag):
        raise KubeSpecError(f"kubernetes.imageTag {tag!r}: a tag (no '/' or ':')")
    later = value.get("joinLater") or []
    if not isinstance(later, list) or not all(isinstance(n, str) for n in later):
        raise KubeSpecError(f"kubernetes.joinLater {later!r}: a list of Node names")
    cni = value.get("cni", "ferry")
    if cni not in CNIS:
        raise KubeSpecError(f"kubernetes.cni {cni!r}: one of {', '.join(CNIS)}")
    proxy = value.get("kubeProxy", "iptables")
    if proxy not in KUBE_PROXY_MODES:
        raise KubeSpecError(f"kubernetes.kubeProxy {proxy!r}: one of {', '.join(KUBE_PROXY_MODES)}")
    ovs_daemons = value.get("ovsDaemons", OVS_HOST)
    if ovs_daemons not in OVS_DAEMONS:
        raise KubeSpecError(f"kubernetes.ovsDaemons {ovs_daemons!r}: one of {', '.join(OVS_DAEMONS)}")
    if ovs_daemons == OVS_FERRY and cni != "ferry":
        raise KubeSpecError(f"kubernetes.ovsDaemons ferry: only with cni ferry (cni is {cni})")
    installer = value.get("installer", "kubectl")
    if installer not in INSTALLERS:
        raise KubeSpecError(f"kubernetes.installer {installer!r}: one of {', '.join(INSTALLERS)}")
    if installer == "helm" and cni != "ferry":
        raise KubeSpecError(f"kubernetes.installer helm: only with cni ferry (cni is {cni})")
    release = value.get("release")
    if release is not None:
        if not isinstance(release, str) or not RELEASE_TAG.match(release):
            raise KubeSpecError(f"kubernetes.release {release!r}: a release tag such as v0.1.0")
        if installer != "helm":
            raise KubeSpecError(f"kubernetes.release {release}: only with installer helm (installer is {installer})")
        if tag is not None:
            raise KubeSpecError(f"kubernetes.release {release}: the release's image, not imageTag {tag}")
    delivery = value.get("controllerDelivery", DELIVERY_LABELS)
    if delivery not in DELIVERIES:
        raise KubeSpecError(f"kubernetes.controllerDelivery {delivery!r}: one of {', '.join(DELIVERIES)}")
    if delivery != DELIVERY_LABELS and release is not None:
        raise KubeSpecError(f"kubernetes.controllerDelivery {delivery}: this tree's controller, "
                            f"not release {release}'s")
    return KubeSpec(cidrs, port, tag, tuple(later), cni, proxy, ovs_daemons, installer, release, delivery)


SERVICE_PREFIXES = {4: (12, 24), 6: (108, 120)}  # what the API server's allocator takes


def _service_cidrs(value: Any) -> str:
    """``serviceCIDR``: None, one CIDR, or one per family (a list or "a,b"); normalised to "a,b"."""
    if value is None:
        return ""
    items = value if isinstance(value, list) else str(value).split(",")
    nets = []
    for item in items:
        try:
            net = ipaddress.ip_network(str(item).strip(), strict=True)
        except ValueError as e:
            raise KubeSpecError(f"kubernetes.serviceCIDR {item!r}: {e}") from None
        lo, hi = SERVICE_PREFIXES[net.version]
        if not lo <= net.prefixlen <= hi:
            raise KubeSpecError(f"kubernetes.serviceCIDR {item!r}: an IPv{net.version} network between /{lo} and /{hi}")
        nets.append(net)
    if not 1 <= len(nets) <= 2 or len({n.version for n in nets}) != len(nets):
        raise KubeSpecError(f"kubernetes.serviceCIDR {value!r}: one network, or one IPv4 and one IPv6")
    return ",".join(str(n) for n in nets)
