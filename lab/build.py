"""``up`` and ``down``: apply a lab's plan to the system, and undo it from the manifest alone.

``up`` records each object in the manifest before creating it, builds what is independent in
parallel (every Node's OVS instance, the underlay, the files), and waits on real readiness
(``--detach`` daemons, the route-sync state file), never on sleeps.  ``down`` kills every
process living in one of the lab's namespaces, deletes the namespaces (and with them every
link and bridge), and removes the lab's files; it works on a half-built lab too."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import yaml

from cni.pipeline.modes import ENCRYPTION_NONE, ENCRYPTION_WIREGUARD
from lab import frr, layout, netplan, ovs, segswitch, tools
from lab.manifest import MANIFEST, Manifest
from lab.sh import NETNS_DIR, LabError, cmdline, ip_batch, pids_in, run, running
from lab.topology import MAX_LAB_NAME, NodeSpec, Topology, check_name, node_netns, router_netns

TOPOLOGY_FILE = "topology.yaml"


def route_sync_command() -> str | None:
    """$FERRY_ROUTE_SYNC, else ``ferry-route-sync`` next to this interpreter (the venv) or on PATH,
    provided its module exists (the console script is installed before the code lands)."""
    override = os.environ.get("FERRY_ROUTE_SYNC")
    if override:
        return override
    import importlib.util

    try:
        if importlib.util.find_spec("routesync.cli") is None:
            return None
    except ImportError:
        return None
    local = os.path.join(os.path.dirname(sys.executable), "ferry-route-sync")
    if os.access(local, os.X_OK):
        return local
    return shutil.which("ferry-route-sync")


def netns_exists(name: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, name))


KERNEL_WIREGUARD = "/sys/module/wireguard"  # the kernel's WireGuard is loaded (route-sync's auto picks it)


def check_encryption(topo: Topology) -> None:
    """An encrypted lab needs what encrypts: route-sync on every Node and a WireGuard it can run
    (the userspace one, unless the kernel has the module).  Refused before anything is built: a lab
    that came up without them would carry Pod traffic in clear."""
    if not topo.encrypted:
        return
    if topo.kubernetes is None and route_sync_command() is None:
        raise LabError(f"encryption: {topo.encryption} needs ferry-route-sync (not installed): lone Nodes would "
                       "send Pod traffic in clear")
    wg = tools.wireguard_go()
    if not os.access(wg, os.X_OK) and not os.path.isdir(KERNEL_WIREGUARD):
        raise LabError(f"encryption: {topo.encryption}: no userspace WireGuard at {wg} and no kernel module; build "
                       f"it with `bash tools/build-go-tools.sh wireguard-go` or set ${tools.WIREGUARD_GO_ENV}")


def up(topo: Topology, topo_doc: dict, name: str, cni_bin: str, root: str | None = None,
       log: Callable[[str], None] | None = None) -> Manifest:
    """Build lab ``name``; on any failure the half-built lab is torn down and the error raised."""
    check_name("lab", name, MAX_LAB_NAME)
    directory = layout.lab_dir(name, root)
    plan = netplan.plan(name, topo)
    if os.path.exists(os.path.join(directory, MANIFEST)):
        state = _peek_state(directory)
        raise LabError(f"lab {name!r} already exists ({state}) in {directory}; "
                       f"run `ferry-lab down --name {name}` first")
    check_encryption(topo)
    taken = [ns for ns in plan.namespaces if netns_exists(ns)]
    if taken:
        raise LabError(f"namespaces already exist, not created by a lab named {name!r} on record: "
                       f"{', '.join(taken)}; remove them (ip netns del) or pick another --name")
    try:
        manifest = Manifest.create(directory, name)
    except FileExistsError:
        raise LabError(f"lab {name!r} is being created by another process ({directory})") from None
    try:
        _build(topo, topo_doc, name, cni_bin, directory, plan, manifest, log or (lambda s: None))
    except BaseException:
        down(name, root)
        raise
    return manifest


def _build(topo: Topology, topo_doc: dict, name: str, cni_bin: str, directory: str,
           plan: netplan.NetPlan, manifest: Manifest, log: Callable[[str], None]) -> None:
    t0 = time.monotonic()
    manifest.record("dir", path=directory)
    layout.write_atomic(os.path.join(directory, TOPOLOGY_FILE), yaml.safe_dump(topo_doc, sort_keys=False))
    manifest.set(cniBin=cni_bin, topology=os.path.join(directory, TOPOLOGY_FILE), started=time.time())
    for ns in plan.namespaces:
        manifest.record("netns", name=ns)
    ip_batch(None, [f"netns add {ns}" for ns in plan.namespaces])
    log(f"namespaces: {len(plan.namespaces)} ({time.monotonic() - t0:.2f}s)")

    kube = topo.kubernetes is not None
    rs_cmd = route_sync_command() if topo.route_sync and not kube else None
    lone = rs_cmd is None and not kube
    if topo.route_sync and rs_cmd is None and not kube:
        log("routeSync is set but ferry-route-sync is not installed: Nodes run the plugin's lone mode")

    def node_files(node: NodeSpec) -> None:
        paths = layout.node_paths(directory, node.name)
        for d in paths.dirs():
            os.makedirs(d, exist_ok=True)
        if not kube:  # on a Kubernetes lab, Ferry's DaemonSet (install-cni) writes the conflist
            layout.write_json(paths.conflist, layout.conflist(topo, node, paths, lone))
        layout.write_atomic(os.path.join(layout.registry_dir(directory), f"{node.name}.yaml"),
                            yaml.safe_dump(layout.registry_record(topo, node), sort_keys=False))

    def node_ovs(node: NodeSpec) -> None:
        paths = layout.node_paths(directory, node.name)
        os.makedirs(paths.ovs, exist_ok=True)  # on OVS-less Nodes, the openvswitch container's run dir
        if not (topo.kubernetes is not None and topo.kubernetes.ferry_runs_ovs):
            ovs.start(node_netns(name, node.name), paths, manifest)

    def network() -> None:
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda item: run(["sysctl", "-q", "-w", *item[1]], netns=item[0]),
                          plan.sysctls.items()))
            for stage in plan.stages:
                list(pool.map(lambda item: ip_batch(item[0], item[1]), stage.items()))
            list(pool.map(lambda item: [run(["ethtool", "-K", dev, "tx", "off"], netns=item[0])
                                        for dev in item[1]], plan.tx_csum_off.items()))
            # tagged segments: their switches (OVS), on the veths just made
            list(pool.map(lambda sp: segswitch.start(sp, directory, manifest), segswitch.plan(name, topo)))
        if topo.router_bgp is not None:  # the router's bgpd, before the Nodes' route-sync dial it
            d = frr.frr_dir(directory)
            os.makedirs(d, exist_ok=True)
            frr.start(frr.plan(topo, name, d), router_netns(name), lambda p: manifest.record("pidfile", path=p))

    for node in topo.nodes:
        node_files(node)
    with ThreadPoolExecutor(max_workers=len(topo.nodes) + 1) as pool:
        futures = [pool.submit(network)] + [pool.submit(node_ovs, n) for n in topo.nodes]
        for f in futures:
            f.result()
    log(f"underlay + OVS: {time.monotonic() - t0:.2f}s")

    if rs_cmd is not None:
        with ThreadPoolExecutor(max_workers=len(topo.nodes)) as pool:
            list(pool.map(lambda n: start_route_sync(rs_cmd, topo, n, name, directory, manifest), topo.nodes))
        log(f"route-sync ready: {time.monotonic() - t0:.2f}s")
    if kube:
        from lab.kube import lab_cluster

        switches = [sp for sp in segswitch.plan(name, topo) if sp.bootstrap]
        stop = threading.Event()
        watcher = threading.Thread(target=segswitch.trunk_when_tagged, daemon=True, args=(
            directory, switches, {n.name: os.path.dirname(layout.node_paths(directory, n.name).state_file)
                                  for n in topo.nodes}, stop))
        if switches:
            watcher.start()
        try:
            lab_cluster.up(topo, name, directory, manifest, log)
        finally:
            stop.set()
    manifest.set(state="up", routeSync=rs_cmd is not None or kube, kubernetes=kube,
                 upSeconds=round(time.monotonic() - t0, 3))


def start_route_sync(cmd: str, topo: Topology, node: NodeSpec, name: str, directory: str,
                     manifest: Manifest) -> int:
    """Start route-sync in the Node's namespace; returns its pid once the state file exists."""
    assert topo.route_sync is not None
    paths = layout.node_paths(directory, node.name)
    layout.write_atomic(paths.route_sync_config,
                        yaml.safe_dump(layout.route_sync_config(topo, node, paths, directory), sort_keys=False))
    netns = node_netns(name, node.name)
    with open(os.path.join(paths.log, "route-sync.out"), "ab") as logf:
        proc = subprocess.Popen(["ip", "netns", "exec", netns, cmd, "run", "--config", paths.route_sync_config],
                                env=ovs.env(paths), stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                start_new_session=True)
    manifest.record("pid", pid=proc.pid, netns=netns, what=f"route-sync {node.name}")
    deadline = time.monotonic() + topo.route_sync.startTimeout
    # until route-sync itself runs (not ``ip netns exec`` on its way to it: while a process is
    # inside execve its /proc cmdline reads empty, and the state file of an earlier run may exist
    # already, so a caller asking ``route_sync_pid`` right after a restart was told no) and the
    # state file exists
    while not (_is_route_sync(proc.pid) and os.path.exists(paths.state_file)):
        if proc.poll() is not None:
            raise LabError(f"ferry-route-sync on {node.name} exited (rc={proc.returncode}) before writing "
                           f"{paths.state_file}; see {paths.log}/route-sync.out:\n{_tail(paths.log)}")
        if time.monotonic() > deadline:
            raise LabError(f"ferry-route-sync on {node.name} wrote no state file {paths.state_file} within "
                           f"{topo.route_sync.startTimeout}s; see {paths.log}/route-sync.out:\n{_tail(paths.log)}")
        time.sleep(0.01)
    if topo.encrypted:
        check_encrypts(paths, node.name)
    return proc.pid


def check_encrypts(paths: layout.NodePaths, node: str) -> None:
    """An encrypted lab's route-sync says so in its state file (``encryption``), or the lab refuses
    to go on: a route-sync that ignores trafficEncryptionMode would carry Pods in clear."""
    try:
        with open(paths.state_file) as f:
            said = json.load(f).get("encryption", ENCRYPTION_NONE)
    except (OSError, ValueError) as e:
        raise LabError(f"ferry-route-sync on {node}: cannot read its state file {paths.state_file}: {e}") from None
    if said != ENCRYPTION_WIREGUARD:
        raise LabError(f"ferry-route-sync on {node} does not encrypt: its state file says encryption {said!r}, "
                       f"{paths.route_sync_config} asks for trafficEncryptionMode {ENCRYPTION_WIREGUARD}; "
                       "refusing to carry Pod traffic in clear (this route-sync has no WireGuard yet?)")


def _is_route_sync(pid: int) -> bool:
    """``pid`` runs route-sync itself (not ``ip netns exec`` on its way to it, nor mid-exec)."""
    argv = cmdline(pid).split()
    return bool(argv) and os.path.basename(argv[0]) != "ip" and "route-sync" in " ".join(argv)


def route_sync_pid(manifest: Manifest, node: str) -> int | None:
    """The pid of ``node``'s route-sync as last recorded, when it still runs it."""
    for e in reversed(manifest.of_kind("pid")):
        if e.get("what") == f"route-sync {node}":
            pid = int(e["pid"])
            return pid if running(pid) and "route-sync" in cmdline(pid) else None
    return None


def _tail(log_dir: str, n: int = 15) -> str:
    try:
        with open(os.path.join(log_dir, "route-sync.out"), errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def _peek_state(directory: str) -> str:
    try:
        return Manifest.load(directory).state
    except (OSError, ValueError):
        return "half-written"


# ------------------------------------------------------------------------------ down

def _recorded_pids(manifest: Manifest, directory: str) -> list[int]:
    """Pids from pidfiles/records whose command line names this lab (guards against pid reuse)."""
    pids = []
    for e in manifest.of_kind("pidfile"):
        pid = ovs.read_pid(e["path"])
        if pid and directory in cmdline(pid):
            pids.append(pid)
    for e in manifest.of_kind("pid"):
        if directory in cmdline(e["pid"]) or f"{manifest.name}-" in cmdline(e["pid"]):
            pids.append(e["pid"])
    return pids


def _stop(pids: set[int], grace: float = 2.0) -> None:
    for p in pids:
        ovs.signal_pid(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        pids = {p for p in pids if running(p)}
        if pids:
            time.sleep(0.01)
    for p in pids:
        ovs.signal_pid(p, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        pids = {p for p in pids if running(p)}
        if pids:
            time.sleep(0.01)



def down(name: str, root: str | None = None) -> bool:
    """Tear lab ``name`` down from its manifest; False when there was nothing to tear down."""
    directory = layout.lab_dir(name, root)
    if not os.path.exists(os.path.join(directory, MANIFEST)):
        if os.path.isdir(directory):  # a manifest never got written: only our own directory exists
            shutil.rmtree(directory, ignore_errors=True)
            return True
        return False
    manifest = Manifest.load(directory)
    namespaces = [e["name"] for e in manifest.of_kind("netns")]
    if manifest.of_kind("mountns") or manifest.of_kind("cgroup"):
        from lab.kube import cluster

        cluster.teardown(manifest)  # containers, kubelets, containerds: before their namespaces go
    # Processes first: a namespace with a live process outlives `ip netns del`.  Those in a Node's
    # namespace include what route-sync started that outlives it (an encrypted lab's wireguard-go,
    # which no manifest entry names).
    _stop(set(pids_in(namespaces)) | set(_recorded_pids(manifest, directory)))
    for _ in range(3):  # a process started meanwhile (a daemon's fork as it was signalled): again
        survivors = pids_in(namespaces)
        if not survivors:
            break
        _stop(set(survivors))
    if survivors:  # deleting the names now would hide them: they would keep their namespaces alive
        manifest.set(state="down-failed")
        raise LabError(f"processes survived SIGKILL in the lab's namespaces: "
                       f"{', '.join(f'{p} ({cmdline(p)[:60]})' for p in survivors)}; manifest kept in {directory}")
    present = [ns for ns in namespaces if netns_exists(ns)]
    if present:
        ip_batch(None, [f"netns del {ns}" for ns in present])
    for e in manifest.of_kind("file"):
        try:
            os.unlink(e["path"])
        except FileNotFoundError:
            pass
    leftover = [ns for ns in namespaces if netns_exists(ns)]
    if leftover:
        manifest.set(state="down-failed")
        raise LabError(f"could not delete namespaces {leftover}; manifest kept in {directory}")
    for e in reversed(manifest.of_kind("dir")):
        shutil.rmtree(e["path"], ignore_errors=True)
    shutil.rmtree(directory, ignore_errors=True)
    return True
