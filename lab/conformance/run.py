"""Running e2e.test on a lab, one traffic mode after another (needs root, like ``ferry-lab up``).

Per mode and kube-proxy mode: the lab comes up with ``kubernetes: {kubeProxy: ...}`` (kube-proxy
and CoreDNS included) under the name ``cf<i|n>-<mode>``; the e2e images (:mod:`lab.kube.e2eimages`)
are imported into every Node's containerd; ``ginkgo -p`` runs ``e2e.test`` in the external host's
network namespace, where the API server listens (as ``ferry-lab kubectl`` does), then the specs
that must run alone (:data:`lab.conformance.plan.DISRUPTIVE`) one at a time on the same cluster;
the JUnit each pass writes is read back against its focus and the skip rules, and the two are one
result; the lab goes down (``keep``: stays up).
A mode the lab refuses (the topology parser names why) is reported as not run, before any lab is
built."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from lab import build, tools
from lab import topology as topology_mod
from lab.api import Lab, default_cni_bin
from lab.conformance import cnp, junit
from lab.conformance.plan import Mode, SkipRule, alone_focus, ginkgo_args, topology_doc
from lab.kube import e2eimages
from lab.sh import LabError
from lab.topology import TopologyError
from routesync.policy.peerslice import DELIVERY_LABELS

Log = Callable[[str], None]
IMPORT_TIMEOUT = 900.0  # seconds for one Node to import the e2e images (a few hundred MB, on busy cores)


@dataclass(frozen=True)
class Options:
    focus: str
    rules: Sequence[SkipRule]
    out: str  # results: <out>/<mode>-<kube-proxy>/{junit_01.xml,e2e.log}
    procs: int = 3
    family: str | None = None
    keep: bool = False  # leave the lab up (debugging one mode)
    timeout: str = "3h"  # ginkgo's suite timeout
    extra: Sequence[str] = field(default_factory=tuple)  # more e2e.test flags
    probes: Sequence[cnp.ProbeRule] = ()  # the cnp suite's probe rules
    alone: Sequence[str] = ()  # specs run alone after the parallel pass (plan.Selection.alone)
    policy_peers: str = "cluster"  # route-sync's policyPeers (plan.POLICY_PEERS)
    delivery: str = DELIVERY_LABELS  # ferry-controller's --delivery (plan.DELIVERIES)


def lab_name(m: Mode, kube_proxy: str, policy_peers: str = "cluster", delivery: str = DELIVERY_LABELS) -> str:
    """``cf<i|n>[s|b]-<mode>``, at most 12 characters: the part of the mode's name after the traffic
    mode when there is one (``encap-vxlan`` -> ``vxlan``), else the mode's initials; ``s`` with
    PeerSlices, ``b`` with PeerSlices by subscription (so a run of each can go side by side)."""
    rest = m.name.partition("-")[2] or "".join(c for c in m.name if c.isupper() or c == m.name[0])
    slices = "" if policy_peers == "cluster" else "s" if delivery == DELIVERY_LABELS else "b"
    return f"cf{kube_proxy[0]}{slices}-{rest.lower()}"[:12]


def refusal(m: Mode, kube_proxy: str, family: str | None, policy_peers: str = "cluster",
            delivery: str = DELIVERY_LABELS) -> str | None:
    """Why the lab cannot build this mode (the topology parser's words), or None."""
    try:
        topology_mod.parse(topology_doc(m, kube_proxy, family, policy_peers, delivery))
    except (TopologyError, OSError) as e:
        return str(e)
    return None


def e2e_argv(lab: Lab, opts: Options, report_dir: str, alone: bool = False) -> list[str]:
    """ginkgo running e2e.test against ``lab``'s API server, from the external host's network
    namespace (e2e.test, its kubectl calls and its port-forwards all dial from there): in parallel
    (the specs not kept for later), or ``alone``: one process, only :attr:`Options.alone`."""
    plan = lab.kube().plan
    procs = ["--procs=1"] if alone else ["-p", f"--procs={opts.procs}"]
    specs = (ginkgo_args(alone_focus(opts.alone), opts.rules, alone=None) if alone
             else ginkgo_args(opts.focus, opts.rules))
    return ["nsenter", f"--net=/run/netns/{lab.external.netns}", "--",
            tools.tool("ginkgo"), *procs, f"--timeout={opts.timeout}", "--no-color",
            "--silence-skips", tools.tool("e2e.test"), "--",
            f"--kubeconfig={plan.admin_kubeconfig}", f"--kubectl-path={tools.tool('kubectl')}",
            # skeleton, not local: "local" claims SSH to every Node, which this lab has not; with
            # skeleton, specs that need SSH skip themselves and say so
            "--provider=skeleton", "--disable-log-dump", f"--report-dir={report_dir}",
            f"--e2e-output-dir={report_dir}", *specs, *opts.extra]


def import_images(lab: Lab, archive: str, log: Log) -> None:
    """The e2e images into every Node's containerd (k8s.io namespace, where the CRI looks)."""
    t0 = time.monotonic()
    lab.kube().import_image(archive, timeout=IMPORT_TIMEOUT)
    log(f"e2e images imported on {len(lab.kube().plan.nodes)} Nodes in {time.monotonic() - t0:.0f}s")


def pod_ips_reachable(lab: Lab) -> tuple[list[str], list[str]]:
    """From the API server's host (the external one), which Pod IPs answer ping: CoreDNS's Pods,
    one per Node at most. The Proxy specs have the API server dial Pod IPs."""
    cp = lab.kube().kubectl("get", "pods", "-A", "-o", "json", check=False)
    pods = json.loads(cp.stdout)["items"] if cp.returncode == 0 else []
    ips = [p["status"]["podIP"] for p in pods
           if not p["spec"].get("hostNetwork") and p.get("status", {}).get("podIP")][:3]
    ok: list[str] = []
    bad: list[str] = []
    for ip in ips:
        p = lab.external.exec(["ping", "-c", "1", "-W", "2", ip])
        (ok if p.returncode == 0 else bad).append(ip)
    return ok, bad


def run_ginkgo(argv: list[str], log_path: str, echo: bool) -> int:
    """ginkgo's output into ``log_path`` (and to stdout with ``echo``) as it comes: a passing spec
    is one character, not a line; returns ginkgo's exit code."""
    with open(log_path, "wb") as logf:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert p.stdout is not None
        while chunk := os.read(p.stdout.fileno(), 65536):
            logf.write(chunk)
            logf.flush()
            if echo:
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
        return p.wait()


Body = Callable[[Lab, str], junit.ModeRun]  # the lab, the mode's results directory


def in_lab(m: Mode, kube_proxy: str, opts: Options, log: Log, body: Body) -> junit.ModeRun:
    """``body`` on a lab of mode ``m`` (up before, down after unless ``opts.keep``); its
    seconds are the whole mode's, lab up and down included."""
    name = lab_name(m, kube_proxy, opts.policy_peers, opts.delivery)
    out = os.path.join(opts.out, f"{m.name}-{kube_proxy}")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    t0 = time.monotonic()
    if build.down(name):
        log(f"removed a lab {name} left by an earlier run")
    log(f"[{m.name}, kube-proxy {kube_proxy}] lab {name} up (ferry-lab up --kubernetes --kube-proxy {kube_proxy}"
        f" {m.flags()})")
    try:
        doc = topology_doc(m, kube_proxy, opts.family, opts.policy_peers, opts.delivery)
        lab = Lab.up(doc, name=name, cni_bin=default_cni_bin(),
                     log=lambda s: log(f"  {s}"))
    except (LabError, TopologyError, OSError) as e:
        return junit.ModeRun(m.name, kube_proxy, error=f"lab up failed: {e}", seconds=time.monotonic() - t0)
    try:
        r = body(lab, out)
        if opts.policy_peers != "cluster":
            keep_ferry_logs(lab, os.path.join(out, "ferry-logs"))
        return replace(r, mode=m.name, kube_proxy=kube_proxy, seconds=time.monotonic() - t0)
    except (LabError, OSError, subprocess.SubprocessError) as e:
        return junit.ModeRun(m.name, kube_proxy, error=str(e), seconds=time.monotonic() - t0)
    finally:
        if opts.keep:
            log(f"  lab {name} stays up: ferry-lab kubectl --name {name} -- get pods -A; "
                f"ferry-lab down --name {name}")
        else:
            lab.down()


def keep_ferry_logs(lab: Lab, out: str) -> None:
    """The logs of ferry-controller's and route-sync's containers (each Pod's, ``kube-system``),
    one file each in ``out``: with PeerSlices, what the controller wrote and what each Node asked
    for (route-sync's "PeerSlices by subscription" lines) during the specs."""
    os.makedirs(out, exist_ok=True)
    cluster = lab.kube()
    for app, container in (("ferry-controller", "controller"), ("ferry", "route-sync")):
        cp = cluster.kubectl("get", "pods", "-n", "kube-system", "-l", f"app.kubernetes.io/name={app}", "-o",
                             "jsonpath={.items[*].metadata.name}", check=False)
        for pod in cp.stdout.split():
            logs = cluster.kubectl("logs", "-n", "kube-system", pod, "-c", container, check=False, timeout=120)
            with open(os.path.join(out, f"{pod}.log"), "w", encoding="utf-8") as f:
                f.write(logs.stdout + logs.stderr)


def run_mode(m: Mode, kube_proxy: str, opts: Options, archive: str, log: Log,
             echo: bool = True) -> junit.ModeRun:
    """The e2e suites: e2e.test under ginkgo."""
    def body(lab: Lab, out: str) -> junit.ModeRun:
        import_images(lab, archive, log)
        ok, bad = pod_ips_reachable(lab)
        if bad:
            log(f"  note: the API server's host does not reach Pod IPs {', '.join(bad)} (reaches: "
                f"{', '.join(ok) or 'no Pod'}); the Proxy specs need it")
        passes = [(False, out)] + ([(True, os.path.join(out, "alone"))] if opts.alone else [])
        results: list[junit.Result] = []
        for alone, report_dir in passes:
            os.makedirs(report_dir, exist_ok=True)
            argv = e2e_argv(lab, opts, report_dir, alone)
            log_path = os.path.join(report_dir, "e2e.log")
            log(f"  e2e{' (the specs run alone)' if alone else ''}: {' '.join(argv)}")
            log(f"  output: {log_path}")
            rc = run_ginkgo(argv, log_path, echo)
            report = os.path.join(report_dir, "junit_01.xml")
            if not os.path.exists(report):
                return junit.ModeRun(m.name, kube_proxy, error=f"e2e wrote no JUnit (ginkgo exit {rc}); see {log_path}")
            focus = alone_focus(opts.alone) if alone else opts.focus
            results.append(junit.read(report, focus, opts.rules, leave_out=() if alone else opts.alone))
            if rc != 0 and not results[-1].failed:
                return junit.ModeRun(m.name, kube_proxy, junit.merge(results),
                                     f"ginkgo exited {rc} with no failed spec: see {log_path}",
                                     junit=os.path.join(out, "junit_01.xml"))
        return junit.ModeRun(m.name, kube_proxy, junit.merge(results, opts.alone), "",
                             junit=os.path.join(out, "junit_01.xml"))

    return in_lab(m, kube_proxy, opts, log, body)


def cnp_argv(lab: Lab, out: str, focus: str) -> list[str]:
    """The ClusterNetworkPolicy conformance binary in the external host's network namespace, where
    the API server listens; KUBECONFIG too: the suite's clientset reads it, not ``--kubeconfig``."""
    kubeconfig = lab.kube().plan.admin_kubeconfig
    return ["nsenter", f"--net=/run/netns/{lab.external.netns}", "--", "env", f"KUBECONFIG={kubeconfig}",
            *cnp.argv(tools.tool("cnp-conformance.test"), kubeconfig, os.path.join(out, "report.yaml"),
                      ferry_version(), focus)]


def fixture_port_conflicts(lab: Lab) -> list[str]:
    """Sockets already listening on a Node's fixture ports (cnp.HOST_NETWORK_PORTS)."""
    out = []
    for n in lab.kube().plan.nodes:
        cp = subprocess.run(["nsenter", f"--net=/run/netns/{n.processes[0].netns}", "--", "ss", "-Hlntu"],
                            capture_output=True, text=True, check=False, timeout=30)
        out += [f"{n.name}: {c}" for c in cnp.port_conflicts(cp.stdout)]
    return out


def run_cnp(lab: Lab, out: str, opts: Options, archive: str, log: Log, echo: bool = True) -> junit.ModeRun:
    """The cnp suite on a running lab (its own, or one a test brought up): the image imported,
    the fixture's ports checked free, the conformance binary run, its -v output and report read
    back (:mod:`lab.conformance.cnp`); mode and kube-proxy left for the caller to name."""
    import_images(lab, archive, log)
    taken = fixture_port_conflicts(lab)
    if taken:
        return junit.ModeRun("", "", error="the hostNetwork fixture's ports are taken: " + "; ".join(taken))
    argv = cnp_argv(lab, out, opts.focus)
    log_path = os.path.join(out, "cnp.log")
    log(f"  cnp: {' '.join(argv)}")
    log(f"  output: {log_path}")
    rc = run_ginkgo(argv, log_path, echo)
    with open(log_path, encoding="utf-8", errors="replace") as f:
        result = cnp.classify(cnp.parse_verbose(f.read()), opts.probes)
    report = os.path.join(out, "report.yaml")
    if os.path.exists(report):
        with open(report, encoding="utf-8") as f:
            log(cnp.report_counts(f.read()))
    explained = result.failed or any(c.rule for c in result.cases)
    error = "" if rc == 0 or explained else f"the suite exited {rc} with no failed test: see {log_path}"
    return junit.ModeRun("", "", result, error, junit=report if os.path.exists(report) else log_path)


def run_cnp_mode(m: Mode, kube_proxy: str, opts: Options, archive: str, log: Log,
                 echo: bool = True) -> junit.ModeRun:
    """The cnp suite on a lab of its own."""
    return in_lab(m, kube_proxy, opts, log, lambda lab, out: run_cnp(lab, out, opts, archive, log, echo))


def ferry_version() -> str:
    """pyproject.toml's version: what the report names as the implementation's."""
    with open(os.path.join(tools.REPO, "pyproject.toml"), encoding="utf-8") as f:
        m = re.search(r'^version = "([^"]+)"', f.read(), re.MULTILINE)
    return m.group(1) if m else "unknown"


def preflight() -> list[str]:
    """What is missing before any lab is built."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (the lab makes namespaces, OVS, containerd and kubelets)")
    for name in ("e2e.test", "ginkgo", "agnhost", "nnp", "sample-apiserver", "etcd", "coredns", "kube-proxy", "kubectl",
                 "kubelet"):
        if not os.access(tools.tool(name), os.X_OK):
            missing.append(f"{tools.tool(name)} (tools/build-go-tools.sh kubernetes kube-e2e kube-e2e-images coredns)")
    if not os.access(tools.tool("busybox"), os.X_OK):
        missing.append(f"{tools.tool('busybox')} (tools/build-busybox.sh)")
    return missing


def list_specs() -> str:
    """``e2e.test --list-tests`` (no cluster needed)."""
    cp = subprocess.run([tools.tool("e2e.test"), "--list-tests"], capture_output=True, text=True, check=False,
                        timeout=300)
    if cp.returncode != 0:
        raise LabError(f"e2e.test --list-tests failed: {cp.stderr.strip()[-400:]}")
    return cp.stdout


def cnp_preflight() -> list[str]:
    """What the cnp suite misses before any lab is built."""
    missing = [] if os.geteuid() == 0 else ["root (the lab makes namespaces, OVS, containerd and kubelets)"]
    for name, tool_set in (("cnp-conformance.test", "network-policy-api"), ("agnhost", "kube-e2e"),
                           ("coredns", "coredns"), ("kube-proxy", "kubernetes"), ("kubectl", "kubernetes")):
        if not os.access(tools.tool(name), os.X_OK):
            missing.append(f"{tools.tool(name)} (tools/build-go-tools.sh {tool_set})")
    return missing


def cnp_images_archive(log: Log) -> str:
    try:
        return e2eimages.build_cnp(log)
    except e2eimages.ImageBuildError as e:
        raise LabError(str(e)) from None


def images_archive(log: Log) -> str:
    try:
        return e2eimages.build(log)
    except e2eimages.ImageBuildError as e:
        raise LabError(str(e)) from None
