"""routesync.apply.pods with real namespaces, veths and the plugin's attachment locks: running
Pods converge to a new plan, a Pod whose namespace is gone is skipped without error, and a Pod
whose ADD/DEL holds its lock is not touched until the lock is released.

The OVS port rows are handed in as plain data (what ``OvsApplier.pod_ports`` returns): OVS
itself has nothing to do with converging a Pod's namespace (the e2e tests run the whole thing)."""

from __future__ import annotations

import os
import re
import threading

import pytest

from cni.node import nodestate
from cni.node.locks import attachment_lock
from cni.pipeline.tables import EXT_CONTAINER_ID, EXT_IFNAME, EXT_IPS, EXT_NETNS, EXT_OWNER
from routesync.apply.pods import PodMtuApplier
from tests.routesync.apply.helpers import ns_sh, sh, veth
from tests.support.ovs_instance import netns
from tests.support.waiting import flock_waiters, until

pytestmark = pytest.mark.root


def state(mode: str, mtu: int, transport: int) -> nodestate.NodeState:
    return nodestate.NodeState(
        node="node-1", mode=mode, bridge="br-int", datapath="netdev", ovsdb="unix:x", ovsRunDir="/r", mtu=mtu,
        podCIDRs=["10.244.1.0/24", "fd00:10:244:1::/64"], clusterCIDRs=["10.244.0.0/16", "fd00:10:244::/48"],
        gateway=nodestate.Gateway("ferry-gw0", "02:00:00:00:00:01", 2, ["10.244.1.1/24", "fd00:10:244:1::1/64"]),
        transportMTU=transport)


def pod(node_ns: str, pod_ns: str, host: str, n: int) -> dict:
    """A Pod as the plugin leaves it before per-path MTUs: MTU 1450, one default route per family."""
    veth(node_ns, host, pod_ns, "eth0")
    for ns, dev in ((node_ns, host), (pod_ns, "eth0")):
        ns_sh(ns, "ip", "link", "set", dev, "mtu", "1450")
    ns_sh(pod_ns, "sysctl", "-q", "-w", "net.ipv6.conf.eth0.accept_dad=0")
    ns_sh(pod_ns, "ip", "addr", "add", f"10.244.1.{n}/24", "dev", "eth0")
    ns_sh(pod_ns, "ip", "addr", "add", f"fd00:10:244:1::{n}/64", "dev", "eth0", "nodad")
    ns_sh(pod_ns, "ip", "route", "add", "default", "via", "10.244.1.1")
    ns_sh(pod_ns, "ip", "-6", "route", "add", "default", "via", "fd00:10:244:1::1")
    return {"name": host, "ofport": 1000 + n, "external_ids": {
        EXT_OWNER: "pod", EXT_CONTAINER_ID: f"cid-{pod_ns}", EXT_IFNAME: "eth0", EXT_NETNS: f"/run/netns/{pod_ns}",
        EXT_IPS: f"10.244.1.{n}/24,fd00:10:244:1::{n}/64"}}


def held(pod_ns: str) -> tuple[int, list[str]]:
    mtu = int(re.search(r" mtu (\d+)", ns_sh(pod_ns, "ip", "-o", "link", "show", "eth0")).group(1))  # type: ignore[union-attr]
    routes = [" ".join(line.split()[:1] + re.findall(r"mtu \d+", line))
              for fam in ("-4", "-6") for line in ns_sh(pod_ns, "ip", fam, "route", "show").splitlines()
              if " via " in line]
    return mtu, sorted(routes)


def host_mtu(node_ns: str, dev: str) -> int:
    return int(re.search(r" mtu (\d+)", ns_sh(node_ns, "ip", "-o", "link", "show", dev)).group(1))  # type: ignore[union-attr]


@pytest.fixture
def node(tmp_path):  # type: ignore[no-untyped-def]
    with netns("fb-pn") as ns, netns("fb-pa") as a, netns("fb-pb") as b:
        ports = [pod(ns, a, "fbh-a", 2), pod(ns, b, "fbh-b", 3)]

        def set_host_mtu(name: str, mtu: int) -> bool:
            if host_mtu(ns, name) == mtu:
                return False
            ns_sh(ns, "ip", "link", "set", name, "mtu", str(mtu))
            return True

        def port(name: str) -> dict | None:
            return next((p for p in ports if p["name"] == name), None)

        applier = PodMtuApplier(lambda: ports, port, set_host_mtu, str(tmp_path / "locks"))
        yield ns, (a, b), ports, applier


ENCAP = sorted(["default mtu 1500", "10.244.0.0/16 mtu 1430", "default mtu 1500", "fd00:10:244::/48 mtu 1430"])


def test_running_pods_converge_then_follow_a_mode_change(node) -> None:  # type: ignore[no-untyped-def]
    ns, (a, b), _ports, applier = node
    rep = applier.sync(state("encap", 1430, 1500))
    assert (rep.updated, rep.failed, rep.skipped) == (2, 0, 0)
    for p in (a, b):  # interface at the transport MTU, the cluster prefixes at the tunnel MTU
        assert held(p) == (1500, ENCAP)
    assert host_mtu(ns, "fbh-a") == 1500 and host_mtu(ns, "fbh-b") == 1500
    assert applier.sync(state("encap", 1430, 1500)).touched == 0  # nothing changed: nothing entered
    full = applier.sync(state("encap", 1430, 1500), full=True)  # a full pass looks, changes nothing
    assert (full.updated, full.unchanged) == (0, 2)
    rep = applier.sync(state("noEncap", 1500, 1500))
    assert rep.updated == 2
    assert held(a) == (1500, ["default mtu 1500", "default mtu 1500"])  # IPv4 and IPv6 default only


def test_pod_whose_netns_is_gone_is_skipped_without_error(node) -> None:  # type: ignore[no-untyped-def]
    _ns, (a, b), _ports, applier = node
    sh("ip", "netns", "del", a)  # its veth goes with it; the OVS port row stays (a DEL to come)
    try:
        rep = applier.sync(state("encap", 1430, 1500))
        assert (rep.updated, rep.skipped, rep.failed) == (1, 1, 0), rep
        assert held(b)[0] == 1500
        assert not os.path.exists(f"/run/netns/{a}")  # never re-created by entering it
    finally:
        sh("ip", "netns", "add", a)  # for the fixture's clean-up


def test_pod_locked_by_add_or_del_waits_for_the_lock(node, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _ns, (a, _b), ports, applier = node
    cid = ports[0]["external_ids"][EXT_CONTAINER_ID]
    report = {}
    with attachment_lock(str(tmp_path / "locks"), cid, "eth0") as lock:
        t = threading.Thread(target=lambda: report.setdefault("r", applier.sync(state("encap", 1430, 1500))))
        t.start()
        until(lambda: flock_waiters(lock.path), "route-sync waiting on the Pod's attachment lock")
        assert held(a)[0] == 1450  # untouched while the plugin holds the Pod
    t.join()
    assert report["r"].updated == 2 and held(a)[0] == 1500
