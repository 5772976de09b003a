"""Ferry's ``openvswitch`` container (``ferry-route-sync ovs``): ovsdb-server and ovs-vswitchd for
a Node that has no Open vSwitch of its own, or, with ``ovsDaemons: host``, a watch on the host's.

The supervisor is the daemons' parent (they run in the foreground), so it learns of an exit from
SIGCHLD, not by polling: it waits in ``sigwaitinfo`` for SIGCHLD, SIGTERM and SIGINT, all three
blocked in it and unblocked in the daemons.  A daemon that exits is started again at once
(:class:`.plan.RestartBudget`); ovs-vswitchd's restart costs the flows, which route-sync puts back
when it sees the new instance (:meth:`routesync.apply.ovs.OvsApplier.vswitchd_instance`).
SIGTERM stops ovs-vswitchd, then ovsdb-server; the database stays on its host path, so the next
container finds the bridge, the Pods' ports and their ``external_ids``."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence

from .plan import OVSDB_SERVER, Layout, Plan, RestartBudget, plan

log = logging.getLogger(__name__)

WAITED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}
STOP_TIMEOUT = 10.0  # seconds a daemon has to exit on SIGTERM before SIGKILL


class SupervisorError(RuntimeError):
    """A step before the daemons failed (database create/convert, the first connection)."""


def _unblock() -> None:  # in the child, before exec: the daemons handle their own signals
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def needs_conversion(layout: Layout, env: dict[str, str]) -> bool:
    cp = subprocess.run(["ovsdb-tool", "needs-conversion", layout.database, layout.schema],
                        env=env, capture_output=True, text=True, check=False)
    if cp.returncode != 0:
        raise SupervisorError(f"ovsdb-tool needs-conversion {layout.database}: {cp.stderr.strip()}")
    return cp.stdout.strip() == "yes"


def run_step(argv: Sequence[str], env: dict[str, str]) -> None:
    cp = subprocess.run(list(argv), env=env, capture_output=True, text=True, check=False)
    if cp.returncode != 0:
        raise SupervisorError(f"{' '.join(argv)}: {cp.stderr.strip() or f'exit {cp.returncode}'}")


def wait_for_database(layout: Layout, env: dict[str, str], child: subprocess.Popen[bytes],
                      timeout: float = 60.0) -> None:
    """Blocks until ovsdb-server (``child``) accepts a connection on its socket, then initialises
    the Open_vSwitch row of a new database (``init`` is idempotent).  The socket is tried every
    10 ms (``ovs-vsctl --retry`` backs off to a second between tries: a second of every restart's
    gap)."""
    deadline = time.monotonic() + timeout
    while not _accepts(layout.db_sock):
        if child.poll() is not None:
            raise SupervisorError(f"ovsdb-server exited ({child.returncode}) before it listened on "
                                  f"{layout.db_sock}; see {layout.log_file(OVSDB_SERVER)}")
        if time.monotonic() > deadline:
            raise SupervisorError(f"ovsdb-server did not listen on {layout.db_sock} within {timeout:.0f} s")
        time.sleep(0.01)
    run_step(["ovs-vsctl", f"--db=unix:{layout.db_sock}", f"--timeout={int(timeout)}", "--no-wait", "init"], env)


def _accepts(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            return False
    return True


class Supervisor:
    def __init__(self, layout: Layout, load_module: bool = False, budget: RestartBudget | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 before_stop: Callable[[], None] | None = None,
                 extra: Sequence[tuple[str, Sequence[str]]] = ()) -> None:
        self.layout = layout
        # further daemons of the Node started after Open vSwitch's and supervised alike (the
        # userspace WireGuard device, routesync/wireguard/device.py): (name, argv)
        self.extra = tuple((n, tuple(a)) for n, a in extra)
        # run while the daemons still answer, before they are stopped (the CLI's: put the Node's
        # uplink back off the bridge); an exception is logged, the daemons stop all the same
        self.before_stop = before_stop
        self.load_module = load_module  # the system datapath: modprobe openvswitch first
        self.budget = budget or RestartBudget()
        self.clock = clock
        self.env = {**os.environ, **layout.env()}
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: dict[str, tuple[float, ...]] = {}

    # -- start
    def prepare(self) -> Plan:
        for d in (self.layout.run_dir, os.path.dirname(self.layout.database), self.layout.log_dir):
            os.makedirs(d, exist_ok=True)
        exists = os.path.exists(self.layout.database)
        p = plan(self.layout, exists, exists and needs_conversion(self.layout, self.env))
        for step in p.database_steps:
            log.info("openvswitch: %s", " ".join(step))
            run_step(step, self.env)
        if self.load_module:
            cp = subprocess.run(["modprobe", "openvswitch"], capture_output=True, text=True, check=False)
            if cp.returncode != 0:
                log.warning("openvswitch: modprobe openvswitch: %s (the system datapath needs the "
                            "kernel module)", cp.stderr.strip())
        return p

    def start(self, name: str, argv: Sequence[str]) -> None:
        # preexec_fn is safe here: the supervisor has no other thread
        child = subprocess.Popen(list(argv), env=self.env, stdin=subprocess.DEVNULL,
                                 preexec_fn=_unblock)  # noqa: PLW1509
        self.children[name] = child
        if name == OVSDB_SERVER:  # ovs-vswitchd (and a restarted one's clients) need it to answer
            wait_for_database(self.layout, self.env, child)
        log.info("openvswitch: %s started (pid %d)", name, child.pid)

    # -- stop
    def stop(self) -> None:
        if self.before_stop is not None and self.children:
            try:
                self.before_stop()
            except Exception as e:  # noqa: BLE001 - whatever failed, the daemons must stop
                log.error("openvswitch: before stopping: %s", e)
        for name in reversed(list(self.children)):
            child = self.children.pop(name)
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    log.warning("openvswitch: %s did not exit on SIGTERM: SIGKILL", name)
                    child.kill()
                    child.wait()
            log.info("openvswitch: %s stopped (%s)", name, child.returncode)

    # -- the loop
    def exited(self) -> list[str]:
        return [name for name, child in self.children.items() if child.poll() is not None]

    def restart(self, name: str, argv: Sequence[str]) -> bool:
        """Start an exited daemon again; False when its restart budget is spent."""
        now = self.clock()
        history = self.restarts.get(name, ())
        if not self.budget.allows(history, now):
            return False
        self.restarts[name] = (*history, now)
        self.start(name, argv)
        return True

    def run(self) -> int:
        """Until SIGTERM/SIGINT (0), or until a daemon exits more often than the budget allows (1)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
        try:
            p = self.prepare()
            daemons = (*p.daemons, *self.extra)
            argv = dict(daemons)
            for name, daemon_argv in daemons:
                self.start(name, daemon_argv)
            log.info("openvswitch: running (database %s, run directory %s)", self.layout.database,
                     self.layout.run_dir)
            while True:
                info = signal.sigwaitinfo(WAITED)
                if info.si_signo != signal.SIGCHLD:
                    log.info("openvswitch: signal %d: stopping", info.si_signo)
                    return 0
                for name in self.exited():
                    code = self.children[name].returncode
                    del self.children[name]
                    log.warning("openvswitch: %s exited (%s): starting it again", name, code)
                    if not self.restart(name, argv[name]):
                        log.error("openvswitch: %s exited %d times within %.0f s: giving up", name,
                                  self.budget.limit, self.budget.window)
                        return 1
        finally:
            self.stop()


def watch_host(layout: Layout) -> int:
    """``ovsDaemons: host``: the host runs Open vSwitch; wait until its database answers, then
    until SIGTERM (the container's probes keep checking the host's daemons)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
    env = {**os.environ, **layout.env()}
    log.info("openvswitch: ovsDaemons host: waiting for the host's ovsdb-server at %s", layout.db_sock)
    run_step(["ovs-vsctl", f"--db=unix:{layout.db_sock}", "--retry", "--no-wait", "show"], env)
    log.info("openvswitch: the host's Open vSwitch answers; nothing to run")
    while True:
        info = signal.sigwaitinfo(WAITED)
        if info.si_signo != signal.SIGCHLD:
            return 0
