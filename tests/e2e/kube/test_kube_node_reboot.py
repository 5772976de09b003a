"""A Node reboot (issue 42's last bullet), on an encap (VXLAN) cluster whose Nodes run Ferry's own
Open vSwitch (the openvswitch container, the default users run): node-1 loses everything a reboot
loses (:mod:`lab.kube.reboot`: its processes, mounts, /run, its network namespace's kernel state,
the Pods' namespaces and veths) and keeps its NIC and /var/lib, then starts containerd, the
kubelet and kube-proxy again.

The kubelet must bring node-1's Pods back (the same Pod objects, each with a new sandbox), Running
with addresses of node-1's Pod CIDRs, reachable from a Pod on node-3, and nothing of the dead
sandboxes may be left: no OVS port, no IPAM reservation, no per-Pod flow.  The seconds from the
kubelet's start to every Pod Running and to every Pod reachable are printed (``-s``), not
asserted: they depend on this machine's load."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from cni.pipeline.tables import (
    EXT_CONTAINER_ID,
    EXT_IFNAME,
    EXT_IPS,
    EXT_POD_NAME,
    EXT_POD_NAMESPACE,
    Cookie,
    Owner,
    pod_cookie,
)
from lab.api import Lab
from lab.kube.cluster import Cluster, wait_for
from routesync.config import OVS_FERRY
from tests.e2e.kube.helpers import topology
from tests.support.waiting import HANG

pytestmark = [pytest.mark.root, pytest.mark.slow]

NODE, PEER = "node-1", "node-3"
LAB_PODS = ("a", "b")  # the lab's Pods on NODE (CoreDNS may have one there too: it is checked alike)
BACK = 3 * HANG  # bounds a hang only: the kubelet's back-off while Ferry is not yet up may add tens of seconds


@pytest.fixture(scope="module")
def lab(kube_module_lab_of) -> Iterator[Lab]:  # type: ignore[no-untyped-def]
    lab = kube_module_lab_of(topology({"trafficEncapMode": "encap", "tunnelType": "vxlan"}, ovs_daemons=OVS_FERRY))
    for name in LAB_PODS:
        lab.add_pod(NODE, name)
    lab.add_pod(PEER, "a")
    yield lab


# ---------------------------------------------------------------- what the API, OVS and IPAM say

def pods_on(cluster: Cluster, node: str | None = None) -> dict[str, dict]:
    """``namespace/name`` -> Pod object of every Pod on the Pod network (on ``node``, or all)."""
    args = ["get", "pods", "-A", "-o", "json"] + (["--field-selector", f"spec.nodeName={node}"] if node else [])
    doc = json.loads(cluster.kubectl(*args).stdout)
    return {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in doc["items"]
            if not p["spec"].get("hostNetwork")}


def container_ids(pod: dict) -> set[str]:
    return {s.get("containerID", "") for s in pod["status"].get("containerStatuses", [])}


def running_again(pod: dict, before: set[str]) -> bool:
    """Every container runs ready in a container the reboot did not kill, with the Pod's IPs."""
    statuses = pod["status"].get("containerStatuses", [])
    return (pod["status"].get("phase") == "Running" and bool(pod["status"].get("podIPs")) and bool(statuses)
            and all("running" in s["state"] and s.get("ready") and s.get("containerID") not in before
                    for s in statuses))


def pod_ips(pod: dict) -> set[str]:
    return {ip["ip"] for ip in pod["status"].get("podIPs") or []}


@dataclass(frozen=True)
class PodPort:
    name: str  # the OVS interface
    ofport: int
    error: str
    sandbox: str  # ferry-container-id
    ifname: str
    pod: str  # namespace/name
    ips: frozenset[str]


def pod_ports(lab: Lab, node: str) -> list[PodPort]:
    """The Pod ports on ``node``'s bridge (interfaces whose external_ids name a Pod)."""
    cp = lab.node(node).exec(["ovs-vsctl", "--format=json", "--columns=name,ofport,error,external_ids", "list",
                              "Interface"], check=True)
    out = []
    for name, ofport, error, ids in json.loads(cp.stdout)["data"]:
        ext = dict(ids[1])
        if EXT_POD_NAME in ext:
            out.append(PodPort(name, ofport if isinstance(ofport, int) else -1, error if isinstance(error, str) else "",
                               ext.get(EXT_CONTAINER_ID, ""), ext.get(EXT_IFNAME, ""),
                               f"{ext.get(EXT_POD_NAMESPACE)}/{ext[EXT_POD_NAME]}",
                               frozenset(a.split("/")[0] for a in ext.get(EXT_IPS, "").split(",") if a)))
    return out


def ipam_dir(lab: Lab, node: str) -> str:
    """The Node's /var/lib/ferry/ipam/<network> (Ferry's IPAM store, the conflist's dataDir)."""
    lib = {dst: src for src, dst in lab.kube().plan.node(node).binds}["/var/lib/ferry"]
    base = os.path.join(lib, "ipam")
    (network,) = os.listdir(base)
    return os.path.join(base, network)


def ipam_reservations(lab: Lab, node: str) -> tuple[set[tuple[str, str]], set[str]]:
    """(attachments as (sandbox, ifname), claimed addresses) in the Node's IPAM store."""
    d = ipam_dir(lab, node)
    attachments = {tuple(e.rsplit(":", 1)) for e in os.listdir(os.path.join(d, "attachments"))}
    return {(a[0], a[1]) for a in attachments}, set(os.listdir(os.path.join(d, "ips")))


def pod_flow_cookies(lab: Lab, node: str) -> set[int]:
    """The cookies of every per-Pod flow (owner POD) on the Node's bridge."""
    out = lab.node(node).exec(["ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", "br-int"],
                              check=True).stdout
    cookies = {int(m.group(1), 16) for m in re.finditer(r"cookie=(0x[0-9a-f]+)", out)}
    return {c for c in cookies if Cookie.parse(c).owner == Owner.POD}


def pod_veths(lab: Lab, node: str) -> set[str]:
    """The Node's links named as Ferry names a Pod's host end."""
    out = lab.node(node).exec(["ip", "-o", "link", "show"], check=True).stdout
    names = (line.split(":", 2)[1].strip().split("@", 1)[0] for line in out.splitlines())
    return {n for n in names if n.startswith("fry")}


def leaks(lab: Lab, pods: dict[str, dict], dead: set[str]) -> list[str]:
    """What of the Node's Pod plumbing is not exactly its live Pods' (empty: nothing leaked)."""
    problems = []
    ports = pod_ports(lab, NODE)
    if sorted(p.pod for p in ports) != sorted(pods):
        problems.append(f"OVS Pod ports {sorted(p.pod for p in ports)} != live Pods {sorted(pods)}")
    for p in ports:
        if p.ofport <= 0 or p.error or p.sandbox in dead:
            problems.append(f"port {p.name} of {p.pod}: ofport {p.ofport}, error {p.error!r}, "
                            f"dead sandbox {p.sandbox in dead}")
    live = {(p.sandbox, p.ifname) for p in ports}
    attachments, claims = ipam_reservations(lab, NODE)
    if attachments != live:
        problems.append(f"IPAM attachments {sorted(attachments)} != the live ports' {sorted(live)}")
    want_ips = set().union(*(pod_ips(p) for p in pods.values())) if pods else set()
    if claims != want_ips:
        problems.append(f"IPAM claims {sorted(claims)} != the live Pods' podIPs {sorted(want_ips)}")
    if {a for p in ports for a in p.ips} != want_ips:
        problems.append(f"the ports' addresses != the Pods' podIPs {sorted(want_ips)}")
    want_cookies = {pod_cookie(s, i).value for s, i in live}
    if pod_flow_cookies(lab, NODE) != want_cookies:
        problems.append(f"per-Pod flow cookies {sorted(map(hex, pod_flow_cookies(lab, NODE)))} != the live "
                        f"Pods' {sorted(map(hex, want_cookies))}")
    if len(pod_veths(lab, NODE)) != len(pods):
        problems.append(f"Pod veths {sorted(pod_veths(lab, NODE))} for {len(pods)} Pods")
    return problems


# ---------------------------------------------------------------- the reboot

def test_a_rebooted_node_brings_its_pods_back_running_reachable_and_leaks_nothing(lab: Lab) -> None:
    cluster = lab.kube()
    peer = lab.pod(PEER, "a")
    before = pods_on(cluster, NODE)
    assert {f"default/{NODE}-{n}" for n in LAB_PODS} <= set(before)
    assert not leaks(lab, before, set()), leaks(lab, before, set())
    dead = {p.sandbox for p in pod_ports(lab, NODE)}
    old_containers = set().union(*(container_ids(p) for p in before.values()))
    for p in before.values():
        for ip in pod_ips(p):
            assert lab.ping(peer, ip).ok, f"{p['metadata']['name']} {ip} before the reboot"

    kubelet_started = lab.reboot(NODE)
    # the kubelet's own view first: Running again, in new containers, the same Pod objects

    def back() -> bool:
        now = pods_on(cluster, NODE)
        return set(now) == set(before) and all(running_again(now[k], old_containers) for k in before)

    wait_for(f"{NODE}'s Pods Running again in new sandboxes", back, BACK,
             lambda: json.dumps({k: p["status"].get("containerStatuses") for k, p in
                                 pods_on(cluster, NODE).items()})[:2000])
    running_s = time.monotonic() - kubelet_started
    after = pods_on(cluster, NODE)
    assert {k: p["metadata"]["uid"] for k, p in after.items()} == \
        {k: p["metadata"]["uid"] for k, p in before.items()}, "the Pods were replaced, not restarted"

    for name in LAB_PODS:
        lab.reattach_kube_pod(NODE, name)
    unreached = lambda: [f"{k} {ip}" for k, p in after.items() for ip in sorted(pod_ips(p))
                         if not lab.ping(peer, ip, timeout=1).ok]
    wait_for(f"every Pod of {NODE} reachable from {PEER}'s Pod", lambda: not unreached(), BACK,
             lambda: str(unreached()))
    reachable_s = time.monotonic() - kubelet_started
    same = {k: pod_ips(after[k]) == pod_ips(before[k]) for k in before}
    print(f"\nNode reboot ({NODE}, encap/VXLAN, Ferry's Open vSwitch): from the kubelet's start, every Pod "
          f"Running in {running_s:.1f} s, every Pod reachable from {PEER} in {reachable_s:.1f} s; "
          f"{len(after)} Pods, addresses kept: {sum(same.values())} of {len(same)} "
          f"({ {k: sorted(pod_ips(p)) for k, p in after.items()} })")

    # addresses of node-1's Pod CIDRs, none held twice in the cluster
    node_cidrs = [ipaddress.ip_network(c) for c in cluster.nodes()[NODE]["spec"]["podCIDRs"]]
    for k, p in after.items():
        assert pod_ips(p) and all(any(ipaddress.ip_address(ip) in c for c in node_cidrs) for ip in pod_ips(p)), \
            (k, pod_ips(p), node_cidrs)
    everyone = [ip for p in pods_on(cluster).values() for ip in pod_ips(p)]
    assert len(everyone) == len(set(everyone)), f"an address held twice: {sorted(everyone)}"
    # the dead sandboxes' DELs (the kubelet stops them before it makes new ones; its GC removes
    # them) leave nothing: ports, IPAM reservations, flows are exactly the live Pods'
    wait_for("nothing of the dead sandboxes left on the Node", lambda: not leaks(lab, after, dead), BACK,
             lambda: "\n".join(leaks(lab, after, dead)))
    assert not {pod_cookie(s, "eth0").value for s in dead} & pod_flow_cookies(lab, NODE)
