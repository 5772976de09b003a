"""What the lab's Kubernetes cluster runs, as plain data (no system access): every process's argv
and namespace, every config file's content, every Node's mounts and cgroup root.

Where things run:

* the control plane (etcd on loopback; kube-apiserver on the external host's underlay addresses,
  port ``apiPort``; kube-controller-manager with ``--allocate-node-cidrs`` over the lab's cluster
  CIDRs, so Nodes get ``spec.podCIDRs`` as in real clusters; kube-scheduler, which binds the
  DaemonSet's Pods and the workload Pods) in the external host's network namespace: a machine
  outside every Node's subnet, reached over the underlay through the router;
* on each Node, containerd and the kubelet in the Node's network namespace and in a mount
  namespace of the Node's own, where the host paths a CNI and its DaemonSet expect
  (``/etc/cni/net.d``, ``/opt/cni/bin``, ``/run/openvswitch``, ``/run/ferry``, ...) are bind mounts
  of the Node's directories: one DaemonSet template then serves every Node, as on real hosts;
* the kubelet under a cgroup root of its own (``/ferry-lab/<lab>/<node>``), cgroupfs driver;
* kube-proxy (``kubeProxy``: iptables or nftables mode) on each Node, in the Node's network
  namespace, with the KubeProxyConfiguration kubeadm writes into its ConfigMap and the
  ``system:kube-proxy`` identity kubeadm gives it.  A per-Node process like the kubelet rather
  than kubeadm's DaemonSet: its image would be a Debian root file system with iptables and
  nftables built here for one binary, and as a process it is stopped and restarted by the fault
  tests exactly like the kubelet.  What kube-proxy does to a Node (its iptables/nftables rules,
  sysctls, conntrack) is the same either way;
* CoreDNS as ``kube-system/kube-dns`` (a Deployment on the Pod network, :mod:`lab.kube.dns`),
  whose Service address the kubelets' ``clusterDNS`` names."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from lab.kube.spec import KubeSpec
from lab.topology import Topology, external_address, external_netns, node_addresses, node_netns

CLUSTER_DOMAIN = "cluster.local"
# The front proxy's CA and the API server's client certificate under it, as kubeadm names them
# (front-proxy-ca, front-proxy-client): the API server proxies a request for an aggregated API
# (an APIService) with that certificate and the caller's identity in X-Remote-* headers, which the
# extension API server believes only from a certificate of that CA with an allowed name.
FRONT_PROXY_CA = "front-proxy-ca"
FRONT_PROXY_CLIENT = "front-proxy-client"
KUBE_PROXY_USER = "system:kube-proxy"  # bound to ClusterRole system:node-proxier by default RBAC
PAUSE_IMAGE = "ferry.local/pause:1"
WORKLOAD_IMAGE = "ferry.local/busybox:1"
# The Node paths a container runtime, a kubelet and Ferry's DaemonSet use, each a bind mount of a
# directory of the Node's own (name under nodes/<node>/k8s/, or a lab path for OVS and Ferry's).
NODE_MOUNTS = (
    ("net.d", "/etc/cni/net.d"),
    ("cni-bin", "/opt/cni/bin"),
    ("cni-cache", "/var/lib/cni"),
    ("netns", "/run/netns"),
    ("ovs", "/run/openvswitch"),
    ("ferry-run", "/run/ferry"),
    ("ferry-lib", "/var/lib/ferry"),
    ("ferry-log", "/var/log/ferry"),
    ("wireguard-run", "/run/wireguard"),
    ("containerd", "/var/lib/containerd"),
    ("containerd-run", "/run/containerd"),
    ("kubelet", "/var/lib/kubelet"),
    ("pod-logs", "/var/log/pods"),
    ("container-logs", "/var/log/containers"),
)
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"  # as the Node sees it
# Debian's reference plugins a Node's OS package brings: containerd's CRI runs `loopback` for
# every sandbox; install-cni chains portmap and bandwidth when present.
NODE_CNI_PLUGINS = ("loopback", "portmap", "bandwidth", "bridge", "host-local", "ptp")
PRIMARY_CONFLIST = "10-ptp.conflist"  # networkPolicyOnly's primary CNI (after install-cni's 00-ferry-chained)


def bridge_conflist(pod_cidrs: tuple[str, ...]) -> dict[str, Any]:
    """Debian's bridge + host-local on a Node's Pod CIDRs: the reference CNI (``kubernetes.cni:
    bridge``), at the highest version containerd 1.6 reads."""
    return {"cniVersion": "1.0.0", "name": "bridge",
            "plugins": [{"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
                         "ipam": {"type": "host-local", "ranges": [[{"subnet": c}] for c in pod_cidrs]}}]}


def ptp_conflist(pod_cidrs: tuple[str, ...]) -> dict[str, Any]:
    """networkPolicyOnly's primary CNI on a Node: Debian's ptp + host-local on the Node's Pod
    CIDRs, a default route per family via the host end (as ``lab.layout.chained_conflist`` for
    the non-Kubernetes lab); Ferry's install-cni chains itself after it."""
    return {"cniVersion": "1.0.0", "name": "ptp",
            "plugins": [{"type": "ptp", "ipMasq": False,
                         "ipam": {"type": "host-local", "ranges": [[{"subnet": c}] for c in pod_cidrs],
                                  "routes": [{"dst": "::/0" if ":" in c else "0.0.0.0/0"} for c in pod_cidrs]}}]}


@dataclass(frozen=True)
class Process:
    name: str
    argv: tuple[str, ...]
    netns: str
    log: str
    mount_ns: str | None = None  # a persisted mount namespace (file) to enter, else the host's
    node: str | None = None  # the Node it serves (containerd, kubelet); None: the control plane

    @property
    def role(self) -> str:
        return f"{self.node}/{self.name}" if self.node else self.name


@dataclass(frozen=True)
class NodePlan:
    name: str
    directory: str  # nodes/<node>/k8s
    addresses: tuple[str, ...]
    mount_ns: str
    binds: tuple[tuple[str, str], ...]  # (directory on this machine, path the Node sees)
    cgroup_root: str
    containerd_config: str
    containerd_socket: str  # the socket's path on this machine
    kubelet_config: dict[str, Any]
    kubeconfig: str
    processes: tuple[Process, ...]  # containerd, kubelet, then kube-proxy when it runs
    kube_proxy_config: dict[str, Any] | None = None


@dataclass(frozen=True)
class ClusterPlan:
    directory: str  # <lab>/k8s
    pki: str
    api_host: str
    api_url: str
    api_port: int
    service_cidr: str  # comma-separated, one per family
    cluster_cidrs: tuple[str, ...]
    admin_kubeconfig: str
    kubeconfigs: dict[str, tuple[str, str]]  # path -> (client cert stem, user)
    control_plane: tuple[Process, ...]
    nodes: tuple[NodePlan, ...] = field(default_factory=tuple)
    kube_proxy: str = "none"  # iptables | nftables | none
    dns_ips: tuple[str, ...] = ()  # kube-dns's ClusterIPs (CoreDNS), one per family; none without kube-proxy

    @property
    def dns_ip(self) -> str | None:
        """kube-dns's address of the first family (what a Pod's resolv.conf names first)."""
        return self.dns_ips[0] if self.dns_ips else None

    @property
    def front_proxy_pki(self) -> str:
        """The front proxy's CA directory (``ca.crt``, ``front-proxy-client.{crt,key}``)."""
        return front_proxy_dir(self.pki)

    def node(self, name: str) -> NodePlan:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def process(self, role: str) -> Process:
        """``kube-apiserver``, ``etcd``, ... or ``<node>/kubelet``, ``<node>/containerd``."""
        for p in (*self.control_plane, *(q for n in self.nodes for q in n.processes)):
            if p.role == role:
                return p
        raise KeyError(role)


def front_proxy_dir(pki: str) -> str:
    return os.path.join(pki, "front-proxy")


def front_proxy_flags(pki: str) -> tuple[str, ...]:
    """kube-apiserver's flags for aggregated APIs, kubeadm's: whom the request headers are
    believed from (``--requestheader-*``: certificates of the front proxy's CA named
    ``front-proxy-client``), which headers carry the user, groups and extra, and the client
    certificate the API server proxies with (``--proxy-client-*``).  The API server publishes the
    first set in ``kube-system/extension-apiserver-authentication``, where extension API servers
    read it."""
    fp = lambda name: os.path.join(front_proxy_dir(pki), name)
    return (f"--requestheader-client-ca-file={fp('ca.crt')}", f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-username-headers=X-Remote-User",
            f"--proxy-client-cert-file={fp(FRONT_PROXY_CLIENT + '.crt')}",
            f"--proxy-client-key-file={fp(FRONT_PROXY_CLIENT + '.key')}")


def api_host(topo: Topology) -> str:
    v4, v6 = external_address(topo)
    return v4 or v6


def server_names(topo: Topology, spec: KubeSpec) -> tuple[str, ...]:
    """The API server certificate's names: its addresses, loopback, the ``kubernetes`` Service."""
    import ipaddress

    first_service_ip = str(next(ipaddress.ip_network(service_cidrs(topo, spec)[0]).hosts()))
    addrs = tuple(a for a in external_address(topo) if a)
    return (*addrs, "127.0.0.1", first_service_ip, "kubernetes", "kubernetes.default",
            "kubernetes.default.svc", f"kubernetes.default.svc.{CLUSTER_DOMAIN}")


def mask_sizes(cluster_cidrs: tuple[str, ...]) -> dict[int, int]:
    """Per family, the Node CIDR size the controller-manager allocates (/24 and /64, as the lab's
    own Pod CIDRs); both must be within 16 bits of the cluster CIDR (the controller's limit)."""
    import ipaddress

    out: dict[int, int] = {}
    for c in cluster_cidrs:
        net = ipaddress.ip_network(c)
        want = 24 if net.version == 4 else 64
        out[net.version] = max(want, net.prefixlen + 1) if want - net.prefixlen <= 16 else net.prefixlen + 16
    return out


DEFAULT_SERVICE_CIDRS = {4: "10.96.0.0/16", 6: "fd00:10:96::/112"}


def service_cidrs(topo: Topology, spec: KubeSpec) -> tuple[str, ...]:
    """The Service CIDRs: the spec's, else one per family of the cluster CIDRs in their order (a
    dual-stack cluster gets dual-stack Services; the first family is the ``kubernetes`` Service's)."""
    import ipaddress

    if spec.service_cidr:
        return tuple(spec.service_cidr.split(","))
    families = list(dict.fromkeys(ipaddress.ip_network(c).version for c in topo.cluster_cidrs)) or [4]
    return tuple(DEFAULT_SERVICE_CIDRS[f] for f in families)


def dns_ips(cidrs: tuple[str, ...]) -> tuple[str, ...]:
    """kube-dns's ClusterIPs: by convention (kubeadm) the 10th address of each Service CIDR."""
    import ipaddress

    return tuple(str(ipaddress.ip_network(c)[10]) for c in cidrs)


def kube_proxy_config(mode: str, kubeconfig: str, cluster_cidrs: tuple[str, ...]) -> dict[str, Any]:
    """The KubeProxyConfiguration kubeadm writes (``clusterCIDR``: the Pod networks, so traffic
    from outside them to a Service is masqueraded), with what a Node that is a network namespace
    needs: ``conntrack.maxPerCore: 0`` (nf_conntrack_max is the machine's, not the namespace's;
    kind sets the same) and its metrics and health on the Node's own addresses."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "mode": mode, "clientConnection": {"kubeconfig": kubeconfig},
        "clusterCIDR": ",".join(cluster_cidrs),
        "conntrack": {"maxPerCore": 0},
        "metricsBindAddress": "127.0.0.1:10249",
    }


def plan(lab: str, lab_dir: str, topo: Topology, spec: KubeSpec, tools_dir: str) -> ClusterPlan:
    d = os.path.join(lab_dir, "k8s")
    pki = os.path.join(d, "pki")
    logs = os.path.join(d, "logs")
    host = api_host(topo)
    url = f"https://{host}:{spec.api_port}" if ":" not in host else f"https://[{host}]:{spec.api_port}"
    ext = external_netns(lab)
    tool = lambda name: os.path.join(tools_dir, name)
    kc = lambda stem: os.path.join(d, f"{stem}.kubeconfig")
    sizes = mask_sizes(topo.cluster_cidrs)
    cluster = ",".join(topo.cluster_cidrs)
    services = ",".join(service_cidrs(topo, spec))
    p = lambda name: os.path.join(pki, name)
    etcd = Process("etcd", (
        tool("etcd"), "--name", "lab", "--data-dir", os.path.join(d, "etcd"),
        "--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
        "--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
        "--initial-cluster", "lab=http://127.0.0.1:2380", "--listen-metrics-urls", "http://127.0.0.1:2381",
    ), ext, os.path.join(logs, "etcd.log"))
    apiserver = Process("kube-apiserver", (
        tool("kube-apiserver"), "--etcd-servers=http://127.0.0.1:2379", "--bind-address=::",
        f"--secure-port={spec.api_port}", f"--advertise-address={host}",
        f"--tls-cert-file={p('apiserver.crt')}", f"--tls-private-key-file={p('apiserver.key')}",
        f"--client-ca-file={p('ca.crt')}", f"--service-account-key-file={p('sa.pub')}",
        f"--service-account-signing-key-file={p('sa.key')}",
        f"--service-account-issuer=https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
        f"--service-cluster-ip-range={services}", "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction", "--allow-privileged=true",
        f"--kubelet-client-certificate={p('apiserver-kubelet-client.crt')}",
        f"--kubelet-client-key={p('apiserver-kubelet-client.key')}",
        f"--kubelet-certificate-authority={p('ca.crt')}",
        "--kubelet-preferred-address-types=InternalIP", "--profiling=false",
        *front_proxy_flags(pki),
        # Admission and conversion webhooks and aggregated APIs are Services: the API server dials
        # one of their endpoints' Pod IPs, which its host (the external one) routes to, instead of
        # the ClusterIP, which only a host running kube-proxy can (upstream's advice for an API
        # server without kube-proxy).
        "--enable-aggregator-routing=true",
    ), ext, os.path.join(logs, "kube-apiserver.log"))
    kcm = Process("kube-controller-manager", (
        tool("kube-controller-manager"), f"--kubeconfig={kc('controller-manager')}",
        f"--authentication-kubeconfig={kc('controller-manager')}",
        f"--authorization-kubeconfig={kc('controller-manager')}",
        "--use-service-account-credentials=true", f"--service-account-private-key-file={p('sa.key')}",
        f"--root-ca-file={p('ca.crt')}", f"--cluster-signing-cert-file={p('ca.crt')}",
        f"--cluster-signing-key-file={p('ca.key')}", "--allocate-node-cidrs=true",
        f"--cluster-cidr={cluster}", *(f"--node-cidr-mask-size-ipv{v}={s}" for v, s in sorted(sizes.items())),
        f"--service-cluster-ip-range={services}", "--leader-elect=false",
        "--controllers=*,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller",
        "--bind-address=127.0.0.1", "--secure-port=10257",
        # A Node whose kubelet stops posting status is marked unreachable after 20 s (default 40 s).
        "--node-monitor-grace-period=20s",
    ), ext, os.path.join(logs, "kube-controller-manager.log"))
    scheduler = Process("kube-scheduler", (
        tool("kube-scheduler"), f"--kubeconfig={kc('scheduler')}",
        f"--authentication-kubeconfig={kc('scheduler')}", f"--authorization-kubeconfig={kc('scheduler')}",
        "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=10259",
    ), ext, os.path.join(logs, "kube-scheduler.log"))
    kubeconfigs = {kc("admin"): ("admin", "kubernetes-admin"),
                   kc("controller-manager"): ("controller-manager", "system:kube-controller-manager"),
                   kc("scheduler"): ("scheduler", "system:kube-scheduler")}
    proxy = None
    if spec.services:
        kubeconfigs[kc("kube-proxy")] = ("kube-proxy", KUBE_PROXY_USER)
        proxy = kube_proxy_config(spec.kube_proxy, kc("kube-proxy"), topo.cluster_cidrs)
    dns = dns_ips(service_cidrs(topo, spec)) if spec.services else ()
    nodes = []
    for n in topo.nodes:
        kubeconfigs[kc(n.name)] = (n.name, f"system:node:{n.name}")
        nodes.append(node_plan(lab, lab_dir, topo, n.name, kc(n.name), p("ca.crt"), tools_dir, proxy, dns))
    return ClusterPlan(d, pki, host, url, spec.api_port, services, topo.cluster_cidrs, kc("admin"),
                       kubeconfigs, (etcd, apiserver, kcm, scheduler), tuple(nodes), spec.kube_proxy, dns)


def node_dir(lab_dir: str, node: str) -> str:
    return os.path.join(lab_dir, "nodes", node, "k8s")


def node_plan(lab: str, lab_dir: str, topo: Topology, name: str, kubeconfig: str, ca: str,
              tools_dir: str, proxy_config: dict[str, Any] | None = None,
              cluster_dns: tuple[str, ...] = ()) -> NodePlan:
    from lab import layout

    spec = topo.node(name)
    d = node_dir(lab_dir, name)
    paths = layout.node_paths(lab_dir, name)
    own = {"net.d": paths.netconf, "ovs": paths.ovs, "ferry-log": paths.log,
           "ferry-run": os.path.dirname(paths.state_file)}
    binds = tuple((own.get(key, os.path.join(d, key)), target) for key, target in NODE_MOUNTS)
    cgroup_root = f"/ferry-lab/{lab}/{name}"
    addresses = tuple(a for a in node_addresses(topo, spec) if a)
    containerd_dir = dict(NODE_MOUNTS)
    config = containerd_config(containerd_dir["containerd"], containerd_dir["containerd-run"])
    pki_dir = os.path.dirname(ca)
    kubelet = kubelet_config(cgroup_root, ca, os.path.join(pki_dir, f"{name}-serving.crt"),
                             os.path.join(pki_dir, f"{name}-serving.key"), cluster_dns)
    mount_ns = os.path.join(lab_dir, "k8s", "mnt", name)
    netns = node_netns(lab, name)
    conf_path = os.path.join(d, "containerd.toml")
    kubelet_path = os.path.join(d, "kubelet.yaml")
    procs: tuple[Process, ...] = (
        Process("containerd", ("containerd", "--config", conf_path), netns,
                os.path.join(paths.log, "containerd.log"), mount_ns, name),
        Process("kubelet", (os.path.join(tools_dir, "kubelet"), f"--config={kubelet_path}",
                            f"--kubeconfig={kubeconfig}", f"--hostname-override={name}",
                            f"--node-ip={','.join(addresses)}", "--v=1"),
                netns, os.path.join(paths.log, "kubelet.log"), mount_ns, name),
    )
    if proxy_config is not None:
        procs += (Process("kube-proxy", (os.path.join(tools_dir, "kube-proxy"),
                                         f"--config={os.path.join(d, 'kube-proxy.yaml')}",
                                         f"--hostname-override={name}", "--v=1"),
                          netns, os.path.join(paths.log, "kube-proxy.log"), mount_ns, name),)
    return NodePlan(name, d, addresses, mount_ns, binds, cgroup_root, config,
                    os.path.join(d, "containerd-run", "containerd.sock"), kubelet, kubeconfig, procs, proxy_config)


def containerd_config(root: str, state: str) -> str:
    """containerd 1.6's config (version 2): CRI with runc, CNI from the standard paths, the lab's
    pause image; ``restrict_oom_score_adj`` because root here lacks CAP_SYS_RESOURCE."""
    return f"""version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{CONTAINERD_SOCKET}"
[ttrpc]
  address = "{CONTAINERD_SOCKET}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
"""


def kubelet_config(cgroup_root: str, ca: str, serving_cert: str, serving_key: str,
                   cluster_dns: tuple[str, ...] = ()) -> dict[str, Any]:
    """The KubeletConfiguration. What this machine needs (lab/README.md has the why): cgroup v1
    with the cgroupfs driver (``failCgroupV1: false``), no oom_score_adj change, eviction and image
    GC thresholds that never fire on a shared disk, no swap check.  ``cluster_dns``: kube-dns's
    addresses, written into every Pod's resolv.conf."""
    dns = {"clusterDNS": list(cluster_dns)} if cluster_dns else {}
    return {**dns,
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs", "cgroupRoot": cgroup_root, "failCgroupV1": False,
        "failSwapOn": False, "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": ca}},
        "authorization": {"mode": "Webhook"},
        # a serving certificate from the cluster's CA (Node name and addresses): the API server
        # verifies the kubelet for logs and exec (--kubelet-certificate-authority)
        "tlsCertFile": serving_cert, "tlsPrivateKeyFile": serving_key,
        "clusterDomain": CLUSTER_DOMAIN, "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
        "resolvConf": "/etc/resolv.conf", "oomScoreAdj": 0,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "rotateCertificates": False, "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "4s", "syncFrequency": "10s",
    }


def kubeconfig(server: str, ca: str, cert: str, key: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "ferry-lab", "cluster": {"server": server, "certificate-authority": ca}}],
            "users": [{"name": "user", "user": {"client-certificate": cert, "client-key": key}}],
            "contexts": [{"name": "ferry-lab", "context": {"cluster": "ferry-lab", "user": "user"}}],
            "current-context": "ferry-lab"}
