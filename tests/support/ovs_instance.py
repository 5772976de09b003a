"""Test helpers: a private Open vSwitch instance, and throw-away network namespaces.

    from tests.support.ovs_instance import OvsInstance, netns

    with netns("xx-node") as ns, OvsInstance("xx-node", netns=ns) as ovs:
        ovs.vsctl("add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev")
        ovs.ofctl("dump-flows", "br-int")
        ovs.db        # "unix:<dir>/db.sock"   (for cni.ovs.ovsdb.Ovsdb)
        ovs.run_dir   # where <bridge>.mgmt lives (for cni.ovs.openflow.bridge.OpenFlow)

Each instance has its own OVS_RUNDIR/OVS_DBDIR/OVS_LOGDIR (see docs/design/tests.md), so
several run side by side without the OVS kernel module (use datapath_type=netdev).  Run each
instance in its own namespace (``netns=``) when several may run at once: a netdev datapath
creates tap devices (``ovs-netdev``, internal ports) in vswitchd's namespace.  ``stop()``
kills both daemons and removes the directory.  Names you pass should carry your test area's
prefix; the directory name also gets a random suffix.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Self

SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"


def _run(argv: list[str], env: dict[str, str] | None = None, input: str | None = None) -> str:
    p = subprocess.run(argv, check=False, env=env, input=input, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie of ours counts as dead.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class OvsInstance:
    """ovsdb-server + ovs-vswitchd with private run/db/log directories, optionally in a netns."""

    def __init__(self, name: str, netns: str | None = None, start: bool = True) -> None:
        self.name = name
        self.netns = netns
        self.dir = tempfile.mkdtemp(prefix=f"ovs-{name}-", dir="/tmp")
        self.env = dict(os.environ, OVS_RUNDIR=self.dir, OVS_DBDIR=self.dir, OVS_LOGDIR=self.dir)
        self._pids: list[int] = []
        if start:
            try:
                self.start()
            except BaseException:
                self.stop()
                raise

    @property
    def db(self) -> str:
        return f"unix:{self.dir}/db.sock"

    @property
    def run_dir(self) -> str:
        return self.dir

    def _in_ns(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else argv

    def start(self) -> None:
        d = self.dir
        _run(["ovsdb-tool", "create", f"{d}/conf.db", SCHEMA], self.env)
        _run(self._in_ns(["ovsdb-server", f"{d}/conf.db", f"--remote=punix:{d}/db.sock",
                          f"--pidfile={d}/ovsdb-server.pid", f"--log-file={d}/ovsdb-server.log",
                          f"--unixctl={d}/ovsdb-server.ctl", "--detach", "--no-chdir"]), self.env)
        self._pids.append(self._pid("ovsdb-server"))
        self.vsctl("--no-wait", "init")
        _run(self._in_ns(["ovs-vswitchd", self.db, f"--pidfile={d}/ovs-vswitchd.pid",
                          f"--log-file={d}/ovs-vswitchd.log", f"--unixctl={d}/ovs-vswitchd.ctl",
                          "--detach", "--no-chdir"]), self.env)
        self._pids.append(self._pid("ovs-vswitchd"))

    def _pid(self, daemon: str) -> int:
        with open(f"{self.dir}/{daemon}.pid") as f:
            return int(f.read().strip())

    def vsctl(self, *args: str) -> str:
        return _run(["ovs-vsctl", f"--db={self.db}", "--timeout=10", *args], self.env)

    def ofctl(self, command: str, bridge: str, *args: str, input: str | None = None) -> str:
        """``ovs-ofctl -O OpenFlow13,OpenFlow14 COMMAND unix:<dir>/<bridge>.mgmt ARGS``."""
        return _run(["ovs-ofctl", "-O", "OpenFlow13,OpenFlow14", command,
                     f"unix:{self.dir}/{bridge}.mgmt", *args], self.env, input)

    def appctl(self, *args: str) -> str:
        return _run(["ovs-appctl", "-t", f"{self.dir}/ovs-vswitchd.ctl", *args], self.env)

    def stop(self) -> None:
        if len(self._pids) == 2:  # vswitchd up: let it remove its datapaths and tap devices
            subprocess.run(["ovs-appctl", "-t", f"{self.dir}/ovs-vswitchd.ctl", "--timeout=5", "exit",
                            "--cleanup"], check=False, capture_output=True, env=self.env)
        for pid in reversed(self._pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        for pid in self._pids:
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        self._pids.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


@contextmanager
def netns(name: str) -> Iterator[str]:
    """Create network namespace ``name`` (loopback up), yield its name, delete it afterwards."""
    _run(["ip", "netns", "add", name])
    try:
        _run(["ip", "-n", name, "link", "set", "lo", "up"])
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def netns_path(name: str) -> str:
    return f"/run/netns/{name}"
