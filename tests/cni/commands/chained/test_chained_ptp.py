"""Ferry chained after Debian's ptp (+ host-local) on one Node in networkPolicyOnly, through cnitool."""

from __future__ import annotations

import json
import re
import sys

import pytest

from cni.commands import chained
from cni.kernel.netns import entered
from cni.node import config as cfg
from cni.pipeline import tables as pl
from cni.spec.request import Request
from cni.spec.result import decode
from tests.support.netcheck import ping, tcp_echo
from tests.support.paths import SUPPORT
from tests.support.waiting import until

pytestmark = pytest.mark.root
FORGE = str(SUPPORT / "forge.py")


def _packets(node, pod, match: str) -> int:
    """n_packets of the Pod's flows (its cookie) whose text contains ``match``."""
    total = 0
    cookie = None
    for line in node.ovs.vsctl("--format=csv", "--columns=name,external_ids", "list", "port").splitlines():
        if pod.host_veth in line:
            m = re.search(rf'{pl.EXT_CONTAINER_ID}="?([^",]+)', line)
            cookie = pl.pod_cookie(m.group(1), "eth0") if m else None
    assert cookie is not None, f"no OVS port for {pod.host_veth}"
    for line in node.flows(cookie.match()):
        if match in line:
            total += int(re.search(r"n_packets=(\d+)", line).group(1))
    return total


def _wait_counter(node, fn, at_least: int) -> int:
    """Datapath statistics reach the OpenFlow counters when the revalidators have run a pass: wait
    for one, read, until the counter reaches ``at_least`` (the deadline only bounds a hang)."""
    def reached() -> int:
        node.ovs.appctl("revalidator/wait")
        value = fn()
        return value if value >= at_least else 0

    return until(reached, f"a counter to reach {at_least}") if at_least > 0 else fn()


def test_two_chained_pods_talk_through_ovs(node):
    a, b = node.add_pod("a"), node.add_pod("b")
    # ptp's attachment is passed through unchanged: Ferry's result is ptp's.
    assert a.host_veth.startswith("veth") and a.result["ips"][0]["gateway"] == "10.244.1.1"
    assert set(node.ports()) == {pl.GATEWAY_PORT, a.host_veth, b.host_veth}
    for fam in (4, 6):
        assert ping(a.netns, b.ip(fam)), f"a -> b IPv{fam}"
        assert ping(b.netns, a.ip(fam)), f"b -> a IPv{fam}"
    assert tcp_echo(b.netns, b.ip(4), a.netns, port=5301)
    assert tcp_echo(b.netns, b.ip(6), a.netns, port=5302)
    # The Pods resolved their next hop through OVS: the gateway port's MAC, not the veth's.
    for fam in (4, 6):
        out = a.exec("ip", "neigh", "show", a.gateway(fam)).stdout
        assert "02:fe:00:00:00:01" in out, out
    # Their packets crossed OVS: SpoofGuard admitted them (per-Pod counters moved).
    assert _wait_counter(node, lambda: _packets(node, a, "nw_src=" + a.ip(4)), 4) >= 4
    assert _wait_counter(node, lambda: _packets(node, a, "ipv6_src=" + a.ip(6)), 4) >= 4


def test_pod_to_node_and_node_to_pod(node):
    a = node.add_pod("a")
    node.exec("ip", "addr", "add", "192.0.2.1/32", "dev", "lo")
    node.exec("ip", "addr", "add", "2001:db8::1/128", "dev", "lo")
    gw_rx = lambda: int(node.ovs.ofctl("dump-ports", node.bridge, pl.GATEWAY_PORT)
                        .split("tx pkts=")[1].split(",")[0])
    before = gw_rx()
    for addr in ("192.0.2.1", "2001:db8::1"):
        assert ping(a.netns, addr), addr  # Pod -> Node's own address (routed by the host)
    assert ping(node.name, a.ip(4)) and ping(node.name, a.ip(6))  # Node -> Pod
    # ... through the gateway port: OVS delivered the Node's packets to the Pod.
    assert gw_rx() - before >= 4
    # The Node's routes to the Pod now lead into OVS.
    assert "dev ferry-gw0" in node.exec("ip", "route", "get", a.ip(4)).stdout
    assert "dev ferry-gw0" in node.exec("ip", "-6", "route", "get", a.ip(6)).stdout


def test_spoofing_from_a_chained_pod_is_dropped(node):
    attacker, victim = node.add_pod("attacker"), node.add_pod("victim")
    assert ping(attacker.netns, victim.ip(4))
    guard = f"table={int(pl.Table.SPOOF_GUARD)}"

    def drops() -> int:
        out = node.ovs.ofctl("dump-flows", node.bridge, guard)
        line = next(ln for ln in out.splitlines() if "priority=0" in ln)
        return int(re.search(r"n_packets=(\d+)", line).group(1))

    def in_echos() -> int:
        lines = victim.exec("cat", "/proc/net/snmp").stdout.splitlines()
        names, values = [ln.split() for ln in lines if ln.startswith("Icmp:")][:2]
        return int(values[names.index("InEchos")])

    d0, e0 = drops(), in_echos()
    attacker.exec(sys.executable, FORGE, "eth0", "icmp", attacker.mac, "02:fe:00:00:00:01",
                  "10.244.1.250", victim.ip(4), "7")
    attacker.exec(sys.executable, FORGE, "eth0", "arp-reply", attacker.mac, victim.mac,
                  "10.244.1.1", victim.ip(4), "7")  # "the next hop is at <attacker>"
    assert _wait_counter(node, drops, d0 + 14) - d0 >= 14
    assert in_echos() == e0, "a forged echo request reached the victim"
    assert "02:fe:00:00:00:01" in victim.exec("ip", "neigh", "show", "10.244.1.1").stdout or \
        "lladdr" not in victim.exec("ip", "neigh", "show", "10.244.1.1").stdout
    assert ping(victim.netns, attacker.ip(4))


def _snapshot(node, pod) -> dict:
    """What ptp made on the Node for one Pod: veth settings, addresses and routes."""
    veth = pod.host_veth
    sysctls = {k: node.exec("cat", f"/proc/sys/net/{fam}/conf/{veth}/{k}").stdout.strip()
               for fam, k in (("ipv4", "arp_ignore"), ("ipv4", "rp_filter"), ("ipv6", "disable_ipv6"))}
    addrs = sorted(re.findall(r"inet6? (\S+)", node.exec("ip", "addr", "show", "dev", veth).stdout))
    routes = sorted(node.exec("ip", "route", "show", pod.ip(4) + "/32").stdout.split("\n")
                    + node.exec("ip", "-6", "route", "show", pod.ip(6) + "/128").stdout.split("\n"))
    txcsum = pod.exec("ethtool", "-k", "eth0").stdout.split("tx-checksumming:")[1].split()[0]
    return {"sysctls": sysctls, "addrs": [a for a in addrs if not a.startswith("fe80")],
            "routes": [r.split(" proto")[0].replace("scope host", "").replace("scope link", "").strip()
                       for r in routes if r], "txcsum": txcsum}


def test_del_undoes_exactly_what_add_did_then_ptp_cleans_its_own(node):
    keep = node.add_pod("keep")
    # ptp alone first: what the primary CNI leaves on the Node, before Ferry is chained.
    conflist = node.conflist()
    path = node.netconf_dir / "10-chained.conflist"
    path.write_text(json.dumps(dict(conflist, plugins=conflist["plugins"][:1])))
    alone = node.add_pod("alone")
    ptp_state = _snapshot(node, alone)
    assert node.del_pod(alone).returncode == 0
    path.write_text(json.dumps(conflist))
    flows_before, ports_before = _strip_counters(node.flows()), set(node.ports())

    gone = node.add_pod("gone")
    assert set(node.ports()) == ports_before | {gone.host_veth}
    chained_state = _snapshot(node, gone)
    assert chained_state["sysctls"] == {"arp_ignore": "8", "rp_filter": "1", "disable_ipv6": "1"}
    assert chained_state["txcsum"] == "off"
    assert all("dev ferry-gw0" in r for r in chained_state["routes"]), chained_state

    # Ferry's DEL alone (in a chain, ptp's DEL runs after it): Ferry's objects go, and ptp's are
    # back as ptp made them (same veth settings, addresses, routes, offload).
    req = Request(command="DEL", cni_version="1.0.0", container_id=_container_id(gone), netns=gone.path,
                  ifname="eth0", config=dict(conflist["plugins"][1], name=conflist["name"]),
                  prev_result=decode(gone.result))
    conf = cfg.parse(req.config)
    with entered(f"/run/netns/{node.name}"):
        chained.delete(req, conf, cfg.node_context(conf, need_state=False))
    assert set(node.ports()) == ports_before
    assert _strip_counters(node.flows()) == flows_before
    assert _snapshot(node, gone) == _renamed(ptp_state, alone, gone)

    # The whole chain's DEL (Ferry's again: nothing left to do; then ptp's) leaves nothing.
    assert node.del_pod(gone).returncode == 0
    assert gone.host_veth not in node.exec("ip", "-o", "link").stdout
    assert gone.ip(4) not in node.exec("ip", "route").stdout
    assert gone.ip(6) not in node.exec("ip", "-6", "route").stdout
    assert set(node.ports()) == ports_before
    # The other Pod never noticed.
    assert ping(node.name, keep.ip(4)) and ping(node.name, keep.ip(6))


def test_check_passes_then_sees_a_moved_route(node):
    a = node.add_pod("a")
    assert node.cnitool("check", a.path).returncode == 0
    node.exec("ip", "route", "del", f"{a.ip(4)}/32", "dev", pl.GATEWAY_PORT)
    p = node.cnitool("check", a.path)
    assert p.returncode != 0 and f"route {a.ip(4)}/32 dev ferry-gw0 is missing" in p.stdout + p.stderr


def _renamed(state: dict, old, new) -> dict:
    """``state`` of Pod ``old`` with its names/addresses as Pod ``new``'s."""
    text = json.dumps(state)
    for a, b in ((old.ip(4), new.ip(4)), (old.ip(6), new.ip(6)), (old.host_veth, new.host_veth)):
        text = text.replace(a, b)
    return json.loads(text)


def _container_id(pod) -> str:
    import hashlib

    return "cnitool-" + hashlib.sha512(pod.path.encode()).hexdigest()[:20]


def _strip_counters(flows: list[str]) -> list[str]:
    return sorted(re.sub(r"(duration|n_packets|n_bytes|idle_age|hard_age)=[^,]+, ?", "", f) for f in flows)


def test_a_primary_below_the_ipv6_minimum_mtu_is_chained(node):
    """ptp with an MTU below 1280 and IPv4 only: its host end has no IPv6, so there is none for
    Ferry to turn off (netdev); the Pod is chained and talks (it failed with 'No such file ...
    disable_ipv6' before)."""
    conflist = node.conflist()
    ptp = conflist["plugins"][0]
    ptp["mtu"] = 1200
    ptp["ipam"] = dict(ptp["ipam"], ranges=[[{"subnet": "10.244.1.0/24"}]], routes=[{"dst": "0.0.0.0/0"}])
    (node.netconf_dir / "10-chained.conflist").write_text(json.dumps(conflist, indent=2))
    a, b = node.add_pod("a"), node.add_pod("b")
    assert set(node.ports()) == {pl.GATEWAY_PORT, a.host_veth, b.host_veth}
    assert ping(a.netns, b.ip(4)) and ping(b.netns, a.ip(4))
    assert node.del_pod(a).returncode == 0 and node.del_pod(b).returncode == 0
    assert set(node.ports()) == {pl.GATEWAY_PORT}
