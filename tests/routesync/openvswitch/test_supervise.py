"""Ferry's openvswitch container's process (``ferry-route-sync ovs``), run for real in a network
namespace: the daemons it starts, what it does when one of them dies, what SIGTERM leaves behind,
the schema conversion an image update brings, and ``ovsDaemons: host``, which starts nothing.

The test synchronises on the supervisor's own log lines (read from its stderr as they come) and on
the daemons' answers, never on time."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from routesync.openvswitch.plan import SCHEMA
from tests.support import wireguard_go
from tests.support.names import uniq
from tests.support.ovs_instance import OvsInstance, netns
from tests.support.waiting import HANG, until

pytestmark = pytest.mark.root


class Supervised:
    """One ``ferry-route-sync ovs`` process and its stderr, line by line."""

    def __init__(self, ns: str, root: Path, daemons: str = "ferry", run_dir: Path | None = None,
                 **keys: object) -> None:
        self.ns, self.root = ns, root
        self.run_dir = run_dir or root / "run"
        self.database = root / "lib" / "conf.db"
        self.state_dir = root / "state"
        cfg = root / "route-sync.yaml"
        cfg.write_text(yaml.safe_dump({
            "nodeName": "n1", "ovsDaemons": daemons, "ovsRunDir": str(self.run_dir),
            "ovsdb": f"unix:{self.run_dir}/db.sock", "ovsDatabase": str(self.database),
            "ovsLogDir": str(root / "log"), "stateFile": str(self.state_dir / "node-state.json"),
            "transportInterface": "eth0", "bridge": "br-int", **keys}))
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", "from routesync.cli import main; main()",
             "ovs", "--config", str(cfg)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            cwd=str(Path(__file__).resolve().parents[3]))
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line.rstrip("\n"))
        self.lines.put("<eof>")

    def expect(self, pattern: str) -> re.Match[str]:
        """The next log line matching ``pattern`` (earlier ones are kept in ``seen``)."""
        while True:
            try:
                line = self.lines.get(timeout=HANG)
            except queue.Empty:
                raise AssertionError(f"no log line {pattern!r}; so far: {self.seen[-15:]}") from None
            if line == "<eof>":
                raise AssertionError(f"exited ({self.proc.wait()}) before {pattern!r}: {self.seen[-15:]}")
            self.seen.append(line)
            found = re.search(pattern, line)
            if found:
                return found

    def env(self) -> dict[str, str]:
        return {**os.environ, "OVS_RUNDIR": str(self.run_dir)}

    def vsctl(self, *args: str) -> str:
        return subprocess.run(["ovs-vsctl", f"--db=unix:{self.run_dir}/db.sock", "--timeout=30", *args],
                              env=self.env(), capture_output=True, text=True, check=True).stdout

    def answers(self, daemon: str) -> bool:
        cp = subprocess.run(["ovs-appctl", "-T", "10", "-t", daemon, "version"], env=self.env(),
                            capture_output=True, text=True, check=False)
        return cp.returncode == 0

    def pid(self, daemon: str) -> int | None:
        """The pid in ``daemon``'s pidfile; None while a starting daemon is (re)writing it."""
        try:
            return int((self.run_dir / f"{daemon}.pid").read_text())
        except (OSError, ValueError):
            return None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=HANG)


def daemons_in(ns: str) -> list[str]:
    """The Open vSwitch daemons running in ``ns`` (``ip netns pids``)."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=True).stdout.split()
    out = []
    for pid in pids:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm in ("ovsdb-server", "ovs-vswitchd"):
            out.append(comm)
    return sorted(out)


@pytest.fixture
def ns() -> Iterator[str]:
    with netns(uniq("ovs")) as name:
        yield name


def test_runs_restarts_a_dead_daemon_and_keeps_the_database(ns: str, tmp_path: Path) -> None:
    s = Supervised(ns, tmp_path)
    try:
        s.expect(r"ovsdb-tool create")
        s.expect(r"openvswitch: running")
        assert daemons_in(ns) == ["ovs-vswitchd", "ovsdb-server"]
        s.vsctl("add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev",
                "--", "add-port", "br0", "p0", "--", "set", "interface", "p0", "type=internal",
                "external_ids:ferry-owner=pod")

        old = s.pid("ovs-vswitchd")
        assert old is not None
        os.kill(old, signal.SIGKILL)
        s.expect(r"ovs-vswitchd exited \(-9\): starting it again")
        new = int(s.expect(r"ovs-vswitchd started \(pid (\d+)\)").group(1))
        assert new != old
        until(lambda: s.pid("ovs-vswitchd") == new and s.answers("ovs-vswitchd"), "the new ovs-vswitchd to answer")
        # the new ovs-vswitchd took the bridge over from the database (vsctl waits for it)
        s.vsctl("add-port", "br0", "p1", "--", "set", "interface", "p1", "type=internal")

        server = s.pid("ovsdb-server")
        assert server is not None
        os.kill(server, signal.SIGKILL)
        s.expect(r"ovsdb-server exited \(-9\): starting it again")
        s.expect(r"ovsdb-server started")
        # ovs-vswitchd (the same one) reconnected: a change is applied again
        s.vsctl("add-port", "br0", "p2", "--", "set", "interface", "p2", "type=internal")
        assert s.pid("ovs-vswitchd") == new

        assert s.stop() == 0
        assert daemons_in(ns) == []
        links = subprocess.run(["ip", "-n", ns, "-o", "link"], capture_output=True, text=True, check=True).stdout
        assert " p0:" in links  # the Pods' internal ports outlive the daemons (netdev taps)
    finally:
        s.stop()

    again = Supervised(ns, tmp_path)  # the next container: same host paths
    try:
        again.expect(r"openvswitch: running")
        assert not any("ovsdb-tool create" in line for line in again.seen)
        assert again.vsctl("get", "interface", "p0", "external_ids:ferry-owner").strip() == "pod"
        assert set(again.vsctl("list-ports", "br0").split()) == {"p0", "p1", "p2"}
    finally:
        assert again.stop() == 0


def test_an_image_with_a_newer_schema_converts_the_database(ns: str, tmp_path: Path) -> None:
    """An older schema (an earlier image's): version 8.0.0 and without Bridge.datapath_version."""
    schema = json.loads(Path(SCHEMA).read_text())
    old = json.loads(json.dumps(schema))
    old["version"] = "8.0.0"
    del old["tables"]["Bridge"]["columns"]["datapath_version"]
    old_file = tmp_path / "old.ovsschema"
    old_file.write_text(json.dumps(old))
    (tmp_path / "lib").mkdir()
    subprocess.run(["ovsdb-tool", "create", str(tmp_path / "lib" / "conf.db"), str(old_file)], check=True)

    s = Supervised(ns, tmp_path)
    try:
        s.expect(r"ovsdb-tool convert")
        s.expect(r"openvswitch: running")
        version = subprocess.run(["ovsdb-tool", "db-version", str(s.database)], capture_output=True, text=True,
                                 check=True).stdout.strip()
        assert version == schema["version"]
        assert (tmp_path / "lib" / "conf.db.before-convert").exists()
        s.vsctl("add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev")
        assert s.vsctl("get", "bridge", "br0", "datapath_version")  # the new column exists
    finally:
        assert s.stop() == 0


def test_ovs_daemons_host_starts_nothing_and_leaves_the_hosts_alone(ns: str, tmp_path: Path) -> None:
    with OvsInstance(uniq("ovh"), netns=ns) as host:
        s = Supervised(ns, tmp_path, daemons="host", run_dir=Path(host.run_dir))
        try:
            s.expect(r"the host's Open vSwitch answers; nothing to run")
            assert daemons_in(ns) == ["ovs-vswitchd", "ovsdb-server"]  # the host's two only
            assert not (tmp_path / "lib" / "conf.db").exists()
        finally:
            assert s.stop() == 0
        assert daemons_in(ns) == ["ovs-vswitchd", "ovsdb-server"]
        host.vsctl("add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev")


def test_ovs_daemons_host_still_runs_the_userspace_wireguard_device(ns: str, tmp_path: Path) -> None:
    """``ovsDaemons: host`` with WireGuard in userspace (``startUserspace: false``): the container
    runs wireguard-go once the host's Open vSwitch answers, starts it again when it dies, and
    stops it on SIGTERM, leaving the host's daemons alone: the device outlives route-sync's
    container with either ovsDaemons."""
    wg = wireguard_go.binary()
    assert wg is not None, "wireguard-go is built by .ci/install.sh (tools/build-go-tools.sh wireguard-go)"
    iface = uniq("wgh")[:15]
    wg_dir = tmp_path / "wg"
    with OvsInstance(uniq("ovh"), netns=ns) as host:
        s = Supervised(ns, tmp_path, daemons="host", run_dir=Path(host.run_dir),
                       trafficEncryptionMode="wireguard",
                       wireguard={"startUserspace": False, "implementation": "userspace", "interface": iface,
                                  "userspaceCommand": wg, "runDir": str(wg_dir), "keyDir": str(tmp_path / "keys")})
        try:
            first = int(s.expect(r"wireguard-go started \(pid (\d+)\)").group(1))
            s.expect(r"the host's Open vSwitch answers; running wireguard-go")
            until(lambda: (wg_dir / f"{iface}.sock").exists(), "wireguard-go's UAPI socket")
            assert link_exists(ns, iface)
            os.kill(first, signal.SIGKILL)
            s.expect(r"wireguard-go exited .*: starting it again")
            again = int(s.expect(r"wireguard-go started \(pid (\d+)\)").group(1))
            assert again != first
            until(lambda: link_exists(ns, iface), "the device made again")
            assert daemons_in(ns) == ["ovs-vswitchd", "ovsdb-server"]  # the host's two only
        finally:
            assert s.stop() == 0
        until(lambda: not link_exists(ns, iface), "wireguard-go stopped with the container")
        assert daemons_in(ns) == ["ovs-vswitchd", "ovsdb-server"]


def link_exists(ns: str, name: str) -> bool:
    return subprocess.run(["ip", "-n", ns, "link", "show", name], capture_output=True, check=False).returncode == 0


def test_stopping_puts_a_moved_uplink_back_first(ns: str, tmp_path: Path) -> None:
    """route-sync moved the Node's uplink onto the bridge (its address on an internal port): once
    Open vSwitch stops, that address answers no more.  SIGTERM (the Ferry Pod deleted, a new image)
    first gives the address back to the physical link, so the Node stays reachable (and its
    kubelet can report the old Pod gone)."""
    from routesync.apply.ovs import OvsApplier
    from routesync.apply.uplink import UplinkMover, recorded_spec
    from routesync.config import load

    with netns(uniq("ovp")) as peer:
        subprocess.run(["ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", "up0",
                        "netns", peer], check=True)
        for where, dev, address in ((ns, "eth0", "192.168.61.1/24"), (peer, "up0", "192.168.61.2/24")):
            subprocess.run(["ip", "-n", where, "addr", "add", address, "dev", dev], check=True)
            subprocess.run(["ip", "-n", where, "link", "set", dev, "up"], check=True)
            subprocess.run(["ip", "netns", "exec", where, "ethtool", "-K", dev, "tx", "off"], check=True,
                           capture_output=True)
        s = Supervised(ns, tmp_path)
        try:
            s.expect(r"openvswitch: running")
            s.vsctl("add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev")
            cfg = load(str(tmp_path / "route-sync.yaml"))
            ovs = OvsApplier(cfg.ovsdb, cfg.bridge, cfg.ovs_run_dir)
            mover = UplinkMover(ovs, recorded_spec(cfg), str(s.state_dir), "netdev", netns=ns)
            try:
                mover.move()
                assert (s.state_dir / "uplink.json").exists()
            finally:
                mover.close()
                ovs.close()
            ping = ["ip", "netns", "exec", peer, "ping", "-c", "1", "-W", "5", "192.168.61.1"]
            assert subprocess.run(ping, capture_output=True, check=False).returncode == 0  # through OVS

            assert s.stop() == 0
            assert any("uplink eth0 is back off the bridge" in line for line in s.seen + _rest(s))
            assert not (s.state_dir / "uplink.json").exists()
            assert daemons_in(ns) == []
            addrs = subprocess.run(["ip", "-n", ns, "-o", "addr", "show", "dev", "eth0"], capture_output=True,
                                   text=True, check=True).stdout
            assert "192.168.61.1/24" in addrs
            assert subprocess.run(ping, capture_output=True, check=False).returncode == 0  # without OVS
        finally:
            s.stop()


def _rest(s: Supervised) -> list[str]:
    """The log lines not read yet (the process has exited)."""
    out = []
    while True:
        line = s.lines.get(timeout=HANG)
        if line == "<eof>":
            return out
        out.append(line)


def manifest_probe(run_dir: str) -> list[str]:
    """deploy/ferry.yaml's probe of the openvswitch container, pointed at ``run_dir``."""
    docs = list(yaml.safe_load_all((Path(__file__).resolve().parents[3] / "deploy" / "ferry.yaml").read_text()))
    pod = next(d for d in docs if d and d["kind"] == "DaemonSet"
               and d["metadata"]["name"] == "ferry-openvswitch")["spec"]["template"]["spec"]
    ovs = next(c for c in pod["containers"] if c["name"] == "openvswitch")
    assert ovs["startupProbe"]["exec"] == ovs["livenessProbe"]["exec"] == ovs["readinessProbe"]["exec"]
    argv = ovs["livenessProbe"]["exec"]["command"]
    return [a.replace("/var/run/openvswitch", run_dir) for a in argv]


def manifest_wait(run_dir: str) -> list[str]:
    """deploy/ferry.yaml's wait of route-sync's Pod for the Node's Open vSwitch (the init container
    ``wait-openvswitch``), pointed at ``run_dir``."""
    docs = list(yaml.safe_load_all((Path(__file__).resolve().parents[3] / "deploy" / "ferry.yaml").read_text()))
    pod = next(d for d in docs if d and d["kind"] == "DaemonSet" and d["metadata"]["name"] == "ferry")
    wait = next(c for c in pod["spec"]["template"]["spec"]["initContainers"] if c["name"] == "wait-openvswitch")
    return [a.replace("/var/run/openvswitch", run_dir) for a in wait["command"]]


@contextmanager
def host_ovs(ns: str, d: Path) -> Iterator[Path]:
    """Open vSwitch as a host's packages start it: default control socket names (``<daemon>.<pid>.ctl``)."""
    env = {**os.environ, "OVS_RUNDIR": str(d), "OVS_DBDIR": str(d), "OVS_LOGDIR": str(d)}
    d.mkdir()
    subprocess.run(["ovsdb-tool", "create", str(d / "conf.db"), SCHEMA], env=env, check=True)
    try:
        for argv in (["ovsdb-server", str(d / "conf.db"), f"--remote=punix:{d}/db.sock"],
                     ["ovs-vswitchd", f"unix:{d}/db.sock"]):
            name = argv[0]
            subprocess.run(["ip", "netns", "exec", ns, *argv, f"--pidfile={d}/{name}.pid", "--detach",
                            "--no-chdir", f"--log-file={d}/{name}.log"], env=env, check=True, capture_output=True)
        yield d
    finally:
        for name in ("ovs-vswitchd", "ovsdb-server"):
            try:
                os.kill(int((d / f"{name}.pid").read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass


def test_the_manifests_probe_works_from_another_pid_namespace(ns: str, tmp_path: Path) -> None:
    """The probe runs in the openvswitch container; with ovsDaemons host the daemons' pids are the
    host's, which the container's PID namespace does not have (``ovs-appctl -t ovs-vswitchd``
    refused them as stale): it passes while both daemons answer, fails when one is gone."""
    with host_ovs(ns, tmp_path / "host") as run_dir:
        probe = ["unshare", "--pid", "--fork", "--mount-proc", *manifest_probe(str(run_dir))]
        cp = subprocess.run(probe, capture_output=True, text=True, check=False)
        assert cp.returncode == 0, cp.stderr
        vswitchd = int((run_dir / "ovs-vswitchd.pid").read_text())
        os.kill(vswitchd, signal.SIGKILL)
        until(lambda: not Path(f"/proc/{vswitchd}").exists(), "ovs-vswitchd to exit")
        assert subprocess.run(probe, capture_output=True, check=False).returncode != 0


def test_route_syncs_pod_waits_until_both_daemons_answer(ns: str, tmp_path: Path) -> None:
    """The wait started before any daemon (no pidfile, no socket: route-sync's Pod scheduled before
    the Node's Open vSwitch is up) does not give up: it ends, with success, once both answer, from
    another PID namespace as in its container."""
    run_dir = tmp_path / "host"
    run_dir.mkdir()
    wait = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", *manifest_wait(str(run_dir))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_dir.rmdir()  # host_ovs makes it: the wait saw it empty, then sees the daemons come
        with host_ovs(ns, run_dir):
            _, err = wait.communicate(timeout=HANG)
            assert wait.returncode == 0, err
    finally:
        if wait.poll() is None:
            wait.kill()
            wait.wait()


def test_a_new_supervisor_waits_for_the_previous_one_then_restores_its_flows(ns: str, tmp_path: Path) -> None:
    """Two Open vSwitch Pods of one Node at once (the new one started while the old one stops, or
    an upgrade from the layout that ran Open vSwitch in route-sync's Pod): the new supervisor starts
    nothing while the old ovsdb-server holds the database, and starts the moment it exits, with the
    flows the old one saved at its SIGTERM."""
    old = Supervised(ns, tmp_path)
    new: Supervised | None = None
    try:
        old.expect(r"openvswitch: running")
        old.vsctl("add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev")
        subprocess.run(["ovs-ofctl", "add-flow", f"unix:{old.run_dir}/br0.mgmt",
                        "table=0,priority=7,cookie=0x42,ip,nw_dst=10.9.8.7,actions=drop"], check=True)
        daemons = {d: old.pid(d) for d in ("ovsdb-server", "ovs-vswitchd")}
        new = Supervised(ns, tmp_path)
        new.expect(r"another ovsdb-server holds .*: waiting for it to exit")
        assert {d: old.pid(d) for d in daemons} == daemons and daemons_in(ns) == ["ovs-vswitchd", "ovsdb-server"]
        assert old.stop() == 0  # saves the flows once more, stops ovs-vswitchd, then ovsdb-server
        new.expect(r"the previous ovsdb-server exited: starting")
        new.expect(r"flows restored on br0 \(\d+ flows")
        new.expect(r"openvswitch: running")
        flows = subprocess.run(["ovs-ofctl", "dump-flows", f"unix:{new.run_dir}/br0.mgmt"], capture_output=True,
                               text=True, check=True).stdout
        assert "nw_dst=10.9.8.7" in flows and "cookie=0x42" in flows, flows
        assert daemons_in(ns) == ["ovs-vswitchd", "ovsdb-server"]
        assert new.pid("ovsdb-server") not in (None, daemons["ovsdb-server"])
    finally:
        old.stop()
        if new is not None:
            assert new.stop() == 0
