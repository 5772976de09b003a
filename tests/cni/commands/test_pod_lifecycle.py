"""DEL leaves nothing; a failed ADD rolls back; CHECK names what diverged."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from cni.pipeline import tables as pl
from tests.support.netcheck import ping
from tests.support.podnode import run

pytestmark = pytest.mark.root


def _pod_flows(node) -> list[str]:
    return node.flows(pl.Cookie.owner_match(pl.Owner.POD))


def _ipam_allocations(node) -> str:
    """What the IPAM store holds, as its own listing prints it."""
    p = run([os.path.join(node.cni_bin, "ferry-ipam"), "ls", "--json", "--data-dir", str(node.ipam_dir)],
            check=False)
    return p.stdout if p.returncode == 0 else ""


def _fry_links(node) -> list[str]:
    return [name for name in node.links() if name.startswith(pl.HOST_VETH_PREFIX)]


def _assert_nothing_left(node) -> None:
    assert _fry_links(node) == [], "host veths left"
    if "br-int" in node.ovs.vsctl("list-br").split():
        assert [p for p in node.ports() if p.startswith(pl.HOST_VETH_PREFIX)] == [], "OVS ports left"
        assert _pod_flows(node) == [], "per-Pod flows left"
    allocs = _ipam_allocations(node)
    assert "10.244." not in allocs and "fd00:" not in allocs, f"IPAM records left: {allocs}"


def test_del_of_every_pod_leaves_nothing(node):
    pods = [node.add_pod(n) for n in ("a", "b", "c")]
    assert len(_fry_links(node)) == 3 and len(_pod_flows(node)) > 30
    assert "10.244." in _ipam_allocations(node)
    for p in pods:
        assert node.del_pod(p).returncode == 0
    node.pods.clear()
    _assert_nothing_left(node)
    for p in pods:
        run(["ip", "netns", "del", p.netns], check=False)


def test_del_is_idempotent_and_survives_a_vanished_netns(node):
    a = node.add_pod("a")
    run(["ip", "netns", "del", a.netns])  # the runtime removed the sandbox first
    for _ in range(2):
        p = node.cnitool("del", a.path)
        assert p.returncode == 0, p.stdout + p.stderr
    node.pods.clear()
    _assert_nothing_left(node)


def test_add_with_the_ifname_taken_fails_cleanly(node):
    ns = f"{node.name}-taken"
    run(["ip", "netns", "add", ns])
    try:
        run(["ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1"])
        p = node.cnitool("add", f"/run/netns/{ns}")
        assert p.returncode != 0
        assert "eth0" in p.stdout + p.stderr and "already exists" in p.stdout + p.stderr
        assert run(["ip", "-n", ns, "link", "show", "eth0"]).stdout  # not ours: untouched
        _assert_nothing_left(node)
    finally:
        run(["ip", "netns", "del", ns], check=False)


def test_add_with_ipam_exhausted_fails_cleanly(node):
    node.ranges = [[{"subnet": "10.244.9.0/30"}]]  # .1 is the gateway: one address left
    node.write_conflist()
    a = node.add_pod("a")
    ns = f"{node.name}-b"
    run(["ip", "netns", "add", ns])
    try:
        p = node.cnitool("add", f"/run/netns/{ns}")
        assert p.returncode != 0
        err = p.stdout + p.stderr
        assert "10.244.9.0/30" in err, err
        assert "eth0" not in run(["ip", "-n", ns, "-o", "link"]).stdout
        assert len(_fry_links(node)) == 1 and len([x for x in node.ports() if x.startswith("fry")]) == 1
    finally:
        run(["ip", "netns", "del", ns], check=False)
    assert node.del_pod(a).returncode == 0
    node.pods.clear()
    _assert_nothing_left(node)
    run(["ip", "netns", "del", a.netns], check=False)


def test_add_into_a_missing_netns_fails_cleanly(node):
    p = node.cnitool("add", f"/run/netns/{node.name}-never-created")
    assert p.returncode != 0
    assert "does not exist" in p.stdout + p.stderr
    _assert_nothing_left(node)


def _direct(node, command: str, netns: str, cid: str, conf_overrides: dict | None = None,
            prev: dict | None = None) -> subprocess.CompletedProcess:
    """Exec the plugin as a runtime would (no cnitool), inside the Node's netns."""
    conf = dict(node.plugin_conf(), cniVersion="1.0.0", name="ferrynet", **(conf_overrides or {}))
    if prev is not None:
        conf["prevResult"] = prev
    env = dict(os.environ, CNI_COMMAND=command, CNI_CONTAINERID=cid, CNI_NETNS=netns, CNI_IFNAME="eth0",
               CNI_PATH=node.cni_bin)
    return subprocess.run(["ip", "netns", "exec", node.name, os.path.join(node.cni_bin, "ferry")],
                          check=False, input=json.dumps(conf), capture_output=True, text=True, env=env, timeout=60)


def test_add_with_vswitchd_down_rolls_back_everything(node):
    """ovsdb-server answers but ovs-vswitchd is gone (no ofport, no flow socket): the port insert,
    the veth and the addresses made before it are all undone."""
    warm = node.add_pod("warm")  # bridge and gateway exist
    with open(f"{node.ovs.dir}/ovs-vswitchd.pid") as f:
        os.kill(int(f.read()), signal.SIGKILL)
    ns = f"{node.name}-x"
    run(["ip", "netns", "add", ns])
    try:
        p = _direct(node, "ADD", f"/run/netns/{ns}", "cid-vswitchd-down")
        assert p.returncode != 0
        err = json.loads(p.stdout)
        assert err["code"] == 101 and "ovs-vswitchd running?" in err["msg"], err
        assert _fry_links(node) == [warm.host_veth]
        assert run(["ip", "-n", ns, "-o", "link"]).stdout.count("eth0") == 0
        assert [x for x in node.ovs.vsctl("list-ports", "br-int").split() if x.startswith("fry")] == [warm.host_veth]
        assert _ipam_allocations(node).count('"address": "10.244.') == 1
    finally:
        run(["ip", "netns", "del", ns], check=False)
    # vswitchd is gone: the fixture's DEL fails fast (no management socket) and still removes the netns.


def test_add_with_ovsdb_down_fails_cleanly(node):
    node.add_pod("warm")  # bridge and gateway exist
    with open(f"{node.ovs.dir}/ovsdb-server.pid") as f:
        os.kill(int(f.read()), signal.SIGKILL)
    ns = f"{node.name}-y"
    run(["ip", "netns", "add", ns])
    try:
        p = _direct(node, "ADD", f"/run/netns/{ns}", "cid-ovsdb-down")
        assert p.returncode != 0
        err = json.loads(p.stdout)
        assert err["code"] == 101, err
        assert len(_fry_links(node)) == 1  # only the warm Pod's
        assert run(["ip", "-n", ns, "-o", "link"]).stdout.count("eth0") == 0
        assert _ipam_allocations(node).count('"address": "10.244.') == 1
    finally:
        run(["ip", "netns", "del", ns], check=False)
    # OVS is gone: the fixture's DEL fails fast and still removes the netns.


@pytest.mark.parametrize("damage", ["address", "route", "port", "flows"])
def test_check_names_what_diverged(node, damage):
    a = node.add_pod("a")
    ok = node.cnitool("check", a.path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    if damage == "address":
        a.exec("ip", "addr", "del", a.result["ips"][0]["address"], "dev", "eth0")
        expect = "address " + a.result["ips"][0]["address"]
    elif damage == "route":
        a.exec("ip", "route", "del", "default")
        expect = "route 0.0.0.0/0"
    elif damage == "port":
        node.ovs.vsctl("del-port", "br-int", a.host_veth)
        expect = "OVS port"
    else:
        cid = node.ovs.vsctl("get", "port", a.host_veth, f"external_ids:{pl.EXT_CONTAINER_ID}").strip().strip('"')
        node.ovs.ofctl("del-flows", "br-int", f"cookie={pl.pod_cookie(cid, 'eth0').match()}")
        expect = "per-Pod flows missing"
    bad = node.cnitool("check", a.path)
    assert bad.returncode != 0
    assert expect in bad.stdout + bad.stderr, bad.stdout + bad.stderr


def test_add_and_del_clear_the_nodes_stale_neighbour_entries(node):
    """An address that comes back with a new Pod (new MAC) must not be sent to the old MAC."""
    warm = node.add_pod("warm")
    ip = warm.ip(4)
    node.exec("ip", "neigh", "replace", ip, "lladdr", "02:de:ad:00:00:01", "dev", "ferry-gw0", "nud", "stale")
    assert node.del_pod(warm).returncode == 0
    node.pods.clear()
    run(["ip", "netns", "del", warm.netns], check=False)
    assert "02:de:ad:00:00:01" not in node.exec("ip", "neigh", "show", "dev", "ferry-gw0").stdout
    # The next Pod gets another address; plant a stale entry for it before its ADD.
    node.exec("ip", "neigh", "replace", "10.244.1.3", "lladdr", "02:de:ad:00:00:02", "dev", "ferry-gw0",
              "nud", "stale")
    b = node.add_pod("b")
    assert b.ip(4) == "10.244.1.3"
    neigh = node.exec("ip", "neigh", "show", "10.244.1.3", "dev", "ferry-gw0").stdout
    assert "02:de:ad:00:00:02" not in neigh
    assert ping(node.name, b.ip(4))
    assert b.mac in node.exec("ip", "neigh", "show", "10.244.1.3", "dev", "ferry-gw0").stdout


def test_lock_files_do_not_pile_up(node):
    """One lock file per attachment while it lives; DEL removes it under the lock."""
    locks = node.dir / "state" / "locks"
    pods = [node.add_pod(n) for n in ("a", "b")]
    assert len([f for f in os.listdir(locks) if f.startswith("pod-")]) == 2
    for p in pods:
        assert node.del_pod(p).returncode == 0
        run(["ip", "netns", "del", p.netns], check=False)
    node.pods.clear()
    assert [f for f in os.listdir(locks) if f.startswith("pod-")] == []


def test_debug_log_gives_each_steps_duration(node):
    """logLevel debug: one line per ADD and per DEL naming every step with its milliseconds, the total
    no smaller than the steps; at the default level no such line."""
    node.add_pod("quiet")
    assert "timing (ms)" not in (node.dir / "cni.log").read_text()
    node.write_conflist(logLevel="debug")
    pod = node.add_pod("timed")
    assert node.del_pod(pod).returncode == 0
    lines = [x for x in (node.dir / "cni.log").read_text().splitlines() if "timing (ms)" in x]
    assert [x.split(" timing")[0].split()[-1] for x in lines] == ["ADD", "DEL"], lines
    for line, steps in zip(lines, (("IPAM", "per-Pod flows", "ofport of", "announce addresses"),
                                   ("find OVS port", "delete per-Pod flows", "wait for the veths to go",
                                    "IPAM release")),
                           strict=True):
        body, total = line.split("(ms): ", 1)[1].split("; total ")
        parts = {p.rsplit(" ", 1)[0]: float(p.rsplit(" ", 1)[1]) for p in body.split(", ")}
        assert all(any(k.startswith(s) for k in parts) for s in steps), (steps, parts)
        assert float(total) > 0 and float(total) >= sum(parts.values()) - 0.05 * len(parts)  # rounding


def test_below_1_1_0_results_leave_out_the_mtu_and_say_so_once(node):
    """A 1.0.0 conflist (what install-cni writes for containerd 1.6/1.7): results in 1.0.0 without
    the interface MTU, and one log line says what is off, not one per ADD; a 1.1.0 conflist has the
    MTU and says nothing."""
    assert node.cni_version == "1.0.0"
    pods = [node.add_pod(n) for n in ("a", "b")]
    for pod in pods:
        assert pod.result["cniVersion"] == "1.0.0"
        assert all("mtu" not in i for i in pod.result["interfaces"]), pod.result
    said = [x for x in (node.dir / "cni.log").read_text().splitlines() if "1.1 features off" in x]
    assert len(said) == 1, said
    assert "cniVersion 1.0.0" in said[0] and "interface eth0 mtu " in said[0] and "STATUS and GC" in said[0]
    assert (node.dir / "state" / "cni-version-noted-1.0.0").exists()

    node.cni_version = "1.1.0"
    node.write_conflist()
    c = node.add_pod("c")
    eth0 = next(i for i in c.result["interfaces"] if i.get("sandbox"))
    assert c.result["cniVersion"] == "1.1.0" and eth0["mtu"] >= 1280
    assert len([x for x in (node.dir / "cni.log").read_text().splitlines() if "1.1 features off" in x]) == 1
