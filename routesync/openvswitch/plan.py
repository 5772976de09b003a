"""What Ferry's ``openvswitch`` container runs for a Node, as plain data: the database steps
(create, or convert to the image's schema after an image update) and both daemons' command lines.

Pure: the facts that need the file system (does the database exist, does it need converting)
come in as arguments; :mod:`.supervise` gathers them and carries the plan out."""

from __future__ import annotations

import os
from dataclasses import dataclass

SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"
OVSDB_SERVER = "ovsdb-server"
OVS_VSWITCHD = "ovs-vswitchd"
DAEMONS = (OVSDB_SERVER, OVS_VSWITCHD)  # in start order; stopped in the reverse one


@dataclass(frozen=True)
class Layout:
    """Where the daemons keep their files: the run directory route-sync and the plugin use
    (``db.sock``, ``<bridge>.mgmt``, pidfiles, control sockets), the database (on a host path, so
    a restarted container finds the bridge, its ports and their ``external_ids``), the logs."""

    run_dir: str
    database: str
    log_dir: str
    schema: str = SCHEMA

    @property
    def db_sock(self) -> str:
        return os.path.join(self.run_dir, "db.sock")

    def pidfile(self, daemon: str) -> str:
        return os.path.join(self.run_dir, f"{daemon}.pid")

    def log_file(self, daemon: str) -> str:
        return os.path.join(self.log_dir, f"{daemon}.log")

    def env(self) -> dict[str, str]:
        """OVS_RUNDIR and friends, so ``ovs-appctl -t ovs-vswitchd`` and ``ovs-vsctl`` without
        ``--db`` find these daemons."""
        return {"OVS_RUNDIR": self.run_dir, "OVS_DBDIR": os.path.dirname(self.database),
                "OVS_LOGDIR": self.log_dir}


@dataclass(frozen=True)
class Plan:
    database_steps: tuple[tuple[str, ...], ...]  # argv each, run in order before the daemons
    daemons: tuple[tuple[str, tuple[str, ...]], ...]  # (name, argv), in start order


def database_steps(layout: Layout, exists: bool, needs_conversion: bool) -> tuple[tuple[str, ...], ...]:
    """A new Node: create the database from the schema.  An image with a newer schema: convert
    in place (``ovsdb-tool convert`` keeps every row; the old file is kept beside it)."""
    if not exists:
        return (("ovsdb-tool", "create", layout.database, layout.schema),)
    if needs_conversion:
        return (("cp", "-p", layout.database, layout.database + ".before-convert"),
                ("ovsdb-tool", "convert", layout.database, layout.schema))
    return ()


def daemon_argv(layout: Layout, daemon: str) -> tuple[str, ...]:
    """In the foreground (no ``--detach``: the supervisor is their parent and sees them exit),
    warnings and worse on the console (the container's log), everything in the log file."""
    common = (f"--pidfile={layout.pidfile(daemon)}", f"--log-file={layout.log_file(daemon)}",
              "-vconsole:warn", "--no-chdir")
    if daemon == OVSDB_SERVER:
        return (OVSDB_SERVER, layout.database, f"--remote=punix:{layout.db_sock}",
                "--remote=db:Open_vSwitch,Open_vSwitch,manager_options", *common)
    if daemon == OVS_VSWITCHD:
        return (OVS_VSWITCHD, f"unix:{layout.db_sock}", *common)
    raise ValueError(f"unknown Open vSwitch daemon {daemon!r}")


def plan(layout: Layout, exists: bool, needs_conversion: bool) -> Plan:
    return Plan(database_steps=database_steps(layout, exists, needs_conversion),
                daemons=tuple((d, daemon_argv(layout, d)) for d in DAEMONS))


@dataclass(frozen=True)
class RestartBudget:
    """A daemon that exits is started again at once, up to ``limit`` times within ``window``
    seconds; beyond that the supervisor gives up and exits non-zero, so the kubelet restarts the
    container with its back-off and the Pod's status shows the crash loop."""

    limit: int = 5
    window: float = 60.0

    def allows(self, restarts: tuple[float, ...], now: float) -> bool:
        """``restarts``: the monotonic times of earlier restarts of this daemon."""
        return sum(1 for t in restarts if now - t < self.window) < self.limit
