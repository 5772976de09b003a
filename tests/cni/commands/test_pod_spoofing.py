"""A Pod that forges its source IP or MAC, or claims the gateway's address, is dropped by SpoofGuard."""

from __future__ import annotations

import re
import sys

import pytest

from cni.pipeline import tables as pl
from tests.support.netcheck import ping
from tests.support.paths import SUPPORT
from tests.support.waiting import until

pytestmark = pytest.mark.root
FORGE = str(SUPPORT / "forge.py")
COUNT = 7


def _guard_drops(node) -> int:
    """Packets counted by SpoofGuard's table-miss drop."""
    out = node.ovs.ofctl("dump-flows", node.bridge, f"table={int(pl.Table.SPOOF_GUARD)}")
    for line in out.splitlines():
        if "priority=0" in line or ("priority=" not in line and "actions=drop" in line):
            return int(re.search(r"n_packets=(\d+)", line).group(1))
    raise AssertionError(out)


def _stats_pushed(node) -> bool:
    node.ovs.appctl("revalidator/wait")
    return True


def _forge(pod, *args: str) -> None:
    pod.exec(sys.executable, FORGE, "eth0", *args, str(COUNT))


def _in_echos(pod) -> int:
    """ICMP echo requests the Pod's kernel received (a forged echo that arrives is counted here)."""
    lines = pod.exec("cat", "/proc/net/snmp").stdout.splitlines()
    names, values = [ln.split() for ln in lines if ln.startswith("Icmp:")][:2]
    return int(values[names.index("InEchos")])


def _neigh_mac(ns_exec, ip: str) -> str:
    out = ns_exec("ip", "neigh", "show", ip).stdout
    m = re.search(r"lladdr ([0-9a-f:]{17})", out)
    return m.group(1) if m else ""


@pytest.mark.parametrize("case", ["forged-ip", "forged-mac", "arp-claims-gateway", "arp-claims-victim"])
def test_forged_frames_are_dropped_and_counted(node, case):
    attacker = node.add_pod("attacker")
    victim = node.add_pod("victim")
    gw_ip = next(i["gateway"] for i in attacker.result["ips"] if "." in i["address"])
    gw_mac = node.exec("cat", "/sys/class/net/ferry-gw0/address").stdout.strip()
    # The honest paths work, and fill the neighbour caches a forged ARP reply would overwrite.
    assert ping(attacker.netns, victim.ip(4)) and ping(victim.netns, gw_ip) and ping(node.name, victim.ip(4))
    drops, echos = _guard_drops(node), _in_echos(victim)
    if case == "forged-ip":
        _forge(attacker, "icmp", attacker.mac, victim.mac, "10.244.1.250", victim.ip(4))
    elif case == "forged-mac":
        _forge(attacker, "icmp", "02:de:ad:be:ef:01", victim.mac, attacker.ip(4), victim.ip(4))
    elif case == "arp-claims-gateway":  # "the gateway is at <attacker MAC>", to the victim
        _forge(attacker, "arp-reply", attacker.mac, victim.mac, gw_ip, victim.ip(4))
    else:  # "the victim is at <attacker MAC>", to the gateway
        _forge(attacker, "arp-reply", attacker.mac, gw_mac, victim.ip(4), gw_ip)
    # Datapath flow statistics reach the OpenFlow counters when the revalidators have run a pass.
    until(lambda: _stats_pushed(node) and _guard_drops(node) - drops >= COUNT,
          "SpoofGuard to count the forged frames")
    assert _in_echos(victim) == echos, "a forged echo request reached the victim"
    assert _neigh_mac(victim.exec, gw_ip) == gw_mac, "the victim's ARP entry for the gateway was poisoned"
    assert _neigh_mac(node.exec, victim.ip(4)) == victim.mac, "the Node's ARP entry for the victim was poisoned"
    # The victim's own traffic is unaffected.
    assert ping(victim.netns, attacker.ip(4)) and ping(victim.netns, gw_ip)


def test_honest_frames_built_the_same_way_do_cross(node):
    """The forging tool itself works: the same frame with the Pod's true addresses arrives."""
    attacker = node.add_pod("attacker")
    victim = node.add_pod("victim")
    assert ping(attacker.netns, victim.ip(4))
    echos = _in_echos(victim)
    _forge(attacker, "icmp", attacker.mac, victim.mac, attacker.ip(4), victim.ip(4))
    until(lambda: _in_echos(victim) - echos >= COUNT, "the honest echo requests to arrive")
    assert _in_echos(victim) - echos == COUNT
