"""What only a real cluster can show, on one encap (VXLAN) cluster of four Nodes whose fourth
(node-4) joins during the tests: Node readiness follows Ferry's conflist, a Node joining and a
Node object deleted, the API server away for 30 s, a kubelet restart, Pod deletion through the
API, a DaemonSet rolling update, and the RBAC route-sync needs.

The tests share the cluster and run in file order (each leaves it as it found it, except the
joining Node, which the later tests use)."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cni.ipam.api import list_allocations
from lab.api import Lab, Probe
from lab.kube import pods as kube_pods
from lab.kube.cluster import Cluster, wait_for
from tests.e2e.kube.helpers import route_sync_pid, topology

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def lab(kube_module_lab_of) -> Iterator[Lab]:  # type: ignore[no-untyped-def]
    lab = kube_module_lab_of(topology({"trafficEncapMode": "encap", "tunnelType": "vxlan"}, nodes=4,
                               join_later=("node-4",)))
    lab.add_pod("node-1", "a")
    lab.add_pod("node-3", "a")
    yield lab


def peers(lab: Lab, node: str) -> set[str]:
    state = lab.node(node).state() or {}
    return {p["name"] for p in state.get("peers") or []}


def flows(lab: Lab, node: str) -> list[str]:
    """The Node's OpenFlow table without counters (comparable before/after)."""
    out = lab.node(node).exec(["ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", "br-int"],
                              check=True).stdout
    return sorted(line.strip() for line in out.splitlines() if "cookie=" in line)


def ping_during(lab: Lab, src_node: str, dst_node: str, seconds: float) -> tuple[threading.Thread, list[Probe]]:
    """A 5-per-second ping between two running Pods for ``seconds``, in a thread."""
    src, dst = lab.pod(src_node, "a"), lab.pod(dst_node, "a")
    assert dst.ipv4
    out: list[Probe] = []
    count = int(seconds * 5)
    t = threading.Thread(target=lambda: out.append(lab.ping(src, dst.ipv4 or "", count=count, interval=0.2)))
    t.start()
    return t, out


def route_sync_restarts(cluster: Cluster) -> dict[str, int]:
    doc = json.loads(cluster.kubectl("-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=ferry",
                                     "-o", "json").stdout)
    return {p["metadata"]["name"]: sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses", []))
            for p in doc["items"]}


def route_sync_log(cluster: Cluster, node: str) -> str:
    pod = json.loads(cluster.kubectl("-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=ferry",
                                     "--field-selector", f"spec.nodeName={node}", "-o", "json").stdout)["items"][0]
    return cluster.kubectl("-n", "kube-system", "logs", pod["metadata"]["name"], "-c", "route-sync").stdout


def test_node_ready_follows_ferry_conflist(lab: Lab) -> None:
    """The kubelet reports NetworkReady from the runtime: no Ferry conflist, Node NotReady."""
    cluster = lab.kube()
    conf = lab.node("node-2").paths.conflist
    assert os.path.exists(conf) and cluster.ready(cluster.nodes()["node-2"])
    aside = conf + ".aside"
    os.rename(conf, aside)
    try:
        wait_for("node-2 NotReady without a CNI config", lambda: not cluster.ready(cluster.nodes()["node-2"]), 180)
        cond = next(c for c in cluster.nodes()["node-2"]["status"]["conditions"] if c["type"] == "Ready")
        assert "NetworkReady=false" in cond["message"] or "network" in cond["message"].lower(), cond
    finally:
        os.rename(aside, conf)
    wait_for("node-2 Ready again", lambda: cluster.ready(cluster.nodes()["node-2"]), 180)


def test_a_node_joins(lab: Lab) -> None:
    """node-4's kubelet starts: it registers, the controller-manager gives it Pod CIDRs, Ferry's
    DaemonSet lands on it, every route-sync learns it, and its Pods are reachable."""
    cluster = lab.kube()
    assert "node-4" not in cluster.nodes()
    t0 = time.monotonic()
    cluster.join("node-4")
    cidrs = cluster.node_pod_cidrs()["node-4"][0]
    assert len(cidrs) == 2, cidrs
    for n in ("node-1", "node-2", "node-3"):
        wait_for(f"{n} to learn node-4", lambda n=n: "node-4" in peers(lab, n), 180)
    pod = lab.add_pod("node-4", "a")
    probe = lab.ping(lab.pod("node-1", "a"), pod.ipv4 or "", count=1, timeout=2)
    for _ in range(20):  # the first packets may still meet the joining Node's flows being installed
        if probe:
            break
        probe = lab.ping(lab.pod("node-1", "a"), pod.ipv4 or "", count=1, timeout=2)
    assert probe, probe
    print(f"node-4: kubelet start -> first cross-Node ping {time.monotonic() - t0:.1f}s")
    assert lab.ping(lab.pod("node-4", "a"), lab.pod("node-3", "a").ipv6 or "", count=2, interval=0.2)


def test_apiserver_away_30s(lab: Lab) -> None:
    """The API server stops for 30 s: forwarding between running Pods goes on, route-sync notices
    (its watch fails, it says so), does not restart, and opens its watch again from the version it
    had (like client-go: no re-list of every Node by every Node after an API server restart); that
    it follows changes afterwards shows in the next test, whose Node deletion every route-sync
    must see."""
    cluster = lab.kube()
    before = route_sync_restarts(cluster)
    t, out = ping_during(lab, "node-1", "node-3", 36)
    cluster.stop("kube-apiserver")
    time.sleep(30)  # the outage itself is the scenario, not a synchronisation
    cluster.start("kube-apiserver")
    wait_for("kube-apiserver ready again", cluster.api_ready, 120)
    t.join()
    assert out and out[0], out
    assert route_sync_restarts(cluster) == before
    for n in ("node-1", "node-3"):  # the broken watch resumes from its version, no re-list
        wait_for(f"{n}'s route-sync to watch again",
                 lambda n=n: re.search(r"kube: Node list/watch failed \(.*\); watching again from version \d+",
                                       route_sync_log(cluster, n)) is not None, 180)


EXPIRED = r"kube: watch version \d+ expired \(410 Gone\), re-listing"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def etcd(cluster: Cluster, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """etcd's v3 JSON gateway on the control plane's loopback."""
    cp = subprocess.run(["nsenter", f"--net=/run/netns/{cluster.plan.process('etcd').netns}", "--", "curl", "-sf",
                         "-X", "POST", f"http://127.0.0.1:2379{path}", "-d", json.dumps(body)],
                        capture_output=True, text=True, check=True, timeout=30)
    return json.loads(cp.stdout)


def test_node_object_deleted_then_compaction(lab: Lab) -> None:
    """node-4 leaves: its kubelet stops, its Node object is deleted; every peer forgets it (state
    file, flows to its address). Then the API server stops, etcd moves on and is compacted past
    every version route-sync saw, and the API server starts again: each route-sync's watch, resumed
    from its last version, is answered 410 Gone (the version is older than the restarted server's
    watch cache and compacted in etcd); route-sync re-lists and watches again in the same process
    (no container restart) and keeps following changes."""
    cluster = lab.kube()
    addr4 = lab.node("node-4").ipv4
    lab.del_pod("node-4", "a")
    pids = {n: route_sync_pid(cluster, n) for n in ("node-1", "node-2", "node-3")}
    cluster.stop("node-4/kubelet")
    cluster.kubectl("delete", "node", "node-4", "--wait=true")
    for n in ("node-1", "node-2", "node-3"):
        wait_for(f"{n} to forget node-4", lambda n=n: "node-4" not in peers(lab, n), 180)
        wait_for(f"{n}'s flows to node-4 to go", lambda n=n: not any(addr4 and addr4 in f for f in flows(lab, n)), 180)
    expired_before = {n: len(re.findall(EXPIRED, route_sync_log(cluster, n))) for n in pids}
    cluster.stop("kube-apiserver")
    # etcd's revision moves past every version a watcher can hold (writes outside /registry,
    # which the API server never reads), then the history is compacted away
    for i in range(3):
        rev = int(etcd(cluster, "/v3/kv/put", {"key": b64(f"/ferry-test/bump-{i}"), "value": b64("x")})
                  ["header"]["revision"])
    etcd(cluster, "/v3/kv/compaction", {"revision": str(rev), "physical": True})
    cluster.start("kube-apiserver")
    wait_for("kube-apiserver ready again", cluster.api_ready, 120)
    for n in pids:
        wait_for(f"{n}'s route-sync to be answered 410 Gone and re-list",
                 lambda n=n: len(re.findall(EXPIRED, route_sync_log(cluster, n))) > expired_before[n], 180)
    assert {n: route_sync_pid(cluster, n) for n in pids} == pids  # recovered in place
    # still following: node-2's own annotation is restored by its route-sync after a change
    cluster.kubectl("annotate", "node", "node-2", "ferry.io/mac-address=00:00:00:00:00:02", "--overwrite")
    wait_for("node-2's route-sync to restore its MAC annotation",
             lambda: cluster.nodes()["node-2"]["metadata"]["annotations"].get("ferry.io/mac-address")
             != "00:00:00:00:00:02", 180)
    assert lab.ping(lab.pod("node-1", "a"), lab.pod("node-3", "a").ipv4 or "", count=2, interval=0.2)


def test_pod_deleted_through_the_api_leaves_nothing(lab: Lab) -> None:
    n = lab.node("node-2")
    pod = lab.add_pod("node-2", "gone")
    api = kube_pods.api_name("node-2", "gone")
    att = kube_pods.find_attachment(lambda argv: n.exec(argv), api, kube_pods.NAMESPACE)
    assert att is not None
    ipam_dir = os.path.join(lab.kube().plan.node("node-2").directory, "ferry-lib", "ipam")
    held = lambda: {r["address"].split("/")[0] for r in list_allocations(ipam_dir)}
    assert pod.ipv4 in held()
    lab.del_pod("node-2", "gone")
    assert kube_pods.find_attachment(lambda argv: n.exec(argv), api, kube_pods.NAMESPACE) is None
    links = n.exec(["ip", "-o", "link", "show"], check=True).stdout
    assert att.port not in links
    assert not any(pod.ipv4 in f or (pod.ipv6 or "@") in f for f in flows(lab, "node-2"))
    assert pod.ipv4 not in held() and pod.ipv6 not in held()


def test_kubelet_restart_changes_nothing(lab: Lab) -> None:
    cluster = lab.kube()
    before = flows(lab, "node-1")
    ports = lab.node("node-1").exec(["ovs-vsctl", "list-ports", "br-int"], check=True).stdout
    t, out = ping_during(lab, "node-1", "node-3", 10)
    cluster.stop("node-1/kubelet")
    cluster.start("node-1/kubelet")
    wait_for("node-1 Ready after the kubelet restart", lambda: cluster.ready(cluster.nodes()["node-1"]), 120)
    t.join()
    assert out and out[0], out
    assert lab.node("node-1").exec(["ovs-vsctl", "list-ports", "br-int"], check=True).stdout == ports
    assert flows(lab, "node-1") == before


def pod_routes(lab: Lab, node: str) -> dict[str, str]:
    """The Pod's IPv4 routes via a gateway, destination -> the rest of the line."""
    out = lab.pod(node, "a").exec(["ip", "-4", "route", "show"], check=True).stdout
    return {line.split()[0]: line for line in out.splitlines() if " via " in line}


def test_route_sync_in_its_pod_keeps_running_pods_mtus(lab: Lab) -> None:
    """route-sync, in Ferry's Pod, enters the Pods' network namespaces (the host's /run/netns,
    mounted with HostToContainer propagation): a Pod route whose MTU someone changed is put back
    to its path's MTU on route-sync's next full pass."""
    before = pod_routes(lab, "node-1")
    cluster_route = next(line for dst, line in before.items() if dst != "default" and " mtu " in line)
    dst, via = cluster_route.split()[0], cluster_route.split()[2]
    assert re.search(r" mtu (\d+)", cluster_route)
    lab.pod("node-1", "a").exec(["ip", "route", "change", dst, "via", via, "dev", "eth0", "mtu", "1000"], check=True)
    assert " mtu 1000" in pod_routes(lab, "node-1")[dst]
    wait_for("route-sync to put the Pod route's MTU back", lambda: pod_routes(lab, "node-1") == before, 180)


def test_rolling_update_loses_no_ping(lab: Lab) -> None:
    """A new image tag rolls out: route-sync restarts on every Node while Pods keep forwarding,
    and no Pod's flows go missing."""
    cluster = lab.kube()
    image = cluster.retag_ferry_image("0.1.0-rollout")
    before = {n: flows(lab, n) for n in ("node-1", "node-3")}
    pods_before = set(route_sync_restarts(cluster))
    t, out = ping_during(lab, "node-1", "node-3", 40)
    cluster.kubectl("-n", "kube-system", "set", "image", "daemonset/ferry", f"route-sync={image}",
                    f"install-cni={image}")
    cluster.kubectl("-n", "kube-system", "rollout", "status", "daemonset/ferry", "--timeout=300s", timeout=320)
    t.join()
    assert out and out[0], out
    assert not (set(route_sync_restarts(cluster)) & pods_before), "every Ferry Pod was replaced"
    for n, was in before.items():
        wait_for(f"{n}'s flows back to what they were", lambda n=n, was=was: flows(lab, n) == was, 180)


def test_rbac_is_what_route_sync_uses(lab: Lab) -> None:
    """The ClusterRole grants get/list/watch/patch on Nodes, get/list/watch on Pods, Namespaces
    and NetworkPolicies (NetworkPolicy) and nothing more; without patch, route-sync says so
    clearly (and keeps forwarding)."""
    cluster = lab.kube()
    sa = "system:serviceaccount:kube-system:ferry"
    can = lambda verb, res: cluster.kubectl("auth", "can-i", verb, res, f"--as={sa}", check=False).stdout.strip()
    for verb in ("get", "list", "watch", "patch"):
        assert can(verb, "nodes") == "yes", verb
    for verb in ("get", "list", "watch"):
        for res in ("pods", "namespaces", "networkpolicies.networking.k8s.io"):
            assert can(verb, res) == "yes", (verb, res)
    for verb, res in (("update", "nodes"), ("delete", "nodes"), ("patch", "pods"), ("delete", "pods"),
                      ("create", "networkpolicies.networking.k8s.io"), ("get", "secrets")):
        assert can(verb, res) == "no", (verb, res)
    role = json.loads(cluster.kubectl("get", "clusterrole", "ferry", "-o", "json").stdout)
    # the same role without patch on Nodes (the policy watches keep their reads)
    narrow: dict[str, Any] = {**role, "rules": [
        {**r, "verbs": [v for v in r["verbs"] if v != "patch"]} for r in role["rules"]]}
    narrow["metadata"] = {"name": "ferry", "labels": role["metadata"].get("labels", {})}
    cluster.kubectl("replace", "-f", "-", input=json.dumps(narrow))
    try:
        # a changed annotation must be written back: make route-sync patch its Node
        cluster.kubectl("annotate", "node", "node-2", "ferry.io/mac-address=00:00:00:00:00:01", "--overwrite")
        wait_for("route-sync on node-2 to log the refused patch",
                 lambda: re.search(r"forbidden|403", route_sync_log(cluster, "node-2"), re.IGNORECASE) is not None, 180)
        assert lab.ping(lab.pod("node-1", "a"), lab.pod("node-3", "a").ipv4 or "", count=2, interval=0.2)
    finally:
        role["metadata"] = {"name": "ferry", "labels": role["metadata"].get("labels", {})}
        cluster.kubectl("replace", "-f", "-", input=json.dumps(role))
