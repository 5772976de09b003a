"""What the restart and upgrade tests look at on a Kubernetes lab (tests/e2e/kube): the modes they
run in, Ferry's DaemonSets' Pods, the Nodes' flows and ports, and a live ping across an event."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Self

from cni.pipeline.modes import DATAPATHS, ENCRYPTION_WIREGUARD, NETDEV
from cni.pipeline.tables import Owner
from lab.api import Lab
from lab.kube import lab_cluster, manifests
from lab.kube import pods as kube_pods
from lab.kube.cluster import Cluster, wait_for
from lab.sh import pids_named
from routesync.apply.ovs import owner_of
from routesync.config import OVS_FERRY
from tests.e2e.kube.helpers import topology
from tests.support.liveping import LivePing, LiveTcp, PingResult
from tests.support.waiting import HANG

OVS_DAEMONS = ("ovsdb-server", "ovs-vswitchd")

# The modes issue 42 measures each restart, rollout, upgrade and rollback in: encap (VXLAN),
# noEncap with the fast path (the uplink on the bridge), encap with WireGuard (wireguard-go in the
# switch's container). Each is a Kubernetes cluster of its own.
MODES = ("encap-vxlan", "noEncap-fastPath", "encap-wireguard")
MODES_ENV = "FERRY_EVENT_MODES"
# the Nodes' Open vSwitch datapath in the event tests: netdev (the default; the only one a kernel
# without the openvswitch module has) or system, where the switch's restarts can lose nothing
DATAPATH_ENV = "FERRY_EVENT_DATAPATH"


def modes(env: str | None = None) -> list[str]:
    """The modes to run the event tests in: ``FERRY_EVENT_MODES`` (a comma list, or ``all``);
    unset, encap alone -- ``make test`` (CI) bounds its time, ``make events-test`` sets ``all``."""
    value = os.environ.get(MODES_ENV) if env is None else env
    if value == "all":
        return list(MODES)
    chosen = [m for m in (value or MODES[0]).split(",") if m]
    unknown = sorted(set(chosen) - set(MODES))
    if unknown:
        raise ValueError(f"{MODES_ENV}: unknown {unknown} (known: {', '.join(MODES)}, all)")
    return chosen


def datapath(env: str | None = None) -> str:
    """The event tests' datapath: ``FERRY_EVENT_DATAPATH`` (netdev when unset)."""
    value = (os.environ.get(DATAPATH_ENV) if env is None else env) or NETDEV
    if value not in DATAPATHS:
        raise ValueError(f"{DATAPATH_ENV}: {value!r}: one of {', '.join(DATAPATHS)}")
    return value


def mode_topology(mode: str, env: str | None = None) -> dict[str, Any]:
    """A three-Node lab in ``mode`` whose Nodes have no Open vSwitch of their own (Ferry's
    openvswitch container, the default users run), on :func:`datapath`."""
    if mode == "noEncap-fastPath":
        topo = topology({"trafficEncapMode": "noEncap", "fastPath": True}, route_pod_cidrs=True, ovs_daemons=OVS_FERRY)
    else:
        topo = topology({"trafficEncapMode": "encap", "tunnelType": "vxlan"}, ovs_daemons=OVS_FERRY)
    if mode == "encap-wireguard":
        topo["encryption"] = ENCRYPTION_WIREGUARD
    topo["datapath"] = datapath(env)
    return topo


def lab_mode(lab: Lab) -> str:
    """The lab's mode as the event lines print it (encap, noEncap+fastPath, encap+wireguard)."""
    keys = lab_cluster.route_sync_keys(lab.topology)
    return "+".join(str(k) for k in (keys["trafficEncapMode"], keys.get("fastPath") and "fastPath",
                                      keys.get("trafficEncryptionMode")) if k)


def flows(lab: Lab, node: str) -> list[str]:
    out = lab.node(node).exec(["ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", "br-int"],
                              check=True).stdout
    return sorted(line.strip() for line in out.splitlines() if "cookie=" in line)


def flow_difference(was: list[str], now: list[str]) -> str:
    """What a failure message shows: the flows gone and the flows new."""
    gone, new = sorted(set(was) - set(now)), sorted(set(now) - set(was))
    return "\n".join([f"{len(gone)} flows gone:", *gone[:20], f"{len(new)} flows new:", *new[:20]])


def ports(lab: Lab, node: str) -> dict[str, int]:
    """Interface name -> ofport on the Node's bridge."""
    doc = json.loads(lab.node(node).vsctl("--format=json", "--columns=name,ofport", "list", "Interface"))
    return {row[0]: row[1] for row in doc["data"]}


def ferry_pods(cluster: Cluster, daemonset: str = manifests.ROUTE_SYNC_DAEMONSET) -> dict[str, dict]:
    """Node -> the DaemonSet's Pod there (route-sync's by default; each DaemonSet labels its Pods
    with its name)."""
    doc = json.loads(cluster.kubectl("-n", "kube-system", "get", "pods", "-l",
                                     f"app.kubernetes.io/name={daemonset}", "-o", "json").stdout)
    return {p["spec"]["nodeName"]: p for p in doc["items"]}


def ovs_pods(cluster: Cluster) -> dict[str, dict]:
    return ferry_pods(cluster, manifests.OVS_DAEMONSET)


def restarts(pod: dict, container: str) -> int:
    statuses = pod["status"].get("initContainerStatuses", []) + pod["status"].get("containerStatuses", [])
    return next((s.get("restartCount", 0) for s in statuses if s["name"] == container), 0)


def ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


# A TCP stream beside the ping: 1 KiB every 10 ms (~100 KB/s), its arrival noted at every KiB,
# so a stall of ~10 ms shows; an 8 MB/s stream through the lab's userspace datapath made the ping
# itself lose requests (docs/design/upgrades.md).
TCP_PORT, TCP_CHUNK, TCP_PAUSE = 5201, 1024, 0.01


def peer_groups_added(was: list[str], now: list[str]) -> list[str] | None:
    """The flows of ``now`` beyond ``was`` when they are whole peer cookie groups ``was`` lacked
    and nothing of ``was`` is gone or changed; None otherwise."""
    if not set(was) <= set(now):
        return None
    had = {cookie_of(f) for f in was}
    added = sorted(set(now) - set(was))
    if any(cookie_of(f) in had or owner_of(cookie_of(f)) != Owner.PEER for f in added):
        return None
    return added


def cookie_of(flow: str) -> int:
    return int(flow.split("cookie=", 1)[1].split(",", 1)[0], 16)


def across(lab: Lab, what: str, event: Callable[[], None], release_before: bool = False) -> PingResult:
    """A 10 ms ping and a paced TCP stream node-1 -> node-3 across ``event``; afterwards every
    flow is back on both Nodes and the Pods' ports kept their numbers. The TCP connection must
    survive (one connection throughout); its longest stall is printed beside the ping's gap.

    ``release_before``: the flows before are v0.1.0's, which has a bug fixed since: the API
    server's watches it opened before its first pass moved the uplink onto the bridge stalled
    until the server ended them (~15 s), so a peer's MAC annotation published meanwhile reached it
    late and that peer's fast-path groups were absent for those seconds (1 of 4 upgrades here
    snapshotted that moment; route-sync now opens its watches again after the move). Then the new
    tree may add whole peer groups the release lacked (printed); nothing it had may go or change."""
    before = {n: (flows(lab, n), ports(lab, n)) for n in ("node-1", "node-3")}
    seen = what_route_sync_saw(lab)  # for a failure's message: what the flows were planned from
    src, dst = lab.pod("node-1", "a"), lab.pod("node-3", "a")
    assert dst.ipv4
    with LiveTcp(dst.netns, dst.ipv4, src.netns, TCP_PORT, chunk=TCP_CHUNK, pause=TCP_PAUSE,
                 stamp=TCP_CHUNK) as stream, LivePing(src.netns, dst.ipv4, interval=0.01) as ping:
        ping.more_replies(20, "before the event")
        stream.more_bytes(20 * TCP_CHUNK, "before the event")
        t0 = time.monotonic()
        event()
        t1 = time.monotonic()
        assert ping.reply_after(time.time()), f"no reply after {what}"
        ping.more_replies(20, f"after {what}")
        stream.more_bytes(20 * TCP_CHUNK, f"after {what}")
        result = ping.stop()
        stall = stream.longest_stall(t0, t1)
        stream.stop()
    print(f"\n{what} ({lab_mode(lab)}): 10 ms ping node-1 -> node-3: {len(result.lost_seqs)} of "
          f"{result.transmitted} lost ({result.lost} unanswered with those in flight at the stop), longest gap "
          f"{result.gap * 1000:.0f} ms; TCP stream's longest stall {stall * 1000:.0f} ms")
    for n, (was_flows, was_ports) in before.items():
        def back(n: str = n, was: list[str] = was_flows) -> bool:
            now = flows(lab, n)
            if now == was:
                return True
            added = peer_groups_added(was, now) if release_before else None
            if added is not None:
                print(f"{n}: peer groups the release lacked, added by this tree: {len(added)} flows, cookies "
                      f"{sorted({hex(cookie_of(f)) for f in added})}")
            return added is not None

        wait_for(f"{n}'s flows back to what they were", back, HANG,
                 lambda n=n, was=was_flows: flow_difference(was, flows(lab, n)) + "\nits neighbours:\n"
                 + lab.node(n).exec(["ip", "neigh", "show"]).stdout + f"\nbefore {what}:\n{seen}")
        assert ports(lab, n) == was_ports, f"{n}: the Pods' ports changed"
    return result


def what_route_sync_saw(lab: Lab, lines: int = 25) -> str:
    """The Nodes' Ferry annotations and each route-sync's last log lines, as text."""
    cluster = lab.kube()
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    out = [f"{n['metadata']['name']}: " + str({k: v for k, v in sorted(n["metadata"].get("annotations", {}).items())
                                              if k.startswith("ferry.io/")}) for n in nodes]
    for node, pod in sorted(ferry_pods(cluster).items()):
        log = cluster.kubectl("-n", "kube-system", "logs", pod["metadata"]["name"], "-c", "route-sync",
                              f"--tail={lines}", check=False)
        out += [f"{node}'s route-sync ({pod['metadata']['name']}):", *log.stdout.splitlines()]
    return "\n".join(out)


def daemon_pids(lab: Lab, node: str) -> dict[str, list[int]]:
    return {d: sorted(pids_named(lab.node(node).netns, d)) for d in OVS_DAEMONS}


def images(pod: dict) -> dict[str, str]:
    return {c["name"]: c["image"] for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]}


def roll_out(cluster: Cluster, daemonset: str = manifests.ROUTE_SYNC_DAEMONSET) -> None:
    """Until the DaemonSet's rollout is done (``kubectl rollout status``: every Pod updated and ready)."""
    cluster.kubectl("-n", "kube-system", "rollout", "status", f"daemonset/{daemonset}", "--timeout=300s",
                    timeout=320)


def interfaces(lab: Lab, node: str) -> dict[str, dict[str, str]]:
    """Interface name -> its OVSDB external_ids (the Pod's name, namespace, sandbox, ...)."""
    doc = json.loads(lab.node(node).vsctl("--format=json", "--columns=name,external_ids", "list", "Interface"))
    return {row[0]: dict(row[1][1]) for row in doc["data"]}


class PodChurn:
    """Pods created and deleted one after another on ``nodes`` while an event runs (``with``):
    each ADD counted with the seconds from ``kubectl create`` to Running, each DEL with its
    ``kubectl delete --wait``; a Pod that never runs, or never goes, leaves :attr:`error` set. The
    kubelet's failed attempts (events FailedCreatePodSandBox, FailedKillPod) are counted too: a
    failed CNI ADD the kubelet then retries."""

    def __init__(self, cluster: Cluster, nodes: tuple[str, ...], prefix: str = "churn") -> None:
        self.cluster, self.nodes, self.prefix = cluster, nodes, prefix
        self.to_running: list[float] = []  # per ADD: create -> Running, seconds
        self.deleted = 0
        self.names: list[str] = []
        self.log: list[tuple[float, str]] = []  # (time.time(), what): each create, Running, delete, gone
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-churn", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        i = 0
        try:
            while not self._stop.is_set() or i < len(self.nodes):  # at least one Pod on every Node
                node = self.nodes[i % len(self.nodes)]
                name = kube_pods.api_name(node, f"{self.prefix}{i}")
                self.names.append(name)
                t0 = time.monotonic()
                self.log.append((time.time(), f"create {name}"))
                self.cluster.kubectl("create", "-f", "-", input=json.dumps(kube_pods.pod_spec(name, node)))
                kube_pods.wait_running(lambda name=name: self.cluster.pod(kube_pods.NAMESPACE, name), HANG)
                self.to_running.append(time.monotonic() - t0)
                self.log.append((time.time(), f"{name} Running"))
                self.cluster.kubectl("delete", "pod", "-n", kube_pods.NAMESPACE, name, "--wait=true",
                                     f"--timeout={int(HANG)}s", timeout=HANG + 10)
                self.log.append((time.time(), f"{name} deleted"))
                self.deleted += 1
                i += 1
        except Exception as e:  # noqa: BLE001 -- reported by the caller (error): a thread's exception is lost
            self.error = e

    def failed_attempts(self) -> dict[str, int]:
        """The kubelet's failed sandbox creations and kills of the churn's Pods, by reason."""
        doc = json.loads(self.cluster.kubectl("get", "events", "-n", kube_pods.NAMESPACE, "-o", "json").stdout)
        out = {"FailedCreatePodSandBox": 0, "FailedKillPod": 0}
        for e in doc["items"]:
            if e.get("reason") in out and e["involvedObject"]["name"] in self.names:
                out[e["reason"]] += int(e.get("count") or 1)
        return out

    def summary(self) -> str:
        longest = max(self.to_running, default=0.0)
        return (f"{len(self.to_running)} ADDs (longest create -> Running {longest:.1f} s), {self.deleted} DELs, "
                f"the kubelet's failed attempts {self.failed_attempts()}")
