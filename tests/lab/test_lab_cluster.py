"""ferry-lab on the real system: namespaces, one OVS per Node, the underlay, teardown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
import yaml

from lab import build, layout
from lab.api import CNI_CACHE, Lab, LabError, cnitool_container_id
from lab.manifest import STOP_AT_ENV, Manifest
from lab.sh import cmdline, running
from tests.support.waiting import until

pytestmark = pytest.mark.root
FERRY_LAB = [sys.executable, "-m", "lab.cli"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def namespaces_of(name: str) -> list[str]:
    try:
        return [ns for ns in os.listdir(build.NETNS_DIR) if ns.startswith(f"{name}-")]
    except FileNotFoundError:
        return []


def processes_of(lab_directory: str) -> list[int]:
    """Pids whose command line names the lab dir (OVS daemons, route-sync, echo servers)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and lab_directory in cmdline(int(entry)) and int(entry) != os.getpid():
            out.append(int(entry))
    return out


def root_links_of(name: str) -> list[str]:
    cp = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True)
    return [line for line in cp.stdout.splitlines() if name in line]


def _stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP): state T in /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def assert_gone(name: str, lab_directory: str) -> None:
    assert namespaces_of(name) == []
    assert processes_of(lab_directory) == []
    assert root_links_of(name) == []
    assert not os.path.exists(lab_directory)


def test_up_builds_the_default_topology(lab: Lab) -> None:
    assert sorted(namespaces_of(lab.name)) == sorted(
        f"{lab.name}-{s}" for s in ("seg-a", "seg-b", "router", "ext", "node-1", "node-2", "node-3"))
    for n in lab.nodes:
        assert n.vswitchd_answers(), n.name
        assert n.exec(["ovs-vsctl", "--timeout=5", "show"], check=True).returncode == 0
        # its own instance: the db socket lives under the Node's own directory
        assert os.path.exists(n.paths.db_sock) and lab.dir in n.paths.db_sock
        conf = n.paths.conflist
        assert os.path.exists(conf)
    n1, n2, n3 = lab.node("node-1"), lab.node("node-2"), lab.node("node-3")
    for dst in (n2.ipv4, n2.ipv6):  # same segment
        assert lab.ping(n1, dst), dst
    for dst in (n3.ipv4, n3.ipv6):  # across the router
        assert lab.ping(n1, dst), dst
    for dst in lab.external.addresses:
        assert lab.ping(n3, dst), dst
    assert lab.tcp(n1, n3.ipv6).peer == n1.ipv6  # no NAT on the underlay
    registry = layout.registry_dir(lab.dir)
    records = {}
    for f in sorted(os.listdir(registry)):
        with open(os.path.join(registry, f)) as fh:
            records[f] = yaml.safe_load(fh)
    assert list(records) == ["node-1.yaml", "node-2.yaml", "node-3.yaml"]
    # route-sync publishes each Node's uplink MAC (what peers' fast path needs) in its record
    for n in (n1, n2, n3):
        link = json.loads(n.exec(["ip", "-j", "link", "show", "eth0"], check=True).stdout)[0]
        assert records[f"{n.name}.yaml"]["annotations"] == {"ferry.io/mac-address": link["address"]}, n.name
    assert records["node-3.yaml"] == {"name": "node-3", "transportAddresses": ["192.168.88.13", "fd00:88::d"],
                                      "podCIDRs": ["10.244.3.0/24", "fd00:10:244:3::/64"],
                                      "annotations": records["node-3.yaml"]["annotations"]}
    assert len({r["annotations"]["ferry.io/mac-address"] for r in records.values()}) == 3
    assert Manifest.load(lab.dir).state == "up"


def test_down_after_up_leaves_nothing(lab_factory: Callable[..., Lab]) -> None:
    lab = lab_factory()
    pods = [lab.add_pod("node-1", "a")]
    assert lab.tcp(pods[0], lab.node("node-1").ipv4)  # an echo server is running now too
    ovs_pids = processes_of(lab.dir)
    assert len(ovs_pids) == 9  # 3 x (ovsdb-server + ovs-vswitchd + ferry-route-sync)
    rs_pids = {lab.route_sync_pid(n.name) for n in lab.nodes}
    assert None not in rs_pids and len(rs_pids) == 3 and rs_pids < set(ovs_pids)
    ns_pids = build.pids_in(namespaces_of(lab.name))
    assert set(ovs_pids) < set(ns_pids)  # + the echo server
    cache = os.path.join(CNI_CACHE, f"ferry-{cnitool_container_id('/run/netns/' + pods[0].netns)}-eth0")
    assert os.path.exists(cache)
    t0 = time.monotonic()
    lab.down()
    print(f"down: {time.monotonic() - t0:.3f}s")
    assert_gone(lab.name, lab.dir)
    assert not any(running(p) for p in ns_pids)
    assert not os.path.exists(cache)
    assert build.down(lab.name) is False  # a second down: nothing left to do


@pytest.mark.parametrize("kill_when", ["netns", "pidfile", "dir-only"])
def test_down_after_up_was_killed_half_way(kill_when: str, new_lab_name: Callable[[], str]) -> None:
    name = new_lab_name()
    directory = layout.lab_dir(name)
    # up stops itself at the step (lab.manifest.STOP_AT_ENV): the kill lands there, not wherever
    # a poll happened to catch it
    step = {"dir-only": "created"}.get(kill_when, kill_when)
    proc = subprocess.Popen([*FERRY_LAB, "up", "--name", name], cwd=REPO, env={**os.environ, STOP_AT_ENV: step},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until(lambda: proc.poll() is not None or _stopped(proc.pid), f"ferry-lab up to stop at {step}")
        assert proc.poll() is None, f"ferry-lab up ended ({proc.returncode}) before {step}"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert os.path.exists(directory)
        if kill_when != "dir-only":
            assert Manifest.load(directory).of_kind(kill_when), f"killed before any {kill_when} was on record"
        try:
            state = Manifest.load(directory).state
        except (OSError, ValueError):
            state = "none"
        print(f"killed at {kill_when}: manifest state {state}, namespaces {len(namespaces_of(name))}")
        cp = subprocess.run([*FERRY_LAB, "down", "--name", name], cwd=REPO, capture_output=True, text=True,
                            check=False)
        assert cp.returncode == 0, cp.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
        build.down(name)
    assert_gone(name, directory)


def test_up_twice_is_a_clear_error_and_keeps_the_first_lab(lab: Lab) -> None:
    with pytest.raises(LabError, match="already exists"):
        Lab.up(name=lab.name, cni_bin=lab.cni_bin)
    cp = subprocess.run([*FERRY_LAB, "up", "--name", lab.name], cwd=REPO, capture_output=True, text=True,
                            check=False)
    assert cp.returncode == 1 and "already exists" in cp.stderr and "down --name" in cp.stderr
    assert len(namespaces_of(lab.name)) == 7
    assert all(n.vswitchd_answers() for n in lab.nodes)
    assert lab.ping(lab.node("node-1"), lab.node("node-3").ipv4)


def test_up_refuses_namespaces_it_does_not_own(lab_factory: Callable[..., Lab],
                                               new_lab_name: Callable[[], str]) -> None:
    name = new_lab_name()
    subprocess.run(["ip", "netns", "add", f"{name}-router"], check=True)
    try:
        with pytest.raises(LabError, match="namespaces already exist"):
            lab_factory(name=name)
        assert namespaces_of(name) == [f"{name}-router"]  # nothing built around the foreign one
        assert not os.path.exists(layout.lab_dir(name))
    finally:
        subprocess.run(["ip", "netns", "del", f"{name}-router"], check=False)


def test_up_timing(lab_factory: Callable[..., Lab]) -> None:
    """How long up and down take, printed (a bound would depend on the machine; bench/ has the
    figures); the outcome is asserted: up, then nothing left."""
    t0 = time.monotonic()
    lab = lab_factory()
    up_s = time.monotonic() - t0
    assert Manifest.load(lab.dir).state == "up"
    t0 = time.monotonic()
    lab.down()
    down_s = time.monotonic() - t0
    print(f"up {up_s:.3f}s down {down_s:.3f}s")
    assert_gone(lab.name, lab.dir)


def test_route_sync_that_dies_fails_up_cleanly(monkeypatch: pytest.MonkeyPatch,
                                               new_lab_name: Callable[[], str]) -> None:
    """route-sync exiting before it writes the state file: a clear error, and nothing left behind."""
    monkeypatch.setenv("FERRY_ROUTE_SYNC", "/bin/false")
    name = new_lab_name()
    with pytest.raises(LabError, match=r"ferry-route-sync on node-\d exited \(rc=1\) before writing"):
        # startTimeout only bounds a hang: the exit is what ends the wait
        Lab.up({"routeSync": {"trafficEncapMode": "encap", "startTimeout": 60}}, name=name, cni_bin="/nonexistent")
    assert_gone(name, layout.lab_dir(name))
