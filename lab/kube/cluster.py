"""Bringing the lab's Kubernetes cluster up and down (the applier for :mod:`lab.kube.plan`).

Every process, mount namespace and cgroup is recorded in the lab's manifest before it is made, so
``ferry-lab down`` removes a half-built cluster too: containers (by their Nodes' cgroup roots),
then everything inside each Node's mount namespace (kubelet, containerd, its shims), then the
control plane, then the mount namespaces and cgroups themselves."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import yaml

from lab import layout, tools
from lab.kube import dns, manifests, ociimage, pki, release
from lab.kube.plan import (
    CLUSTER_DOMAIN,
    FRONT_PROXY_CA,
    FRONT_PROXY_CLIENT,
    KUBE_PROXY_USER,
    NODE_CNI_PLUGINS,
    PAUSE_IMAGE,
    PRIMARY_CONFLIST,
    WORKLOAD_IMAGE,
    ClusterPlan,
    NodePlan,
    Process,
    bridge_conflist,
    kubeconfig,
    ptp_conflist,
    server_names,
)
from lab.manifest import Manifest
from lab.sh import LabError, ip_batch, running
from routesync.policy.peerslice import DELIVERY_LABELS

REPO = tools.REPO
CONTROLLER = "ferry-controller"  # deploy/ferry-controller.yaml's Deployment
CGROUP_FS = "/sys/fs/cgroup"
DEBIAN_CNI_DIR = "/usr/lib/cni"
Log = Callable[[str], None]


# ---------------------------------------------------------------- waiting on conditions

def wait_for(what: str, ready: Callable[[], bool], timeout: float, detail: Callable[[], str] = lambda: "") -> None:
    """Poll ``ready`` until true; the deadline only bounds a hang (the message says what failed)."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while not ready():
        if time.monotonic() > deadline:
            extra = detail()
            raise LabError(f"timed out after {timeout:.0f}s waiting for {what}" + (f"\n{extra}" if extra else ""))
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)


def tail(path: str, n: int = 12) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


# ---------------------------------------------------------------- processes

def nsenter_argv(proc: Process) -> list[str]:
    argv = ["nsenter", f"--net=/run/netns/{proc.netns}"]
    if proc.mount_ns:
        argv.append(f"--mount={proc.mount_ns}")
    return [*argv, "--", *proc.argv]


def start(proc: Process, manifest: Manifest) -> int:
    os.makedirs(os.path.dirname(proc.log), exist_ok=True)
    with open(proc.log, "ab") as out:
        p = subprocess.Popen(nsenter_argv(proc), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True, cwd="/")
    manifest.record("pid", pid=p.pid, role=proc.role)
    return p.pid


def in_node(node: NodePlan, argv: list[str], check: bool = True, timeout: float = 120.0,
            input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """``argv`` in the Node's mount namespace (its view of /run/containerd, /etc/cni/net.d, ...)."""
    cp = subprocess.run(["nsenter", f"--mount={node.mount_ns}", "--", *argv], capture_output=True,
                        timeout=timeout, check=False, input=input)
    if check and cp.returncode != 0:
        raise LabError(f"{node.name}: {' '.join(argv)} failed: {cp.stderr.decode(errors='replace').strip()}")
    return cp


def ctr(node: NodePlan, *args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[bytes]:
    return in_node(node, ["ctr", "-a", "/run/containerd/containerd.sock", "-n", "k8s.io", *args], check=check,
                   timeout=timeout)


def image_names(node: NodePlan) -> set[str]:
    """The images the Node's containerd holds (``ctr images ls -q``)."""
    return set(ctr(node, "images", "ls", "-q").stdout.decode().split())


# ---------------------------------------------------------------- Node set-up

def make_cgroup(root: str) -> None:
    """``root`` in every mounted v1 hierarchy (cpuset needs its cpus/mems copied down each level)."""
    for controller in sorted(os.listdir(CGROUP_FS)):
        base = os.path.join(CGROUP_FS, controller)
        if not os.path.isdir(base) or controller == "unified":
            continue
        path = base
        for part in root.strip("/").split("/"):
            parent, path = path, os.path.join(path, part)
            os.makedirs(path, exist_ok=True)
            if controller == "cpuset":
                for f in ("cpuset.cpus", "cpuset.mems"):
                    with open(os.path.join(path, f)) as cur:
                        if cur.read().strip():
                            continue
                    with open(os.path.join(parent, f)) as src, open(os.path.join(path, f), "w") as dst:
                        dst.write(src.read().strip())


def cgroup_pids(root: str) -> set[int]:
    pids: set[int] = set()
    base = os.path.join(CGROUP_FS, "pids", root.strip("/"))
    for dirpath, _dirs, files in os.walk(base):
        if "cgroup.procs" in files:
            try:
                with open(os.path.join(dirpath, "cgroup.procs")) as f:
                    pids.update(int(x) for x in f.read().split())
            except OSError:
                pass
    return pids


def remove_cgroup(root: str) -> None:
    for controller in os.listdir(CGROUP_FS):
        base = os.path.join(CGROUP_FS, controller, root.strip("/"))
        if not os.path.isdir(base):
            continue
        for dirpath, _dirs, _files in sorted(os.walk(base), key=lambda t: -t[0].count("/")):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass
        # the empty parents /ferry-lab/<lab>
        parent = os.path.dirname(base)
        for _ in range(2):
            try:
                os.rmdir(parent)
            except OSError:
                break
            parent = os.path.dirname(parent)


def make_holder(holder: str, manifest: Manifest) -> None:
    """The directory the Nodes' mount namespace files live in: a private mount (a namespace file
    can only be bound there). Made once, before any Node's namespace (a later bind would hide them)."""
    os.makedirs(holder, exist_ok=True)
    manifest.record("mountns", path="", holder=holder)
    if not os.path.ismount(holder):
        subprocess.run(["mount", "--bind", holder, holder], check=True)
        subprocess.run(["mount", "--make-private", holder], check=True)


def make_mount_ns(node: NodePlan, manifest: Manifest) -> None:
    """A persisted mount namespace (slave of the host's: host mounts show, the Node's stay inside)
    with the Node's directories bound at the standard host paths."""
    manifest.record("mountns", path=node.mount_ns, holder=os.path.dirname(node.mount_ns))
    open(node.mount_ns, "a").close()
    subprocess.run(["unshare", f"--mount={node.mount_ns}", "--propagation", "slave", "true"], check=True)
    script = []
    for src, dst in node.binds:
        os.makedirs(src, exist_ok=True)
        script.append(f"mkdir -p {dst} && mount --bind {src} {dst}")
        if dst == "/run/netns":
            # shared, as on a real host (systemd mounts /run shared; `ip netns` makes /run/netns
            # shared): the runtime's Pod namespaces then reach containers that mount it with
            # HostToContainer propagation (route-sync, which enters them), and the kubelet
            # refuses that propagation from a private mount
            script.append(f"mount --make-shared {dst}")
    in_node(node, ["sh", "-ec", "\n".join(script)])


def stop_node(node_mount_ns: str, cgroup_root: str) -> None:
    """Kill the Node's containers (its cgroup root), then every process in its mount namespace."""
    for _ in range(3):
        pids = cgroup_pids(cgroup_root)
        if not pids:
            break
        for p in pids:
            kill(p)
        wait_gone(pids)
    try:
        ino = os.stat(node_mount_ns).st_ino
    except OSError:
        return
    pids = {p for p in _all_pids() if _ns_ino(p, "mnt") == ino}
    for p in pids:
        kill(p)
    wait_gone(pids)


def _all_pids() -> Iterable[int]:
    return (int(e) for e in os.listdir("/proc") if e.isdigit())


def _ns_ino(pid: int, kind: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


def kill(pid: int) -> None:
    """SIGKILL ``pid`` (gone already: nothing to do)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass



def wait_gone(pids: set[int], timeout: float = 10.0) -> None:
    wait_for("killed processes to exit", lambda: not any(running(p) for p in pids), timeout)


def teardown(manifest: Manifest) -> None:
    """The cluster part of ``ferry-lab down`` (before the lab's own processes and namespaces)."""
    roots = [e["path"] for e in manifest.of_kind("cgroup")]
    node_ns = [e for e in manifest.of_kind("mountns") if e["path"]]
    for e in node_ns:
        cg = next((r for r in roots if r.endswith("/" + os.path.basename(e["path"]))), "")
        stop_node(e["path"], cg)
    for path in [e["path"] for e in node_ns] + sorted({e["holder"] for e in manifest.of_kind("mountns")}):
        for _ in range(8):  # a mount point may carry several mounts (an interrupted earlier up)
            if subprocess.run(["umount", "-l", path], capture_output=True, check=False).returncode != 0:
                break
    for r in roots:
        remove_cgroup(r)


# ---------------------------------------------------------------- the cluster

def router_routes(nodes: dict[str, tuple[tuple[str, ...], tuple[str, ...]]]) -> list[str]:
    """``<cidr> via <node address of the same family>`` for every Node's Pod CIDRs (pure)."""
    out = []
    for name in sorted(nodes):
        cidrs, addrs = nodes[name]
        for c in cidrs:
            via = next((a for a in addrs if (":" in a) == (":" in c)), None)
            if via:
                out.append(f"{c} via {via}")
    return out


def kubectl_argv(plan: ClusterPlan, args: list[str]) -> list[str]:
    """kubectl with the admin kubeconfig, in the external host's network namespace: the API server
    listens on the underlay, which this machine's own namespace does not reach (like a cluster
    reached through a bastion); ``ferry-lab kubectl`` wraps this for users."""
    return ["nsenter", f"--net=/run/netns/{plan.control_plane[0].netns}", "--", tools.tool("kubectl"),
            f"--kubeconfig={plan.admin_kubeconfig}", *args]


class Cluster:
    """Applies a :class:`ClusterPlan` for the lab whose manifest is ``manifest``."""

    def __init__(self, plan: ClusterPlan, manifest: Manifest, log: Log, router_netns: str | None = None,
                 bgp: bool = False, chained: bool = False) -> None:
        self.plan = plan
        self.manifest = manifest
        self.log = log
        self.router_netns = router_netns  # set: the router follows the Nodes' Pod CIDRs (routePodCIDRs)
        self.bgp = bgp  # routePodCIDRs: bgp: the router learns them from route-sync, nothing static
        self.chained = chained  # networkPolicyOnly: each Node gets a primary CNI (ptp) for Ferry to follow

    # -- certificates and kubeconfigs
    def credentials(self, topo_names: tuple[str, ...]) -> None:
        ca = pki.Authority(self.plan.pki)
        ca.issue("apiserver", "kube-apiserver", server_names=topo_names, client=False)
        ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ["system:masters"])
        ca.issue("admin", "kubernetes-admin", ["system:masters"])
        ca.issue("controller-manager", "system:kube-controller-manager")
        ca.issue("scheduler", "system:kube-scheduler")
        if self.plan.kube_proxy != "none":
            ca.issue("kube-proxy", KUBE_PROXY_USER)
        for n in self.plan.nodes:
            ca.issue(n.name, f"system:node:{n.name}", ["system:nodes"])
            ca.issue(f"{n.name}-serving", f"system:node:{n.name}", ["system:nodes"],
                     server_names=(n.name, *n.addresses), client=False)
        ca.service_account_keys()
        # the front proxy's own CA and the API server's client certificate under it (aggregated APIs)
        pki.Authority(self.plan.front_proxy_pki, FRONT_PROXY_CA).issue(FRONT_PROXY_CLIENT, FRONT_PROXY_CLIENT)
        for path, (stem, _user) in self.plan.kubeconfigs.items():
            doc = kubeconfig(self.plan.api_url, ca.path("ca.crt"), ca.path(f"{stem}.crt"), ca.path(f"{stem}.key"))
            layout.write_atomic(path, yaml.safe_dump(doc, sort_keys=False))

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        cp = subprocess.run(kubectl_argv(self.plan, list(args)), input=input, capture_output=True, text=True,
                            timeout=timeout, check=False)
        if check and cp.returncode != 0:
            raise LabError(f"kubectl {' '.join(args)}: {cp.stderr.strip()}")
        return cp

    # -- components: stop, start, restart (the failure tests)
    def pid_of(self, role: str) -> int | None:
        """The live pid of ``role`` (the newest record whose process still runs)."""
        for e in reversed(self.manifest.of_kind("pid")):
            if e.get("role") == role and running(e["pid"]):
                return int(e["pid"])
        return None

    def stop(self, role: str, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        pid = self.pid_of(role)
        if pid is None:
            raise LabError(f"{role} is not running")
        os.kill(pid, sig)
        try:
            wait_gone({pid}, timeout)
        except LabError:
            kill(pid)
            wait_gone({pid}, 10)
        self.manifest.forget("pid", pid=pid, role=role)

    def start(self, role: str) -> int:
        if self.pid_of(role) is not None:
            raise LabError(f"{role} runs already")
        return start(self.plan.process(role), self.manifest)

    def pod(self, namespace: str, name: str) -> dict | None:
        cp = self.kubectl("get", "pod", "-n", namespace, name, "-o", "json", check=False)
        return json.loads(cp.stdout) if cp.returncode == 0 else None

    def api_ready(self) -> bool:
        cp = self.kubectl("get", "--raw", "/readyz", check=False, timeout=10)
        return cp.returncode == 0 and cp.stdout.strip() == "ok"

    # -- control plane
    def control_plane(self) -> None:
        by = {p.name: p for p in self.plan.control_plane}
        start(by["etcd"], self.manifest)
        start(by["kube-apiserver"], self.manifest)
        wait_for("kube-apiserver /readyz", self.api_ready, 120,
                 lambda: tail(by["kube-apiserver"].log) + tail(by["etcd"].log))
        start(by["kube-controller-manager"], self.manifest)
        start(by["kube-scheduler"], self.manifest)

    # -- Nodes
    def node_up(self, node: NodePlan, images: list[str]) -> None:
        self.manifest.record("cgroup", path=node.cgroup_root)
        make_cgroup(node.cgroup_root)
        make_mount_ns(node, self.manifest)
        bin_dir = {dst: src for src, dst in node.binds}["/opt/cni/bin"]
        for plugin in NODE_CNI_PLUGINS:
            src = os.path.join(DEBIAN_CNI_DIR, plugin)
            if os.path.exists(src):
                shutil.copy2(src, os.path.join(bin_dir, plugin))
        conf = os.path.join(node.directory, "containerd.toml")
        layout.write_atomic(conf, node.containerd_config)
        layout.write_atomic(os.path.join(node.directory, "kubelet.yaml"),
                            yaml.safe_dump(node.kubelet_config, sort_keys=False))
        if node.kube_proxy_config is not None:
            layout.write_atomic(os.path.join(node.directory, "kube-proxy.yaml"),
                                yaml.safe_dump(node.kube_proxy_config, sort_keys=False))
        self.start_node(node, images)

    def start_node(self, node: NodePlan, images: list[str], missing_only: bool = False) -> float:
        """containerd, the ``images`` into it (``missing_only``: those its store lacks, as after a
        reboot, whose /var/lib/containerd kept them), the kubelet, kube-proxy.  Returns the
        kubelet's start (``time.monotonic()``)."""
        containerd, kubelet, *proxy = node.processes
        start(containerd, self.manifest)
        wait_for(f"{node.name}: containerd's socket", lambda: os.path.exists(node.containerd_socket), 60,
                 lambda: tail(containerd.log))
        have = image_names(node) if missing_only else set()
        for image in images:
            if not missing_only or ociimage.archive_names(image) - have:
                ctr(node, "images", "import", image)
        started = time.monotonic()
        start(kubelet, self.manifest)
        for p in proxy:  # kube-proxy: hostNetwork, needs no CNI; Ferry's route-sync reaches the API through it
            start(p, self.manifest)
        return started

    def roll_controller_delivery(self, how: str, timeout: float = 300.0) -> None:
        """ferry-controller rolled out again with ``--delivery how`` (peerslice.DELIVERIES), as an
        operator changing it does; returns once the rollout is complete."""
        cp = self.kubectl("-n", manifests.NAMESPACE, "get", "deployment", CONTROLLER, "-o", "json")
        command = json.loads(cp.stdout)["spec"]["template"]["spec"]["containers"][0]["command"]
        patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/command",
                  "value": manifests.with_flag(command, "--delivery", how)}]
        self.kubectl("-n", manifests.NAMESPACE, "patch", "deployment", CONTROLLER, "--type=json", "-p",
                     json.dumps(patch))
        self.kubectl("-n", manifests.NAMESPACE, "rollout", "status", "deployment", CONTROLLER,
                     f"--timeout={int(timeout)}s", timeout=timeout + 20)

    def switch_kube_proxy(self, mode: str) -> None:
        """Every Node's kube-proxy in ``mode`` (iptables or nftables) from now on, as an operator
        switches it: stopped, its configuration's ``mode`` changed, started again; kube-proxy
        removes the other mode's rules itself when it starts (``platformCleanup`` in
        cmd/kube-proxy/app/server_linux.go, v1.34.4)."""
        for node in self.plan.nodes:
            if node.kube_proxy_config is None:
                raise LabError(f"{node.name}: runs no kube-proxy (--kube-proxy none)")
        for node in self.plan.nodes:
            assert node.kube_proxy_config is not None
            role = f"{node.name}/kube-proxy"
            if self.pid_of(role) is not None:
                self.stop(role)
            layout.write_atomic(os.path.join(node.directory, "kube-proxy.yaml"),
                                yaml.safe_dump({**node.kube_proxy_config, "mode": mode}, sort_keys=False))
            self.start(role)

    def import_image(self, image: str, timeout: float = 120.0) -> None:
        """``image`` (an archive) into every Node's containerd; ``timeout`` per Node bounds a hang."""
        with ThreadPoolExecutor(max_workers=len(self.plan.nodes)) as pool:
            list(pool.map(lambda n: ctr(n, "images", "import", image, timeout=timeout), self.plan.nodes))

    def nodes(self) -> dict[str, dict]:
        cp = self.kubectl("get", "nodes", "-o", "json", check=False)
        if cp.returncode != 0:
            return {}
        return {n["metadata"]["name"]: n for n in json.loads(cp.stdout)["items"]}

    @staticmethod
    def ready(node: dict) -> bool:
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))

    def deploy_ferry(self, overlay: manifests.Overlay, installer: str = "kubectl",
                     chart: str = manifests.CHART) -> None:
        """The CRDs Ferry reads (``deploy/crds/``), established, then Ferry's manifest, as a user
        applies them (README); with installer ``helm``, ``helm install`` of ``chart`` instead."""
        if installer == "helm":
            self.helm_install(overlay, chart)
            return
        self.kubectl("apply", "--server-side", "-f", manifests.CRDS)
        # kubectl wait fails at once ("accessor error: <nil>") on a CRD whose status has no
        # conditions yet, as right after it is created: the lab polls the condition itself
        wait_for("the CRDs of deploy/crds to be Established", self.crds_established, 120.0)
        docs = manifests.apply_overlay(manifests.load(), overlay)
        self.kubectl("apply", "-f", "-", input=manifests.dump(docs))
        if manifests.wants_controller(overlay):
            self.kubectl("apply", "-f", "-", input=manifests.dump(manifests.controller_docs(overlay)))

    def helm(self, *args: str, timeout: float = 180.0) -> str:
        """Helm against the lab's API server (from the control plane's netns), its cache, config
        and data in the lab's directory; its stdout, or a LabError with its stderr."""
        helm = tools.tool("helm")
        if not os.access(helm, os.X_OK):
            raise LabError(f"{helm} missing: run `tools/build-go-tools.sh helm` (make install)")
        home = os.path.join(self.plan.directory, "helm")
        env = {**os.environ, "HELM_CACHE_HOME": f"{home}/cache", "HELM_CONFIG_HOME": f"{home}/config",
               "HELM_DATA_HOME": f"{home}/data"}
        argv = ["nsenter", f"--net=/run/netns/{self.plan.control_plane[0].netns}", "--", helm,
                f"--kubeconfig={self.plan.admin_kubeconfig}", *args]
        cp = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
        if cp.returncode != 0:
            raise LabError(f"helm {args[0]}: {cp.stderr.strip()}")
        return cp.stdout

    def helm_values_file(self, overlay: manifests.Overlay) -> str:
        values = os.path.join(self.plan.directory, "ferry-values.yaml")
        with open(values, "w", encoding="utf-8") as f:
            yaml.safe_dump(manifests.helm_values(overlay), f, sort_keys=False)
        return values

    def helm_install(self, overlay: manifests.Overlay, chart: str = manifests.CHART) -> None:
        """``helm install`` of ``chart`` (deploy/helm/ferry, or a release's) with the overlay as a
        values file: Helm creates the chart's crds/ first, then the rest; the lab waits for the
        DaemonSet itself (wait_converged)."""
        self.helm("install", manifests.RELEASE, chart, "--namespace", manifests.NAMESPACE,
                  "--values", self.helm_values_file(overlay))
        wait_for("the CRDs of deploy/crds to be Established", self.crds_established, 120.0)

    def helm_upgrade(self, overlay: manifests.Overlay, chart: str = manifests.CHART) -> None:
        """``helm upgrade`` of the release to ``chart`` with the overlay's values, as a user
        upgrades; returns once Helm has written the objects (the rollout is the caller's to wait for)."""
        self.helm("upgrade", manifests.RELEASE, chart, "--namespace", manifests.NAMESPACE,
                  "--values", self.helm_values_file(overlay))

    def helm_rollback(self, revision: int) -> None:
        """``helm rollback`` of the release to ``revision`` (1: what ``helm install`` wrote)."""
        self.helm("rollback", manifests.RELEASE, str(revision), "--namespace", manifests.NAMESPACE)

    def crds_established(self) -> bool:
        """Every CRD of ``deploy/crds/`` has the condition Established True."""
        cp = self.kubectl("get", "-f", manifests.CRDS, "-o", "json", check=False)
        if cp.returncode != 0:
            return False
        doc = json.loads(cp.stdout)
        items = doc.get("items", [doc]) if doc.get("kind") == "List" else [doc]
        return bool(items) and all(
            any(c.get("type") == "Established" and c.get("status") == "True"
                for c in (item.get("status") or {}).get("conditions") or [])
            for item in items)

    def deploy_dns(self, timeout: float = 180.0) -> None:
        """CoreDNS as ``kube-system/kube-dns`` (:mod:`lab.kube.dns`); waits until it answers
        readiness (it reached the API server through the ``kubernetes`` Service)."""
        assert self.plan.dns_ips
        self.kubectl("apply", "-f", "-", input=manifests.dump(dns.documents(self.plan.dns_ips, CLUSTER_DOMAIN)))
        wait_for("CoreDNS to be ready", self.dns_ready, timeout,
                 lambda: self.kubectl("-n", "kube-system", "get", "pods", "-l", "k8s-app=kube-dns", "-o", "wide",
                                      check=False).stdout)

    def _observed(self, kind: str, name: str) -> tuple[dict, dict] | None:
        """(object, status) of ``kube-system/<kind>/<name>`` once its controller has seen its
        latest spec (observedGeneration), else None."""
        cp = self.kubectl("-n", "kube-system", "get", kind, name, "-o", "json", check=False)
        if cp.returncode != 0:
            return None
        doc = json.loads(cp.stdout)
        st = doc.get("status", {})
        return (doc, st) if st.get("observedGeneration") == doc["metadata"]["generation"] else None

    def dns_ready(self) -> bool:
        got = self._observed("deployment", "coredns")
        return got is not None and got[1].get("readyReplicas", 0) == got[0]["spec"]["replicas"] == \
            got[1].get("updatedReplicas", 0)

    def daemonset_ready(self, want: int) -> bool:
        """Ferry's DaemonSets run ready on ``want`` Nodes: route-sync's up to date, the Node's Open
        vSwitch's whatever image it has (an OnDelete DaemonSet keeps its Pods across a rollout)."""
        return (self._daemonset_ready(manifests.ROUTE_SYNC_DAEMONSET, want, updated=True)
                and self._daemonset_ready(manifests.OVS_DAEMONSET, want, updated=False))

    def _daemonset_ready(self, name: str, want: int, updated: bool) -> bool:
        got = self._observed("daemonset", name)
        st = got[1] if got else {}
        return (got is not None and st.get("desiredNumberScheduled") == want and st.get("numberReady") == want
                and (not updated or st.get("updatedNumberScheduled") == want) and st.get("numberAvailable") == want)

    def started_nodes(self) -> list[NodePlan]:
        return [n for n in self.plan.nodes if self.pid_of(f"{n.name}/kubelet") is not None]

    def wait_converged(self, timeout: float = 180.0) -> None:
        """Every started Node registered and Ready, Ferry's DaemonSet ready on each."""
        names = {n.name for n in self.started_nodes()}
        wait_for(f"Nodes {sorted(names)} to register", lambda: set(self.nodes()) >= names, timeout,
                 lambda: "\n".join(tail(n.processes[1].log, 5) for n in self.plan.nodes if n.name in names))
        wait_for("Ferry's DaemonSets to be ready on every Node", lambda: self.daemonset_ready(len(names)), timeout,
                 lambda: self.kubectl("-n", "kube-system", "get", "pods", "-o", "wide", check=False).stdout)
        wait_for("every Node to be Ready",
                 lambda: all(self.ready(n) for k, n in self.nodes().items() if k in names), timeout)

    def node_pod_cidrs(self) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
        """Node name -> (spec.podCIDRs, InternalIP addresses), as the API has them."""
        out = {}
        for name, n in self.nodes().items():
            ips = tuple(a["address"] for a in n["status"].get("addresses", []) if a["type"] == "InternalIP")
            out[name] = (tuple(n["spec"].get("podCIDRs") or ()), ips)
        return out

    def route_pod_cidrs(self, router_netns: str, timeout: float = 60.0) -> list[str]:
        """What a cloud's route controller does for noEncap: the router gets a route to every
        Node's Pod CIDRs (from the Node objects) via that Node's address. Returns the routes.
        With BGP nothing is written: this waits until FRR has learned them all from route-sync."""
        routes = router_routes(self.node_pod_cidrs())
        if not self.bgp:
            ip_batch(router_netns, [f"route replace {r}" for r in routes])
            return routes
        from lab import frr

        want = {r.split()[0] for r in routes}
        wait_for(f"the router to learn {sorted(want)} over BGP",
                 lambda: want <= {str(r["dst"]) for r in frr.routes(router_netns)}, timeout,
                 lambda: f"learned: {frr.routes(router_netns)}")
        return routes

    def retag_ferry_image(self, tag: str) -> str:
        """Ferry's image under another tag on every started Node (``ctr images tag``): a new image
        reference for a DaemonSet rolling update. Returns the reference."""
        shipped = manifests.shipped_image(manifests.load())
        src = f"docker.io/{shipped}"
        new = f"{shipped.rsplit(':', 1)[0]}:{tag}"
        for n in self.started_nodes():
            ctr(n, "images", "tag", "--force", src, f"docker.io/{new}")
        return new

    def write_conflists(self, nodes: list[NodePlan], name: str,
                        make: Callable[[tuple[str, ...]], dict], timeout: float = 120.0) -> None:
        """``name`` in each of ``nodes``' conf dirs: ``make(its Pod CIDRs)``, once the
        controller-manager has given them."""
        names = {n.name for n in nodes}
        wait_for(f"Pod CIDRs on {sorted(names)}",
                 lambda: set(self.nodes()) >= names and all(
                     len(c) == len(self.plan.cluster_cidrs) for k, (c, _a) in self.node_pod_cidrs().items()
                     if k in names), timeout)
        cidrs = self.node_pod_cidrs()
        for n in nodes:
            conf_dir = {dst: src for src, dst in n.binds}["/etc/cni/net.d"]
            layout.write_json(os.path.join(conf_dir, name), make(cidrs[n.name][0]))

    def install_bridge(self, timeout: float = 120.0) -> None:
        """The reference CNI instead of Ferry: each Node's conflist is Debian's bridge + host-local
        on the Pod CIDRs the controller-manager gave it; waits until every Node is Ready."""
        names = {n.name for n in self.started_nodes()}
        self.write_conflists(self.started_nodes(), "10-bridge.conflist", bridge_conflist, timeout)
        wait_for("every Node to be Ready",
                 lambda: all(self.ready(n) for k, n in self.nodes().items() if k in names), timeout)

    def install_primary(self, nodes: list[NodePlan]) -> None:
        """networkPolicyOnly: the primary CNI Ferry chains itself after (install-cni reads it)."""
        self.write_conflists(nodes, PRIMARY_CONFLIST, ptp_conflist)

    def images(self) -> list[str]:
        d = os.path.join(self.plan.directory, "images")
        return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".tar"))

    def join(self, node: str, timeout: float = 180.0) -> None:
        """Start ``node``'s containerd and kubelet (a ``joinLater`` Node): it registers, gets its
        Pod CIDRs from the controller-manager, Ferry's DaemonSet lands on it."""
        self.node_up(self.plan.node(node), self.images())
        if self.chained:
            self.install_primary([self.plan.node(node)])
        self.wait_converged(timeout)
        if self.router_netns:
            self.route_pod_cidrs(self.router_netns)


def build_images(directory: str, tag: str | None, log: Log, services: bool = False) -> list[str]:
    """The pause and workload images (made here) and Ferry's (``tools/build-image.sh``), in
    ``directory`` (Ferry's linked from build/image); with ``services``, CoreDNS's and agnhost's
    (the Service tests' servers) from the binaries tools/build-go-tools.sh built."""
    os.makedirs(directory, exist_ok=True)
    pause = ociimage.write_archive(ociimage.busybox_image(PAUSE_IMAGE, cmd=("sleep", "2147483647")),
                                   os.path.join(directory, "pause.tar"))
    busybox = ociimage.write_archive(ociimage.busybox_image(WORKLOAD_IMAGE), os.path.join(directory, "busybox.tar"))
    ferry = os.path.join(directory, "ferry.tar")
    if os.path.lexists(ferry):
        os.unlink(ferry)
    os.symlink(ferry_image(tag, log), ferry)
    out = [pause, busybox, ferry]
    if services:
        for name, spec in dns.images(tools.tool).items():
            out.append(ociimage.write_archive(spec, os.path.join(directory, f"{name}.tar")))
    return out


def ferry_image(tag: str | None, log: Log) -> str:
    """``build/image/ferry-<tag>.tar``, built (``make dist`` + ``tools/build-image.sh``) when absent
    or older than the bundle or the wireguard-go it carries."""
    tag = tag or manifests.shipped_image(manifests.load()).rsplit(":", 1)[1]
    path = os.path.join(REPO, "build", "image", f"ferry-{tag}.tar")
    bundle = os.path.join(REPO, "dist", "ferry", "ferry-route-sync")
    if not os.path.exists(bundle):
        raise LabError("no frozen bundle (dist/ferry): run `make dist` (or `make image`) first")
    parts = [bundle] + [p for p in (tools.tool("wireguard-go"),) if os.path.exists(p)]
    if not os.path.exists(path) or os.path.getmtime(path) < max(os.path.getmtime(p) for p in parts):
        log(f"building Ferry's image {tag}")
        cp = subprocess.run(["bash", os.path.join(REPO, "tools", "build-image.sh"), tag], capture_output=True,
                            text=True, check=False)
        if cp.returncode != 0:
            raise LabError(f"tools/build-image.sh failed: {cp.stderr.strip()[-800:]}")
    return path


def up(plan: ClusterPlan, topo_server_names: tuple[str, ...], route_sync: dict, image_tag: str | None,
       join_later: tuple[str, ...], route_pod_cidrs: bool, router_netns: str, manifest: Manifest,
       log: Log, cni: str = "ferry", bgp: bool = False, chained: bool = False,
       installer: str = "kubectl", release_tag: str | None = None,
       controller_delivery: str = DELIVERY_LABELS) -> Cluster:
    """The cluster, Ferry on it (this tree's image and manifest or chart; ``release_tag``'s chart
    and image with it, lab.kube.release; ferry-controller, if route-sync reads PeerSlices, with
    ``--delivery controller_delivery``), its Nodes Ready."""
    t0 = time.monotonic()
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"):
        if not os.access(tools.tool(name), os.X_OK):
            raise LabError(f"{tools.tool(name)} missing: run `tools/build-go-tools.sh kubernetes` (make install)")
    # The router follows the Nodes' Pod CIDRs on every cluster running Ferry, not only in noEncap:
    # the API server dials Pod IPs (pods/proxy, webhooks, aggregated APIs), as it does from a
    # control-plane Node on the Pod network; here it runs on the external host, behind the router.
    cluster = Cluster(plan, manifest, log, router_netns if route_pod_cidrs or cni == "ferry" else None,
                      bgp=bgp, chained=chained)
    os.makedirs(plan.directory, exist_ok=True)
    cluster.credentials(topo_server_names)
    services = plan.kube_proxy != "none"
    if services:
        for name in ("kube-proxy", "coredns", "agnhost"):
            if not os.access(tools.tool(name), os.X_OK):
                raise LabError(f"{tools.tool(name)} missing: run `tools/build-go-tools.sh kubernetes kube-e2e coredns`"
                               " (make install), or `--kube-proxy none`")
    images = build_images(os.path.join(plan.directory, "images"), image_tag, log, services)
    if release_tag:  # beside this tree's (the upgrade's), in the images a joining Node loads too
        release.require(release_tag)
        link = os.path.join(plan.directory, "images", "ferry-release.tar")
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(release.image_archive(release_tag), link)
        images.append(link)
    cluster.control_plane()
    log(f"control plane ready: {time.monotonic() - t0:.1f}s")
    make_holder(os.path.dirname(plan.nodes[0].mount_ns), manifest)
    now = [n for n in plan.nodes if n.name not in join_later]
    with ThreadPoolExecutor(max_workers=len(now)) as pool:
        list(pool.map(lambda n: cluster.node_up(n, images), now))
    if cni == "bridge":
        cluster.install_bridge()
        log(f"bridge + host-local on every Node: {time.monotonic() - t0:.1f}s")
        return cluster
    if chained:
        cluster.install_primary(now)
        log(f"primary CNI (ptp + host-local) on every Node: {time.monotonic() - t0:.1f}s")
    image, chart = None, manifests.CHART
    if image_tag:
        image = manifests.shipped_image(manifests.load()).rsplit(":", 1)[0] + f":{image_tag}"
    if release_tag:
        image, chart = release.image_ref(release_tag), release.chart(release_tag)
    cluster.deploy_ferry(manifests.Overlay(plan.api_host, plan.api_port, plan.cluster_cidrs, route_sync, image,
                                           api_override=not services, controller_delivery=controller_delivery),
                         installer, chart)
    cluster.wait_converged()
    cluster.route_pod_cidrs(router_netns)
    log(f"Ferry deployed, Nodes Ready: {time.monotonic() - t0:.1f}s")
    if services and not join_later:
        cluster.deploy_dns()
        log(f"CoreDNS ready (kube-dns {', '.join(plan.dns_ips)}): {time.monotonic() - t0:.1f}s")
    return cluster


__all__ = ["Cluster", "build_images", "server_names", "teardown", "up", "wait_for"]
