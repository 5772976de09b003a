"""One private OVS instance (ovsdb-server + ovs-vswitchd) per simulated Node, started inside
the Node's namespace with its own OVS_RUNDIR/OVS_DBDIR/OVS_LOGDIR (docs/design/tests.md)."""

from __future__ import annotations

import os
import signal

from lab.layout import NodePaths
from lab.manifest import Manifest
from lab.sh import LabError, pids_named, run, running

SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"
DAEMONS = ("ovsdb-server", "ovs-vswitchd")


def pidfile(paths: NodePaths, daemon: str) -> str:
    return os.path.join(paths.ovs, f"{daemon}.pid")


def env(paths: NodePaths) -> dict[str, str]:
    return {**os.environ, **paths.ovs_env()}


def start(netns: str, paths: NodePaths, manifest: Manifest, timeout: float = 30.0) -> None:
    """Create the database and start both daemons; returns when ovs-vswitchd is connected.

    ``--detach`` returns only once each daemon is ready (pidfile written, db socket listening,
    vswitchd configured from the db), so no polling is needed."""
    e = env(paths)
    os.makedirs(paths.ovs, exist_ok=True)
    db = os.path.join(paths.ovs, "conf.db")
    if not os.path.exists(db):
        run(["ovsdb-tool", "create", db, SCHEMA], env=e)
    for d in DAEMONS:
        manifest.record("pidfile", path=pidfile(paths, d), netns=netns)
    run(["ovsdb-server", db, f"--remote=punix:{paths.db_sock}", f"--pidfile={pidfile(paths, 'ovsdb-server')}",
         f"--log-file={os.path.join(paths.ovs, 'ovsdb-server.log')}", "--detach", "--no-chdir"],
        netns=netns, env=e, timeout=timeout)
    run(["ovs-vsctl", f"--db=unix:{paths.db_sock}", f"--timeout={int(timeout)}", "--no-wait", "init"],
        env=e, timeout=timeout)
    start_vswitchd(netns, paths, timeout)


def start_vswitchd(netns: str, paths: NodePaths, timeout: float = 30.0) -> None:
    """ovs-vswitchd alone (``--detach``: returns once it is configured from the database)."""
    run(["ovs-vswitchd", f"unix:{paths.db_sock}", f"--pidfile={pidfile(paths, 'ovs-vswitchd')}",
         f"--log-file={os.path.join(paths.ovs, 'ovs-vswitchd.log')}", "--detach", "--no-chdir"],
        netns=netns, env=env(paths), timeout=timeout)


def stop_vswitchd(paths: NodePaths, sig: int = signal.SIGKILL, timeout: float = 30.0) -> int | None:
    """Signal ovs-vswitchd and wait until it is gone; its pid, or None when none ran.  Flows
    die with it; ports, internal (tap) devices and the database stay."""
    import time

    pid = read_pid(pidfile(paths, "ovs-vswitchd"))
    if pid is None or not alive(pid):
        return None
    signal_pid(pid, sig)
    deadline = time.monotonic() + timeout
    while running(pid):
        if time.monotonic() > deadline:
            raise LabError(f"ovs-vswitchd {pid} did not exit")
        time.sleep(0.005)
    return pid



def kill_and_await_restart(netns: str, paths: NodePaths, sig: int = signal.SIGKILL, timeout: float = 60.0) -> None:
    """An ovs-vswitchd the lab did not start (Ferry's openvswitch container, whose pidfile holds a
    pid of the container's PID namespace): signal it by its host pid, then wait until its
    supervisor's new one answers."""
    import time

    old = pids_named(netns, "ovs-vswitchd")
    if not old:
        raise LabError(f"no ovs-vswitchd runs in {netns}")
    for pid in old:
        signal_pid(pid, sig)
    deadline = time.monotonic() + timeout
    while not (set(pids_named(netns, "ovs-vswitchd")) - set(old) and vswitchd_answers(paths, timeout=5)):
        if time.monotonic() > deadline:
            raise LabError(f"ovs-vswitchd in {netns} was not started again within {timeout:.0f} s")
        time.sleep(0.01)


def read_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def vswitchd_answers(paths: NodePaths, timeout: float = 30.0) -> bool:
    """ovs-vswitchd answers on its control socket (``timeout`` bounds a hung daemon only)."""
    pid = read_pid(pidfile(paths, "ovs-vswitchd"))
    if pid is None:
        return False
    ctl = os.path.join(paths.ovs, f"ovs-vswitchd.{pid}.ctl")
    cp = run(["ovs-appctl", f"--timeout={int(timeout)}", "-t", ctl, "version"], env=env(paths), check=False)
    return cp.returncode == 0 and "ovs-vswitchd" in cp.stdout


def vsctl(paths: NodePaths, *args: str, timeout: float = 10.0) -> str:
    cp = run(["ovs-vsctl", f"--db=unix:{paths.db_sock}", f"--timeout={int(timeout)}", *args],
             env=env(paths), timeout=timeout + 2)
    return cp.stdout


def signal_pid(pid: int, sig: int = signal.SIGTERM) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError as e:
        raise LabError(f"cannot signal pid {pid}: {e}") from None
