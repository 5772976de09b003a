"""CNI ADD/DEL latency: Ferry (source launcher and frozen bundle) vs ovs-cni and the reference
``bridge`` + ``host-local`` (Debian's and upstream's current), same run.

    python -m bench.bench_cni [--pods 200] [--conc 8] [--quick] [--json OUT] [--cni-bin DIR] [--dist DIR]

Measured the way the reference baseline in docs/benchmarks.md was measured: a Python
driver running inside a "node" network namespace execs the plugin directly (``CNI_COMMAND`` in
the environment, the network configuration on stdin) and takes the wall time of each plugin
process (fork+exec+run+exit) with ``perf_counter_ns``; every Pod is its own netns.

* Six plugins (``bench.peers`` finds or builds them; one that is not there is reported
  "not built: <reason>"): ``ferry`` (the source launchers, ``python3.11 -IS``), ``ferry-frozen``
  (``dist/ferry``, what hosts run), ``ovs-cni`` (k8snetworkplumbingwg/ovs-cni's plugin, with
  host-local, its defaults), ``ovs-cni-poll10`` (the same, polling the new port's link state every
  10 ms instead of sleeping 600 ms when vswitchd has not reported it up yet), ``bridge`` (Debian's
  bridge + host-local, the reference of issue 3) and ``bridge-upstream`` (containernetworking/plugins
  at the newest version, built from its module).
* Two nodes, so the OVS plugins never see the Linux bridge's link churn: ``<tag>-fnode`` holds a
  private OVS instance (``tests.support.ovs_instance.OvsInstance``; Ferry creates the netdev ``br-int``, the
  gateway and the base flows on the warm-up ADD, lone-Node mode) that ovs-cni plugs into too (same
  bridge, same Node), ``<tag>-rnode`` the Linux bridge that ``bridge`` creates (``isGateway``,
  ``ipMasq: false``, cniVersion 1.0.0).  The plugins of one node take turns on its Pods' namespaces.
* Each phase also records where the CPU went (``bench.cpu``): the plugin processes, ovs-vswitchd,
  ovsdb-server, the rest of the kernel and everything else.
* Phases, each run for one plugin after the other (so machine noise hits them alike): N Pods
  sequentially (all ADDs, then all DELs), a few through ``cnitool``, then N Pods with a thread
  pool of C workers (a new call starts as soon as one ends).  One ADD/DEL warm-up first.
* Two A/B phases of Ferry against itself on the OVS node, the two sides' calls taking turns: the
  encryption phase (issue 30, ``bench.cni_encryption``: a state file in clear and one encrypted)
  and the policy phase (issue 27, ``bench.cni_policy``: a state file without and one with the
  Pods' namespace in ``policyNamespaces``, so their ADDs install pending drops).
* Every ADD phase is verified (one unique IP per Pod, exactly one host veth per Pod, and the
  host veths named in the results are the ones on the node; Ferry: one OVS port and one set of
  per-Pod flows per Pod, one IPAM record per Pod; ovs-cni: one OVS port and one cache file per
  Pod; bridge and ovs-cni: one host-local reservation per Pod),
  every DEL phase too (nothing of it left on the node, in OVS, in IPAM or in the Pod netns), so
  a plugin that skips work cannot look fast.
* Everything (namespaces, OVS, temp dirs with IPAM stores, caches, launchers) is removed at the
  end, on failure and on Ctrl-C/SIGTERM.  Names carry ``fbn-<random>`` so runs never collide.

Percentiles are nearest-rank.  2 noisy vCPUs here: trust the ratios, report the load average.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench import cni_encryption as enc
from bench import cni_policy as pol
from bench import cpu, peers
from bench.util import percentile, table
from cni.pipeline.modes import ENCRYPTION_NONE, ENCRYPTION_WIREGUARD, NO_ENCAP
from cni.pipeline.tables import GATEWAY_PORT
from lab import tools

if TYPE_CHECKING:
    from cni.pipeline.modes import Encryption

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
IFNAME = "eth0"
PREFIX = "fbn"
REF_BRIDGE = "fbn-br0"
FERRY_SUBNET = "10.244.0.0/16"
REF_SUBNET, REF_GATEWAY = "10.251.0.0/16", "10.251.0.1"
OVS_CNI_SUBNET = "10.250.0.0/16"
OVS_CNI_CACHE = "/var/lib/cni/ovs-cni/cache"  # ovs-cni's fixed cache (container ID + ifname)
# The plugins, in the order each phase runs them.  The first two run on the Linux bridge node, the
# rest on the OVS node (Ferry first: its warm-up ADD creates br-int, which ovs-cni plugs into).
# ovs-cni-poll10: ovs-cni polling the port's link state every 10 ms instead of its default 600 ms
# (same 3 s budget), so its ADD shows its work rather than its sleep.
KEYS = ("bridge", "bridge-upstream", "ferry", "ferry-frozen", "ovs-cni", "ovs-cni-poll10")
OVS_KEYS = ("ferry", "ferry-frozen", "ovs-cni", "ovs-cni-poll10")
CNITOOL_KEYS = ("bridge", "ferry")
# The encryption phase's two Ferrys (bench.cni_encryption): the same launcher on the OVS node, a
# state file in clear and one encrypted; they take turns call by call, in no other phase.
ENC_KEYS = {ENCRYPTION_NONE: "ferry-clear", ENCRYPTION_WIREGUARD: "ferry-wireguard"}
# The policy phase's two Ferrys (bench.cni_policy): the same again, a state file without
# policyNamespaces and one listing the Pods' namespace; on the encryption phase's Pods' namespaces.
POLICY_KEYS = {pol.NONE: "ferry-no-policy", pol.POLICY: "ferry-policy-namespace"}
CNI_VERSION = "1.0.0"
# Issue 3's targets: (figure, comparison, bound).  Ratios are Ferry / reference.
TARGETS = (("ADD p50", "<=", 1.5), ("ADD p99", "<=", 2.0), ("DEL p50", "<=", 1.2),
           ("concurrent ADD throughput", ">=", 1.0))
# Issue 18's comparisons: (figure, ours, reference, comparison, bound); bound None: reported only.
COMPARISONS = (
    ("frozen / launcher: ADD p50", "ferry-frozen", "ferry", "<=", 1.1),
    ("frozen / launcher: VERSION p50", "ferry-frozen", "ferry", "<=", 1.2),
    ("frozen / launcher: DEL p50", "ferry-frozen", "ferry", None, None),
    ("frozen / launcher: concurrent ADD throughput", "ferry-frozen", "ferry", None, None),
    ("ferry (frozen) / ovs-cni: ADD p50", "ferry-frozen", "ovs-cni", "<=", 1.0),
    ("ferry (frozen) / ovs-cni: ADD p99", "ferry-frozen", "ovs-cni", None, None),
    ("ferry (frozen) / ovs-cni: DEL p50", "ferry-frozen", "ovs-cni", None, None),
    ("ferry (frozen) / ovs-cni: concurrent ADD throughput", "ferry-frozen", "ovs-cni", ">=", 1.0),
    ("ferry (frozen) / ovs-cni: ovs-vswitchd CPU per ADD", "ferry-frozen", "ovs-cni", None, None),
    ("ferry (frozen) / ovs-cni polling 10 ms: ADD p50", "ferry-frozen", "ovs-cni-poll10", None, None),
    ("ferry (frozen) / ovs-cni polling 10 ms: ADD p99", "ferry-frozen", "ovs-cni-poll10", None, None),
    ("ferry (frozen) / ovs-cni polling 10 ms: concurrent ADD throughput", "ferry-frozen", "ovs-cni-poll10",
     None, None),
    ("upstream / Debian bridge: ADD p50", "bridge-upstream", "bridge", None, None),
    ("upstream / Debian bridge: DEL p50", "bridge-upstream", "bridge", None, None),
    ("upstream / Debian bridge: concurrent ADD throughput", "bridge-upstream", "bridge", None, None),
    ("ferry (frozen) / upstream bridge: ADD p50", "ferry-frozen", "bridge-upstream", None, None),
    ("ferry (frozen) / upstream bridge: concurrent ADD throughput", "ferry-frozen", "bridge-upstream", None, None),
)


def log(msg: str) -> None:
    print(f"[bench_cni] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------
# The driver: runs inside a node netns, execs calls, times each one.  Standard library only.

def _timed(call: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter_ns()
    p = subprocess.run(call["argv"], input=call.get("stdin", "").encode(), env=call["env"],
                       capture_output=True, check=False, timeout=120)
    ms = (time.perf_counter_ns() - t0) / 1e6
    return {"ms": ms, "rc": p.returncode, "stdout": p.stdout.decode(errors="replace"),
            "stderr": p.stderr.decode(errors="replace")[-2000:]}


def driver_main() -> int:
    """``--driver``: a job ``{"calls": [...], "conc": C}`` on stdin, results as JSON on stdout."""
    job = json.load(sys.stdin)
    calls, conc = job["calls"], int(job.get("conc", 1))
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter_ns()
    if conc <= 1:
        results = [_timed(c) for c in calls]
    else:
        with cf.ThreadPoolExecutor(max_workers=conc) as ex:
            results = list(ex.map(_timed, calls))
    wall = (time.perf_counter_ns() - t0) / 1e9
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = {"user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime}
    json.dump({"wall_s": wall, "results": results, "children": children}, sys.stdout)
    return 0


# ------------------------------------------------------------------------------------------
# Plain data: configurations, calls, statistics, the report.

@dataclass(frozen=True)
class Plugin:
    """One side of the comparison: how to exec it and where its state lives."""

    key: str  # one of KEYS
    kind: str  # "ferry" | "ovs-cni" | "bridge": what its verifier counts
    label: str
    version: str
    exe: str  # the plugin executable
    cni_path: str  # CNI_PATH for it (IPAM plugins)
    node: str  # node netns name
    netname: str
    conf: dict[str, Any]  # the plugin's entry of the conflist
    netconf_dir: str  # NETCONFPATH for cnitool (one conflist)
    cache_dir: str  # libcni's result cache, for cnitool

    def stdin(self) -> str:
        return json.dumps(dict(self.conf, cniVersion=CNI_VERSION, name=self.netname))

    def conflist(self) -> dict[str, Any]:
        return {"cniVersion": CNI_VERSION, "name": self.netname, "plugins": [self.conf]}


def ferry_conf(work: str, ovs_db: str, ovs_run_dir: str) -> dict[str, Any]:
    """Lone-Node Ferry like ``tests/support/podnode.py``: no state file, explicit IPv4 ranges."""
    return {"type": "ferry", "stateFile": os.path.join(work, "ferry-state", "node-state.json"),
            "bridge": "br-int", "ovsdb": ovs_db, "ovsRunDir": ovs_run_dir, "datapath": "netdev",
            "logFile": os.path.join(work, "ferry-cni.log"),
            "ipam": {"type": "ferry-ipam", "dataDir": os.path.join(work, "ferry-ipam"),
                     "ranges": [[{"subnet": FERRY_SUBNET}]]}}


def bridge_conf(work: str, data_dir: str = "host-local") -> dict[str, Any]:
    """The reference script's conflist entry (ipMasq false), host-local state in our own dir."""
    return {"type": "bridge", "bridge": REF_BRIDGE, "isGateway": True, "ipMasq": False,
            "hairpinMode": False,
            "ipam": {"type": "host-local", "dataDir": os.path.join(work, data_dir),
                     "ranges": [[{"subnet": REF_SUBNET, "gateway": REF_GATEWAY}]],
                     "routes": [{"dst": "0.0.0.0/0"}]}}


def ovs_cni_conf(work: str, ovs_db: str, poll_ms: int | None = None) -> dict[str, Any]:
    """ovs-cni on Ferry's br-int (same bridge, same Node), its documented defaults otherwise;
    host-local like the bridge references (ovs-cni has no IPAM of its own).  ``poll_ms``: check
    the port's link state that often (default 600 ms x 5 tries), within the same 3 s."""
    conf: dict[str, Any] = {"type": "ovs", "bridge": "br-int", "socket_file": ovs_db,
                            "ipam": {"type": "host-local", "dataDir": os.path.join(work, "host-local-ovs"),
                                     "ranges": [[{"subnet": OVS_CNI_SUBNET}]]}}
    if poll_ms:
        conf.update(link_state_check_interval=poll_ms, link_state_check_retries=3000 // poll_ms)
    return conf


def pod_args(pod: str, namespace: str = PREFIX) -> str:
    """kubelet's CNI_ARGS for Pod ``pod`` in Kubernetes namespace ``namespace``."""
    return f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod}"


def direct_call(plugin: Plugin, op: str, pod: str, container_id: str, namespace: str = PREFIX) -> dict[str, Any]:
    env = dict(BASE_ENV, CNI_COMMAND=op.upper(), CNI_CONTAINERID=container_id,
               CNI_NETNS=f"/run/netns/{pod}", CNI_IFNAME=IFNAME, CNI_PATH=plugin.cni_path,
               CNI_ARGS=pod_args(pod, namespace))
    return {"argv": [plugin.exe], "env": env, "stdin": plugin.stdin()}


def version_call(plugin: Plugin) -> dict[str, Any]:
    return {"argv": [plugin.exe], "env": dict(BASE_ENV, CNI_COMMAND="VERSION"),
            "stdin": json.dumps({"cniVersion": CNI_VERSION})}


def import_floor_call(plugin: Plugin) -> dict[str, Any] | None:
    """The launcher's interpreter importing every per-Pod module and exiting: the part of an ADD
    that no plugin work can remove.  None for an executable that is not a source launcher."""
    try:
        with open(plugin.exe, "rb") as f:
            first = f.readline().decode(errors="replace")
    except OSError:
        return None
    if not first.startswith("#!") or "python" not in first:
        return None
    interpreter, *flags = first[2:].split()
    from cni.launcher import PER_POD_MODULES

    code = (f"import sys; sys.path.insert(0, {ROOT!r}); import " + ", ".join(PER_POD_MODULES)
            + "; from cni.plugin import leave; leave(0)")
    return {"argv": [interpreter, *flags, "-c", code], "env": BASE_ENV}


def cnitool_call(plugin: Plugin, cnitool: str, op: str, pod: str) -> dict[str, Any]:
    env = dict(BASE_ENV, NETCONFPATH=plugin.netconf_dir, CNI_PATH=plugin.cni_path,
               CNI_CACHE_DIR=plugin.cache_dir, CNI_ARGS=pod_args(pod), CNI_IFNAME=IFNAME)
    return {"argv": [cnitool, op.lower(), plugin.netname, f"/run/netns/{pod}"], "env": env}


def stats(samples: Sequence[float]) -> dict[str, Any]:
    xs = list(samples)
    return {"n": len(xs), "p50": percentile(xs, 50), "p90": percentile(xs, 90),
            "p99": percentile(xs, 99), "max": max(xs), "mean": sum(xs) / len(xs), "samples_ms": xs}


def conc_stats(samples: Sequence[float], wall_s: float, workers: int) -> dict[str, Any]:
    return dict(stats(samples), wall_s=wall_s, pods_per_s=len(samples) / wall_s, workers=workers)


def _vswitchd_ms_per_pod(s: dict[str, Any]) -> float:
    c = s.get("cpu") or {}
    return 1000.0 * (c.get("ovs-vswitchd_user_s", 0.0) + c.get("ovs-vswitchd_sys_s", 0.0)) / s["n"]


def _figure(figs: dict[str, Any], floors: dict[str, Any], key: str, figure: str) -> float:
    """One figure of one plugin, named by the text after the colon of a COMPARISONS entry."""
    f = figs[key]
    return {"ADD p50": lambda: f["sequential"]["add"]["p50"], "ADD p99": lambda: f["sequential"]["add"]["p99"],
            "DEL p50": lambda: f["sequential"]["del"]["p50"],
            "VERSION p50": lambda: floors[f"{key} VERSION (start-up floor)"]["p50"],
            "concurrent ADD throughput": lambda: f["concurrent"]["add"]["pods_per_s"],
            "ovs-vswitchd CPU per ADD": lambda: _vswitchd_ms_per_pod(f["concurrent"]["add"])}[figure]()


def comparisons(figs: dict[str, Any], floors: dict[str, Any], not_built: dict[str, str]) -> list[dict[str, Any]]:
    """Issue 18's ratios, ours / reference; a side that is not built gives ``not_built`` instead."""
    out: list[dict[str, Any]] = []
    for name, ours_key, ref_key, cmp, bound in COMPARISONS:
        row: dict[str, Any] = {"figure": name, "ours_key": ours_key, "reference_key": ref_key,
                               "target": f"{cmp} {bound}x" if cmp else "—"}
        missing = [k for k in (ours_key, ref_key) if k not in figs]
        if missing:
            row["not_built"] = "; ".join(f"{k}: {not_built.get(k, 'not run')}" for k in missing)
            out.append(row)
            continue
        figure = name.split(": ", 1)[1]
        ours, ref = _figure(figs, floors, ours_key, figure), _figure(figs, floors, ref_key, figure)
        ratio = ours / ref if ref else None
        row.update(ours=ours, reference=ref, ratio=ratio)
        if cmp and bound is not None and ratio is not None:
            row["pass"] = ratio <= bound if cmp == "<=" else ratio >= bound
        out.append(row)
    return out


def ratios(figs: dict[str, Any]) -> list[dict[str, Any]]:
    """Ferry / reference for each target of issue 3, marked pass/short."""
    f, r = figs["ferry"], figs["bridge"]
    values = {"ADD p50": (f["sequential"]["add"]["p50"], r["sequential"]["add"]["p50"]),
              "ADD p99": (f["sequential"]["add"]["p99"], r["sequential"]["add"]["p99"]),
              "DEL p50": (f["sequential"]["del"]["p50"], r["sequential"]["del"]["p50"]),
              "concurrent ADD throughput": (f["concurrent"]["add"]["pods_per_s"],
                                            r["concurrent"]["add"]["pods_per_s"])}
    out = []
    for name, cmp, bound in TARGETS:
        ours, ref = values[name]
        ratio = ours / ref
        ok = ratio <= bound if cmp == "<=" else ratio >= bound
        out.append({"figure": name, "ferry": ours, "reference": ref, "ratio": ratio,
                    "target": f"{cmp} {bound}x", "pass": ok})
    return out


def render(res: dict[str, Any]) -> str:
    meta, figs = res["meta"], res["plugins"]
    head = [
        (f"# CNI ADD/DEL latency, {meta['pods']} Pods, concurrency {meta['conc']}; "
         f"ferry (launcher, frozen) vs ovs-cni and bridge + host-local (cniVersion {CNI_VERSION})"),
        (f"# {meta['date']}  {meta['host']}  loadavg before {meta['loadavg_before']} "
         f"after {meta['loadavg_after']}"),
        f"# ferry {meta['ferry_exe']} (commit {meta['ferry_commit']})",
        *[f"# {key}: {figs[key]['label']} {figs[key]['version']}" for key in KEYS if key in figs],
        *[f"# {key}: not built: {why}" for key, why in res.get("not_built", {}).items()],
        "# per-call wall time of the plugin process (fork+exec+run+exit), nearest-rank percentiles"]
    floors = res.get("floors") or {"harness floor (exec /bin/true)": res["floor"]}
    rows: list[list[object]] = [[label, *_cols(s)] for label, s in floors.items()]
    for key in KEYS:
        for mode, label in (("sequential", "direct"), ("cnitool", "cnitool")):
            for op in ("add", "del"):
                s = figs.get(key, {}).get(mode, {}).get(op)
                if s:
                    rows.append([f"{key} {label} {op.upper()}", *_cols(s)])
    seq = table(["sequential, per call (ms)", "n", "p50", "p90", "p99", "max", "mean"], rows)
    crow: list[list[object]] = []
    prow: list[list[object]] = []
    for key in KEYS:
        for op in ("add", "del"):
            c = figs.get(key, {}).get("concurrent", {}).get(op)
            if not c:
                continue
            crow.append([f"{key} direct {op.upper()}", c["n"], c["wall_s"], c["pods_per_s"], c["p50"],
                         c["p90"], c["p99"], c["max"]])
            if c.get("cpu"):
                sh = cpu.shares(c["cpu"])
                prow.append([f"{key} {op.upper()}", c["wall_s"],
                             *[1000.0 * sh.get(k, 0.0) / c["n"] for k in cpu.CONSUMERS],
                             1000.0 * sum(sh.get(k, 0.0) for k in cpu.CONSUMERS[:-1]) / c["n"]])
    conc = table([f"concurrency {meta['conc']} (thread pool)", "n", "wall s", "pods/s", "p50 ms",
                  "p90 ms", "p99 ms", "max ms"], crow)
    prof = table([f"CPU ms per Pod, concurrency {meta['conc']}", "wall s", *cpu.CONSUMERS, "all but other users"],
                 prow)
    rrow = [[r["figure"], r["ferry"], r["reference"], r["ratio"], r["target"],
             "pass" if r["pass"] else "short"] for r in res["ratios"]]
    rat = table(["ferry / Debian bridge (issue 3)", "ferry", "reference", "ratio", "target", ""], rrow)
    crows = [[c["figure"], c.get("ours", "—"), c.get("reference", "—"),
              c["ratio"] if c.get("ratio") is not None else "—", c["target"],
              f"not built: {c['not_built']}" if "not_built" in c else
              ("pass" if c["pass"] else "short") if "pass" in c else ""] for c in res.get("comparisons", [])]
    cmp_table = table(["issue 18", "ours", "reference", "ratio", "target", ""], crows)
    return ("\n".join(head) + "\n\n" + seq + "\n\n" + conc + "\n\n" + prof + "\n\n" + rat + "\n\n"
            + cmp_table + "\n" + render_encryption(res.get("encryption")) + render_policy(res.get("policy")))


def render_ab(title: str, rows: list[list[object]], ratio: str, r: dict[str, Any], extra: str = "") -> str:
    """An A/B phase's table (``rows``: a label and :func:`_cols` each) and its ratios line
    (``r``: :func:`bench.util.ab_ratios`)."""
    per_pair = f", ADD per pair (median) {r['ADD per pair, median']:.3f}x" if r["ADD per pair, median"] else ""
    return ("\n" + table([title, "n", "p50", "p90", "p99", "max", "mean"], rows)
            + f"\n{ratio}: ADD p50 {r['ADD p50']:.3f}x ({r['target']}: "
            f"{'pass' if r['pass'] else 'short'}), ADD p99 {r['ADD p99']:.3f}x, DEL p50 {r['DEL p50']:.3f}x"
            f"{per_pair}{extra}\n")


def render_encryption(e: dict[str, Any] | None) -> str:
    """The encryption phase's table and ratios (issue 30)."""
    if not e:
        return ""
    rows = [[f"state file encryption {side} {op.upper()}", *_cols(e[op][side])]
            for op in ("add", "del") for side in enc.SIDES]
    return render_ab(f"encryption phase, {e['mode']}, interleaved (ms)", rows, "wireguard / clear (issue 30)",
                     e["ratios"])


def render_policy(p: dict[str, Any] | None) -> str:
    """The policy phase's table and ratios (issue 27)."""
    if not p:
        return ""
    rows = [[f"policyNamespaces {p['policyNamespaces'][side]} {op.upper()}", *_cols(p[op][side])]
            for op in ("add", "del") for side in pol.SIDES]
    return render_ab(f"policy phase, Pods in namespace {p['namespace']}, interleaved (ms)", rows,
                     "policy / none (issue 27)", p["ratios"], f"; pending drops after ADD {p['pending_drops']}")


def _cols(s: dict[str, Any]) -> list[object]:
    return [s["n"], s["p50"], s["p90"], s["p99"], s["max"], s["mean"]]


# ------------------------------------------------------------------------------------------
# The system side: namespaces, OVS, running the driver, verifying state.

class BenchError(RuntimeError):
    pass


def _run(argv: Sequence[str], check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=300, **kw)
    if check and p.returncode != 0:
        raise BenchError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()}")
    return p


def netns_batch(op: str, names: Sequence[str], check: bool = True) -> None:
    """``ip netns add|del`` for many namespaces in one ``ip -batch``."""
    if names:
        _run(["ip", "-force", "-batch", "-"], check=check,
             input="".join(f"netns {op} {n}\n" for n in names))


def run_driver(node: str, calls: list[dict[str, Any]], conc: int = 1) -> dict[str, Any]:
    """Run the calls in ``node``'s netns.  The driver gets its own session: on Ctrl-C/SIGTERM or
    any error here, it and every plugin it started are killed before the clean-up removes their
    namespaces and directories (an orphaned plugin could otherwise write into them afterwards)."""
    p = subprocess.Popen(["ip", "netns", "exec", node, sys.executable, "-m", "bench.bench_cni", "--driver"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=ROOT, start_new_session=True)
    try:
        stdout, stderr = p.communicate(json.dumps({"calls": calls, "conc": conc}))
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise
    if p.returncode != 0:
        raise BenchError(f"driver in {node} failed ({p.returncode}): {stderr.strip()[-2000:]}")
    out: dict[str, Any] = json.loads(stdout)
    return out


def node_links(node: str, kind: str | None = None) -> list[str]:
    argv = ["ip", "-n", node, "-o", "link", "show"] + (["type", kind] if kind else [])
    return [line.split(":", 2)[1].strip().split("@")[0] for line in _run(argv).stdout.splitlines()]


def pods_not_empty(pods: Sequence[str]) -> list[str]:
    """Pod namespaces still holding a link other than ``lo``."""
    left = []
    for pod in pods:
        links = node_links(pod)
        if links != ["lo"]:
            left.append(f"{pod}: {links}")
    return left


@dataclass
class Verifier:
    """Counts what a plugin left on its node; ``added``/``deleted`` raise on any mismatch."""

    plugin: Plugin
    ovs: Any = None  # tests.support.ovs_instance.OvsInstance for the OVS plugins
    log: list[str] = field(default_factory=list)
    tag: str = ""

    def _state(self) -> dict[str, Any]:
        if self.plugin.kind == "ovs-cni":
            names = _run(["ovs-vsctl", f"--db={self.ovs.db}", "--bare", "--columns=name", "list",
                          "Interface"]).stdout.split()
            ipdir = os.path.join(self.plugin.conf["ipam"]["dataDir"], self.plugin.netname)
            veths = sorted(node_links(self.plugin.node, "veth"))
            cache = [f for f in os.listdir(OVS_CNI_CACHE) if f.startswith(f"{self.tag}-")] \
                if os.path.isdir(OVS_CNI_CACHE) else []
            return {"host_veths": veths, "all_veths": veths,
                    "ovs_ports": sorted(n for n in names if n.startswith("veth")),
                    "ipam": len([f for f in os.listdir(ipdir) if f[:1].isdigit()]) if os.path.isdir(ipdir) else 0,
                    "cache": len(cache)}
        if self.plugin.kind == "ferry":
            from cni.ipam.api import list_allocations
            from cni.pipeline.tables import HOST_VETH_PREFIX, Cookie, Owner

            names = _run(["ovs-vsctl", f"--db={self.ovs.db}", "--bare", "--columns=name", "list",
                          "Interface"]).stdout.split()
            flows = self.ovs.ofctl("dump-flows", "br-int", f"cookie={Cookie.owner_match(Owner.POD)}")
            cookies = {line.split("cookie=", 1)[1].split(",", 1)[0] for line in flows.splitlines()
                       if "cookie=" in line}
            return {"host_veths": sorted(n for n in node_links(self.plugin.node) if n.startswith(HOST_VETH_PREFIX)),
                    "all_veths": sorted(node_links(self.plugin.node, "veth")),
                    "ovs_ports": sorted(n for n in names if n.startswith(HOST_VETH_PREFIX)),
                    "pod_cookies": sorted(cookies),
                    "ipam": len(list_allocations(self.plugin.conf["ipam"]["dataDir"]))}
        ipdir = os.path.join(self.plugin.conf["ipam"]["dataDir"], self.plugin.netname)
        ips = [f for f in os.listdir(ipdir) if f[:1].isdigit()] if os.path.isdir(ipdir) else []
        veths = sorted(node_links(self.plugin.node, "veth"))
        return {"host_veths": veths, "all_veths": veths, "ipam": len(ips)}

    def added(self, phase: str, outputs: Sequence[str]) -> None:
        n = len(outputs)
        results = [json.loads(o) for o in outputs]
        addrs = {ip["address"] for r in results for ip in r.get("ips", [])}
        named = set()
        for r in results:
            host = [i["name"] for i in r.get("interfaces", []) if not i.get("sandbox") and i["name"] != REF_BRIDGE]
            sandbox = [i for i in r.get("interfaces", []) if i.get("sandbox")]
            if len(host) != 1 or len(sandbox) != 1:
                raise BenchError(f"{self.plugin.key} {phase}: result without exactly one host veth and "
                                 f"one sandbox interface: {r.get('interfaces')}")
            named.add(host[0])
        st = self._state()
        problems = []
        if len(addrs) != n:
            problems.append(f"{len(addrs)} unique IPs")
        if set(st["host_veths"]) != named or len(named) != n or len(st["all_veths"]) != n:
            problems.append(f"{len(named)} host veths in results, {len(st['host_veths'])} on the node "
                            f"({len(st['all_veths'])} veths), sets "
                            f"{'equal' if set(st['host_veths']) == named else 'differ'}")
        if st["ipam"] != n:
            problems.append(f"{st['ipam']} IPAM records")
        if "ovs_ports" in st and (set(st["ovs_ports"]) != named):
            problems.append(f"{len(st['ovs_ports'])} OVS ports, not the result's host veths")
        if "pod_cookies" in st and len(st["pod_cookies"]) != n:
            problems.append(f"{len(st['pod_cookies'])} distinct per-Pod flow cookies")
        if "cache" in st and st["cache"] != n:
            problems.append(f"{st['cache']} ovs-cni cache files")
        if problems:
            raise BenchError(f"{self.plugin.key} {phase} after ADD of {n} Pods: " + "; ".join(problems)
                             + f" (expected {n} each)")
        self.log.append(f"{self.plugin.key} {phase}: {n} ADDs verified")

    def deleted(self, phase: str, pods: Sequence[str]) -> None:
        st = self._state()
        leaks = {k: v for k, v in st.items() if v}
        left = pods_not_empty(pods)
        if leaks or left:
            raise BenchError(f"{self.plugin.key} {phase}: leaked after DEL: {leaks} {left[:5]}")
        self.log.append(f"{self.plugin.key} {phase}: {len(pods)} DELs left nothing")


def _checked(res: dict[str, Any], what: str) -> list[dict[str, Any]]:
    bad = [r for r in res["results"] if r["rc"] != 0]
    if bad:
        r = bad[0]
        raise BenchError(f"{what}: {len(bad)} calls failed; first rc={r['rc']} stdout={r['stdout'][:500]} "
                         f"stderr={r['stderr'][-500:]}")
    out: list[dict[str, Any]] = res["results"]
    return out


@dataclass
class Testbed:
    tag: str
    work: str
    pods: int
    plugins: dict[str, Plugin]
    verifiers: dict[str, Verifier]
    pod_ns: dict[str, list[str]]  # plugin key -> its Pods' namespaces (shared by a node's plugins)
    ovs_dir: str
    not_built: dict[str, str]  # plugin key -> why it is not in this run
    ovs: Any = None  # the OVS node's tests.support.ovs_instance.OvsInstance

    def daemon_pids(self) -> dict[str, int]:
        pids = {}
        for name in cpu.DAEMONS:
            try:
                with open(os.path.join(self.ovs_dir, f"{name}.pid")) as f:
                    pids[name] = int(f.read().strip())
            except (OSError, ValueError):
                pass
        return pids


@dataclass(frozen=True)
class Sources:
    """Where each plugin comes from: ``bench.peers`` found or built them (or says why not)."""

    cni_bin: str | None  # Ferry's launchers (None: written to the work dir)
    frozen: peers.Peer
    ovs_cni: peers.Peer
    upstream: peers.Peer
    debian: peers.Peer


def find_sources(cni_bin: str | None, dist_dir: str, reference_dir: str, build: bool = True) -> Sources:
    return Sources(cni_bin, peers.frozen_bundle(dist_dir), peers.go_peer("ovs-cni", build),
                   peers.go_peer("cni-plugins", build), peers.debian_plugins(reference_dir))


def _link_dir(path: str, links: dict[str, str]) -> str:
    """A CNI_PATH directory of symlinks."""
    os.makedirs(path)
    for name, target in links.items():
        os.symlink(target, os.path.join(path, name))
    return path


@contextlib.contextmanager
def testbed(tag: str, pods: int, src: Sources) -> Iterator[Testbed]:
    """Node namespaces, a private OVS for the OVS plugins, one netns per Pod; all removed on exit."""
    from tests.support.ovs_instance import OvsInstance

    with contextlib.ExitStack() as stack:
        work = tempfile.mkdtemp(prefix=f"{tag}-", dir="/tmp")
        stack.callback(shutil.rmtree, work, True)
        stack.callback(_remove_ovs_cni_cache, tag)
        fnode, rnode = f"{tag}-fnode", f"{tag}-rnode"
        fpods = [f"{tag}-f{i:03d}" for i in range(1, pods + 1)]
        rpods = [f"{tag}-r{i:03d}" for i in range(1, pods + 1)]
        wpods = [f"{tag}-w{i:03d}" for i in range(1, pods + 1)]  # the second side of the encryption and policy phases
        pod_ns = {key: fpods if key in OVS_KEYS else rpods for key in KEYS}
        pod_ns.update({ENC_KEYS[ENCRYPTION_NONE]: fpods, ENC_KEYS[ENCRYPTION_WIREGUARD]: wpods,
                       POLICY_KEYS[pol.NONE]: fpods, POLICY_KEYS[pol.POLICY]: wpods})
        all_ns = [fnode, rnode, *fpods, *rpods, *wpods]
        stack.callback(netns_batch, "del", all_ns, False)  # runs last: after OVS has stopped
        netns_batch("add", all_ns)
        for node in (fnode, rnode):
            _run(["ip", "-n", node, "link", "set", "lo", "up"])
        ovs = OvsInstance(f"{tag}-fnode", netns=fnode)
        stack.callback(ovs.stop)
        cni_bin = src.cni_bin
        if cni_bin is None:
            cni_bin = os.path.join(work, "cni-bin")
            from cni.launcher import write_launchers

            write_launchers(cni_bin)
        commit = _commit()

        def plugin(key: str, kind: str, label: str, version: str, exe: str, cni_path: str,
                   conf: dict[str, Any]) -> Plugin:
            return Plugin(key, kind, label, version, exe, cni_path, fnode if key in OVS_KEYS else rnode,
                          f"{tag}-{key}", conf, os.path.join(work, f"netd-{key}"), os.path.join(work, f"cache-{key}"))

        plugins = {"ferry": plugin("ferry", "ferry", "ferry, source launcher (OVS netdev, ferry-ipam)", commit,
                                   os.path.join(cni_bin, "ferry"), cni_bin, ferry_conf(work, ovs.db, ovs.run_dir))}
        not_built: dict[str, str] = {}
        if src.frozen.directory:
            d = src.frozen.directory
            plugins["ferry-frozen"] = plugin("ferry-frozen", "ferry", f"ferry, frozen bundle ({d})", commit,
                                             os.path.join(d, "ferry"), d, ferry_conf(work, ovs.db, ovs.run_dir))
        else:
            not_built["ferry-frozen"] = src.frozen.reason
        if src.ovs_cni.directory:
            host_local = src.upstream if src.upstream.directory else src.debian
            ipam_dir = host_local.directory or src.debian.directory or "/usr/lib/cni"
            path = _link_dir(os.path.join(work, "cni-ovs"), {"ovs": os.path.join(src.ovs_cni.directory, "ovs"),
                                                             "host-local": os.path.join(ipam_dir, "host-local")})
            plugins["ovs-cni"] = plugin("ovs-cni", "ovs-cni", f"ovs-cni (same br-int; host-local {host_local.version})",
                                        src.ovs_cni.version, os.path.join(path, "ovs"), path,
                                        ovs_cni_conf(work, ovs.db))
            plugins["ovs-cni-poll10"] = plugin(
                "ovs-cni-poll10", "ovs-cni",
                f"ovs-cni polling the link state every 10 ms (host-local {host_local.version})",
                src.ovs_cni.version, os.path.join(path, "ovs"), path, ovs_cni_conf(work, ovs.db, poll_ms=10))
        else:
            not_built["ovs-cni"] = not_built["ovs-cni-poll10"] = src.ovs_cni.reason
        if src.debian.directory:
            plugins["bridge"] = plugin("bridge", "bridge", "Debian bridge + host-local", src.debian.version,
                                       os.path.join(src.debian.directory, "bridge"), src.debian.directory,
                                       bridge_conf(work, "host-local"))
        else:
            raise BenchError(f"reference plugins not found: {src.debian.reason}")
        if src.upstream.directory:
            plugins["bridge-upstream"] = plugin("bridge-upstream", "bridge", "upstream bridge + host-local",
                                                src.upstream.version, os.path.join(src.upstream.directory, "bridge"),
                                                src.upstream.directory, bridge_conf(work, "host-local-upstream"))
        else:
            not_built["bridge-upstream"] = src.upstream.reason
        for p in plugins.values():
            os.makedirs(p.netconf_dir)
            with open(os.path.join(p.netconf_dir, f"10-{p.key}.conflist"), "w") as f:
                json.dump(p.conflist(), f, indent=2)
        verifiers = {key: Verifier(p, ovs if key in OVS_KEYS else None, tag=tag) for key, p in plugins.items()}
        stack.callback(signal.signal, signal.SIGINT, signal.SIG_IGN)  # runs first: let clean-up finish
        yield Testbed(tag, work, pods, plugins, verifiers, pod_ns, ovs.dir, not_built, ovs)


def _remove_ovs_cni_cache(tag: str) -> None:
    """ovs-cni's cache files of this run (left by a run that failed before its DELs)."""
    if os.path.isdir(OVS_CNI_CACHE):
        for f in os.listdir(OVS_CNI_CACHE):
            if f.startswith(f"{tag}-"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(OVS_CNI_CACHE, f))


def run_phase(tb: Testbed, key: str, mode: str, conc: int, count: int,
              make_call: Callable[[str, str, int], dict[str, Any]]) -> dict[str, Any]:
    """ADD then DEL of ``count`` Pods of plugin ``key``, verified; returns the figures."""
    pods = tb.pod_ns[key][:count]
    v = tb.verifiers[key]
    out: dict[str, Any] = {}
    for op in ("add", "del"):
        log(f"{key} {mode} {op.upper()} x{count}" + (f" ({conc} workers)" if conc > 1 else ""))
        calls = [make_call(op, pod, i) for i, pod in enumerate(pods)]
        daemons = tb.daemon_pids()
        before = cpu.snapshot(daemons)
        res = run_driver(tb.plugins[key].node, calls, conc)
        after = cpu.snapshot(daemons)
        results = _checked(res, f"{key} {mode} {op.upper()}")
        ms = [r["ms"] for r in results]
        out[op] = conc_stats(ms, res["wall_s"], conc) if conc > 1 or mode == "concurrent" else stats(ms)
        out[op]["cpu"] = cpu.split(before, after, res.get("children", {}), res["wall_s"])
        if op == "add":
            v.added(mode, [r["stdout"] for r in results])
        else:
            v.deleted(mode, pods)
    return out


def _pod_routes(pod: str) -> set[tuple[str, str, int]]:
    """The IPv4 routes through a gateway that Pod ``pod``'s kernel holds."""
    return enc.kernel_routes(json.loads(_run(["ip", "-n", pod, "-j", "-4", "route", "show"]).stdout or "[]"))


def _gateway_port(ovs: Any) -> tuple[int, str]:
    """The OVS node's gateway port: its ofport and MAC, as a state file names them."""
    ofport = int(ovs.vsctl("get", "Interface", GATEWAY_PORT, "ofport").strip())
    return ofport, ovs.vsctl("get", "Interface", GATEWAY_PORT, "mac_in_use").strip().strip('"')


def _state_file_plugin(tb: Testbed, key: str, label: str, state: Any, name: str, ipam_dir: str,
                       netname: str) -> Plugin:
    """Ferry's launcher on the OVS node reading ``state`` (a ``NodeState``), written to its own
    state file ``<work>/state-<name>``; its Pods' addresses from ``ipam_dir``."""
    ferry = tb.plugins["ferry"]
    state_file = os.path.join(tb.work, f"state-{name}", "node-state.json")
    os.makedirs(os.path.dirname(state_file))
    with open(state_file, "w") as f:
        f.write(state.to_json())
    conf = {"type": "ferry", "stateFile": state_file, "logFile": os.path.join(tb.work, f"ferry-{name}.log"),
            "ipam": {"type": "ferry-ipam", "dataDir": ipam_dir}}
    return Plugin(key, "ferry", label, ferry.version, ferry.exe, ferry.cni_path, ferry.node, netname, conf, "", "")


def encryption_phase(tb: Testbed) -> dict[str, Any]:
    """Issue 30's "ADD unchanged": ``tb.pods`` ADDs then DELs on the OVS node through a state file
    in clear and as many through one that says ``encryption: wireguard`` (bench.cni_encryption),
    the two sides taking turns call by call.  Every ADD verified as the other phases' are, and
    every Pod holds the routes its state file gives it (the encrypted side's differ: the cluster
    prefix at WireGuard's MTU), so neither side can skip its work."""
    ovs, fnode = tb.ovs, tb.plugins["ferry"].node
    gw_ofport, gw_mac = _gateway_port(ovs)
    ipam_dir = os.path.join(tb.work, "ferry-ipam-encryption")  # one store: the sides share the Node's CIDR
    plugins: dict[str, Plugin] = {}
    expected: dict[str, set[tuple[str, str, int]]] = {}
    for side in enc.SIDES:
        state = enc.node_state(side, gw_mac, gw_ofport, ovs.db, ovs.run_dir)
        expected[side] = enc.expected_routes(state)
        # one network name: the sides are one Node's network, its addresses from one store
        plugins[side] = _state_file_plugin(tb, ENC_KEYS[side], f"ferry, state file encryption {side}", state, side,
                                           ipam_dir, f"{tb.tag}-ferry-encryption")
    if expected[ENCRYPTION_NONE] == expected[ENCRYPTION_WIREGUARD]:
        raise BenchError(f"the encryption phase's state files give the same routes: {expected}")
    # one verifier for both sides: they share the node, the bridge and the IPAM store
    both = dataclasses.replace(plugins[ENCRYPTION_NONE], key="ferry-encryption")
    verifier = tb.verifiers["ferry-encryption"] = Verifier(both, ovs, tag=tb.tag)
    calls = enc.order(tb.pods)
    pods = {side: tb.pod_ns[ENC_KEYS[side]] for side in enc.SIDES}
    # the Node as its state files describe it: the gateway holds their Pod CIDR's gateway address
    _run(["ip", "-n", fnode, "addr", "add", enc.GATEWAY, "dev", GATEWAY_PORT])
    out: dict[str, Any] = {"mode": NO_ENCAP, "routes": {side: sorted(expected[side]) for side in enc.SIDES}}
    ms: dict[str, dict[Encryption, list[float]]] = {}
    try:
        for op in ("add", "del"):
            log(f"encryption {op.upper()} x{tb.pods} per side, interleaved")
            res = _checked(run_driver(fnode, [direct_call(plugins[side], op, pods[side][i],
                                                          f"{tb.tag}-enc-{side}-{i:03d}") for side, i in calls]),
                           f"encryption {op.upper()}")
            ms[op] = enc.by_side([r["ms"] for r in res], calls)
            out[op] = {side: stats(ms[op][side]) for side in enc.SIDES}
            if op == "add":
                verifier.added("encryption", [r["stdout"] for r in res])
                for side, i in calls:
                    have = _pod_routes(pods[side][i])
                    if have != expected[side]:
                        raise BenchError(f"encryption {side}: Pod {pods[side][i]} holds routes {sorted(have)}, "
                                         f"its state file gives {sorted(expected[side])}")
                verifier.log.append(f"{both.key} encryption: {len(calls)} Pods hold their state file's routes")
            else:
                verifier.deleted("encryption", [pods[side][i] for side, i in calls])
    finally:
        _run(["ip", "-n", fnode, "addr", "del", enc.GATEWAY, "dev", GATEWAY_PORT], check=False)
    out["ratios"] = enc.ratios(ms)
    return out


def _pending_on_bridge(ovs: Any) -> dict[int, frozenset[pol.Canon]]:
    """The pending drops on br-int, per cookie (one dump of their table)."""
    from cni.ovs.openflow.ofctl import parse_dump
    from cni.pipeline.tables import Table

    dump = ovs.ofctl("dump-flows", "br-int", f"table={int(Table.CONNTRACK_STATE)}")
    return pol.installed_pending(parse_dump(dump))


def _check_pending(ovs: Any, expected: dict[int, frozenset[pol.Canon]], when: str) -> None:
    """Raise unless br-int holds exactly the pending drops ``expected`` (per Pod cookie)."""
    problems = pol.pending_problems(expected, _pending_on_bridge(ovs))
    if problems:
        raise BenchError(f"policy {when}: " + "; ".join(problems[:5]) + (" ..." if len(problems) > 5 else ""))


def _expected_pending(calls: Sequence[tuple[pol.Side, int]], results: Sequence[dict[str, Any]],
                      container: Callable[[str, int], str]) -> dict[pol.Side, dict[int, frozenset[pol.Canon]]]:
    """Per side, each ADDed Pod's cookie and the pending drops it must hold, from its ADD's result
    (its addresses) and container ID."""
    expected: dict[pol.Side, dict[int, frozenset[pol.Canon]]] = {side: {} for side in pol.SIDES}
    for (side, i), r in zip(calls, results, strict=True):
        addresses = [ip["address"] for ip in json.loads(r["stdout"]).get("ips", [])]
        cookie, drops = pol.expected_pending(side, container(side, i), IFNAME, addresses)
        expected[side][cookie] = drops
    return expected


def policy_phase(tb: Testbed) -> dict[str, Any]:
    """Issue 27's "the per-Pod ADD stays fast": ``tb.pods`` ADDs then DELs on the OVS node through a
    state file without ``policyNamespaces`` and as many through one that lists the Pods' namespace
    (bench.cni_policy), the two sides taking turns call by call.  Every ADD verified as the other
    phases' are, and every Pod of the policy side holds its pending drops on the bridge, exactly
    those the plugin's plan gives it, and the other side's Pods none, so neither side can skip
    its work; after the DELs no pending drop is left."""
    ovs, fnode = tb.ovs, tb.plugins["ferry"].node
    gw_ofport, gw_mac = _gateway_port(ovs)
    ipam_dir = os.path.join(tb.work, "ferry-ipam-policy")  # one store: the sides share the Node's CIDR
    states = {side: pol.node_state(side, gw_mac, gw_ofport, ovs.db, ovs.run_dir) for side in pol.SIDES}
    # one network name: the sides are one Node's network, its addresses from one store
    plugins = {side: _state_file_plugin(tb, POLICY_KEYS[side], f"ferry, state file policyNamespaces "
                                        f"{states[side].policyNamespaces}", states[side], f"policy-{side}",
                                        ipam_dir, f"{tb.tag}-ferry-policy") for side in pol.SIDES}
    # one verifier for both sides: they share the node, the bridge and the IPAM store
    both = dataclasses.replace(plugins[pol.NONE], key="ferry-policy")
    verifier = tb.verifiers["ferry-policy"] = Verifier(both, ovs, tag=tb.tag)
    calls = pol.order(tb.pods)
    pods = {side: tb.pod_ns[POLICY_KEYS[side]] for side in pol.SIDES}

    def container(side: str, i: int) -> str:
        return f"{tb.tag}-pol-{side}-{i:03d}"

    out: dict[str, Any] = {"mode": NO_ENCAP, "namespace": pol.NAMESPACE,
                           "policyNamespaces": {side: states[side].policyNamespaces for side in pol.SIDES}}
    ms: dict[str, dict[pol.Side, list[float]]] = {}
    # the Node as its state files describe it: the gateway holds their Pod CIDR's gateway address
    _run(["ip", "-n", fnode, "addr", "add", enc.GATEWAY, "dev", GATEWAY_PORT])
    try:
        for op in ("add", "del"):
            log(f"policy {op.upper()} x{tb.pods} per side, interleaved")
            res = _checked(run_driver(fnode, [direct_call(plugins[side], op, pods[side][i], container(side, i),
                                                          namespace=pol.NAMESPACE) for side, i in calls]),
                           f"policy {op.upper()}")
            ms[op] = pol.by_side([r["ms"] for r in res], calls)
            out[op] = {side: stats(ms[op][side]) for side in pol.SIDES}
            if op == "add":
                verifier.added("policy", [r["stdout"] for r in res])
                expected = _expected_pending(calls, res, container)
                if not all(expected[pol.POLICY].values()):
                    raise BenchError("policy: the plugin's plan gives a Pod of the policy side no pending drop")
                _check_pending(ovs, {**expected[pol.NONE], **expected[pol.POLICY]}, "after ADD")
                out["pending_drops"] = {side: sum(map(len, expected[side].values())) for side in pol.SIDES}
                verifier.log.append(f"{both.key} policy: {tb.pods} Pods hold their pending drops, {tb.pods} none")
            else:
                verifier.deleted("policy", [pods[side][i] for side, i in calls])
                _check_pending(ovs, {}, "after DEL")
                verifier.log.append(f"{both.key} policy: no pending drop left")
    finally:
        _run(["ip", "-n", fnode, "addr", "del", enc.GATEWAY, "dev", GATEWAY_PORT], check=False)
    out["ratios"] = pol.ratios(ms)
    return out


def measure(tb: Testbed, conc: int, cnitool: str | None, cnitool_pods: int) -> dict[str, Any]:
    keys = [k for k in KEYS if k in tb.plugins]
    figs: dict[str, dict[str, Any]] = {k: {} for k in keys}

    def direct(key: str, mode: str) -> Callable[[str, str, int], dict[str, Any]]:
        return lambda op, pod, i: direct_call(tb.plugins[key], op, pod, f"{tb.tag}-{key}-{mode}-{i:03d}")

    for key in keys:  # warm-up: bridge/gateway created, binaries and modules in the page cache
        run_phase(tb, key, "warm-up", 1, 1, direct(key, "warm"))
        figs[key]["label"] = tb.plugins[key].label
        figs[key]["version"] = tb.plugins[key].version
    if tb.plugins["ferry"].conf["datapath"] == "netdev":
        dp = _run(["ovs-vsctl", f"--db=unix:{tb.ovs_dir}/db.sock", "get", "bridge", "br-int",
                   "datapath_type"]).stdout.strip()
        if dp != "netdev":
            raise BenchError(f"br-int datapath_type is {dp}, not netdev")
    floor = _checked(run_driver(tb.plugins["bridge"].node,
                                [{"argv": ["/bin/true"], "env": BASE_ENV}] * tb.pods), "floor")
    floors = {"harness floor (exec /bin/true)": stats([r["ms"] for r in floor])}
    # What a call costs before any work (start, the protocol core): VERSION, the plugins taking
    # turns call by call, so a burst of load elsewhere slows them alike (frozen vs launcher is a
    # target of a few tenths of a millisecond).
    res = _checked(run_driver(tb.plugins["bridge"].node,
                              [version_call(tb.plugins[key]) for _ in range(tb.pods) for key in keys]), "VERSION")
    for i, key in enumerate(keys):
        floors[f"{key} VERSION (start-up floor)"] = stats([r["ms"] for r in res[i::len(keys)]])
    imports = import_floor_call(tb.plugins["ferry"])
    if imports is not None:
        res = _checked(run_driver(tb.plugins["ferry"].node, [imports] * tb.pods), "ferry import floor")
        floors["ferry start + every per-Pod import, no work"] = stats([r["ms"] for r in res])
    for key in keys:
        figs[key]["sequential"] = run_phase(tb, key, "sequential", 1, tb.pods, direct(key, "seq"))
    encryption = encryption_phase(tb)
    policy = policy_phase(tb)
    if cnitool and cnitool_pods > 0:
        tool = cnitool

        def via_cnitool(key: str) -> Callable[[str, str, int], dict[str, Any]]:
            return lambda op, pod, i: cnitool_call(tb.plugins[key], tool, op, pod)

        for key in keys:
            if key in CNITOOL_KEYS:
                figs[key]["cnitool"] = run_phase(tb, key, "cnitool", 1, min(cnitool_pods, tb.pods), via_cnitool(key))
    for key in keys:
        figs[key]["concurrent"] = run_phase(tb, key, "concurrent", conc, tb.pods, direct(key, "conc"))
    return {"floor": stats([r["ms"] for r in floor]), "floors": floors, "plugins": figs, "encryption": encryption,
            "policy": policy}


def _commit() -> str:
    p = _run(["git", "-C", ROOT, "describe", "--always", "--dirty"], check=False)
    return p.stdout.strip() or "?"


def _loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--driver"]:
        return driver_main()
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--pods", type=int, default=200)
    ap.add_argument("--conc", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="10 Pods, concurrency 2")
    ap.add_argument("--json", help="write every figure (and the raw samples) to this file")
    ap.add_argument("--cni-bin", help="a CNI_PATH directory holding `ferry` (default: launchers in a temp dir)")
    ap.add_argument("--reference-dir", default="/usr/lib/cni", help="where Debian's bridge/host-local are")
    ap.add_argument("--dist", default=os.path.join(ROOT, "dist", "ferry"),
                    help="the frozen bundle (make dist); not there: reported as not built")
    ap.add_argument("--no-build", action="store_true",
                    help="do not build the Go peers (ovs-cni, upstream plugins); use what build/tools holds")
    ap.add_argument("--cnitool", default=tools.cnitool())
    ap.add_argument("--cnitool-pods", type=int, default=20, help="Pods run through cnitool (0: skip)")
    ap.add_argument("--tag", help=f"name prefix of everything created (default {PREFIX}-<random>)")
    args = ap.parse_args(args_in)
    if args.quick:
        args.pods, args.conc, args.cnitool_pods = 10, 2, min(args.cnitool_pods, 10)
    if os.geteuid() != 0:
        print("bench_cni needs root (network namespaces, OVS)", file=sys.stderr)
        return 2
    if not 1 <= args.pods <= 999 or args.conc < 1:
        print("--pods must be 1..999 and --conc >= 1", file=sys.stderr)
        return 2
    if not os.access(os.path.join(args.reference_dir, "bridge"), os.X_OK):
        print(f"reference plugin {args.reference_dir}/bridge not found", file=sys.stderr)
        return 2
    cnitool = args.cnitool if os.access(args.cnitool, os.X_OK) else None
    if cnitool is None:
        log(f"no cnitool at {args.cnitool}: skipping the cnitool rows")
    tag = args.tag or f"{PREFIX}-{secrets.token_hex(3)}"
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    signal.signal(signal.SIGTERM, _on_sigterm)
    load_before = _loadavg()
    started = datetime.datetime.now(datetime.UTC)
    try:
        src = find_sources(args.cni_bin, args.dist, args.reference_dir, build=not args.no_build)
        for key, peer in (("ferry-frozen", src.frozen), ("ovs-cni", src.ovs_cni), ("bridge-upstream", src.upstream)):
            log(f"{key}: {peer.version} in {peer.directory}" if peer.built else f"{key}: not built: {peer.reason}")
        with testbed(tag, args.pods, src) as tb:
            figs = measure(tb, args.conc, cnitool, args.cnitool_pods)
            checks = [line for v in tb.verifiers.values() for line in v.log]
            ferry_exe, work, ovs_dir, not_built = tb.plugins["ferry"].exe, tb.work, tb.ovs_dir, tb.not_built
            log("cleaning up")
    except BenchError as e:
        print(f"bench_cni: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench_cni: interrupted; cleaned up", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    res = {"benchmark": "cni-add-del",
           "meta": {"date": started.strftime("%Y-%m-%dT%H:%M:%SZ"), "tag": tag, "pods": args.pods,
                    "conc": args.conc, "cnitool_pods": min(args.cnitool_pods, args.pods) if cnitool else 0,
                    "host": f"{platform.node()} {platform.release()}, {os.cpu_count()} CPUs",
                    "loadavg_before": load_before, "loadavg_after": _loadavg(),
                    "ferry_exe": ferry_exe, "ferry_commit": _commit(),
                    "reference_version": src.debian.version,
                    "versions": {"debian_plugins": src.debian.version, "upstream_plugins": src.upstream.version,
                                 "ovs_cni": src.ovs_cni.version, "ferry": _commit()},
                    "python": platform.python_version(), "work_dir": work, "ovs_dir": ovs_dir},
           **figs, "checks": checks}
    res["not_built"] = not_built
    res["ratios"] = ratios(res["plugins"])
    res["comparisons"] = comparisons(res["plugins"], res["floors"], not_built)
    print(render(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
