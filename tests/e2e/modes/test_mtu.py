"""Per-path MTU end to end (issue 17): each Pod route carries the MTU of the path behind it, and
route-sync keeps running Pods right when the mode or the underlay MTU changes.

Observables: DF pings of the exact sizes (``ping -M do``: the largest that passes and the first
that must fail), TCP transfers of a large payload between existing Pods, the MTUs a Pod's
interface and routes hold (``ip link``/``ip route`` in the Pod), the ADD result's route MTUs
(cniVersion 1.1.0; absent at 1.0.0), CHECK, and ``ferry-route-sync show``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from cni.node import nodestate
from cni.pipeline import podnet
from lab import layout
from lab.api import Lab, Pod, cnitool
from lab.sh import run
from tests.support.labs import PODS, start_lab, topology
from tests.support.paths import REPO
from tests.support.waiting import until

pytestmark = [pytest.mark.root, pytest.mark.slow]

HEADERS = {4: 28, 6: 48}  # IPv4 + ICMP, IPv6 + ICMPv6: ping -s payload = packet size - this
ROOT = str(REPO)
BIN = os.path.dirname(sys.executable)  # the venv's ferry-route-sync, ferry-lab
BIG = 4 << 20  # bytes of the TCP transfers (thousands of full-sized segments)


def df_ping(lab: Lab, src: Pod, dst: str, size: int) -> bool:
    """One echo of a ``size``-byte IP packet with DF set (IPv6 never fragments on the way)."""
    family = 6 if ":" in dst else 4
    cp = src.exec(["ping", f"-{family}", "-n", "-c", "1", "-W", "2", "-M", "do", "-s", str(size - HEADERS[family]),
                   dst], timeout=15)
    return cp.returncode == 0


def held(pod: Pod) -> tuple[int, dict[str, int]]:
    """(interface MTU, {route dst: MTU}) as the Pod holds them now (routes via a gateway)."""
    link = pod.exec(["ip", "-o", "link", "show", "eth0"], check=True).stdout
    mtu = int(re.search(r" mtu (\d+)", link).group(1))  # type: ignore[union-attr]
    routes = {}
    for fam in ("-4", "-6"):
        for line in pod.exec(["ip", fam, "route", "show"], check=True).stdout.splitlines():
            if " via " in line:
                m = re.search(r" mtu (\d+)", line)
                dst = line.split()[0]
                routes[{"default": "0.0.0.0/0" if fam == "-4" else "::/0"}.get(dst, dst)] = int(m.group(1)) if m else 0
    return mtu, routes


def wanted(lab: Lab, pod: Pod) -> tuple[int, dict[str, int]] | None:
    """What the Pod's Node's state file says it should hold (cni.pipeline.podnet, as ADD and route-sync)."""
    path = lab.node(pod.node).paths.state_file
    try:
        state = nodestate.read(path)
    except nodestate.StateError:
        return None
    want = podnet.for_state(state, podnet.gateways_of(state, pod.ips))
    return want.mtu, {r.dst: r.mtu for r in want.routes}


def pods_follow(lab: Lab, pods: list[Pod], mtu: int, mode: str) -> bool:
    """Every Pod holds what its Node's state (of ``mode``, transport ``mtu``) wants."""
    for p in pods:
        st = lab.node(p.node).state() or {}
        if st.get("mode") != mode or st.get("transportMTU") != mtu:
            return False
        if held(p) != wanted(lab, p):
            return False
    return True


def _tcp(lab: Lab, src: Pod, dst: Pod, family: int) -> None:
    addr = dst.address(family)
    assert addr is not None
    probe = lab.tcp(src, addr, size=BIG, timeout=30)
    assert probe, f"TCP {BIG} bytes {src.node}/{src.name} -> {dst.node}/{dst.name} ({addr}): {probe.detail}"


def _state(lab: Lab, node: str) -> dict:
    st = lab.node(node).state()
    assert st is not None
    return st


# ------------------------------------------------------------------------------------ hybrid


@pytest.fixture(scope="module")
def hybrid(lab_of):  # type: ignore[no-untyped-def]
    return lab_of(topology({"trafficEncapMode": "hybrid", "tunnelType": "vxlan"}))


@pytest.mark.parametrize("family", [4, 6])
def test_hybrid_same_subnet_full_mtu_cross_subnet_tunnel_mtu(hybrid: Lab, family: int) -> None:
    lab = hybrid
    st = _state(lab, "node-1")
    full, tunnel = st["transportMTU"], st["mtu"]
    assert (full, tunnel) == (1500, 1430)  # dual-stack: tunnels over IPv6 too, 50 + 20 bytes
    src, same, other = lab.pod("node-1", "a"), lab.pod("node-2", "a"), lab.pod("node-3", "a")
    same_addr, other_addr = same.address(family), other.address(family)
    assert same_addr and other_addr
    # same subnet: routed, never encapsulated: the whole 1500 bytes with DF
    assert df_ping(lab, src, same_addr, full), f"{full}-byte DF packet to the same-subnet Pod"
    # across the router: tunnelled: exactly the tunnel MTU, and not one byte more
    assert df_ping(lab, src, other_addr, tunnel), f"{tunnel}-byte DF packet across the tunnel"
    assert not df_ping(lab, src, other_addr, tunnel + 1), f"{tunnel + 1} bytes must not pass the tunnel"
    assert not df_ping(lab, src, other_addr, full)
    # and back (the peer's Pods hold their routes too)
    assert df_ping(lab, same, src.address(family), full)  # type: ignore[arg-type]
    assert not df_ping(lab, other, src.address(family), tunnel + 1)  # type: ignore[arg-type]
    _tcp(lab, src, other, family)
    _tcp(lab, src, same, family)


def test_hybrid_pod_holds_the_documented_routes_and_check_passes(hybrid: Lab) -> None:
    lab = hybrid
    pod = lab.pod("node-1", "a")
    mtu, routes = held(pod)
    assert mtu == 1500
    assert routes == {"0.0.0.0/0": 1500, "::/0": 1500, "10.244.0.0/16": 1430, "fd00:10:244::/48": 1430,
                      "10.244.2.0/24": 1500, "fd00:10:244:2::/64": 1500}  # node-2: routed
    assert held(lab.pod("node-3", "a"))[1] == {"0.0.0.0/0": 1500, "::/0": 1500, "10.244.0.0/16": 1430,
                                               "fd00:10:244::/48": 1430}  # node-3 has no routed peer
    cp = lab.check_pod("node-1", "a")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    # a route's MTU changed by hand is what CHECK reports
    pod.exec(["ip", "route", "replace", "10.244.0.0/16", "via", "10.244.1.1", "dev", "eth0", "mtu", "1500"], check=True)
    try:
        cp = lab.check_pod("node-1", "a")
        assert cp.returncode != 0 and "10.244.0.0/16" in cp.stdout + cp.stderr and "1430" in cp.stdout + cp.stderr
    finally:
        pod.exec(["ip", "route", "replace", "10.244.0.0/16", "via", "10.244.1.1", "dev", "eth0", "mtu", "1430"],
                 check=True)


def test_add_result_route_mtus_in_1_1_0_only(hybrid: Lab, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The lab's conflist is 1.0.0: no ``mtu`` key in its results.  The same network at 1.1.0
    reports the interface MTU and every route's."""
    lab = hybrid
    assert all("mtu" not in r for r in lab.pod("node-1", "a").result.get("routes", []))
    n = lab.node("node-1")
    with open(n.paths.conflist) as f:
        conf = json.load(f)
    conf["cniVersion"] = "1.1.0"
    netconf = tmp_path / "net.d"
    netconf.mkdir()
    (netconf / "10-ferry.conflist").write_text(json.dumps(conf))
    netns = f"{lab.name}-v11"
    run(["ip", "netns", "add", netns])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NETCONFPATH": str(netconf), "CNI_PATH": lab.cni_bin}
    try:
        cp = run([cnitool(), "add", layout.NETWORK_NAME, f"/run/netns/{netns}"], netns=n.netns, env=env, check=False)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        result = json.loads(cp.stdout)
        sandbox = [i for i in result["interfaces"] if i.get("sandbox")]
        assert sandbox[0]["mtu"] == 1500
        assert {r["dst"]: r["mtu"] for r in result["routes"]} == {
            "0.0.0.0/0": 1500, "::/0": 1500, "10.244.0.0/16": 1430, "fd00:10:244::/48": 1430,
            "10.244.2.0/24": 1500, "fd00:10:244:2::/64": 1500}
    finally:
        run([cnitool(), "del", layout.NETWORK_NAME, f"/run/netns/{netns}"], netns=n.netns, env=env, check=False)
        run(["ip", "netns", "del", netns], check=False)


def test_show_prints_the_mtu_per_path(hybrid: Lab) -> None:
    n = hybrid.node("node-1")
    cp = subprocess.run([os.path.join(BIN, "ferry-route-sync"), "show", "--state-file", n.paths.state_file],
                        capture_output=True, text=True, check=True)
    rows = {(line.split()[0], line.split()[3]): line.split()[4] for line in cp.stdout.splitlines()[3:]}
    assert rows[("node-2", "route")] == "1500" and rows[("node-3", "tunnel")] == "1430"
    lab_show = subprocess.run([os.path.join(BIN, "ferry-lab"), "show", "--name", hybrid.name],
                              capture_output=True, text=True, check=True).stdout
    assert "peer node-2: path route mtu 1500" in lab_show and "peer node-3: path tunnel mtu 1430" in lab_show
    assert "mtu 1500; routes default 1500, 10.244.0.0/16 1430" in lab_show


# ------------------------------------------------------------------------------------ encap


@pytest.mark.parametrize("family", [4, 6])
def test_encap_pod_to_external_host_full_mtu(lab_of, family: int) -> None:  # type: ignore[no-untyped-def]
    lab = lab_of(topology({"trafficEncapMode": "encap", "tunnelType": "geneve"}))
    st = _state(lab, "node-1")
    full, tunnel = st["transportMTU"], st["mtu"]
    src = lab.pod("node-1", "a")
    ext = lab.external.address(family)
    assert ext
    # masqueraded out of the uplink, never encapsulated: the full MTU with DF
    assert df_ping(lab, src, ext, full), f"{full}-byte DF packet to the external host"
    peer = lab.pod("node-2", "a").address(family)
    assert peer
    assert df_ping(lab, src, peer, tunnel) and not df_ping(lab, src, peer, tunnel + 1)


# ------------------------------------------------------------------------------- mode switch


def test_mode_switch_encap_noencap_and_back_running_pods_follow(cni_bin: str) -> None:
    """encap -> noEncap -> encap, route-sync restarted with the new mode on each Node: the Pods
    (not recreated: same netns, same host veth) get the new MTUs; TCP of 4 MiB passes after each
    switch, same subnet and across the router (the router routes Pod CIDRs for noEncap)."""
    lab = start_lab(cni_bin, topology({"trafficEncapMode": "encap", "tunnelType": "vxlan"}, route_pod_cidrs=True))
    try:
        pods = [lab.pod(n, p) for n, p in PODS]
        ids = {(p.node, p.name): (p.netns, p.mac) for p in pods}
        a, same, other = lab.pod("node-1", "a"), lab.pod("node-2", "a"), lab.pod("node-3", "a")
        for mode, tunnel in (("noEncap", 1500), ("encap", 1430)):
            for n in ("node-1", "node-2", "node-3"):
                lab.reconfigure_route_sync(n, trafficEncapMode=mode)
            until(lambda m=mode: pods_follow(lab, pods, 1500, m), f"every Pod at the MTUs of {mode}")  # type: ignore[misc]
            assert all(held(p)[0] == 1500 for p in pods)
            assert {(p.node, p.name): (p.netns, p.mac) for p in [lab.pod(n, q) for n, q in PODS]} == ids
            assert held(a)[1].get("10.244.0.0/16") == (tunnel if mode == "encap" else None)
            for family in (4, 6):
                _tcp(lab, a, same, family)
                _tcp(lab, a, other, family)
                dst = other.address(family)
                assert dst and df_ping(lab, a, dst, tunnel)
                assert not df_ping(lab, a, dst, tunnel + 1) or mode == "noEncap"
    finally:
        lab.down()


# ----------------------------------------------------------------------------- underlay MTU


def test_underlay_mtu_9000_and_back_running_pods_follow(cni_bin: str) -> None:
    """The operator raises the segments and uplinks to 9000, then lowers them to 1500 again:
    route-sync's next full pass (resyncSeconds 0.5 here) follows the physical uplink; the Pods
    (and the gateway and uplink ports) follow it; jumbo tunnelled packets pass, then 1500 again."""
    lab = start_lab(cni_bin, topology({"trafficEncapMode": "hybrid", "tunnelType": "vxlan",
                                           "resyncSeconds": 0.5}))
    try:
        pods = [lab.pod(n, p) for n, p in PODS]
        a, same, other = lab.pod("node-1", "a"), lab.pod("node-2", "a"), lab.pod("node-3", "a")
        for mtu in (9000, 1500):
            lab.set_underlay_mtu(mtu)
            until(lambda m=mtu: pods_follow(lab, pods, m, "hybrid"), f"every Pod at transport MTU {mtu}")  # type: ignore[misc]
            tunnel = _state(lab, "node-1")["mtu"]
            assert tunnel == mtu - 70
            for n in ("node-1", "node-3"):
                gw = lab.node(n).exec(["ip", "-o", "link", "show", "ferry-gw0"], check=True).stdout
                assert f" mtu {mtu} " in gw
            for family in (4, 6):
                s, o = same.address(family), other.address(family)
                assert s and o
                assert df_ping(lab, a, s, mtu), f"{mtu} bytes, same subnet, IPv{family}"
                assert df_ping(lab, a, o, tunnel) and not df_ping(lab, a, o, tunnel + 1)
                _tcp(lab, a, other, family)
    finally:
        lab.down()


HOOKED_LAUNCHER = """#!{python} -IS
# test stand-in for timing only: route-sync replacing the state file exactly between the ADD's
# read of it and the Pod's configuration (a window of microseconds no test can hit by waiting)
import os, sys
sys.path.insert(0, {root!r})
from cni.commands import add as commands
configure = commands._configure_pod_interface
def hooked(*args, **kwargs):
    configure(*args, **kwargs)
    os.replace({new!r}, {state!r})
commands._configure_pod_interface = hooked
from cni.plugin import main, leave
leave(main())
"""


def test_add_that_read_an_older_state_file_converges_its_own_pod(hybrid: Lab, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """route-sync may list the Node's Pods before a new Pod's port is in OVS, having just
    replaced the state file that ADD read earlier: ADD notices the new file and converges itself."""
    lab = hybrid
    n = lab.node("node-1")
    state_file = n.paths.state_file
    with open(state_file) as f:
        original = f.read()
    doc = json.loads(original)
    for p in doc["peers"]:
        if p["name"] == "node-2":
            p["path"] = "tunnel"  # the hybrid decision flipped: node-2 is now behind a tunnel
    new = str(tmp_path / "new-state.json")
    with open(new, "w") as f:
        json.dump(doc, f)
    cni_bin = tmp_path / "bin"
    shutil.copytree(lab.cni_bin, cni_bin, symlinks=True)
    (cni_bin / "ferry").unlink()
    (cni_bin / "ferry").write_text(HOOKED_LAUNCHER.format(python=sys.executable, root=ROOT, new=new,
                                                          state=state_file))
    (cni_bin / "ferry").chmod(0o755)
    netns = f"{lab.name}-race"
    run(["ip", "netns", "add", netns])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NETCONFPATH": n.paths.netconf, "CNI_PATH": str(cni_bin)}
    try:
        cp = run([cnitool(), "add", layout.NETWORK_NAME, f"/run/netns/{netns}"], netns=n.netns, env=env, check=False)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        dsts = {r["dst"] for r in json.loads(cp.stdout)["routes"]}
        assert "10.244.2.0/24" not in dsts and "10.244.0.0/16" in dsts
        routes = run(["ip", "-n", netns, "route", "show"]).stdout
        assert "10.244.2.0/24" not in routes and "10.244.0.0/16" in routes
    finally:
        run([cnitool(), "del", layout.NETWORK_NAME, f"/run/netns/{netns}"], netns=n.netns, env=env, check=False)
        run(["ip", "netns", "del", netns], check=False)
        with open(state_file + ".t", "w") as f:
            f.write(original)
        os.replace(state_file + ".t", state_file)
