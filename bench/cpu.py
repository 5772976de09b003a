"""Where one benchmark phase's CPU goes: the plugin processes, ovs-vswitchd, ovsdb-server, the rest
of the kernel and everything else on the machine.

Sources, read before and after the phase:

* the plugin processes: ``resource.getrusage(RUSAGE_CHILDREN)`` in the driver that execs them (it
  waits for every plugin, and each plugin waits for what it spawns: host-local, ovs-ofctl), so
  their user and system time, children included;
* the OVS daemons: ``utime``/``stime`` of ``/proc/<pid>/stat``;
* the machine: the ``cpu`` line of ``/proc/stat``.  Its system + irq + softirq time, less the
  system time of the processes above, is the rest of the kernel (kworkers tearing down netns and
  veths, softirqs, other processes' system calls); its user time, less theirs, is everything else
  (the driver, and whatever else the machine runs: a shared machine shows up here).

Parsing and the split are pure; :func:`snapshot` reads ``/proc``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

DAEMONS = ("ovs-vswitchd", "ovsdb-server")
# What :func:`shares` names, in the order a report shows them.
CONSUMERS = ("plugin processes", *DAEMONS, "kernel, other", "user, other")


@dataclass(frozen=True)
class Snapshot:
    machine: dict[str, int]  # /proc/stat "cpu" fields, ticks
    daemons: dict[str, tuple[int, int]]  # name -> (utime, stime), ticks


def parse_proc_stat(text: str) -> dict[str, int]:
    """The aggregate ``cpu`` line of ``/proc/stat``: user, nice, system, idle, iowait, irq,
    softirq, steal (ticks)."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
            values = [int(x) for x in line.split()[1:1 + len(names)]]
            return dict(zip(names, values + [0] * (len(names) - len(values)), strict=True))
    raise ValueError("no aggregate cpu line in /proc/stat")


def parse_pid_stat(text: str) -> tuple[int, int]:
    """(utime, stime) in ticks from ``/proc/<pid>/stat``; the command name may hold spaces and
    parentheses, so the fields are counted from the last ``)``."""
    fields = text[text.rindex(")") + 2:].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15
    return int(fields[11]), int(fields[12])


def snapshot(daemon_pids: dict[str, int]) -> Snapshot:
    with open("/proc/stat") as f:
        machine = parse_proc_stat(f.read())
    daemons = {}
    for name, pid in daemon_pids.items():
        try:
            with open(f"/proc/{pid}/stat") as f:
                daemons[name] = parse_pid_stat(f.read())
        except OSError:
            daemons[name] = (0, 0)
    return Snapshot(machine, daemons)


def split(before: Snapshot, after: Snapshot, children: dict[str, float], wall_s: float,
          hz: int | None = None, ncpu: int | None = None) -> dict[str, Any]:
    """CPU seconds of one phase by consumer.  ``children``: the plugin processes' ``user_s`` and
    ``sys_s`` (the driver's RUSAGE_CHILDREN delta)."""
    hz = hz or os.sysconf("SC_CLK_TCK")
    ncpu = ncpu or os.cpu_count() or 1

    def d(field: str) -> float:
        return (after.machine[field] - before.machine[field]) / hz

    out: dict[str, Any] = {"wall_s": wall_s, "capacity_s": wall_s * ncpu,
                           "plugins_user_s": children.get("user_s", 0.0), "plugins_sys_s": children.get("sys_s", 0.0)}
    daemon_user = daemon_sys = 0.0
    for name in before.daemons:
        u = (after.daemons[name][0] - before.daemons[name][0]) / hz
        s = (after.daemons[name][1] - before.daemons[name][1]) / hz
        out[f"{name}_user_s"], out[f"{name}_sys_s"] = u, s
        daemon_user, daemon_sys = daemon_user + u, daemon_sys + s
    kernel = d("system") + d("irq") + d("softirq")
    user = d("user") + d("nice")
    out["kernel_other_s"] = max(0.0, kernel - out["plugins_sys_s"] - daemon_sys)
    out["user_other_s"] = max(0.0, user - out["plugins_user_s"] - daemon_user)
    out["machine_busy_s"] = kernel + user + d("steal")
    out["idle_s"] = d("idle") + d("iowait")
    return out


def shares(cpu: dict[str, Any]) -> dict[str, float]:
    """Seconds per consumer, the OVS daemons' user and system time summed: what a report shows."""
    out = {"plugin processes": cpu["plugins_user_s"] + cpu["plugins_sys_s"]}
    for name in DAEMONS:
        if f"{name}_user_s" in cpu:
            out[name] = cpu[f"{name}_user_s"] + cpu[f"{name}_sys_s"]
    out["kernel, other"] = cpu["kernel_other_s"]
    out["user, other"] = cpu["user_other_s"]
    return out
