"""Services and cluster DNS on a real Kubernetes cluster with stock kube-proxy and CoreDNS, in every
traffic mode the Kubernetes lab runs (issue 26): here an IPv6-only cluster; every mode with
kube-proxy's iptables mode and then its nftables mode on test_kube_modes' clusters. The checks:
tests/e2e/kube/servicecheck.py."""

from __future__ import annotations

import ipaddress

import pytest

from lab.api import ECHO_PORT, Lab
from lab.kube import services as svc
from tests.e2e.kube.helpers import topology
from tests.e2e.kube.servicecheck import dns_probe, pod_ip

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_services_and_dns_on_an_ipv6_only_cluster(kube_lab_of) -> None:  # type: ignore[no-untyped-def]
    """An IPv6-only cluster (encap over an IPv6 underlay): IPv6 ClusterIPs (fd00:10:96::/112),
    kube-dns on fd00:10:96::a, Services reached over TCP and UDP with the backend on a peer, and
    names answered with AAAA records."""
    topo = topology({"trafficEncapMode": "encap", "tunnelType": "vxlan"})
    topo["clusterCIDRs"] = ["fd00:10:244::/48"]
    topo["segments"] = {"a": {"ipv6": "fd00:77::/64"}, "b": {"ipv6": "fd00:88::/64"}}
    topo["router"]["external"] = {"ipv6": "fd00:99::/64"}
    lab: Lab = kube_lab_of(topo)
    cluster = lab.kube()
    assert cluster.plan.dns_ips == ("fd00:10:96::a",)
    client, server = lab.add_pod("node-1", "client"), lab.add_pod("node-3", "srv")
    svc.backend(lab, server, "six")
    ep = svc.create(cluster, svc.service("six", ECHO_PORT, udp=True), 1)
    (ip,) = ep.cluster_ips
    assert ipaddress.ip_address(ip) in ipaddress.ip_network("fd00:10:96::/112"), ep
    for udp in (False, True):
        p = svc.until(lambda u=udp: lab.connect(client, ip, 80, udp=u))
        assert p.ok and p.peer == pod_ip(client, 6) and p.server == pod_ip(server, 6), p
    r = svc.until(lambda: dns_probe(svc.resolve(client, "fd00:10:96::a", f"six.{svc.NAMESPACE}.svc.cluster.local",
                                                 tcp=True, aaaa=True)))
    assert r.ok and r.detail == ip, r
    ok, out = svc.resolve_in_pod(cluster, "node-1", "kubernetes.default", 443)
    assert ok, out
