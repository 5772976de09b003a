"""The connectivity matrix on a real Kubernetes cluster, in every traffic mode: Pods created from
Pod specs through the API, plugged by kubelet -> containerd -> Ferry (the conflist install-cni
wrote), reached with ping and TCP in both families; Pod IPs as the API reports them; then, on the
same cluster, Services and cluster DNS through kube-proxy's iptables mode, then its nftables mode
(tests/e2e/kube/servicecheck.py), the fail-open suite in both kube-proxy modes (a locked-down Pod
reaches nothing past kube-proxy's NAT: tests/e2e/kube/failopen.py), and NetworkPolicy's window
check: a Pod a policy selects is not reached by one probe before its policy is in force
(tests/e2e/kube/policycheck.py).
The Nodes run no Open vSwitch of their own: Ferry's openvswitch container does."""

from __future__ import annotations

import json

import pytest

from lab import check
from lab.api import Lab
from lab.kube import pods as kube_pods
from routesync.config import OVS_FERRY
from tests.e2e.kube import failopen
from tests.e2e.kube.helpers import MODES, Mode, switch_kube_proxy, topology
from tests.e2e.kube.policycheck import check_window
from tests.e2e.kube.servicecheck import check_services, probe_services

pytestmark = [pytest.mark.root, pytest.mark.slow]


PODS = (("node-1", "a"), ("node-1", "b"), ("node-2", "a"), ("node-3", "a"))


@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
def test_matrix_on_kubernetes(kube_lab_of, mode: Mode) -> None:  # type: ignore[no-untyped-def]
    # Nodes with no Open vSwitch of their own: Ferry's DaemonSet brings it (its openvswitch
    # container); the other Kubernetes suites run host-OVS Nodes
    lab: Lab = kube_lab_of(mode.topology(ovs_daemons=OVS_FERRY))
    assert not any((e.get("netns") or "").startswith(f"{lab.name}-node") for e in lab.manifest.of_kind("pidfile"))
    for node, pod in PODS:
        lab.add_pod(node, pod)
    rows = check.run(lab)
    ran = [r for r in rows if r.configured]
    failed = [r for r in ran if not r.ok]
    assert not failed, check.table(lab, rows)
    # every category, both families: 2 same-node + 6 pod-to-node + 6 same-subnet + 4 other-subnet... as planned
    assert {r.spec.category for r in ran} == set(check.CATEGORIES), check.table(lab, rows)
    # Pod IPs: the API's status.podIPs are the addresses Ferry recorded on the OVS port
    for p in lab.pods():
        with open(lab.node(p.node).paths.pod_result(p.name)) as f:
            api_ips = {i["ip"] for i in json.load(f)["kubernetes"]["podIPs"]}
        assert api_ips == {a.split("/")[0] for a in p.ips}, (p.name, api_ips, p.ips)
    # route-sync in the DaemonSet reports the mode it was configured with
    for n in lab.nodes:
        state = n.state()
        assert state is not None and state["mode"] == mode.route_sync["trafficEncapMode"], state
    # Services and cluster DNS with kube-proxy's iptables mode, then, on the same cluster and
    # Services, with its nftables mode (kube-proxy removes the other mode's rules as it starts)
    assert lab.kube().plan.kube_proxy == "iptables"
    made = check_services(lab)
    # NetworkPolicy past kube-proxy's NAT: nothing of a locked-down Pod gets through (failopen.py)
    fo = failopen.setup(lab)
    failopen.check(lab, fo, f"{mode.name}, kube-proxy iptables", readiness=True)
    switch_kube_proxy(lab, "nftables")
    probe_services(lab, made)
    failopen.check(lab, fo, f"{mode.name}, kube-proxy nftables")
    # NetworkPolicy in this mode: a selected Pod on node-2 is closed from its first packet on,
    # probed from node-1 (and from node-3, in another subnet: hybrid's tunnel, BGP's routes)
    for prober in (lab.pod("node-1", "a"), lab.pod("node-3", "a")):
        seen = check_window(lab, prober, "node-2", name=f"window-{prober.node}")
        print(f"{mode.name}: window from {prober.node}: {seen}")


def test_cni_args_carry_the_pod_identity(kube_lab_of) -> None:  # type: ignore[no-untyped-def]
    """The kubelet's CNI_ARGS (K8S_POD_NAME, K8S_POD_NAMESPACE) reach the OVS port's external_ids."""
    lab: Lab = kube_lab_of(topology({"trafficEncapMode": "encap", "tunnelType": "vxlan"}))
    lab.add_pod("node-2", "ident")
    att = kube_pods.find_attachment(lambda argv: lab.node("node-2").exec(argv),
                                    kube_pods.api_name("node-2", "ident"), kube_pods.NAMESPACE)
    assert att is not None and att.netns.startswith("/var/run/netns/cni-"), att


def test_install_cni_writes_what_the_runtime_reads(kube_lab_of) -> None:  # type: ignore[no-untyped-def]
    """deploy/ferry.yaml's install-cni (--cni-version auto) reads the Node's runtime from the API
    (Debian's containerd 1.6: libcni 1.1, results up to 1.0.0) and writes a 1.0.0 conflist, which
    the runtime then uses for every Pod (the matrix above)."""
    lab: Lab = kube_lab_of(topology({"trafficEncapMode": "encap", "tunnelType": "vxlan"}))
    cluster = lab.kube()
    for name, node in cluster.nodes().items():
        runtime = node["status"]["nodeInfo"]["containerRuntimeVersion"]
        assert runtime.startswith("containerd://1.6."), runtime
        with open(lab.node(name).paths.conflist) as f:
            assert json.load(f)["cniVersion"] == "1.0.0"
