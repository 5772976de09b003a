"""A Pod forging IPv6 sources, NAs for the gateway's or another Pod's address, router
advertisements, or gratuitous ARP for another Pod's (or the gateway's) address is dropped by
SpoofGuard; the flow counters prove it and the victims' caches, routes and traffic are unaffected.

The last test removes the attacker's SpoofGuard flows (a permissive flow in their place) and
shows the same forged frame then does reach the victim, so these checks can fail."""

from __future__ import annotations

import re
import sys

import pytest

from cni.pipeline import tables as pl
from tests.support.netcheck import ping
from tests.support.paths import SUPPORT

pytestmark = pytest.mark.root
FORGE = str(SUPPORT / "forge6.py")
COUNT = 7
GW6 = "fd00:10:244:1::1"
SG = int(pl.Table.SPOOF_GUARD)


def _packets(node, *needles: str, cookie: str | None = None) -> int:
    """Sum of n_packets over SpoofGuard flows whose text contains every needle."""
    node.ovs.appctl("revalidator/wait")
    out = node.ovs.ofctl("dump-flows", node.bridge, f"table={SG}" + (f",cookie={cookie}" if cookie else ""))
    lines = [ln for ln in out.splitlines() if "n_packets=" in ln and all(n in ln for n in needles)]
    assert lines, f"no SpoofGuard flow with {needles}:\n{out}"
    return sum(int(re.search(r"n_packets=(\d+)", ln).group(1)) for ln in lines)


def _miss(node) -> int:
    return _packets(node, "priority=0", "actions=drop")


def _forge(pod, *args: str) -> None:
    pod.exec(sys.executable, FORGE, "eth0", *args, str(COUNT))


def _snmp6(pod, key: str) -> int:
    for ln in pod.exec("cat", "/proc/net/snmp6").stdout.splitlines():
        k, v = ln.split()
        if k == key:
            return int(v)
    raise KeyError(key)


def _neigh(exec_, ip: str) -> str:
    m = re.search(r"lladdr ([0-9a-f:]{17})", exec_("ip", "neigh", "show", ip).stdout)
    return m.group(1) if m else ""


def _ll(pod) -> str:
    out = pod.exec("ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link").stdout
    return re.search(r"inet6 (fe80::[0-9a-f:]+)/", out).group(1)


@pytest.fixture
def trio(fx_node):
    attacker, victim = fx_node.add_pod("attacker"), fx_node.add_pod("victim")
    gw4 = next(i["gateway"] for i in attacker.result["ips"] if "." in i["address"])
    gw_mac = fx_node.exec("cat", "/sys/class/net/ferry-gw0/address").stdout.strip()
    # honest paths first: they work, and fill the caches a forgery would poison
    for src, dst in ((attacker, victim.ip(6)), (victim, GW6), (victim, gw4), (attacker, victim.ip(4))):
        assert ping(src.netns, dst), f"{src.name} -> {dst}"
    assert ping(fx_node.name, victim.ip(6)) and ping(fx_node.name, victim.ip(4))
    return fx_node, attacker, victim, gw4, gw_mac


@pytest.mark.parametrize("case", ["forged-v6-source", "na-claims-gateway", "na-claims-victim", "ra",
                                  "garp-claims-victim", "garp-claims-gateway"])
def test_forged_frames_are_dropped_and_counted(trio, case):
    node, attacker, victim, gw4, gw_mac = trio
    cookie = pl.pod_cookie(node.ovs.vsctl("get", "port", attacker.host_veth,
                                          f"external_ids:{pl.EXT_CONTAINER_ID}").strip().strip('"'), "eth0").match()
    if case == "forged-v6-source":
        read = lambda: _miss(node)
        before, echos = read(), _snmp6(victim, "Icmp6InEchos")
        _forge(attacker, "echo6", attacker.mac, victim.mac, "fd00:10:244:1::fa", victim.ip(6))
    elif case in ("na-claims-gateway", "na-claims-victim"):
        read = lambda: _packets(node, "priority=204", "icmp_type=136", "actions=drop", cookie=cookie)
        before = read()
        if case == "na-claims-gateway":  # to the victim: "the gateway is at <attacker MAC>"
            _forge(attacker, "na", attacker.mac, victim.mac, attacker.ip(6), victim.ip(6), GW6)
        else:  # to the gateway: "the victim is at <attacker MAC>"
            _forge(attacker, "na", attacker.mac, gw_mac, attacker.ip(6), GW6, victim.ip(6))
    elif case == "ra":
        read = lambda: _packets(node, "priority=210", "icmp_type=134", "actions=drop", cookie=cookie)
        before = read()
        _forge(attacker, "ra", attacker.mac, _ll(attacker))
    else:
        read = lambda: _miss(node)
        before = read()
        _forge(attacker, "garp", attacker.mac, victim.ip(4) if case == "garp-claims-victim" else gw4)
    assert read() - before >= COUNT, "SpoofGuard did not count the forged frames"
    # the victims' caches and routes hold the truth
    if case == "forged-v6-source":
        assert _snmp6(victim, "Icmp6InEchos") == echos, "a forged echo request reached the victim"
    assert _neigh(victim.exec, GW6) == gw_mac, "victim's neighbour entry for the gateway poisoned"
    assert _neigh(victim.exec, gw4) == gw_mac, "victim's ARP entry for the gateway poisoned"
    assert _neigh(node.exec, victim.ip(6)) in ("", victim.mac), "Node's entry for the victim poisoned"
    assert _neigh(node.exec, victim.ip(4)) in ("", victim.mac), "Node's ARP entry for the victim poisoned"
    routes = victim.exec("ip", "-6", "route", "show").stdout
    assert _ll(attacker) not in routes and "proto ra" not in routes, f"victim took the RA: {routes}"
    # the victim's own traffic is unaffected
    for dst in (GW6, gw4, attacker.ip(4), attacker.ip(6)):
        assert ping(victim.netns, dst), f"victim -> {dst} after {case}"
    assert ping(node.name, victim.ip(6)) and ping(node.name, victim.ip(4))


def test_without_spoofguard_the_forgery_lands(trio):
    """The checks above can fail: with the attacker's SpoofGuard flows replaced by a permissive
    one, the forged-source echo reaches the victim."""
    node, attacker, victim, _gw4, _gw_mac = trio
    cid = node.ovs.vsctl("get", "port", attacker.host_veth, f"external_ids:{pl.EXT_CONTAINER_ID}").strip().strip('"')
    ofport = node.ovs.vsctl("get", "interface", attacker.host_veth, "ofport").strip()
    cookie = pl.pod_cookie(cid, "eth0")
    node.ovs.ofctl("del-flows", node.bridge, f"table={SG},cookie={cookie.match()}")
    node.ovs.ofctl("add-flow", node.bridge, f"table={SG},priority=200,cookie={cookie.value:#x},in_port={ofport},"
                   f"actions=goto_table:{int(pl.Table.L3_FORWARDING)}")
    echos = _snmp6(victim, "Icmp6InEchos")
    _forge(attacker, "echo6", attacker.mac, victim.mac, "fd00:10:244:1::fa", victim.ip(6))
    assert _snmp6(victim, "Icmp6InEchos") - echos == COUNT
