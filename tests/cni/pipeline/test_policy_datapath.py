"""NetworkPolicy on a real bridge: the policy planner's flows (routesync/policy/plan.py) installed
through the same codec route-sync uses, and real connections between Pods the plugin plugged.

One Node (a netns with its own OVS, netdev bridge, the plugin's base flows as on a lone Node),
Pods a, b, c; an echo server on b.  What the Pods see, for each of:

* no policy: everyone reaches b;
* b isolated for ingress, one rule (from Pods labelled app=a, TCP port 7000): a reaches b, c
  does not, on either family; b's own connections out still work (egress not isolated), and
  their replies come back (stateful);
* a named port (``http`` = 7000 on b) in the rule: the same;
* a isolated for egress with no rule: a reaches nobody, while c still reaches a's own server
  (a's ingress is not isolated, and the replies of an allowed connection pass);
* an established connection (a stream kept open across the change) stops when a policy starts
  to deny it: its next exchange fails; a reply direction alone never is judged;
* a Pod's pending block (``cni.pipeline.flows.pending_flows``): nothing new in or out until its
  flows in ConntrackState are deleted by cookie, as route-sync's release does;
* a remote client isolated for egress (a netns behind the Node's host, with an address of another
  Node's Pod CIDR, its packets forwarded by the host into the gateway as noEncap's are): what its
  egress allows reaches a local Pod, what it does not is dropped here, at the destination, and a
  local Pod's connection to it still gets its replies; with the denied log on, route-sync's
  listener logs each denied connection naming the remote Pod and its policy."""

from __future__ import annotations

import ipaddress
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import closing as _closing
from contextlib import contextmanager

import pytest

from cni.ovs.openflow import codec
from cni.ovs.openflow.bridge import OpenFlow
from cni.ovs.openflow.ofctl import parse_flow_line
from cni.ovs.openflow.session import Session
from cni.pipeline.flows import pending_flows
from cni.pipeline.tables import DENIED_LOG_METER, Cookie, Owner, Table, policy_cookie
from routesync.policy import plan as pp
from routesync.policy import stats
from routesync.policy.deniedlog import DeniedLog
from routesync.policy.listener import DeniedListener
from routesync.policy.model import NamedPort, Pod, policy_from
from tests.support.podnode import Node, run
from tests.support.podnode import Pod as NetPod
from tests.support.waiting import until

pytestmark = pytest.mark.root

PORT = 7000
NODE = "n1"


def _pod(p: NetPod, labels: dict[str, str], ports: tuple[NamedPort, ...] = ()) -> Pod:
    return Pod("default", p.name, NODE, tuple(sorted(labels.items())), (p.ip(4), p.ip(6)), ports)


def _install(node: Node, pods: list[Pod], policies: list[dict], of: OpenFlow,
             pod_cidrs: tuple[str, ...] = (), denied_log: bool = False) -> pp.Plan:
    """Replace every POLICY flow with the plan for ``policies``."""
    inputs = pp.Inputs(tuple(pods), {"default": ()}, tuple(policy_from(d) for d in policies))
    gw = (node.pods[0].gateway(4), node.pods[0].gateway(6))
    plan = pp.plan(inputs, pp.NodeFacts(NODE, gw, pod_cidrs=pod_cidrs, denied_log=denied_log))
    of.del_flows(Cookie.owner_match(Owner.POLICY))
    of.add_flows(plan.flows)
    node.ovs.appctl("revalidator/wait")  # the cached megaflows of earlier probes re-checked: the new verdicts hold
    return plan


def _policy(name: str, selector: dict, ingress: list | None = None, egress: list | None = None,
            types: tuple[str, ...] = ("Ingress",)) -> dict:
    spec: dict = {"podSelector": {"matchLabels": selector}, "policyTypes": list(types)}
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    return {"metadata": {"namespace": "default", "name": name}, "spec": spec}


def _stop(procs: list) -> None:
    for p in procs:
        if p is not None:
            p.kill()
            p.wait()


def _reach(src: NetPod, dst: NetPod, family: int, timeout: float = 2.0) -> bool:
    return bool(src.connect(dst.ip(family), PORT, timeout)["ok"])


def test_ingress_rules_isolate_and_allow_statefully(node: Node) -> None:
    a, b, c = node.add_pod("pa"), node.add_pod("pb"), node.add_pod("pc")
    of = OpenFlow(node.bridge, node.ovs.dir)
    pods = [_pod(a, {"app": "a"}), _pod(b, {"app": "b"}, (NamedPort("http", "TCP", PORT),)), _pod(c, {"app": "c"})]
    servers = [b.serve(PORT), a.serve(PORT)]
    try:
        for family in (4, 6):
            assert _reach(a, b, family, 10) and _reach(c, b, family, 10)
        from_a = [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}], "ports": [{"port": PORT}]}]
        plan = _install(node, pods, [_policy("b-from-a", {"app": "b"}, from_a)], of)
        assert plan.isolated["default/pb"] == (True, False)
        for family in (4, 6):
            assert _reach(a, b, family, 10), family
            assert not _reach(c, b, family), family
            assert _reach(b, a, family, 10), family  # b's own connection out, and its replies in
        # the rule's conj_id flow counted a's connections
        counted = [f for f in node.flows(policy_cookie_of(plan)) if "conj_id=" in f]
        assert counted and any("n_packets=0" not in f for f in counted), counted
        # a named port resolves on b: the same verdicts
        named = [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}], "ports": [{"port": "http"}]}]
        _install(node, pods, [_policy("b-from-a", {"app": "b"}, named)], of)
        for family in (4, 6):
            assert _reach(a, b, family, 10) and not _reach(c, b, family)
        # a's egress isolated, no rule: a reaches nobody new; c's connection to a still lands
        deny_out = _policy("a-no-egress", {"app": "a"}, egress=[], types=("Egress",))
        _install(node, pods, [_policy("b-from-a", {"app": "b"}, named), deny_out], of)
        for family in (4, 6):
            assert not _reach(a, b, family) and not _reach(a, c, family)
            assert _reach(c, a, family, 10)
        # policies gone: open again
        _install(node, pods, [], of)
        for family in (4, 6):
            assert _reach(c, b, family, 10) and _reach(a, b, family, 10)
    finally:
        _stop(servers)


STREAM_SERVER = """
import socket, sys, threading
s = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", int(sys.argv[1]))); s.listen(8); print("ready", flush=True)
def echo(c):
    while True:
        b = c.recv(100)
        if not b: return
        c.sendall(b)
while True:
    c, _ = s.accept(); threading.Thread(target=echo, args=(c,), daemon=True).start()
"""
STREAM_CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5); c.settimeout(2)
for line in sys.stdin:
    try:
        c.sendall(b"x"); ok = c.recv(1) == b"x"
    except OSError:
        ok = False
    print("ok" if ok else "lost", flush=True)
"""


def test_an_established_connection_stops_when_a_policy_denies_it(node: Node) -> None:
    import subprocess
    import sys

    a, b = node.add_pod("ea"), node.add_pod("eb")
    of = OpenFlow(node.bridge, node.ovs.dir)
    pods = [_pod(a, {"app": "a"}), _pod(b, {"app": "b"})]
    srv = subprocess.Popen(["ip", "netns", "exec", b.netns, sys.executable, "-c", STREAM_SERVER, str(PORT)],
                           stdout=subprocess.PIPE, text=True)
    cli = None
    try:
        assert srv.stdout is not None and srv.stdout.readline().strip() == "ready"
        cli = subprocess.Popen(["ip", "netns", "exec", a.netns, sys.executable, "-c", STREAM_CLIENT, b.ip(4),
                                str(PORT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert cli.stdin is not None and cli.stdout is not None

        def exchange() -> str:
            cli.stdin.write("go\n")
            cli.stdin.flush()
            return cli.stdout.readline().strip()

        assert exchange() == "ok"
        allow_a = [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}]}]
        _install(node, pods, [_policy("b-from-a", {"app": "b"}, allow_a)], of)
        assert exchange() == "ok"  # still allowed: the stream goes on
        _install(node, pods, [_policy("b-from-a", {"app": "b"}, [])], of)  # now b admits nobody
        assert exchange() == "lost"  # _install waited for the switch to re-check its cached megaflows
    finally:
        _stop([cli, srv])


def policy_cookie_of(plan: pp.Plan) -> str:
    conj = next(f for f in plan.flows if "conj_id=" in f.match_text())
    return conj.cookie.match()


def test_a_pending_pod_is_closed_until_its_block_is_deleted(node: Node) -> None:
    a, b = node.add_pod("qa"), node.add_pod("qb")
    of = OpenFlow(node.bridge, node.ovs.dir)
    cookie = Cookie(Owner.POD, 0x5EED)
    of.add_flows(pending_flows(cookie, (b.ip(4), b.ip(6))))
    servers = [b.serve(PORT), a.serve(PORT)]
    try:
        for family in (4, 6):
            assert not _reach(a, b, family) and not _reach(b, a, family)
        with Session(node.bridge, node.ovs.dir) as s:  # route-sync's release: that cookie, that table
            s.bundle([codec.flow_mod_delete(cookie, table=Table.CONNTRACK_STATE)])
        for family in (4, 6):
            assert _reach(a, b, family, 10) and _reach(b, a, family, 10)
    finally:
        _stop(servers)


def test_policy_cookie_is_per_flow_identity() -> None:
    assert policy_cookie("50|200|ip,nw_dst=10.0.0.1") != policy_cookie("50|200|ip,nw_dst=10.0.0.2")
    assert policy_cookie("x").owner == Owner.POLICY


def test_sctp_rules_match_in_the_switch(node: Node) -> None:
    """This kernel has no SCTP sockets (the upstream SCTP specs are skipped by a named rule), so
    SCTP matching is shown by the switch's own trace of an SCTP packet through the pipeline: a
    rule allowing SCTP port 9000 from a admits a's packet to b and nothing else."""
    a, b, c = node.add_pod("sa"), node.add_pod("sb"), node.add_pod("sc")
    of = OpenFlow(node.bridge, node.ovs.dir)
    pods = [_pod(a, {"app": "a"}), _pod(b, {"app": "b"}), _pod(c, {"app": "c"})]
    rule = [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}], "ports": [{"protocol": "SCTP", "port": 9000}]}]
    _install(node, pods, [_policy("b-sctp", {"app": "b"}, rule)], of)
    gw_mac = node.ovs.vsctl("get", "Interface", "ferry-gw0", "mac_in_use").strip().strip('"')
    b_port = node.ovs.vsctl("get", "Interface", b.host_veth, "ofport").strip()

    def trace(src: NetPod, port: int, proto: str = "sctp") -> str:
        ofport = node.ovs.vsctl("get", "Interface", src.host_veth, "ofport").strip()
        packet = (f"in_port={ofport},{proto},dl_src={src.mac},dl_dst={gw_mac},nw_src={src.ip(4)},nw_dst={b.ip(4)},"
                  f"nw_ttl=64,{proto}_dst={port}")
        return node.ovs.appctl("ofproto/trace", node.bridge, packet, "--ct-next", "trk,new")

    assert f"output:{b_port}" in trace(a, 9000)
    for out in (trace(c, 9000), trace(a, 9001), trace(a, 9000, "tcp")):
        assert f"output:{b_port}" not in out and "Datapath actions: drop" in out, out


# Another Node's Pod, as this Node's host sees it in noEncap: behind a route, forwarded by the host
# into the gateway port (the DNATed Service connection of issue 27's gap takes this path).
REMOTE_NODE = "n2"
REMOTE = {4: ("10.244.2.5", "10.244.2.1", 24), 6: ("fd00:10:244:2::5", "fd00:10:244:2::1", 64)}


@contextmanager
def remote_client(node: Node) -> Iterator[NetPod]:
    """A netns ``<node>-rm`` with REMOTE's addresses, reached from the Node's netns through a veth
    and routed (forwarding on) to the Node's Pods through the gateway: a Pod of another Node as
    a routed mode delivers it.  Not plugged by the plugin: it is not this Node's Pod."""
    name = f"{node.name}-rm"
    host_end = f"rm{secrets.token_hex(3)}"
    run(["ip", "netns", "add", name])
    try:
        run(["ip", "-n", node.name, "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", name])
        for k, v in (("net.ipv4.ip_forward", "1"), ("net.ipv6.conf.all.forwarding", "1")):
            run(["ip", "netns", "exec", node.name, "sysctl", "-qw", f"{k}={v}"])
        for ns, dev in ((node.name, host_end), (name, "eth0"), (name, "lo")):
            run(["ip", "-n", ns, "link", "set", dev, "up"])
        ips = []
        for family, (addr, gw, plen) in REMOTE.items():
            nodad = ["nodad"] if family == 6 else []
            run(["ip", "-n", node.name, "addr", "add", f"{gw}/{plen}", "dev", host_end, *nodad])
            run(["ip", "-n", name, "addr", "add", f"{addr}/{plen}", "dev", "eth0", *nodad])
            run(["ip", "-n", name, f"-{family}", "route", "add", "default", "via", gw])
            ips.append({"address": f"{addr}/{plen}", "gateway": gw})
        yield NetPod("rm", name, {"ips": ips, "interfaces": []})
    finally:
        run(["ip", "-n", node.name, "link", "del", host_end], check=False)
        run(["ip", "netns", "del", name], check=False)


@pytest.mark.parametrize("by_cidr", [True, False], ids=["pod-cidrs", "pod-addresses"])
def test_a_remote_clients_egress_is_judged_at_the_destination(node: Node, by_cidr: bool) -> None:
    """``by_cidr``: the Node's Pod CIDRs stand for its Pods as destinations (routed modes), or
    each Pod's address (networkPolicyOnly, where the Node has none of its own).  With the denied
    log on: each denied connection gives one line naming the remote Pod and its policy."""
    b, c = node.add_pod("rb"), node.add_pod("rc")
    of = OpenFlow(node.bridge, node.ovs.dir)
    with Session(node.bridge, node.ovs.dir) as s:
        s.transact([codec.meter_mod(DENIED_LOG_METER, 10_000, 10_000, 0)])
    lines: list[str] = []
    listener = DeniedListener(node.bridge, node.ovs.dir, DeniedLog(100, 100, time.monotonic), emit=lines.append)
    with remote_client(node) as r, _closing(listener.start()):
        assert listener.listening.wait(30), "the denied log's listener did not get to listening"
        pods = [Pod("default", "rm", REMOTE_NODE, (("app", "r"),), (r.ip(4), r.ip(6))),
                _pod(b, {"app": "b"}), _pod(c, {"app": "c"})]
        servers = [b.serve(PORT), c.serve(PORT), r.serve(PORT)]
        try:
            for family in (4, 6):
                assert _reach(r, b, family, 10) and _reach(r, c, family, 10), family
            to_b = [{"to": [{"podSelector": {"matchLabels": {"app": "b"}}}], "ports": [{"port": PORT}]}]
            cidrs = tuple(str(ipaddress.ip_interface(a["address"]).network) for a in b.result["ips"]) if by_cidr else ()
            plan = _install(node, pods, [_policy("r-to-b", {"app": "r"}, egress=to_b, types=("Egress",))], of, cidrs,
                            denied_log=True)
            listener.denied.set_remote(plan.remote_sources)
            assert [r_.pods for r_ in plan.remote_rules] == [("default/rm",)] and not plan.rules
            for family in (4, 6):
                assert _reach(r, b, family, 10), family  # its rule allows it
                assert not _reach(r, c, family), family  # dropped here: nothing of r's egress allows it
                assert _reach(c, r, family, 10), family  # c's own connection to r, and r's replies
            until(lambda: len(lines) == 2, "a line for each denied connection (IPv4, IPv6)")
            why = "egress from default/rm (of another Node, judged here), isolated by default/r-to-b"
            assert [re.sub(r":\d+ ->", ": ->", x) for x in lines] == [
                f"denied: TCP {r.ip(4)}: -> {c.ip(4)}:{PORT}, {why}",
                f"denied: TCP [{r.ip(6)}]: -> [{c.ip(6)}]:{PORT}, {why}"], lines
            up = [f for f in node.flows() if f"conj_id={plan.remote_isolation_id},ct_state=+new+trk " in f]
            assert len(up) == 1 and "n_packets=0" not in up[0] and "controller(" in up[0], up
            dumped = [d for d in map(parse_flow_line, node.flows()) if d]
            counted = stats.remote_denied(plan.remote_isolation_id, dumped)
            assert counted >= 2, counted
            allowed = [f for f in node.flows() if f"conj_id={plan.remote_rules[0].conj_id} " in f]
            assert len(allowed) == 1 and "n_packets=0" not in allowed[0], allowed
            _install(node, pods, [], of)
            for family in (4, 6):
                assert _reach(r, c, family, 10), family
        finally:
            _stop(servers)
