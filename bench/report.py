"""``results.json`` → ``report.md`` + PNG plots.

    python -m bench.report RESULTS_DIR [--docs DOCS_DIR]

``results.json`` (written by ``python -m bench``) holds ``meta`` and ``benchmarks``: for each
benchmark ``{"status": "ok" | "failed", "error": ..., "data": <its own --json output>}``.

The report lists every goal figure of the other issues as a ratio against its reference,
marked pass / short (or "—" where the issue sets no bound, "not run" when its benchmark failed or
the quick run leaves it out, "not built: <reason>" when a peer plugin could not be built), then
each benchmark's own figures, then the plots: ``latency.png`` (CNI ADD and DEL latency
distributions: Ferry's launcher and frozen bundle, ovs-cni, Debian's and upstream's bridge),
``throughput.png``
(iperf3 per data-plane path, median with min-max) and ``reconcile.png`` (route-sync full
reconcile time vs peers).  ``--docs DIR`` also writes ``DIR/benchmarks.md`` with the plots
copied to ``DIR/benchmarks/``.

Building the rows is pure (:func:`goal_rows`, :func:`render`); only :func:`plot_*` and
:func:`main` touch files."""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.cpu import CONSUMERS as CPU_SHARES
from bench.cpu import shares as cpu_shares
from bench.util import percentile

PLOTS = ("latency.png", "throughput.png", "reconcile.png")


@dataclass(frozen=True)
class Goal:
    """One goal figure: ``ratio = ours / reference`` compared with ``bound`` by ``cmp``
    (``cmp`` None: the issue gives no bound, the ratio is reported only)."""

    issue: int
    bench: str
    figure: str
    cmp: str | None
    bound: float | None
    values: Callable[[dict[str, Any]], tuple[float, float] | None]  # data → (ours, reference)
    unit: str = "ms"
    reference: str = ""  # may name versions: {debian_plugins}, {upstream_plugins}, {ovs_cni} (bench_cni's meta)
    paths: tuple[str, ...] = ()  # data-plane paths the figure needs
    missing: Callable[[dict[str, Any]], str | None] | None = None  # data → why the figure is absent


@dataclass(frozen=True)
class Row:
    issue: int
    figure: str
    ours: float | None
    reference: float | None
    ratio: float | None
    target: str
    verdict: str  # pass | short | — | not run
    unit: str
    reference_name: str


# ------------------------------------------------------------------------------------------
# Figure extraction from each benchmark's JSON (None: that figure is not in this run).

def _startup(call: str) -> Callable[[dict[str, Any]], tuple[float, float] | None]:
    def get(d: dict[str, Any]) -> tuple[float, float] | None:
        s = {(x["call"], x["plugin"]): x for x in d.get("series", [])}
        if (call, "ferry") not in s or (call, "bridge") not in s:
            return None
        return s[(call, "ferry")]["p50"], s[(call, "bridge")]["p50"]
    return get


def _cni(figure: str) -> Callable[[dict[str, Any]], tuple[float, float] | None]:
    def get(d: dict[str, Any]) -> tuple[float, float] | None:
        for r in d.get("ratios", []):
            if r["figure"] == figure:
                return r["ferry"], r["reference"]
        return None
    return get


def _cmp(figure: str) -> Callable[[dict[str, Any]], tuple[float, float] | None]:
    """An issue-18 comparison of bench_cni (ours / reference)."""
    def get(d: dict[str, Any]) -> tuple[float, float] | None:
        for r in d.get("comparisons", []):
            if r["figure"] == figure and r.get("ratio") is not None:
                return r["ours"], r["reference"]
        return None
    return get


def _cmp_missing(figure: str) -> Callable[[dict[str, Any]], str | None]:
    def get(d: dict[str, Any]) -> str | None:
        for r in d.get("comparisons", []):
            if r["figure"] == figure and r.get("not_built"):
                return f"not built: {r['not_built']}"
        return None
    return get


def _goal18(figure: str, cmp: str | None, bound: float | None, reference: str, unit: str = "ms") -> Goal:
    return Goal(18, "cni", figure, cmp, bound, _cmp(figure), unit=unit, reference=reference,
                missing=_cmp_missing(figure))


def _ipam(fill: int) -> Callable[[dict[str, Any]], tuple[float, float] | None]:
    def get(d: dict[str, Any]) -> tuple[float, float] | None:
        s = {(x["fill"], x["implementation"]): x for x in d.get("series", [])}
        if (fill, "ferry-ipam exec") not in s or (fill, "host-local exec") not in s:
            return None
        return s[(fill, "ferry-ipam exec")]["add_p50"], s[(fill, "host-local exec")]["add_p50"]
    return get


def _ipam_flat(d: dict[str, Any]) -> tuple[float, float] | None:
    s = {(x["fill"], x["implementation"]): x for x in d.get("series", [])}
    if (99, "ferry in-process") not in s or (0, "ferry in-process") not in s:
        return None
    return s[(99, "ferry in-process")]["add_p50"], s[(0, "ferry in-process")]["add_p50"]


def _reconcile(peers: int, budget: float) -> Callable[[dict[str, Any]], tuple[float, float] | None]:
    def get(d: dict[str, Any]) -> tuple[float, float] | None:
        for r in d.get("sizes", []):
            if r["peers"] == peers:
                return r["reconcile_s"], budget
        return None
    return get


def _rss(d: dict[str, Any]) -> tuple[float, float] | None:
    sizes = d.get("sizes", [])
    return (max(r["peak_rss_mb"] for r in sizes), 150.0) if sizes else None


def _change(d: dict[str, Any]) -> tuple[float, float] | None:
    c = d.get("change")
    return (c["p99_ms"], 100.0) if c else None


def _throughput(path: str, ref: str) -> Callable[[dict[str, Any]], tuple[float, float] | None]:
    def get(d: dict[str, Any]) -> tuple[float, float] | None:
        p = {x["path"]: x for x in d.get("paths", []) if "median" in x}
        if path not in p or ref not in p:
            return None
        return p[path]["median"], p[ref]["median"]
    return get


def _dp_cost(path: str, ref: str) -> Callable[[dict[str, Any]], tuple[float, float] | None]:
    """CPU seconds per Gbit of two data-plane paths (bench_dataplane's medians)."""
    def get(d: dict[str, Any]) -> tuple[float, float] | None:
        p = {x["path"]: x for x in d.get("paths", []) if "median" in x}
        if path not in p or ref not in p:
            return None
        return p[path]["cpu_s_per_gbit_median"], p[ref]["cpu_s_per_gbit_median"]
    return get


def _dp_latency(path: str, ref: str, pct: str) -> Callable[[dict[str, Any]], tuple[float, float] | None]:
    """The TCP round trips' ``pct`` (p50, p99) of two data-plane paths, µs."""
    def get(d: dict[str, Any]) -> tuple[float, float] | None:
        p = {x["path"]: x.get("latency_us") for x in d.get("paths", []) if "median" in x}
        if not p.get(path) or not p.get(ref):
            return None
        return p[path][pct], p[ref][pct]
    return get


def _cni_encryption(d: dict[str, Any]) -> tuple[float, float] | None:
    """bench_cni's encryption phase: ADD p50 through the state file that encrypts, and in clear."""
    e = d.get("encryption")
    if not e:
        return None
    return e["add"]["wireguard"]["p50"], e["add"]["none"]["p50"]


def _cni_policy(d: dict[str, Any]) -> tuple[float, float] | None:
    """bench_cni's policy phase: ADD p50 through the state file that lists the Pods' namespace in
    policyNamespaces (pending drops installed), and through the one that lists none."""
    p = d.get("policy")
    if not p:
        return None
    return p["add"]["policy"]["p50"], p["add"]["none"]["p50"]


def _service(mode: str, what: str) -> Callable[[dict[str, Any]], tuple[float, float] | None]:
    """bench_services: ClusterIP against Pod IP on the same pair, ``what`` = gbps or rtt_ms."""
    def get(d: dict[str, Any]) -> tuple[float, float] | None:
        m = (d.get("modes") or {}).get(mode)
        if not m:
            return None
        key = "gbps_median" if what == "gbps" else "rtt_ms_median"
        ours, ref = m["service"].get(key), m["pod"].get(key)
        return (ours, ref) if ours is not None and ref else None
    return get


def _policy_plan(key: str, ref: str) -> Callable[[dict[str, Any]], tuple[float, float] | None]:
    """bench_policy's planning: ``key`` against ``ref`` (a figure of the same run) or a budget."""
    def get(d: dict[str, Any]) -> tuple[float, float] | None:
        p = d.get("planning") or {}
        if key not in p:
            return None
        reference = (d.get("budgets") or {}).get("plan_s") if ref == "budget" else p.get(ref)
        return (p[key], reference) if reference else None
    return get


def _policy_rss(d: dict[str, Any]) -> tuple[float, float] | None:
    rss = (d.get("planning") or {}).get("rss")
    budget = (d.get("budgets") or {}).get("rss_mb")
    return (rss["peak_rss_mb"], budget) if rss and budget else None


def _policy_dataplane(what: str) -> Callable[[dict[str, Any]], tuple[float, float] | None]:
    """bench_policy's data plane, with 1,000 policies' flows against none: ``gbps`` or ``cpu``."""
    def get(d: dict[str, Any]) -> tuple[float, float] | None:
        dp = d.get("dataplane") or {}
        if "policy" not in dp or "none" not in dp:
            return None
        key = "gbps_median" if what == "gbps" else "cpu_s_per_gbit_median"
        ours, ref = dp["policy"].get(key), dp["none"].get(key)
        return (ours, ref) if ours is not None and ref else None
    return get


def _realize(section: str, figure: str, ref: str) -> Callable[[dict[str, Any]], tuple[float, float] | None]:
    """bench_policy_realize: ``section.figure``'s p99 against ``ref``: a number (the issue's
    bound, ms) or another figure of the same section (its p50)."""
    def get(d: dict[str, Any]) -> tuple[float, float] | None:
        sec = d.get(section) or {}
        ours = (sec.get(figure) or {}).get("p99_ms")
        reference = float(ref) if ref[0].isdigit() else (sec.get(ref) or {}).get("p50_ms")
        return (ours, reference) if ours is not None and reference else None
    return get


def _realize_p99(section: str, figure: str, ref: str) -> Callable[[dict[str, Any]], tuple[float, float] | None]:
    """bench_policy_realize: ``section[figure]``'s enforced-on-every-Node p99 against ``section[ref]``'s,
    two kinds of policy measured in one run."""
    def get(d: dict[str, Any]) -> tuple[float, float] | None:
        sec = d.get(section) or {}
        ours = ((sec.get(figure) or {}).get("enforced_all_nodes") or {}).get("p99_ms")
        reference = ((sec.get(ref) or {}).get("enforced_all_nodes") or {}).get("p99_ms")
        return (ours, reference) if ours is not None and reference else None
    return get


def _encryption_goals(path: str, ref: str, label: str, ref_label: str) -> tuple[Goal, ...]:
    """Issue 30's cost of encryption on one pair of data-plane paths: reported, no bound."""
    return (Goal(30, "dataplane", f"{label}: throughput", None, None, _throughput(path, ref), paths=(path, ref),
                 unit="Gbit/s", reference=ref_label),
            Goal(30, "dataplane", f"{label}: CPU s per Gbit", None, None, _dp_cost(path, ref), paths=(path, ref),
                 unit="s", reference=ref_label),
            Goal(30, "dataplane", f"{label}: TCP round trip p50", None, None, _dp_latency(path, ref, "p50"),
                 paths=(path, ref), unit="µs", reference=ref_label),
            Goal(30, "dataplane", f"{label}: TCP round trip p99", None, None, _dp_latency(path, ref, "p99"),
                 paths=(path, ref), unit="µs", reference=ref_label))


GOALS: tuple[Goal, ...] = (
    Goal(2, "startup", "VERSION p50", None, None, _startup("VERSION"), reference="Go bridge"),
    Goal(2, "startup", "error path (malformed config) p50", None, None, _startup("malformed config (ADD)"),
         reference="Go bridge"),
    Goal(3, "cni", "ADD p50", "<=", 1.5, _cni("ADD p50"), reference="Debian bridge + host-local {debian_plugins}"),
    Goal(3, "cni", "ADD p99", "<=", 2.0, _cni("ADD p99"), reference="Debian bridge + host-local {debian_plugins}"),
    Goal(3, "cni", "DEL p50", "<=", 1.2, _cni("DEL p50"), reference="Debian bridge + host-local {debian_plugins}"),
    Goal(3, "cni", "8-concurrent ADD throughput", ">=", 1.0, _cni("concurrent ADD throughput"),
         unit="Pods/s", reference="Debian bridge + host-local {debian_plugins}"),
    _goal18("frozen / launcher: ADD p50", "<=", 1.1, "ferry source launcher"),
    _goal18("frozen / launcher: VERSION p50", "<=", 1.2, "ferry source launcher"),
    _goal18("frozen / launcher: concurrent ADD throughput", None, None, "ferry source launcher", unit="Pods/s"),
    _goal18("ferry (frozen) / ovs-cni: ADD p50", "<=", 1.0, "ovs-cni {ovs_cni}"),
    _goal18("ferry (frozen) / ovs-cni: DEL p50", None, None, "ovs-cni {ovs_cni}"),
    _goal18("ferry (frozen) / ovs-cni: concurrent ADD throughput", ">=", 1.0, "ovs-cni {ovs_cni}", unit="Pods/s"),
    _goal18("ferry (frozen) / ovs-cni: ovs-vswitchd CPU per ADD", None, None, "ovs-cni {ovs_cni}"),
    _goal18("ferry (frozen) / ovs-cni polling 10 ms: ADD p50", None, None, "ovs-cni {ovs_cni}, link state every 10 ms"),
    _goal18("ferry (frozen) / ovs-cni polling 10 ms: concurrent ADD throughput", None, None,
            "ovs-cni {ovs_cni}, link state every 10 ms", unit="Pods/s"),
    _goal18("upstream / Debian bridge: ADD p50", None, None, "Debian bridge + host-local {debian_plugins}"),
    _goal18("upstream / Debian bridge: concurrent ADD throughput", None, None,
            "Debian bridge + host-local {debian_plugins}", unit="Pods/s"),
    _goal18("ferry (frozen) / upstream bridge: ADD p50", None, None, "upstream bridge + host-local {upstream_plugins}"),
    _goal18("ferry (frozen) / upstream bridge: concurrent ADD throughput", None, None,
            "upstream bridge + host-local {upstream_plugins}", unit="Pods/s"),
    Goal(5, "ipam", "ADD p50 at 0 % (ferry-ipam exec)", None, None, _ipam(0), reference="host-local"),
    Goal(5, "ipam", "ADD p50 at 50 % (ferry-ipam exec)", None, None, _ipam(50), reference="host-local"),
    Goal(5, "ipam", "ADD p50 at 99 % (ferry-ipam exec)", None, None, _ipam(99), reference="host-local"),
    Goal(5, "ipam", "ADD cost independent of fill: 99 % / 0 % (in-process)", "<=", 1.5, _ipam_flat,
         reference="ferry at 0 %"),
    Goal(6, "routesync", "full reconcile, 1,000 peers", "<=", 1.0, _reconcile(1000, 1.0), unit="s",
         reference="budget 1 s"),
    Goal(6, "routesync", "full reconcile, 5,000 peers", "<=", 1.0, _reconcile(5000, 5.0), unit="s",
         reference="budget 5 s"),
    Goal(6, "routesync", "peak RSS (largest size)", "<=", 1.0, _rss, unit="MB", reference="budget 150 MB"),
    Goal(6, "routesync", "one Node change → applied, p99", "<=", 1.0, _change, reference="budget 100 ms"),
    Goal(7, "dataplane", "fast path / gateway path", ">=", 1.5, _throughput("fast", "gateway"),
         paths=("fast", "gateway"), unit="Gbit/s", reference="noEncap via gateway"),
    Goal(7, "dataplane", "encap vxlan / gateway path", None, None, _throughput("vxlan", "gateway"),
         paths=("vxlan", "gateway"), unit="Gbit/s", reference="noEncap via gateway"),
    Goal(6, "dataplane", "encap geneve / vxlan", None, None, _throughput("geneve", "vxlan"), paths=("geneve", "vxlan"),
         unit="Gbit/s", reference="encap vxlan"),
    Goal(6, "dataplane", "encap gre / vxlan", None, None, _throughput("gre", "vxlan"), paths=("gre", "vxlan"),
         unit="Gbit/s", reference="encap vxlan"),
    Goal(30, "cni", "ADD p50, state file encryption wireguard / clear", "<=", 1.05, _cni_encryption,
         reference="the same Ferry, noEncap state file in clear, interleaved"),
    Goal(27, "cni", "ADD p50, namespace with policies / without", "<=", 1.05, _cni_policy,
         reference="the same Ferry, state file without policyNamespaces, interleaved"),
    *_encryption_goals("wg-vxlan", "vxlan", "encap vxlan + WireGuard / clear", "encap vxlan"),
    *_encryption_goals("wg-gateway", "gateway", "noEncap + WireGuard / clear", "noEncap via gateway"),
    Goal(26, "services", "Pod → ClusterIP / Pod → Pod IP throughput, encap vxlan", None, None,
         _service("encap", "gbps"), unit="Gbit/s", reference="the same pair by Pod IP"),
    Goal(26, "services", "Pod → ClusterIP / Pod → Pod IP throughput, fast path", None, None,
         _service("fast", "gbps"), unit="Gbit/s", reference="the same pair by Pod IP"),
    Goal(26, "services", "Pod → ClusterIP / Pod → Pod IP echo time, encap vxlan", None, None,
         _service("encap", "rtt"), unit="ms", reference="the same pair by Pod IP"),
    Goal(26, "services", "Pod → ClusterIP / Pod → Pod IP echo time, fast path", None, None,
         _service("fast", "rtt"), unit="ms", reference="the same pair by Pod IP"),
    Goal(27, "policy", "policy plan() for one Node, CPU", "<=", 1.0, _policy_plan("plan_cpu_s", "budget"), unit="s",
         reference="budget 2 s"),
    Goal(27, "policy", "policy plan() for one Node, wall", None, None, _policy_plan("plan_s", "budget"), unit="s",
         reference="budget 2 s"),
    Goal(27, "policy", "policy plan() / parsing the API objects, CPU", None, None,
         _policy_plan("plan_cpu_s", "parse_cpu_s"), unit="s", reference="model.*_from on every object"),
    Goal(27, "policy", "policy re-plan, one policy changed / parsing, CPU", None, None,
         _policy_plan("replan_cpu_s", "parse_cpu_s"), unit="s", reference="model.*_from on every object"),
    Goal(27, "policy", "policy peak RSS (inputs + one plan)", "<=", 1.0, _policy_rss, unit="MB",
         reference="budget 300 MB"),
    Goal(27, "policy", "Pod → Pod throughput, the generated policies in force / none", ">=", 0.9,
         _policy_dataplane("gbps"), unit="Gbit/s", reference="no policy, same pair, interleaved"),
    Goal(27, "policy", "CPU s per Gbit, the generated policies in force / none", None, None, _policy_dataplane("cpu"),
         unit="s", reference="no policy, same pair, interleaved"),
    Goal(27, "realize", "policy created → enforced on every Node, p99", "<=", 1.0,
         _realize("enforcement", "enforced_all_nodes", "500"), reference="goal 500 ms"),
    Goal(27, "realize", "policy enforced on every Node p99 / seen by an API watch p50", None, None,
         _realize("enforcement", "enforced_all_nodes", "api_watch"), reference="kubectl get --watch, same policies"),
    Goal(27, "realize", "selected Pod Running → reachable by its allowed peer, p99", "<=", 1.0,
         _realize("reach", "policy", "1000"), reference="goal 1 s"),
    Goal(27, "realize", "selected Pod reachable p99 / a Pod without policy p50", None, None,
         _realize("reach", "policy", "open"), reference="Pods in a namespace without policy, same run"),
    Goal(43, "realize", "ClusterNetworkPolicy created → enforced on every Node, p99", "<=", 1.0,
         _realize_p99("tiers", "clusternetworkpolicy", "networkpolicy"),
         reference="NetworkPolicy of the same subject and peers, interleaved, same run"),
)


def _unavailable(data: dict[str, Any]) -> set[str]:
    """Data-plane paths the tree does not have (reported "not available", not "not run")."""
    return {p["path"] for p in data.get("paths", []) if p.get("available") is False}


def goal_rows(results: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    benches = results.get("benchmarks", {})
    for g in GOALS:
        b = benches.get(g.bench) or {}
        ok = b.get("status") == "ok" and b.get("data")
        vals = g.values(b["data"]) if ok else None
        target = f"{g.cmp} {g.bound:g}x" if g.cmp and g.bound is not None else "—"
        versions = collections.defaultdict(lambda: "?", ((b.get("data") or {}).get("meta") or {}).get("versions") or {})
        reference = g.reference.format_map(versions)
        if vals is None:
            missing = "not available" if b.get("data") and _unavailable(b["data"]) & set(g.paths) else "not run"
            if ok and g.missing is not None:
                missing = g.missing(b["data"]) or missing
            rows.append(Row(g.issue, g.figure, None, None, None, target, missing, g.unit, reference))
            continue
        ours, ref = vals
        ratio = ours / ref if ref else None
        if g.cmp is None or g.bound is None or ratio is None:
            verdict = "—"
        else:
            ok = ratio <= g.bound if g.cmp == "<=" else ratio >= g.bound
            verdict = "pass" if ok else "short"
        rows.append(Row(g.issue, g.figure, ours, ref, ratio, target, verdict, g.unit, reference))
    return rows


# ------------------------------------------------------------------------------------------
# Markdown.

def _f(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "—"
    return f"{x:,.{digits}f}"


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _section_startup(d: dict[str, Any]) -> str:
    rows = [[x["call"], x["plugin"], str(x["n"]), _f(x["p50"]), _f(x["p99"]), _f(x["mean"])]
            for x in d.get("series", [])]
    return _md_table(["call", "plugin", "n", "p50 ms", "p99 ms", "mean ms"], rows)


CNI_KEYS = ("bridge", "bridge-upstream", "ferry", "ferry-frozen", "ovs-cni", "ovs-cni-poll10")


def _section_cni_profile(d: dict[str, Any]) -> str:
    """Where the concurrent run's CPU goes, per Pod, by consumer."""
    rows = []
    for key in CNI_KEYS:
        for op in ("add", "del"):
            s = d["plugins"].get(key, {}).get("concurrent", {}).get(op)
            if not s or not s.get("cpu"):
                continue
            sh = cpu_shares(s["cpu"])
            ours = sum(v for k, v in sh.items() if k != "user, other")
            rows.append([key, op.upper(), _f(s["pods_per_s"], 1),
                         *[_f(1000 * sh.get(k, 0.0) / s["n"], 1) for k in CPU_SHARES], _f(1000 * ours / s["n"], 1),
                         f"{100 * s['cpu']['machine_busy_s'] / s['cpu']['capacity_s']:.0f} %"])
    if not rows:
        return ""
    ovs_rows = []
    for key in CNI_KEYS:
        p = d["plugins"].get(key, {})
        cells = []
        for mode in ("sequential", "concurrent"):
            for op in ("add", "del"):
                c = (p.get(mode, {}).get(op) or {}).get("cpu") or {}
                if "ovs-vswitchd_user_s" not in c:
                    break
                cells.append(f"{c['ovs-vswitchd_user_s'] + c['ovs-vswitchd_sys_s']:.2f} / "
                             f"{c['ovsdb-server_user_s'] + c['ovsdb-server_sys_s']:.2f}")
        if len(cells) == 4 and key not in ("bridge", "bridge-upstream"):
            ovs_rows.append([key, *cells])
    ovs_table = ("\n\nCPU seconds of ovs-vswitchd / ovsdb-server during each run of the OVS plugins (same bridge, same "
                 "Node, same Pod count).\n\n"
                 + _md_table(["plugin", "sequential ADD", "sequential DEL", "concurrent ADD", "concurrent DEL"],
                             ovs_rows)
                 ) if ovs_rows else ""
    return ovs_table + (
        "\n\nWhere the concurrent run's CPU goes, ms per Pod (bench/cpu.py: the plugin processes from the "
        "driver's RUSAGE_CHILDREN, the OVS daemons from /proc/<pid>/stat, the kernel from /proc/stat's system "
        "+ irq + softirq time less those processes' own; \"user, other\" is the driver and whatever else the "
        "machine runs).\n\n"
        + _md_table(["plugin", "op", "Pods/s", *[f"{c} ms" for c in CPU_SHARES], "all but other users ms",
                     "machine busy"], rows))


def _section_cni(d: dict[str, Any]) -> str:
    rows = []
    for key in CNI_KEYS:
        if key not in d["plugins"]:
            continue
        p = d["plugins"][key]
        for mode in ("sequential", "cnitool", "concurrent"):
            for op in ("add", "del"):
                s = p.get(mode, {}).get(op)
                if s:
                    rate = _f(s.get("pods_per_s"), 1) if mode == "concurrent" else ""
                    rows.append([key, mode, op.upper(), str(s["n"]), _f(s["p50"]), _f(s["p90"]), _f(s["p99"]),
                                 _f(s["max"]), rate])
    meta = d.get("meta", {})
    floors = [[label, str(s["n"]), _f(s["p50"]), _f(s["p99"])] for label, s in (d.get("floors") or {}).items()]
    floor_table = ("\n\nFloors, same run: what a call costs before any plugin work.\n\n"
                   + _md_table(["floor", "n", "p50 ms", "p99 ms"], floors)) if floors else ""
    who = [f"- `{key}`: {d['plugins'][key].get('label', key)}, {d['plugins'][key].get('version', '?')}"
           for key in CNI_KEYS if key in d["plugins"]]
    who += [f"- `{key}`: not built: {why}" for key, why in (d.get("not_built") or {}).items()]
    cmp_rows = [[c["figure"], _f(c.get("ours")), _f(c.get("reference")),
                 _f(c.get("ratio")) + "x" if c.get("ratio") is not None else "—", c["target"],
                 f"not built: {c['not_built']}" if c.get("not_built") else
                 ("pass" if c["pass"] else "short") if "pass" in c else ""] for c in d.get("comparisons", [])]
    cmp_table = ("\n\nSide by side, ours / reference, same run.\n\n"
                 + _md_table(["comparison", "ours", "reference", "ratio", "target", ""], cmp_rows)) if cmp_rows else ""
    return (f"{meta.get('pods')} Pods, concurrency {meta.get('conc')}; wall time per plugin process "
            f"(fork+exec+run+exit).  Plugins:\n\n" + "\n".join(who) + "\n\n"
            + _md_table(["plugin", "phase", "op", "n", "p50 ms", "p90 ms", "p99 ms", "max ms", "Pods/s"], rows)
            + floor_table + cmp_table + _section_cni_encryption(d.get("encryption"))
            + _section_cni_policy(d.get("policy")) + _section_cni_profile(d))


def _section_cni_encryption(e: dict[str, Any] | None) -> str:
    """bench_cni's encryption phase (issue 30): the same ADD and DEL through two state files."""
    if not e:
        return ""
    rows = [[f"encryption {side}", op.upper(), str(e[op][side]["n"]), _f(e[op][side]["p50"]), _f(e[op][side]["p90"]),
             _f(e[op][side]["p99"]), _f(e[op][side]["max"])] for op in ("add", "del") for side in ("none", "wireguard")]
    r = e.get("ratios") or {}
    routes = "; ".join(f"{side}: " + ", ".join(f"{dst} mtu {mtu}" for dst, _gw, mtu in rs)
                       for side, rs in (e.get("routes") or {}).items())
    return (f"\n\nEncryption: the same Ferry on one {e.get('mode')} Node whose state file says encryption "
            "none or wireguard, the two taking turns call by call (the order alternating per pair); every Pod's "
            f"routes checked ({routes}).  wireguard / clear: ADD p50 {_f(r.get('ADD p50'), 3)}x "
            f"({r.get('target')}), ADD p99 {_f(r.get('ADD p99'), 3)}x, DEL p50 {_f(r.get('DEL p50'), 3)}x, "
            f"per pair (median) {_f(r.get('ADD per pair, median'), 3)}x.\n\n"
            + _md_table(["state file", "op", "n", "p50 ms", "p90 ms", "p99 ms", "max ms"], rows))


def _section_cni_policy(p: dict[str, Any] | None) -> str:
    """bench_cni's policy phase (issue 27): the same ADD and DEL with and without the Pods'
    namespace in the state file's policyNamespaces."""
    if not p:
        return ""
    rows = [[f"policyNamespaces {p['policyNamespaces'][side]}", op.upper(), str(p[op][side]["n"]),
             _f(p[op][side]["p50"]), _f(p[op][side]["p90"]), _f(p[op][side]["p99"]), _f(p[op][side]["max"])]
            for op in ("add", "del") for side in ("none", "policy")]
    r = p.get("ratios") or {}
    drops = p.get("pending_drops") or {}
    return (f"\n\nPolicies: the same Ferry on one {p.get('mode')} Node, its Pods in namespace "
            f"`{p.get('namespace')}`, whose state file lists that namespace in policyNamespaces or not, the two "
            "taking turns call by call (the order alternating per pair); every Pod's pending drops checked on the "
            f"bridge ({drops.get('policy')} on the policy side, {drops.get('none')} on the other, none after the "
            f"DELs).  policy / none: ADD p50 {_f(r.get('ADD p50'), 3)}x ({r.get('target')}), "
            f"ADD p99 {_f(r.get('ADD p99'), 3)}x, DEL p50 {_f(r.get('DEL p50'), 3)}x, "
            f"per pair (median) {_f(r.get('ADD per pair, median'), 3)}x.\n\n"
            + _md_table(["state file", "op", "n", "p50 ms", "p90 ms", "p99 ms", "max ms"], rows))


def _section_ipam(d: dict[str, Any]) -> str:
    rows = [[f"{x['fill']} %", x["implementation"], str(x["n"]), _f(x["add_p50"]), _f(x["add_p99"]),
             _f(x["del_p50"]), _f(x["del_p99"])] for x in d.get("series", [])]
    return (f"Allocation on {d.get('subnet')}.\n\n"
            + _md_table(["fill", "implementation", "n", "ADD p50 ms", "ADD p99 ms", "DEL p50 ms", "DEL p99 ms"],
                        rows))


def _section_routesync(d: dict[str, Any]) -> str:
    rows = [[f"{r['peers']:,}", _f(r["reconcile_s"], 3), _f(r["noop_reconcile_s"], 3), _f(r["peak_rss_mb"], 1),
             _f(r.get("vswitchd_rss_mb"), 1)] for r in d.get("sizes", [])]
    text = (f"Mode {d.get('mode')}; real OVS, routes, nftables in a namespace, route-sync's daemon and "
            "appliers in one process per size.\n\n"
            + _md_table(["peers", "full reconcile s", "re-assert (no change) s", "peak RSS MB",
                         "ovs-vswitchd RSS MB"], rows))
    c = d.get("change")
    if c:
        text += (f"\n\nOne Node change → applied on {c['peers']:,} peers (n={c['n']}): p50 {_f(c['p50_ms'], 1)} ms, "
                 f"p99 {_f(c['p99_ms'], 1)} ms, max {_f(c['max_ms'], 1)} ms.")
        if "cpu_p50_ms" in c:  # route-sync's own CPU for it (issue 40's budget: 2 ms), and what it sent OVS
            text += (f" route-sync CPU per change p50 {_f(c['cpu_p50_ms'], 2)} ms, p99 {_f(c['cpu_p99_ms'], 2)} ms; "
                     f"flow-mods per change p50 {_f(c.get('flow_mods_p50'), 0)}, max {c.get('flow_mods_max')}.")
    return text


def _section_dataplane(d: dict[str, Any]) -> str:
    rows = []
    for p in d.get("paths", []):
        if "median" in p:
            retrans = p.get("retransmits") or []
            lat = p.get("latency_us") or {}
            check = p.get("path_check") or f"{p['counter_port']} {p['counter_packets']:,} pkts"
            rows.append([p["label"], _f(p["median"]), _f(p["min"]), _f(p["max"]), str(len(p["gbps"])),
                         _f(p.get("cpu_s_per_gbit_median")), _f(lat.get("p50"), 0), _f(lat.get("p99"), 0),
                         f"{sorted(retrans)[len(retrans) // 2]:,}" if retrans else "—", check])
        else:
            why = p.get("reason") or f"FAILED: {p.get('error')}"
            rows.append([p["label"], "—", "—", "—", "0", "—", "—", "—", "—",
                         why.replace("|", "/").replace("\n", " ")[:200]])
    how = " (interleaved rounds, the same iperf3 parameters for every path)" if d.get("interleaved") else ""
    lat = d.get("latency") or {}
    rtt = (f"  Round trips: {lat.get('method')}, {lat.get('round_trips'):,} after each iperf3 run, p50 / p99 of a "
           "path's repetitions pooled." if lat.get("round_trips") else "")
    ratio_rows = [[k, _f(v.get("median")) + "x" if v.get("median") is not None else "—",
                   _f(v.get("cpu_per_gbit")) + "x" if v.get("cpu_per_gbit") is not None else "—",
                   _f(v.get("latency_p50")) + "x" if v.get("latency_p50") is not None else "—",
                   _f(v.get("latency_p99")) + "x" if v.get("latency_p99") is not None else "—",
                   ", ".join(f"{x:.2f}" for x in v.get("per_repetition") or [])]
                  for k, v in (d.get("ratios") or {}).items()]
    ratio_table = ("\n\nPath / reference, same run (CPU per Gbit and round trips: > 1 costs more).\n\n"
                   + _md_table(["pair", "throughput", "CPU s / Gbit", "RTT p50", "RTT p99",
                                "throughput per repetition"], ratio_rows)) if ratio_rows else ""
    return (f"{d.get('pair')}; {d.get('repetitions')} x {d.get('seconds'):g} s each{how}.  CPU s / Gbit: both "
            "Nodes' ovs-vswitchd (and, encrypted, both Nodes' wireguard-go) and both iperf3 processes per Gbit "
            f"received.{rtt}  Where the cycles go and what was tried to speed up the fast path: "
            "docs/design/decisions.md, \"The fast path on the userspace datapath\".\n\n"
            + _md_table(["path", "median Gbit/s", "min", "max", "reps", "CPU s / Gbit", "RTT p50 µs", "RTT p99 µs",
                         "retransmits (median run)", "path check (node-1 counters)"], rows)
            + ratio_table)


def _section_services(d: dict[str, Any]) -> str:
    rows = []
    for mode, m in (d.get("modes") or {}).items():
        for target in ("pod", "service"):
            t = m[target]
            rows.append([mode, "Pod IP" if target == "pod" else "ClusterIP", _f(t["gbps_median"]), _f(t["gbps_min"]),
                         _f(t["gbps_max"]), _f(t.get("rtt_ms_median")), str(t.get("rtt_n"))])
    return (f"kube-proxy {d.get('proxy')} mode; {d.get('reps')} interleaved repetitions x {d.get('seconds'):g} s "
            "iperf3, node-1 → node-2, the backend the Service's only one; echo: connect, 1,000 bytes each way.\n\n"
            + _md_table(["mode", "target", "median Gbit/s", "min", "max", "echo median ms", "echo n"], rows))


def _section_policy(d: dict[str, Any]) -> str:
    p = d.get("planning") or {}
    return ((_section_policy_planning(p) if p else "Planning: not run.")
            + _section_policy_dataplane(d.get("dataplane")))


def _section_policy_planning(p: dict[str, Any]) -> str:
    rss = p.get("rss") or {}
    rows = [["parse the API objects (reference)", _f(p.get("parse_s"), 3), _f(p.get("parse_cpu_s"), 3), ""],
            ["plan() for node-1", _f(p.get("plan_s"), 3), _f(p.get("plan_cpu_s"), 3),
             f"{p.get('flows', 0):,} flows, {p.get('conjunctions', 0):,} conjunctions"],
            [f"re-plan, {p.get('replan_policy')} changed", _f(p.get("replan_s"), 3), _f(p.get("replan_cpu_s"), 3),
             f"+{p.get('replan_flows_added')} / -{p.get('replan_flows_removed')} flows"]]
    shapes = ", ".join(f"{k} {v}" for k, v in (p.get("shapes") or {}).items())
    text = (f"{p.get('objects', 0):,} API objects generated (seed {p.get('seed')}): {p.get('pods', 0):,} dual-stack "
            f"Pods on {p.get('nodes')} Nodes ({p.get('local_pods', 0):,} on node-1), {p.get('namespaces')} "
            f"namespaces, {p.get('policies', 0):,} policies ({shapes}).  Medians of {p.get('runs')} runs, wall and "
            f"this process's CPU (load average {_loadavg(p.get('loadavg'))}).\n\n"
            + _md_table(["step", "wall s", "CPU s", ""], rows)
            + f"\n\nFlows per table: {p.get('flows_by_table')}.  Peak RSS of a fresh process: "
            f"{_f(rss.get('inputs_rss_mb'), 0)} MB after building the inputs, {_f(rss.get('peak_rss_mb'), 0)} MB "
            f"after one plan (the plan's own: {_f(rss.get('plan_rss_mb'), 0)} MB); held (VmRSS): "
            f"{_f(rss.get('vmrss_inputs_mb'), 0)} MB with the inputs, {_f(rss.get('vmrss_with_plan_mb'), 0)} MB with "
            "the plan too.")
    prof = p.get("profile") or []
    if prof:
        text += ("\n\nWhere one plan's time goes (cProfile, by own time; profiling inflates the total):\n\n"
                 + _md_table(["function", "calls", "own s", "share", "cumulative s"],
                             [[f"`{r['function']}`", f"{r['ncalls']:,}", _f(r["tottime_s"], 3),
                               f"{100 * r['share']:.1f} %", _f(r["cumtime_s"], 3)] for r in prof]))
    return text


def _section_policy_dataplane(dp: dict[str, Any] | None) -> str:
    text = ""
    if not dp:
        text += "\n\nData plane: not run."
    elif dp.get("error"):
        text += f"\n\nData plane: FAILED: {dp['error']}"
    elif "policy" in dp:
        rows = [[label, _f(c["gbps_median"]), _f(c["gbps_min"]), _f(c["gbps_max"]), _f(c.get("cpu_s_per_gbit_median")),
                 f"{c['bridge_flows']:,.0f}", ", ".join(str(m) for m in c.get("megaflows") or []) or "—",
                 _f(statistics.median(c["install_s"]), 2) if c.get("install_s") else "—"]
                for label, c in (("no policy", dp["none"]), (f"{dp.get('policies'):,} policies", dp["policy"]))]
        text += (f"\n\nData plane: one Node, netdev bridge, client → server (iperf3, one TCP stream, "
                 f"{dp.get('reps')} interleaved repetitions x {dp.get('seconds'):g} s); the server isolated, the "
                 f"client allowed by the last of {dp.get('conjunctions', 0):,} conjunctions ({dp.get('last_rule')}); "
                 f"verdicts checked first: {dp.get('verdicts')}.  Per repetition, policy / none: "
                 f"{dp.get('ratio_per_repetition')}.\n\n"
                 + _md_table(["case", "median Gbit/s", "min", "max", "CPU s / Gbit", "flows on the bridge",
                              "megaflows after each run", "install s"], rows))
    return text


def _loadavg(x: Any) -> str:
    return " / ".join(f"{v:.1f}" for v in x) if x else "?"


def _section_system(d: dict[str, Any]) -> str:
    rows = [[r["operation"], r["implementation"], str(r["n"]), _f(r["min_ms"]), _f(r["median_ms"])]
            for r in d.get("operations", [])]
    imports = ", ".join(f"{k} {_f(v, 1)} ms" for k, v in (d.get("import_ms") or {}).items())
    return ("One call at a time on a private OVS instance and two namespaces, imports excluded.\n\n"
            + _md_table(["operation", "implementation", "n", "min ms", "median ms"], rows)
            + f"\n\novsdbapp's connect, schema and IDL sync, once: {_f(d.get('ovsdbapp_connect_ms'), 1)} ms. "
            f"Import, fresh interpreter (best of 5): {imports}.")


def _section_spans(d: dict[str, Any]) -> str:
    runs = d.get("runs") or {"cluster": d}  # one run per policyPeers (results before it: cluster's alone)
    head = (f"{d.get('pods', 0):,} Pods, {d.get('policies', 0):,} policies, {d.get('cluster_policies', 0)} cluster "
            f"policies over {d.get('nodes', 0):,} Nodes; equal after the replay: {d.get('equal_after_replay')}.")
    out = [head]
    for peers, r in runs.items():
        pr = r.get("pairs") or {}
        rows = [[kind, str(e.get("n")), _f(e.get("cpu_p50_ms"), 3), _f(e.get("cpu_p99_ms"), 3),
                 _f(e.get("full_over_index_p50"), 0) + "x" if e.get("full_over_index_p50") else "—",
                 f"{e.get('changed_p50', 0):.0f} / {e.get('changed_max', 0)}"]
                for kind, e in (r.get("events") or {}).items()]
        share = pr.get("pairs", 0) / max(1, pr.get("pairs_today", 0))
        out.append(f"`policyPeers: {peers}`: full `relevance.spans` {_f(r.get('full_spans_cpu_s'))} s CPU; the "
                   f"index's load {_f(r.get('index_load_cpu_s'))} s.  (Pod, Node) pairs the spans hold: "
                   f"{pr.get('pairs', 0):,} of {pr.get('pairs_today', 0):,} today ({share:.1%}).\n\n"
                   + _md_table(["event", "n", "CPU p50 ms", "CPU p99 ms", "full / index p50",
                                "spans changed p50 / max"], rows))
    return "\n\n".join(out)


def _section_policy_pass(d: dict[str, Any]) -> str:
    rows = [[side, _f((d.get(side) or {}).get("cpu_p50_ms"), 1), _f((d.get(side) or {}).get("cpu_p99_ms"), 1),
             _f((d.get(side) or {}).get("judge_write_p50_ms"), 1), _f((d.get(side) or {}).get("judge_write_p99_ms"), 1)]
            for side in ("element", "whole")]
    return (f"{d.get('pods', 0):,} Pods, {d.get('policies', 0):,} policies, {d.get('local_pods', 0)} local; "
            f"{d.get('events', 0)} Pod events; the judge {d.get('judge_bytes', 0):,} bytes; whole / element at p50: "
            f"{_f(d.get('whole_over_element_p50'), 1)}x; tables equal after the run: {d.get('tables_equal')}.\n\n"
            + _md_table(["judge applied", "CPU p50 ms", "CPU p99 ms", "its write p50 ms", "its write p99 ms"], rows))


SECTIONS: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "startup": ("Start-up: VERSION and error path vs Go bridge", _section_startup),
    "cni": ("CNI ADD/DEL: Ferry (launcher, frozen) vs ovs-cni and bridge + host-local", _section_cni),
    "ipam": ("IPAM on a /16 vs host-local: ADD and DEL as it fills", _section_ipam),
    "routesync": ("route-sync reconcile: full passes by number of peers, one Node change", _section_routesync),
    "dataplane": ("Data plane: iperf3 Pod↔Pod across Nodes, clear and encrypted",
                  _section_dataplane),
    "services": ("Services: Pod → ClusterIP against Pod → Pod IP, kube-proxy on a real cluster",
                 _section_services),
    "policy": ("NetworkPolicy: the planner at 10,000 Pods / 1,000 policies, and the data plane under them",
               _section_policy),
    "policy-pass": ("route-sync's NetworkPolicy pass per Pod event: the host judge by element vs written whole",
                    _section_policy_pass),
    "spans": ("A Node receives what concerns it: the spans index per event vs relevance.spans", _section_spans),
    "system": ("The plugin's system layer: netlink, OVSDB, OpenFlow vs pyroute2, ovsdbapp, ovs-vsctl", _section_system),
}


def render(results: dict[str, Any], image_prefix: str = "") -> str:
    meta = results.get("meta", {})
    lines = [f"# Ferry benchmarks{' (quick)' if meta.get('quick') else ''}", "",
             f"- date: {meta.get('date')}", f"- machine: {meta.get('machine')}",
             f"- commit: {meta.get('commit')}", f"- command: `{meta.get('command')}`",
             f"- load average before / after: {meta.get('loadavg_before')} / {meta.get('loadavg_after')}", "",
             ("Ratios are Ferry / reference, measured in the same run (for route-sync the reference is the "
              "issue's budget).  2 noisy vCPUs: trust ratios over absolute figures."), "", "## Goals", ""]
    grow = [[str(r.issue), r.figure, f"{_f(r.ours)} {r.unit}" if r.ours is not None else "—",
             f"{_f(r.reference)} {r.unit} ({r.reference_name})" if r.reference is not None else r.reference_name,
             _f(r.ratio) + "x" if r.ratio is not None else "—", r.target, f"**{r.verdict}**"
             if r.verdict in ("pass", "short") else r.verdict] for r in goal_rows(results)]
    lines.append(_md_table(["issue", "figure", "ferry", "reference", "ratio", "target", ""], grow))
    failed = [k for k, b in results.get("benchmarks", {}).items() if b.get("status") != "ok"]
    if failed:
        lines += ["", "## Failed benchmarks", ""]
        for k in failed:
            err = str(results["benchmarks"][k].get("error") or "").strip().replace("\n", " ")[-500:]
            lines.append(f"- **{k}**: {err}")
    for key, (title, fn) in SECTIONS.items():
        b = results.get("benchmarks", {}).get(key)
        lines += ["", f"## {title}", ""]
        if not b or b.get("status") != "ok" or not b.get("data"):
            lines.append("not run" if not b else f"failed: {str(b.get('error') or '')[-300:]}")
            continue
        lines.append(fn(b["data"]))
        lines.append(f"\n({b.get('seconds', 0):.0f} s)")
    lines += ["", "## Plots", ""]
    for png, title in zip(PLOTS, ("CNI ADD/DEL latency", "Throughput per path", "Reconcile time vs peers"),
                          strict=True):
        lines.append(f"![{title}]({image_prefix}{png})")
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# Plots (matplotlib, Agg).

def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _placeholder(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def _ok(results: dict[str, Any], key: str) -> dict[str, Any] | None:
    b = results.get("benchmarks", {}).get(key) or {}
    return b.get("data") if b.get("status") == "ok" else None


LATENCY_LINES = (("ferry", "ferry launcher", "-"), ("ferry-frozen", "ferry frozen", "-"),
                 ("ovs-cni", "ovs-cni {ovs_cni}", "--"), ("ovs-cni-poll10", "ovs-cni, link state every 10 ms", "-."),
                 ("bridge", "Debian bridge {debian_plugins}", ":"),
                 ("bridge-upstream", "upstream bridge {upstream_plugins}", ":"))


def plot_latency(results: dict[str, Any], path: str) -> None:
    """ECDF of sequential ADD and DEL per-call latency: Ferry (launcher, frozen), ovs-cni, and
    Debian's and upstream's bridge + host-local, each in one panel."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), dpi=90)
    d = _ok(results, "cni")
    versions = collections.defaultdict(lambda: "?", ((d or {}).get("meta") or {}).get("versions") or {})
    for ax, op in zip(axes, ("add", "del"), strict=True):
        if d is None:
            _placeholder(ax, "CNI benchmark not run")
            continue
        for key, label, style in LATENCY_LINES:
            if key not in d["plugins"]:
                continue
            xs = sorted(d["plugins"][key]["sequential"][op]["samples_ms"])
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", linestyle=style,
                    label=f"{label.format_map(versions)} (p50 {percentile(xs, 50):.1f} ms)")
        ax.set_xscale("log")
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{op.upper()} latency, sequential")
        ax.set_xlabel("ms per call")
        ax.set_ylabel("fraction of calls")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_throughput(results: dict[str, Any], path: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.4), dpi=90)
    d = _ok(results, "dataplane")
    paths = [p for p in (d or {}).get("paths", []) if "median" in p]
    if not paths:
        _placeholder(ax, "data-plane benchmark not run")
    else:
        labels = [p["label"] for p in paths]
        med = [p["median"] for p in paths]
        err = [[m - p["min"] for m, p in zip(med, paths, strict=True)],
               [p["max"] - m for m, p in zip(med, paths, strict=True)]]
        ax.bar(labels, med, yerr=err, capsize=4, color="#4c72b0")
        for i, m in enumerate(med):
            ax.text(i, m, f"{m:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("Gbit/s (median, min-max)")
        ax.set_title(f"iperf3 Pod↔Pod across Nodes, {d.get('repetitions')} x {d.get('seconds'):g} s")  # type: ignore[union-attr]
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_reconcile(results: dict[str, Any], path: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.4), dpi=90)
    d = _ok(results, "routesync")
    sizes = sorted((d or {}).get("sizes", []), key=lambda r: r["peers"])
    if not sizes:
        _placeholder(ax, "route-sync benchmark not run")
    else:
        xs = [r["peers"] for r in sizes]
        ax.plot(xs, [r["reconcile_s"] for r in sizes], "o-", label="full reconcile")
        ax.plot(xs, [r["noop_reconcile_s"] for r in sizes], "s--", label="re-assert (no change)")
        ax.plot([1000, 5000], [1.0, 5.0], "r^", label="budget: 1 s per 1,000 peers")
        ax.set_xscale("log")
        ax.set_yscale("log")
        from matplotlib.ticker import FuncFormatter, NullFormatter

        plain = FuncFormatter(lambda v, _pos: f"{v:,.4g}")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(plain)
            axis.set_minor_formatter(NullFormatter())
        ax.set_xticks(sorted({*xs, 1000, 5000}))
        from matplotlib.ticker import LogLocator

        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        for r in sizes:
            ax.annotate(f"{r['reconcile_s']:.2f} s", (r["peers"], r["reconcile_s"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
        ax.set_xlabel("peers")
        ax.set_ylabel("seconds")
        ax.set_title("route-sync reconcile time vs peers")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write(results_dir: str, docs_dir: str | None = None) -> str:
    """report.md and the plots in ``results_dir``; with ``docs_dir``, also its benchmarks.md."""
    with open(os.path.join(results_dir, "results.json")) as f:
        results = json.load(f)
    for png, fn in zip(PLOTS, (plot_latency, plot_throughput, plot_reconcile), strict=True):
        fn(results, os.path.join(results_dir, png))
    report = os.path.join(results_dir, "report.md")
    with open(report, "w") as f:
        f.write(render(results) + "\n")
    if docs_dir:
        img = os.path.join(docs_dir, "benchmarks")
        os.makedirs(img, exist_ok=True)
        for png in PLOTS:
            shutil.copyfile(os.path.join(results_dir, png), os.path.join(img, png))
        with open(os.path.join(docs_dir, "benchmarks.md"), "w") as f:
            f.write("<!-- written by `make bench` (python -m bench --docs docs); the latest full run -->\n")
            f.write(render(results, image_prefix="benchmarks/") + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--docs", help="also write DOCS/benchmarks.md and DOCS/benchmarks/*.png")
    args = ap.parse_args(argv)
    print(write(args.results_dir, args.docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
