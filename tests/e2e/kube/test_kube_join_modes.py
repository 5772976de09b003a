"""A Node that joins a running cluster later gets the mode right, in the two modes whose per-Node
part is not in Ferry's DaemonSet alone (one cluster per mode, node-4 on segment b joining):

* noEncap with BGP: the one ConfigMap's ``defaultGateway`` peer is node-4's own segment's router
  address; FRR (dynamic neighbours per segment) accepts it unconfigured and learns node-4's Pod
  CIDRs, so a Pod on node-1 (segment a) reaches one on node-4 with no static route anywhere;
* networkPolicyOnly: node-4 gets its primary CNI (ptp), install-cni chains Ferry after it, its
  Pods are on OVS (chained ports) and reachable, and a Service whose backend is on node-4 answers
  a client on node-4 itself (the reply back through the host) and one on node-1."""

from __future__ import annotations

import json
import os

import pytest

from lab import frr
from lab.api import ECHO_PORT, Lab
from lab.kube import services as svc
from lab.kube.cluster import wait_for
from lab.topology import router_netns
from routesync.bgp import status as bgp_status
from tests.e2e.kube.helpers import MODES, Mode
from tests.e2e.kube.servicecheck import pod_ip
from tests.support.waiting import HANG

pytestmark = [pytest.mark.root, pytest.mark.slow]

JOINING = ("noEncap-bgp", "networkPolicyOnly")


def reach(lab: Lab, src: str, dst: str) -> None:
    a, b = lab.pod(src, "a"), lab.pod(dst, "a")
    lab.ensure_echo(b.netns)
    for ip in (b.ipv4, b.ipv6):
        assert ip
        p = svc.until(lambda ip=ip: lab.connect(a, ip, ECHO_PORT))
        assert p.ok, (src, dst, ip, p)


@pytest.mark.parametrize("mode", [m for m in MODES if m.name in JOINING], ids=JOINING)
def test_a_node_joins_in_mode(kube_lab_of, mode: Mode) -> None:  # type: ignore[no-untyped-def]
    lab: Lab = kube_lab_of(mode.topology(nodes=4, join_later=("node-4",)))
    cluster = lab.kube()
    lab.add_pod("node-1", "a")
    cluster.join("node-4")
    v4, v6 = cluster.node_pod_cidrs()["node-4"][0]
    pod = lab.add_pod("node-4", "a")
    assert pod.ipv4 and pod.ipv6
    if mode.name == "noEncap-bgp":
        st_dir = os.path.join(os.path.dirname(lab.node("node-4").paths.state_file), "bgp")
        wait_for("node-4's session to its default gateway up", lambda: any(
            p.address == frr.peering_address(lab.topology, "b") and p.state == "established"
            for p in (bgp_status.read(st_dir) or bgp_status.BgpStatus(0)).peers), HANG)
        learned = {r["dst"]: r for r in frr.routes(router_netns(lab.name))}
        assert learned[v4]["protocol"] == "bgp" and learned[v6]["protocol"] == "bgp", learned
    else:
        conf_dir = os.path.dirname(lab.node("node-4").paths.conflist)
        with open(os.path.join(conf_dir, "00-ferry-chained.conflist")) as f:
            # ptp's plugins, ferry, then the portmap and bandwidth the Node has and ptp does not run
            assert [p["type"] for p in json.load(f)["plugins"]] == ["ptp", "ferry", "portmap", "bandwidth"]
        assert (lab.node("node-4").state() or {}).get("mode") == "networkPolicyOnly"
    reach(lab, "node-1", "node-4")
    reach(lab, "node-4", "node-1")
    # a Service whose backend is on node-4: from node-4 itself and from node-1
    svc.backend(lab, pod, "late")
    (ip, *_) = svc.create(cluster, svc.service("late", ECHO_PORT), 1).cluster_ips
    client = lab.add_pod("node-4", "c")
    for src in (client, lab.pod("node-1", "a")):
        p = svc.until(lambda src=src: lab.connect(src, ip, 80))
        assert p.ok and p.peer == pod_ip(src, 4) and p.server == pod_ip(pod, 4), (src.name, p)
