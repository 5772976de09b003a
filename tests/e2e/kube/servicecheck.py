"""The Service and cluster-DNS checks of issue 26 on a running Kubernetes lab, shared by the
suites that bring clusters up (test_kube_modes: kube-proxy's iptables mode, then its nftables mode
on the same cluster and Services; test_kube_services: an IPv6-only cluster).

The client is a Pod on node-1; backends are Pods on node-1 (same Node), node-2 (a peer in the same
subnet) and node-3 (a peer behind the router), each running the lab's echo server, which answers
with the source address it saw and its own: so every probe shows that the reply crossed the
client Node's conntrack (a reply that skipped it reaches the client from the backend's address and
the connection is reset), which backend answered, and whether the source was NATed."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from lab.api import ECHO_PORT, Lab, Pod
from lab.kube import services as svc

BACKENDS = (("node-1", "same Node"), ("node-2", "same-subnet peer"), ("node-3", "other-subnet peer"))


def v4(addrs: tuple[str, ...]) -> str:
    return next(a for a in addrs if ipaddress.ip_address(a).version == 4)


def pod_ip(p: Pod, family: int = 4) -> str:
    return next(a.split("/")[0] for a in p.ips if ipaddress.ip_interface(a).version == family)


@dataclass(frozen=True)
class ServiceSet:
    """What :func:`create_services` made: the client, a backend per Node, and the Services."""

    client: Pod
    servers: dict[str, Pod]
    eps: dict[str, Any]  # per backend Node: its Service's endpoints (svc.create)
    all_ep: Any
    sticky_ep: Any
    np_cluster: Any
    np_local: Any
    dual: Any


def check_services(lab: Lab) -> ServiceSet:
    """Every Service and DNS case of the module docstring on ``lab`` (a cluster with node-1..3)."""
    made = create_services(lab)
    probe_services(lab, made)
    return made


def create_services(lab: Lab) -> ServiceSet:
    """The client Pod on node-1, a backend on each of node-1..3, one Service per backend Node, one
    over all three, one with ClientIP affinity, two NodePorts and a dual-stack one."""
    cluster = lab.kube()
    client = lab.add_pod("node-1", "client")
    servers = {node: lab.add_pod(node, "srv") for node, _ in BACKENDS}
    for node, _where in BACKENDS:
        svc.backend(lab, servers[node], f"to-{node}", "all")
    eps = {node: svc.create(cluster, svc.service(f"to-{node}", ECHO_PORT, udp=True), 1) for node, _ in BACKENDS}
    spread, sticky = svc.service("spread", ECHO_PORT), svc.service("sticky", ECHO_PORT, affinity=True)
    for doc in (spread, sticky):
        doc["spec"]["selector"] = svc.group_selector("all")
    all_ep, sticky_ep = svc.create(cluster, spread, 3), svc.create(cluster, sticky, 3)
    np_cluster = svc.create(cluster, svc.service("np-cluster", ECHO_PORT, node_port=True, selects="to-node-2"), 1)
    np_local = svc.create(cluster, svc.service("np-local", ECHO_PORT, node_port=True, local=True,
                                               selects="to-node-2"), 1)
    dual = svc.create(cluster, svc.service("dual", ECHO_PORT, udp=True, families=(4, 6), selects="to-node-3"), 1)
    return ServiceSet(client, servers, eps, all_ep, sticky_ep, np_cluster, np_local, dual)


def probe_services(lab: Lab, made: ServiceSet) -> None:
    """Every case of the module docstring through the Services ``made`` holds (whichever kube-proxy
    mode programs them now); fails naming each case that did not pass."""
    cluster = lab.kube()
    client, servers, eps = made.client, made.servers, made.eps
    all_ep, sticky_ep, dual = made.all_ep, made.sticky_ep, made.dual
    np_cluster, np_local = made.np_cluster, made.np_local
    failures: list[str] = []

    def check(what: str, ok: bool, detail: str = "") -> None:
        if not ok:
            failures.append(f"{what}: {detail}")

    # Pod -> ClusterIP, TCP and UDP, for a backend on each kind of Node; the backend sees the client.
    for node, where in BACKENDS:
        ip = v4(eps[node].cluster_ips)
        for udp in (False, True):
            p = svc.until(lambda u=udp, a=ip: lab.connect(client, a, 80, udp=u))
            proto = "udp" if udp else "tcp"
            check(f"client -> ClusterIP {ip}/{proto}, backend on {where}", p.ok, p.detail)
            check(f"client -> ClusterIP {ip}/{proto}: backend saw the client's address",
                  not p.ok or p.peer == pod_ip(client), f"saw {p.peer}")
            check(f"client -> ClusterIP {ip}/{proto}: answered by {node}'s backend",
                  not p.ok or p.server == pod_ip(servers[node]), f"answered by {p.server}")
    # IPv6 (the lab is dual-stack: a PreferDualStack Service has a ClusterIP of each family)
    assert len(dual.cluster_ips) == 2, dual
    v6 = next(a for a in dual.cluster_ips if ipaddress.ip_address(a).version == 6)
    for udp in (False, True):
        p = svc.until(lambda u=udp: lab.connect(client, v6, 80, udp=u))
        proto = "udp" if udp else "tcp"
        check(f"client -> IPv6 ClusterIP [{v6}]/{proto}, backend on node-3", p.ok, p.detail)
        check(f"client -> [{v6}]/{proto}: backend saw the client's IPv6 address",
              not p.ok or p.peer == pod_ip(client, 6), f"saw {p.peer}")
    # hairpin: a backend through its own Service
    for node, where in BACKENDS:
        ip = v4(eps[node].cluster_ips)
        p = svc.until(lambda a=ip, n=node: lab.connect(servers[n], a, 80))
        check(f"hairpin on {node} ({where}) -> {ip}", p.ok, p.detail)
    # several endpoints: every one answers over repeated requests; ClientIP affinity: always one
    seen = {lab.connect(client, v4(all_ep.cluster_ips), 80).server for _ in range(40)}
    check("Service over three Nodes: every backend answers", seen == {pod_ip(p) for p in servers.values()},
          f"answered by {sorted(map(str, seen))}")
    stuck = {lab.connect(client, v4(sticky_ep.cluster_ips), 80).server for _ in range(15)}
    check("sessionAffinity ClientIP: one backend", len(stuck) == 1 and None not in stuck, f"answered by {stuck}")
    # the Node's own network namespace -> ClusterIP (backend on another Node)
    node1 = lab.node("node-1")
    p = svc.until(lambda: lab.connect(node1, v4(eps["node-2"].cluster_ips), 80))
    check("node-1's host -> ClusterIP (backend on node-2)", p.ok, p.detail)
    # NodePort from the external host to every Node: Cluster everywhere; Local only where the
    # backend runs, and then the backend sees the external client's own address.
    ext = lab.external
    ext_ip = ext.address(4)
    cluster_port, local_port = np_cluster.node_port, np_local.node_port
    assert cluster_port and local_port and ext_ip
    for n in lab.nodes:
        addr = str(n.address(4))
        p = svc.until(lambda a=addr: lab.connect(ext, a, cluster_port))
        check(f"external -> {n.name} NodePort (Cluster)", p.ok, p.detail)
    p = svc.until(lambda: lab.connect(ext, str(lab.node("node-2").address(4)), local_port))
    check("external -> node-2 NodePort (Local)", p.ok, p.detail)
    check("NodePort Local: the backend saw the external client", not p.ok or p.peer == ext_ip, f"saw {p.peer}")
    # cluster DNS: a Service's name over UDP and TCP, and the Pod's own resolver
    dns_ip = cluster.plan.dns_ip
    assert dns_ip is not None
    fqdn = f"to-node-3.{svc.NAMESPACE}.svc.cluster.local"
    for tcp in (False, True):
        r = svc.until(lambda t=tcp: dns_probe(svc.resolve(client, dns_ip, fqdn, tcp=t)))
        check(f"DNS {fqdn} over {'tcp' if tcp else 'udp'}", r.ok and r.detail == v4(eps["node-3"].cluster_ips),
              r.detail)
    r = svc.until(lambda: dns_probe(svc.resolve(client, dns_ip, f"dual.{svc.NAMESPACE}.svc.cluster.local",
                                                   aaaa=True)))
    check("DNS AAAA of the dual-stack Service", r.ok and r.detail == v6, r.detail)
    ok, out = svc.resolve_in_pod(cluster, "node-1", "kubernetes.default", 443)
    check("a Pod resolves kubernetes.default with its resolv.conf and connects", ok, out)
    assert not failures, "\n".join(failures)


@dataclass(frozen=True)
class Answer:
    ok: bool
    detail: str


def dns_probe(r: dict[str, Any]) -> Answer:
    return Answer(bool(r["ok"]), ",".join(r["addresses"]) if r["ok"] else str(r["error"]))
