"""Ferry's ``openvswitch`` container (``ferry-route-sync ovs``): ovsdb-server and ovs-vswitchd for
a Node that has no Open vSwitch of its own, or, with ``ovsDaemons: host``, a watch on the host's.

The supervisor is the daemons' parent (they run in the foreground), so it learns of an exit from
SIGCHLD, not by polling: it waits in ``sigwaitinfo`` for SIGCHLD, SIGTERM and SIGINT, all three
blocked in it and unblocked in the daemons.  A daemon that exits is started again at once
(:class:`.plan.RestartBudget`).  ovs-vswitchd starts with no flows: between signals the
supervisor dumps every bridge's flows, groups and meters (every :data:`.plan.SAVE_INTERVAL`,
the copy rewritten when it changed), and starts a new ovs-vswitchd with flow-restore-wait set,
puts the copy back once the bridge answers, then clears it (:func:`.plan.restore_plan`, as
``ovs-ctl restart`` with ``ovs-save``).  route-sync, which holds its full pass until
flow-restore-wait is cleared, then finds its flows in place and the Pods' flows replayed.
SIGTERM stops ovs-vswitchd, then ovsdb-server; the database stays on its host path, so the next
container finds the bridge, the Pods' ports and their ``external_ids``."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence

from cni.node.atomicfile import write_atomic

from .plan import (
    OVS_VSWITCHD,
    OVSDB_SERVER,
    SAVE_INTERVAL,
    Layout,
    Plan,
    RestartBudget,
    Restore,
    SavedBridge,
    Step,
    bridges_in,
    database_lock,
    dump_argv,
    flow_lines,
    group_lines,
    meter_specs,
    plan,
    restore_plan,
    saved_dir,
    saved_path,
)

log = logging.getLogger(__name__)

WAITED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}
STOP_TIMEOUT = 10.0  # seconds a daemon has to exit on SIGTERM before SIGKILL
RESTORE_TIMEOUT = 30.0  # seconds a new ovs-vswitchd has to serve a saved bridge before it is given up


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


def wait_for_bridge(layout: Layout, bridge: str, child: subprocess.Popen[bytes],
                    timeout: float = RESTORE_TIMEOUT) -> bool:
    """Blocks until the new ovs-vswitchd (``child``) accepts OpenFlow connections on ``bridge``'s
    management socket (every 10 ms, as :func:`wait_for_database`); False when it exited or took
    longer than ``timeout``."""
    path = os.path.join(layout.run_dir, f"{bridge}.mgmt")
    deadline = time.monotonic() + timeout
    while not _accepts(path):
        if child.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def run_restore_step(step: Step, env: dict[str, str]) -> None:
    cp = subprocess.run(list(step.argv), input=step.stdin, env=env, capture_output=True, text=True, check=False)
    if cp.returncode != 0:
        raise SupervisorError(f"{' '.join(step.argv[:5])}: {cp.stderr.strip() or f'exit {cp.returncode}'}")


def _accepts(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def wait_for_predecessor(layout: Layout) -> bool:
    """Until no other ovsdb-server holds the database: the Node's previous Open vSwitch Pod still
    stopping while this one starts (a DaemonSet whose Pods replace each other, or an upgrade from
    the layout that ran Open vSwitch in route-sync's Pod).  Starting beside it would fail on the
    lock and leave the kubelet's back-off (up to 5 minutes) between the old switch's stop and the
    new one's start; waiting on the lock itself wakes the moment the old ovsdb-server exits, which
    the old supervisor does after saving the flows and stopping ovs-vswitchd, so the new one
    restores them at once.  Returns whether it waited.  Signals are not blocked yet: a SIGTERM meanwhile
    ends the process, nothing started."""
    if not os.path.exists(layout.database):
        return False
    fd = os.open(database_lock(layout), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                raise
        log.info("openvswitch: another ovsdb-server holds %s (the Node's previous Open vSwitch, stopping): "
                 "waiting for it to exit", layout.database)
        fcntl.lockf(fd, fcntl.LOCK_EX)
        log.info("openvswitch: the previous ovsdb-server exited: starting")
        return True
    finally:
        os.close(fd)  # the lock goes with the descriptor: ovsdb-server takes it next


class Supervisor:
    def __init__(self, layout: Layout, load_module: bool = False, budget: RestartBudget | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 before_stop: Callable[[], None] | None = None,
                 extra: Sequence[tuple[str, Sequence[str]]] = (),
                 save_interval: float | None = SAVE_INTERVAL) -> None:
        self.layout = layout
        # seconds between two saves of the bridges' flows; None: never saved, never restored
        self.save_interval = save_interval
        self.saved: dict[str, SavedBridge] = {}  # what each bridge's copy on disk holds
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

    def start_vswitchd(self, argv: Sequence[str]) -> None:
        """ovs-vswitchd with its bridges' saved flows: flow-restore-wait set, the daemon started,
        each saved bridge's copy put back once it answers, flow-restore-wait cleared."""
        restore = self.restore_plan()
        try:
            for step in restore.before:
                run_restore_step(step, self.env)
        except SupervisorError as e:
            log.error("openvswitch: flow-restore-wait not set, the flows are not restored: %s", e)
            restore = Restore(before=(), bridges=(), after=restore.after)
        try:
            self.start(OVS_VSWITCHD, argv)
            child = self.children[OVS_VSWITCHD]
            for bridge, steps in restore.bridges:
                self.restore_bridge(bridge, steps, child)
        finally:
            for step in restore.after:
                try:
                    run_restore_step(step, self.env)
                except SupervisorError as e:  # the database is gone: its own restart clears it
                    log.error("openvswitch: flow-restore-wait not cleared: %s", e)

    def restore_plan(self) -> Restore:
        if self.save_interval is None:
            return Restore(before=(), bridges=(), after=())
        self.saved = self.load_saved()
        existing: tuple[str, ...] = ()
        if self.saved:
            cp = subprocess.run(["ovs-vsctl", f"--db=unix:{self.layout.db_sock}", "--timeout=10", "list-br"],
                                env=self.env, capture_output=True, text=True, check=False)
            existing = tuple(cp.stdout.split()) if cp.returncode == 0 else ()
        return restore_plan(self.layout, list(self.saved.values()), existing)

    def restore_bridge(self, bridge: str, steps: Sequence[Step], child: subprocess.Popen[bytes]) -> None:
        t0 = time.monotonic()
        if not wait_for_bridge(self.layout, bridge, child):
            log.error("openvswitch: %s did not serve %s within %.0f s: its flows are not restored (route-sync "
                      "puts its own back)", OVS_VSWITCHD, bridge, RESTORE_TIMEOUT)
            return
        try:
            for step in steps:
                run_restore_step(step, self.env)
        except SupervisorError as e:
            log.error("openvswitch: flows of %s not restored: %s", bridge, e)
            return
        s = self.saved[bridge]
        log.info("openvswitch: flows restored on %s (%d flows, %d groups, %d meters) in %.1f ms", bridge,
                 len(s.flows), len(s.groups), len(s.meters), (time.monotonic() - t0) * 1e3)

    # -- the copy of the flows
    def load_saved(self) -> dict[str, SavedBridge]:
        out: dict[str, SavedBridge] = {}
        try:
            names = os.listdir(saved_dir(self.layout))
        except OSError:
            return out
        for n in names:
            try:
                with open(os.path.join(saved_dir(self.layout), n)) as f:
                    s = SavedBridge.from_json(json.load(f))
            except (OSError, ValueError):
                s = None
            if s is not None and n == os.path.basename(saved_path(self.layout, s.bridge)):
                out[s.bridge] = s
        return out

    def dump_bridge(self, bridge: str) -> SavedBridge | None:
        """The bridge's flows, groups and meters now; None when a dump failed (ovs-vswitchd exiting,
        the bridge going): the copy on disk stays as it was."""
        texts = {}
        for what, argv in dump_argv(self.layout, bridge).items():
            cp = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, check=False)
            if cp.returncode != 0:
                log.debug("openvswitch: %s of %s not dumped: %s", what, bridge, cp.stderr.strip())
                return None
            texts[what] = cp.stdout
        return SavedBridge(bridge, flow_lines(texts["flows"]), group_lines(texts["groups"]),
                           meter_specs(texts["meters"]))

    def save_flows(self) -> None:
        """Every bridge's copy brought up to date (written only when it changed)."""
        child = self.children.get(OVS_VSWITCHD)
        if self.save_interval is None or child is None or child.poll() is not None:
            return
        try:
            os.makedirs(saved_dir(self.layout), exist_ok=True)
            bridges = bridges_in(os.listdir(self.layout.run_dir))
        except OSError as e:
            log.warning("openvswitch: flows not saved: %s", e)
            return
        for bridge in bridges:
            now = self.dump_bridge(bridge)
            if now is None or self.saved.get(bridge) == now:
                continue
            try:
                write_atomic(saved_path(self.layout, bridge), json.dumps(now.to_json()).encode(), sync=False)
            except OSError as e:
                log.warning("openvswitch: flows of %s not saved: %s", bridge, e)
                continue
            self.saved[bridge] = now
            log.debug("openvswitch: %s saved (%d flows, %d groups, %d meters)", bridge, len(now.flows),
                      len(now.groups), len(now.meters))

    # -- stop
    def stop(self) -> None:
        self.save_flows()  # the next container (a new image, a liveness restart) starts from these
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
        if name == OVS_VSWITCHD:
            self.start_vswitchd(argv)
        else:
            self.start(name, argv)
        return True

    def run(self) -> int:
        """Until SIGTERM/SIGINT (0), or until a daemon exits more often than the budget allows (1)."""
        wait_for_predecessor(self.layout)
        signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
        try:
            p = self.prepare()
            daemons = (*p.daemons, *self.extra)
            for name, daemon_argv in daemons:
                if name == OVS_VSWITCHD:
                    self.start_vswitchd(daemon_argv)
                else:
                    self.start(name, daemon_argv)
            log.info("openvswitch: running (database %s, run directory %s)", self.layout.database,
                     self.layout.run_dir)
            return self.watch(dict(daemons))
        finally:
            self.stop()

    def watch(self, argv: dict[str, Sequence[str]]) -> int:
        """The started daemons (``argv``: name -> command) until SIGTERM/SIGINT (0), each started
        again when it exits, until one exits more often than the budget allows (1); the flows saved
        every ``save_interval`` s meanwhile. WAITED must be blocked."""
        next_save = time.monotonic()
        while True:
            if self.save_interval is None:
                info = signal.sigwaitinfo(WAITED)
            else:
                if time.monotonic() >= next_save:
                    self.save_flows()
                    next_save = time.monotonic() + self.save_interval
                got = signal.sigtimedwait(WAITED, max(0.0, next_save - time.monotonic()))
                if got is None:
                    continue
                info = got
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


def watch_host(layout: Layout, extra: Sequence[tuple[str, Sequence[str]]] = ()) -> int:
    """``ovsDaemons: host``: the host runs Open vSwitch; wait until its database answers, then
    until SIGTERM (the container's probes keep checking the host's daemons).  Nothing is saved
    or restored here.  The host's ``ovs-ctl restart`` (what ``systemctl reload ovs-vswitchd``
    runs, and ``ovs-ctl force-reload-kmod``) saves the flows itself (``ovs-save save-flows``), sets
    flow-restore-wait, starts the new ovs-vswitchd, restores them and clears it; route-sync holds
    its full pass meanwhile.  ``systemctl restart`` (a stop, then a start) and a crash (systemd's
    ``Restart=on-failure``) start it with no copy: route-sync puts the flows back, as before.

    ``extra``: the Node's other daemons this container runs as with ``ovsDaemons: ferry`` (the
    userspace WireGuard device), started once the host's Open vSwitch answers and supervised
    alike, so that they outlive route-sync's container here too."""
    signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
    env = {**os.environ, **layout.env()}
    log.info("openvswitch: ovsDaemons host: waiting for the host's ovsdb-server at %s", layout.db_sock)
    run_step(["ovs-vsctl", f"--db=unix:{layout.db_sock}", "--retry", "--no-wait", "show"], env)
    supervisor = Supervisor(layout, extra=extra, save_interval=None)
    if not supervisor.extra:
        log.info("openvswitch: the host's Open vSwitch answers; nothing to run")
    try:
        for name, argv in supervisor.extra:
            supervisor.start(name, argv)
        if supervisor.extra:
            log.info("openvswitch: the host's Open vSwitch answers; running %s",
                     ", ".join(name for name, _ in supervisor.extra))
        return supervisor.watch(dict(supervisor.extra))
    finally:
        supervisor.stop()
