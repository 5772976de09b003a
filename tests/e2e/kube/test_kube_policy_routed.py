"""A client's egress through a Service in a routed mode (issue 27's gap): in noEncap the client's
Node DNATs a ClusterIP connection in its host and routes it out of its uplink, so it never
re-enters OVS there after the DNAT; the backend's Node judges the client's egress instead
(``routesync/policy/plan.py``: a remote client's egress).  The encap walk of the same policies:
tests/e2e/kube/test_kube_policy.py.

Pods: ``client`` on node-1, ``other`` on node-2 (same segment: routed directly), ``srv`` on node-3
(behind the router), each behind a ClusterIP Service of its own.  The client isolated for
egress, allowed to srv's port only: srv by Pod IP and ClusterIP, other by neither; other's own
connection to the client still lands (the client's ingress is open)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from lab.api import ECHO_PORT, Lab, Pod
from lab.kube import services as svc
from lab.kube.pods import api_name
from tests.e2e.kube.helpers import topology
from tests.e2e.kube.policycheck import settles
from tests.e2e.kube.servicecheck import pod_ip, v4

pytestmark = [pytest.mark.root, pytest.mark.slow]

NS = svc.NAMESPACE


@pytest.fixture(scope="module")
def lab(kube_module_lab_of) -> Iterator[Lab]:  # type: ignore[no-untyped-def]
    yield kube_module_lab_of(topology({"trafficEncapMode": "noEncap"}))


def test_egress_through_a_service_is_judged_on_the_backends_node(lab: Lab) -> None:
    cluster = lab.kube()
    client, other, srv = (lab.add_pod("node-1", "client"), lab.add_pod("node-2", "other"),
                          lab.add_pod("node-3", "srv"))
    lab.ensure_echo(client.netns)
    for p, name in ((srv, "srv"), (other, "other")):
        svc.backend(lab, p, name)
    cluster.kubectl("label", "pod", "-n", NS, api_name("node-1", "client"), "role=client", "--overwrite")
    srv_ip, other_ip = (v4(svc.create(cluster, svc.service(n, ECHO_PORT), 1).cluster_ips) for n in ("srv", "other"))
    failures: list[str] = []

    def expect(what: str, src: Pod, addr: str, want: bool, port: int = 80) -> None:
        if not settles(lab, src, addr, want, port):
            failures.append(f"{what}: {'not reached' if want else 'reached'}")

    expect("no policy: client -> other ClusterIP", client, other_ip, True)
    to_srv = [{"to": [{"podSelector": {"matchLabels": {svc.LABEL: "srv"}}}], "ports": [{"port": ECHO_PORT}]}]
    doc = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": "client-to-srv", "namespace": NS},
           "spec": {"podSelector": {"matchLabels": {"role": "client"}}, "policyTypes": ["Egress"], "egress": to_srv}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
    expect("egress: client -> other ClusterIP (judged on node-2)", client, other_ip, False)
    expect("egress: client -> other Pod IP", client, pod_ip(other), False, ECHO_PORT)
    expect("egress: client -> srv ClusterIP", client, srv_ip, True)
    expect("egress: client -> srv Pod IP", client, pod_ip(srv), True, ECHO_PORT)
    expect("egress: other -> client (its ingress is open)", other, pod_ip(client), True, ECHO_PORT)
    cluster.kubectl("delete", "networkpolicy", "-n", NS, "client-to-srv", "--wait=true")
    expect("policy deleted: client -> other ClusterIP", client, other_ip, True)
    assert not failures, "\n".join(failures)
