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


def database_lock(layout: Layout) -> str:
    """The file ovsdb-server (and ovsdb-tool) hold a POSIX write lock on while they use the
    database: ``.<name>.~lock~`` beside it (Open vSwitch's ``lib/lockfile.c``)."""
    directory, name = os.path.split(layout.database)
    return os.path.join(directory, f".{name}.~lock~")


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


# -- ovs-vswitchd's flows across its restarts (issue 42) ---------------------------------------
# ovs-vswitchd starts with an empty flow table.  While it runs, the supervisor keeps a copy of
# every bridge's flows, meters and groups (one dump every SAVE_INTERVAL, the file rewritten only
# when it changed); before it starts ovs-vswitchd again it sets flow-restore-wait, once the
# bridge answers it puts the copy back in one bundle, then clears flow-restore-wait: what Open
# vSwitch's own ``ovs-save`` and ``ovs-ctl restart`` do, for a crash too (there is no exit time
# to save at).  route-sync holds its full pass while flow-restore-wait is set.

FLOW_RESTORE_WAIT = "flow-restore-wait"  # Open_vSwitch other_config key (ovs-vswitchd.conf.db(5))
SAVE_INTERVAL = 1.0  # s between dumps: a flow younger than this is put back by route-sync instead
# ovs-ofctl negotiates the highest of these the bridge enables; bundles need 1.3 (ONF EXT-230) or
# 1.4, and the dump is parsed back under the same negotiation (ovs-save: the highest enabled)
SAVE_PROTOCOLS = "OpenFlow13,OpenFlow14,OpenFlow15"
SAVED_SUFFIX = ".flows.json"
SAVED_VERSION = 1


@dataclass(frozen=True)
class SavedBridge:
    """One bridge's OpenFlow state as dumped while its ovs-vswitchd ran: flow and group lines in
    ``ovs-ofctl add-flows``/``add-groups`` syntax, meters as ``add-meter`` arguments."""

    bridge: str
    flows: tuple[str, ...]
    groups: tuple[str, ...] = ()
    meters: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {"version": SAVED_VERSION, "bridge": self.bridge, "flows": list(self.flows),
                "groups": list(self.groups), "meters": list(self.meters)}

    @classmethod
    def from_json(cls, d: object) -> SavedBridge | None:
        """None for anything but a saved bridge of this version (a file of another release)."""
        if not isinstance(d, dict) or d.get("version") != SAVED_VERSION or not isinstance(d.get("bridge"), str):
            return None
        lists = [d.get(k, []) for k in ("flows", "groups", "meters")]
        if not all(isinstance(x, list) and all(isinstance(s, str) for s in x) for x in lists):
            return None
        return cls(d["bridge"], *(tuple(x) for x in lists))


def saved_dir(layout: Layout) -> str:
    """In the run directory: on the host (a restarted container finds it), in tmpfs (a reboot,
    whose ports are all new, does not)."""
    return os.path.join(layout.run_dir, "ferry-saved-flows")


def saved_path(layout: Layout, bridge: str) -> str:
    return os.path.join(saved_dir(layout), bridge + SAVED_SUFFIX)


def mgmt_target(layout: Layout, bridge: str) -> str:
    return f"unix:{os.path.join(layout.run_dir, bridge)}.mgmt"


def bridges_in(names: list[str]) -> tuple[str, ...]:
    """The bridges ovs-vswitchd serves, from the run directory's entries (``<bridge>.mgmt``): no
    exec, no database round trip on every save."""
    return tuple(sorted(n[: -len(".mgmt")] for n in names if n.endswith(".mgmt") and len(n) > len(".mgmt")))


def dump_argv(layout: Layout, bridge: str) -> dict[str, tuple[str, ...]]:
    """What one save runs per bridge: its flows (without counters, as ``ovs-save``), groups, meters."""
    target = mgmt_target(layout, bridge)
    return {"flows": ("ovs-ofctl", "-O", SAVE_PROTOCOLS, "dump-flows", "--no-names", "--no-stats", target),
            "groups": ("ovs-ofctl", "-O", SAVE_PROTOCOLS, "dump-groups", target),
            "meters": ("ovs-ofctl", "-O", SAVE_PROTOCOLS, "dump-meters", target)}


def _reply_header(line: str) -> bool:
    return line.startswith(("OFPST_", "NXST_", "OFPT_", "NXT_"))


def flow_lines(dump: str) -> tuple[str, ...]:
    """``dump-flows --no-stats`` output as ``add-flows`` lines: headers dropped, ages dropped, and
    ``igmp`` rewritten to what the parser takes back (``ovs-save``'s sed, line by line)."""
    import re

    out = []
    for raw in dump.splitlines():
        line = raw.strip()
        if not line or _reply_header(line):
            continue
        line = re.sub(r"(idle|hard)_age=[^,]*, ?", "", line)
        line = line.replace("igmp_type", "tp_src").replace("igmp_code", "tp_dst").replace("igmp", "ip,nw_proto=2")
        out.append(line)
    return tuple(out)


def group_lines(dump: str) -> tuple[str, ...]:
    return tuple(s for s in (raw.strip() for raw in dump.splitlines()) if s and not _reply_header(s))


def meter_specs(dump: str) -> tuple[str, ...]:
    """``dump-meters`` output (``meter=1 pktps burst bands=`` then one ``type=drop rate=..`` line
    per band) as ``add-meter`` arguments (``meter=1,pktps,burst,bands=type=drop,rate=..``)."""
    meters: list[list[str]] = []
    for raw in dump.splitlines():
        line = raw.strip()
        if not line or _reply_header(line):
            continue
        if line.startswith("meter="):
            meters.append(line.split())
        elif meters:
            meters[-1].extend(line.split())
    return tuple(",".join(words).replace("bands=,", "bands=") for words in meters)


@dataclass(frozen=True)
class Step:
    """One command of a restore: argv, and what it reads on stdin (None: nothing)."""

    argv: tuple[str, ...]
    stdin: str | None = None


@dataclass(frozen=True)
class Restore:
    """Around one ovs-vswitchd start: ``before`` it (flow-restore-wait on when there is a copy to
    put back, else a stale one removed), per bridge once it answers, ``after`` (always, also when
    a bridge's steps failed: ovs-vswitchd must not wait for ever)."""

    before: tuple[Step, ...]
    bridges: tuple[tuple[str, tuple[Step, ...]], ...]
    after: tuple[Step, ...]


def _vsctl(layout: Layout, *args: str) -> tuple[str, ...]:
    return ("ovs-vsctl", f"--db=unix:{layout.db_sock}", "--timeout=10", "--no-wait", *args)


def restore_plan(layout: Layout, saved: list[SavedBridge], existing: tuple[str, ...]) -> Restore:
    """Put back the copies of the bridges that are still in the database (``existing``): meters
    first (a flow naming a missing meter is refused), then groups, then the flows, each set in one
    bundle.  ``add-flows``, not ``replace-flows``: a flow the plugin adds while ovs-vswitchd
    waits (a Pod's ADD) stays."""
    clear = _vsctl(layout, "--if-exists", "remove", "Open_vSwitch", ".", "other_config", FLOW_RESTORE_WAIT)
    todo = [s for s in saved if s.bridge in existing and (s.flows or s.groups or s.meters)]
    if not todo:
        return Restore(before=(Step(clear),), bridges=(), after=())
    bridges = []
    for s in todo:
        target = mgmt_target(layout, s.bridge)
        steps = [Step(("ovs-ofctl", "-O", SAVE_PROTOCOLS, "add-meter", target, m)) for m in s.meters]
        if s.groups:
            steps.append(Step(("ovs-ofctl", "-O", SAVE_PROTOCOLS, "--bundle", "add-groups", target, "-"),
                              "\n".join(s.groups) + "\n"))
        if s.flows:
            steps.append(Step(("ovs-ofctl", "-O", SAVE_PROTOCOLS, "--bundle", "add-flows", target, "-"),
                              "\n".join(s.flows) + "\n"))
        bridges.append((s.bridge, tuple(steps)))
    return Restore(before=(Step(_vsctl(layout, "set", "Open_vSwitch", ".",
                                       f"other_config:{FLOW_RESTORE_WAIT}=true")),),
                   bridges=tuple(bridges), after=(Step(clear),))
