"""Ferry's own fail-open suite (issue 41): every way a locked-down Pod's traffic could get past
NetworkPolicy through kube-proxy, probed on a running Kubernetes lab, each beside a positive
control that must connect (so a broken probe or an unprogrammed Service cannot pass as "denied").
No upstream suite covers these: Kubernetes' Netpol specs reach only Services whose endpoints are
Pods.

* **egress**: ``fo-cli`` on node-1 is under an egress default-deny (DNS to kube-dns allowed);
  the control ``fo-free`` on node-1 has no policy.  Targets: the ``kubernetes`` Service (the API
  server), ClusterIPs whose endpoint is a server on a Node's own address (what a hostNetwork Pod
  is to kube-proxy: an address off the Pod network; node-2's and the client's own node-1),
  selector-less Services whose EndpointSlices name the external host and the router, and
  directly: a Pod IP, a ClusterIP with a Pod endpoint, the API server's and the Nodes' real
  addresses, a NodePort on node-2, the external host and the router.
* **ingress**: ``fo-srv`` on node-2 is under an ingress default-deny; the control ``fo-open``
  beside it has none, behind Services of the same kinds.  Sources: the external host, a Pod on
  node-1, a Pod on node-2 (``fo-near``).  Targets: a NodePort (``externalTrafficPolicy:
  Cluster``) on the server's own Node and on node-1, an ``externalTrafficPolicy: Local``
  NodePort, the Pod IP and the ClusterIP; and node-1's host (what a hostNetwork Pod on another
  Node sends from).  node-2's own host must still reach ``fo-srv`` (kubelet probes), and a Pod
  with a readiness probe under the ingress deny becomes Ready.
* **from the first packet** (:func:`early_egress`): a Pod created under the egress deny, whose
  container connects out from its start, gets nothing through.

Both families wherever the target has an address of that family.  A probe is a TCP connect:
``open`` or ``refused`` (a reset came back: the SYN got there) is *reached*; ``timeout`` is
denied.  All probes of one source run at once, so a round costs one connect timeout.  The
"hostNetwork" servers are the lab's echo server in the Node's namespace: the busybox image has no
server that answers a connect the way the probes read it, and kube-proxy sees the same endpoint
either way (the Node's address and a port)."""

from __future__ import annotations

import ipaddress
import json
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from lab.api import ECHO_PORT, Host, Lab, Node, Pod
from lab.kube import pods as kube_pods
from lab.kube import services as svc
from lab.kube.cluster import wait_for
from lab.kube.pods import api_name
from tests.e2e.kube.policycheck import NS, Policies, policy
from tests.support.waiting import HANG

LABEL = "ferry-lab/failopen"
TIMEOUT = 3.0  # s a denied connect waits; every probe of a round at once
PROBE = r"""
import errno, json, socket, sys, threading
targets, timeout = json.loads(sys.argv[1]), float(sys.argv[2])
out = [""] * len(targets)
def one(i, addr, port):
    s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect((addr, port)); out[i] = "open"
    except socket.timeout:
        out[i] = "timeout"
    except ConnectionRefusedError:
        out[i] = "refused"
    except OSError as e:
        out[i] = errno.errorcode.get(e.errno or 0, str(e))
    finally:
        s.close()
ts = [threading.Thread(target=one, args=(i, a, p)) for i, (a, p) in enumerate(targets)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(out))
"""
REACHED = ("open", "refused")
Source = Pod | Host | Node


@dataclass(frozen=True)
class Case:
    """One probe of a locked-down Pod (``target``, from ``src``) and its control."""

    direction: str
    name: str
    src: str  # a key of FailOpen.sources
    target: tuple[str, int]
    control_src: str
    control_target: tuple[str, int]


@dataclass(frozen=True)
class Row:
    case: Case
    seen: str
    control: str

    @property
    def ok(self) -> bool:
        return self.seen not in REACHED and self.control == "open"


@dataclass
class FailOpen:
    """What :func:`setup` made on a lab: the probe sources and the cases."""

    sources: dict[str, Source]
    cases: list[Case]
    early_target: str  # the IPv4 ClusterIP of a selector-less Service -> the external host's EARLY_PORT


def _addrs(ips: Iterable[str]) -> dict[int, str]:
    out: dict[int, str] = {}
    for a in ips:
        ip = ipaddress.ip_interface(a).ip
        out.setdefault(ip.version, str(ip))
    return out


def _selectorless(cluster: Any, name: str, endpoints: dict[int, str], port: int = ECHO_PORT) -> svc.Endpoint:
    """A Service without a selector, of the families of ``endpoints``, and one EndpointSlice per
    family naming its endpoint (at ``port``)."""
    doc = svc.service(name, port, families=tuple(sorted(endpoints)))
    del doc["spec"]["selector"]
    cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
    for v, addr in endpoints.items():
        sl = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
              "metadata": {"name": f"{name}-v{v}", "namespace": NS, "labels": {"kubernetes.io/service-name": name}},
              "addressType": f"IPv{v}", "ports": [{"name": "tcp", "port": port, "protocol": "TCP"}],
              "endpoints": [{"addresses": [addr], "conditions": {"ready": True}}]}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(sl))
    got: list[svc.Endpoint | None] = [None]

    def ready() -> bool:
        got[0] = svc.endpoint(cluster, name)
        return got[0] is not None and len(got[0].ready) >= len(endpoints)
    wait_for(f"Service {name} with its EndpointSlices", ready, HANG, lambda: repr(got[0]))
    assert got[0] is not None
    return got[0]


def _by_family(ep: svc.Endpoint) -> dict[int, str]:
    return _addrs(ep.cluster_ips)


def setup(lab: Lab) -> FailOpen:
    """The Pods, servers and Services of the module docstring (no policy yet: :func:`check`)."""
    cluster = lab.kube()
    cli, free = lab.add_pod("node-1", "fo-cli"), lab.add_pod("node-1", "fo-free")
    srv, open_, near = (lab.add_pod("node-2", n) for n in ("fo-srv", "fo-open", "fo-near"))
    for p, role in ((cli, "client"), (srv, "srv")):
        cluster.kubectl("label", "pod", "-n", NS, api_name(p.node, p.name), f"{LABEL}={role}", "--overwrite")
    n1, n2, ext, router = lab.node("node-1"), lab.node("node-2"), lab.external, lab.router
    for ns in (n1.netns, n2.netns, ext.netns, router.netns):
        lab.ensure_echo(ns)
    svc.backend(lab, srv, "fo-srv")
    svc.backend(lab, open_, "fo-open")
    eps: dict[str, svc.Endpoint] = {}
    for backend in ("fo-srv", "fo-open"):
        eps[backend] = svc.create(cluster, svc.service(backend, ECHO_PORT, node_port=True, families=(4, 6)), 1)
        eps[f"{backend}-local"] = svc.create(cluster, svc.service(f"{backend}-local", ECHO_PORT, node_port=True,
                                                                   local=True, families=(4, 6), selects=backend), 1)
    a1, a2 = _addrs(a for a in n1.addresses if a), _addrs(a for a in n2.addresses if a)
    ea, ra = _addrs(ext.addresses), _addrs(router.addresses)
    eps["fo-host1"] = _selectorless(cluster, "fo-host1", a1)
    eps["fo-host2"] = _selectorless(cluster, "fo-host2", a2)
    eps["fo-ext"] = _selectorless(cluster, "fo-ext", ea)
    eps["fo-router"] = _selectorless(cluster, "fo-router", ra)
    early = _by_family(_selectorless(cluster, "fo-early", {4: ea[4]}, EARLY_PORT))[4]
    kube = json.loads(cluster.kubectl("get", "service", "-n", "default", "kubernetes", "-o", "json").stdout)
    kube_ips = _addrs(kube["spec"].get("clusterIPs") or [kube["spec"]["clusterIP"]])
    api_ep = svc.endpoint(cluster, "kubernetes")
    api_real = _addrs(api_ep.ready if api_ep is not None else ())
    slices = json.loads(cluster.kubectl("get", "endpointslices", "-n", "default", "-l",
                                        "kubernetes.io/service-name=kubernetes", "-o", "json").stdout)["items"]
    api_port = int(slices[0]["ports"][0]["port"])  # where the API server listens (the Service's 443 is DNATed)
    sources: dict[str, Source] = {"fo-cli": cli, "fo-free": free, "fo-near": near, "external": ext, "node-1": n1,
                                  "node-2": n2}
    cases: list[Case] = []

    def egress(name: str, target: tuple[str, int]) -> None:
        cases.append(Case("egress", name, "fo-cli", target, "fo-free", target))

    def ingress(name: str, src: str, srv_target: tuple[str, int], open_target: tuple[str, int]) -> None:
        cases.append(Case("ingress", name, src, srv_target, src, open_target))

    for v in (4, 6):
        fam = f"IPv{v}"
        if v in kube_ips:
            egress(f"kubernetes ClusterIP (the API server) {fam}", (kube_ips[v], 443))
        for key, what in (("fo-host2", "a server on node-2's address (hostNetwork)"),
                          ("fo-host1", "a server on the client's own Node (hostNetwork)"),
                          ("fo-ext", "a selector-less Service -> the external host"),
                          ("fo-router", "a selector-less Service -> the router")):
            if v in _by_family(eps[key]):
                egress(f"ClusterIP of {what} {fam}", (_by_family(eps[key])[v], 80))
        direct = [("the Pod IP of fo-open", _addrs(open_.ips).get(v), ECHO_PORT),
                  ("the ClusterIP of fo-open (a Pod endpoint)", _by_family(eps["fo-open"]).get(v), 80),
                  ("the API server's real address", api_real.get(v), api_port),
                  ("node-2's address", a2.get(v), ECHO_PORT), ("node-1's address (its own Node)", a1.get(v), ECHO_PORT),
                  ("the external host", ea.get(v), ECHO_PORT), ("the router", ra.get(v), ECHO_PORT)]
        node_port = eps["fo-open"].node_port
        if node_port and v in a2:
            direct.append(("a NodePort on node-2", a2[v], node_port))
        if node_port and v in a1:
            direct.append(("a NodePort on node-1 (its own Node)", a1[v], node_port))
        for what, addr, port in direct:
            if addr:
                egress(f"{what} {fam}", (addr, port))
        # ingress to fo-srv (isolated) and fo-open (the control), by the same kinds of targets
        srv_np, open_np = eps["fo-srv"].node_port, eps["fo-open"].node_port
        srv_local, open_local = eps["fo-srv-local"].node_port, eps["fo-open-local"].node_port
        if v in a2 and srv_np and open_np:
            for src, what in (("external", "the external host"), ("fo-free", "a Pod on node-1"),
                              ("fo-near", "a Pod on the server's Node")):
                ingress(f"NodePort (Cluster) on the server's Node from {what} {fam}", src, (a2[v], srv_np),
                        (a2[v], open_np))
        if v in a1 and srv_np and open_np:
            ingress(f"NodePort (Cluster) on node-1 from the external host {fam}", "external", (a1[v], srv_np),
                    (a1[v], open_np))
        if v in a2 and srv_local and open_local:
            ingress(f"NodePort (Local) on the server's Node from the external host {fam}", "external",
                    (a2[v], srv_local), (a2[v], open_local))
        s_ip, o_ip = _addrs(srv.ips).get(v), _addrs(open_.ips).get(v)
        if s_ip and o_ip:
            for src, what in (("fo-free", "a Pod on node-1"), ("fo-near", "a Pod on the server's Node"),
                              ("node-1", "node-1's host (a hostNetwork Pod on another Node)")):
                ingress(f"Pod IP from {what} {fam}", src, (s_ip, ECHO_PORT), (o_ip, ECHO_PORT))
        s_c, o_c = _by_family(eps["fo-srv"]).get(v), _by_family(eps["fo-open"]).get(v)
        if s_c and o_c:
            ingress(f"ClusterIP from a Pod on node-1 {fam}", "fo-free", (s_c, 80), (o_c, 80))
    return FailOpen(sources, cases, early)


def probe(src: Source, targets: list[tuple[str, int]], timeout: float = TIMEOUT) -> list[str]:
    """What a TCP connect to each of ``targets`` from ``src`` gets, all at once."""
    if not targets:
        return []
    cp = src.exec([sys.executable, "-I", "-S", "-c", PROBE, json.dumps(targets), str(timeout)], timeout=timeout + 30)
    try:
        out = json.loads(cp.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [f"probe failed: {cp.stderr.strip()[-200:]}"] * len(targets)
    return [str(o) for o in out]


def _round(fo: FailOpen, pairs: list[tuple[str, tuple[str, int]]]) -> dict[tuple[str, tuple[str, int]], str]:
    """Every (source, target) of ``pairs`` probed, each source's at once and the sources side by side."""
    by_src: dict[str, list[tuple[str, int]]] = {}
    for src, target in pairs:
        by_src.setdefault(src, [])
        if target not in by_src[src]:
            by_src[src].append(target)
    with ThreadPoolExecutor(max_workers=len(by_src) or 1) as pool:
        futures = {src: pool.submit(probe, fo.sources[src], targets) for src, targets in by_src.items()}
    return {(src, t): seen for src, f in futures.items() for t, seen in zip(by_src[src], f.result(), strict=True)}


READY_POD = "fo-ready"
EARLY_POD, EARLY_PORT = "fo-early", 7801
LOGGER = r"""
import socket, sys
s = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", int(sys.argv[1]))); s.listen(64)
print("ready", flush=True)
while True:
    c, peer = s.accept(); print(peer[0], flush=True); c.close()
"""


def _judge_drops(node: Node) -> int:
    """The host judge's egress drop counter on ``node`` (table inet ferry_policy)."""
    out = node.exec(["nft", "list", "chain", "inet", "ferry_policy", "egress"]).stdout
    line = next((ln for ln in out.splitlines() if "counter packets" in ln and "drop" in ln), "")
    return int(line.split("counter packets")[1].split()[0]) if line else 0


def early_egress(lab: Lab, fo: FailOpen, ext_service_ip: str) -> dict[str, Any]:
    """From its first packet: a Pod created under the egress default-deny whose container, from
    its start, connects in a loop to a logger on the external host, directly and through a
    ClusterIP DNATed there.  While the policy holds the logger sees nothing, from the Pod's first
    packet on (waited until the container's log shows 10 attempts timed out, so the loop ran);
    the policy deleted, the logger sees it (so the loop could have been seen).  Run with the
    policies of :func:`check` in force; deletes the egress one."""
    import subprocess
    import threading

    cluster = lab.kube()
    ext = fo.sources["external"]
    assert isinstance(ext, Host)
    logger = subprocess.Popen(["ip", "netns", "exec", ext.netns, sys.executable, "-c", LOGGER, str(EARLY_PORT)],
                              stdout=subprocess.PIPE, text=True)
    seen: list[str] = []
    try:
        assert logger.stdout is not None and logger.stdout.readline().strip() == "ready"
        out = logger.stdout
        reader = threading.Thread(target=lambda: seen.extend(iter(out.readline, "")), daemon=True)
        reader.start()
        ext_ip = ext.address(4)
        loop = (f"while :; do nc -w 1 {ext_ip} {EARLY_PORT} </dev/null; nc -w 1 {ext_service_ip} 80 </dev/null; "
                "done")
        doc = kube_pods.pod_spec(EARLY_POD, "node-1")
        doc["metadata"]["labels"][LABEL] = "client"
        doc["spec"]["containers"][0]["command"] = ["sh", "-c", loop]
        n1 = lab.node("node-1")
        drops0 = _judge_drops(n1)
        cluster.kubectl("create", "-f", "-", input=json.dumps(doc))

        def attempts() -> int:  # the container's own word for each connection that did not go through
            logs = cluster.kubectl("logs", "-n", NS, EARLY_POD, check=False).stdout
            return logs.count("timed out")

        def detail() -> str:
            pod = cluster.kubectl("get", "pod", "-n", NS, EARLY_POD, "-o", "wide", check=False).stdout
            return f"judge drops {drops0} -> {_judge_drops(n1)}, attempts timed out: {attempts()}\n{pod}"
        wait_for("10 of the early Pod's attempts to time out", lambda: attempts() >= 10, HANG, detail)
        while_isolated = len(seen)
        Policies(lab).delete("fo-client-egress")
        wait_for("the early Pod's connections once its egress policy is gone", lambda: len(seen) > while_isolated,
                 HANG)
        return {"while_isolated": while_isolated, "attempts": attempts(), "after": len(seen)}
    finally:
        logger.kill()
        logger.wait()
        cluster.kubectl("delete", "pod", "-n", NS, EARLY_POD, "--wait=true", check=False)


def ready_under_policy(lab: Lab) -> float:
    """A Pod on node-2 that the ingress default-deny selects from its start, with a readiness
    probe (TCP, busybox's httpd): the kubelet's probes come from the Node's own address, so it
    becomes Ready; the seconds that took."""
    import time

    cluster = lab.kube()
    doc = kube_pods.pod_spec(READY_POD, "node-2")
    doc["metadata"]["labels"][LABEL] = "srv"
    main = doc["spec"]["containers"][0]
    main["command"] = ["httpd", "-f", "-p", "8080", "-h", "/"]
    main["readinessProbe"] = {"tcpSocket": {"port": 8080}, "periodSeconds": 1, "failureThreshold": 1}
    t0 = time.monotonic()
    cluster.kubectl("create", "-f", "-", input=json.dumps(doc))
    try:
        cluster.kubectl("wait", "-n", NS, "--for=condition=Ready", f"pod/{READY_POD}", f"--timeout={HANG:.0f}s")
        return time.monotonic() - t0
    finally:
        cluster.kubectl("delete", "pod", "-n", NS, READY_POD, "--wait=true", check=False)


def check(lab: Lab, fo: FailOpen, label: str, readiness: bool = False) -> list[Row]:
    """The policies applied, every case probed (the controls first, until all of them connect: a
    new Service is programmed on kube-proxy's schedule), the policies deleted; fails with the
    table when a case got through or a control did not.  ``readiness``: also
    :func:`ready_under_policy` while the policies are in force."""
    pol = Policies(lab)
    dns = [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]
    controls = [(c.control_src, c.control_target) for c in fo.cases]
    seen_controls: dict[tuple[str, tuple[str, int]], str] = {}

    def controls_open() -> bool:
        seen_controls.update(_round(fo, [p for p in controls if seen_controls.get(p) != "open"]))
        return all(seen_controls[p] == "open" for p in controls)

    wait_for(f"{label}: every control of the fail-open suite to connect", controls_open, HANG,
             lambda: repr(sorted(p for p in controls if seen_controls.get(p) != "open")))
    pol.apply(policy("fo-client-egress", {LABEL: "client"}, egress=dns))
    pol.apply(policy("fo-srv-ingress", {LABEL: "srv"}, ingress=[]))
    try:
        # in force on both Nodes: the client's direct connection to a Pod and the server's from one
        # are denied in OVS (route-sync writes the host's judge in the same pass, before the flows)
        cli, srv_ip = fo.sources["fo-cli"], next(c.target for c in fo.cases if c.name.startswith("Pod IP from"))
        open_ip = next(c.target for c in fo.cases if c.name.startswith("the Pod IP of fo-open"))
        # the same connect timeout as the rounds: a slow but open path is not mistaken for one in force
        wait_for(f"{label}: the policies in force", lambda: probe(cli, [open_ip]) == ["timeout"]
                 and probe(fo.sources["fo-free"], [srv_ip]) == ["timeout"], HANG)
        seen = _round(fo, [(c.src, c.target) for c in fo.cases])
        again = _round(fo, controls)  # the controls still connect (their Pods have no policy)
        own = probe(fo.sources["node-2"], [srv_ip])  # node-2's own host (kubelet probes) still reaches fo-srv
        ready, early = "", None
        if readiness:
            ready = f"; a Pod with a readiness probe under the ingress deny Ready in {ready_under_policy(lab):.1f} s"
            early = early_egress(lab, fo, fo.early_target)
    finally:
        if early is None:
            pol.delete("fo-client-egress")
        pol.delete("fo-srv-ingress")
    rows = [Row(c, seen[(c.src, c.target)], again[(c.control_src, c.control_target)]) for c in fo.cases]
    table = render(rows, label) + f"\nnode-2's own host -> fo-srv {srv_ip[0]}:{srv_ip[1]}: {own[0]}{ready}"
    if early is not None:
        table += (f"\na Pod created under the egress deny, connecting from its start: {early['while_isolated']} "
                  f"connections through while isolated, {early['attempts']} attempts timed out, "
                  f"{early['after'] - early['while_isolated']} once its policy was deleted")
    print(table)
    assert all(r.ok for r in rows) and own == ["open"], table
    assert early is None or early["while_isolated"] == 0, table
    return rows


def render(rows: list[Row], label: str) -> str:
    lines = [f"fail-open suite, {label}: {sum(r.ok for r in rows)} of {len(rows)} denied with the control open",
             "| direction | case | from | target | seen | control |", "|---|---|---|---|---|---|"]
    for r in rows:
        mark = "" if r.ok else " **FAIL**"
        lines.append(f"| {r.case.direction} | {r.case.name} | {r.case.src} | {r.case.target[0]}:{r.case.target[1]} "
                     f"| {r.seen}{mark} | {r.control} |")
    return "\n".join(lines)
