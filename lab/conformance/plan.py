"""What a conformance run runs, as plain data (no system access): the suites (which e2e specs, as a
ginkgo focus); the Ferry traffic modes, each as the topology document ``ferry-lab up --kubernetes``
would build; the skip rules, each naming why a spec cannot run on one machine; and which specs of
``e2e.test --list-tests`` the focus selects and each rule skips.

A spec is skipped only by a rule printed with its reason, never silently: the rules go to ginkgo
as ``--ginkgo.skip`` (one per rule), and the JUnit e2e writes is read back against the same rules
(:mod:`lab.conformance.junit`)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cni.pipeline import modes as m_
from lab import overrides
from lab.kube.spec import KUBE_PROXY_MODES as _ALL_PROXY_MODES
from lab.topology import DEFAULT_TOPOLOGY
from routesync.policy import peerslice

DEFAULT_FOCUS = r"\[sig-network\].*\[Conformance\]"
# Every SIG's Conformance specs (424 at v1.34.4): what a certified cluster passes.
ALL_CONFORMANCE_FOCUS = r"\[Conformance\]"
# Every NetworkPolicy spec of e2e v1.34.4 is under "[sig-network] Netpol" (test/e2e/network/netpol:
# 48 enforcement specs, 2 API ones); the older "NetworkPolicyLegacy" specs are gone from this binary.
NETPOL_FOCUS = r"\[sig-network\] Netpol\b"
PROXY_MODES = _ALL_PROXY_MODES[:-1]  # all but "no kube-proxy": e2e needs a Service proxy
TOPOLOGIES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "topologies")


# ---------------------------------------------------------------- suites

@dataclass(frozen=True)
class Suite:
    """A named set of e2e specs: ``focus`` is ginkgo's ``--focus`` (a regular expression matched
    anywhere in a spec's full name)."""

    name: str
    focus: str
    about: str
    runner: str = "e2e"  # e2e: e2e.test under ginkgo; cnp: network-policy-api's test binary (lab.conformance.cnp)


def literal(text: str) -> str:
    """``text`` as a regular expression matching itself, in Python's and in Go's (ginkgo's) syntax."""
    return re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", text)


# One spec per part of the API that CI checks (the netpol-ci suite), each named by its text after
# "[sig-network] Netpol " (the TCP specs', not their UDP or SCTP twins'). e2e v1.34.4 has no spec that
# enforces endPort: only the API's validation of it.
NETPOL_CI_SPECS = (
    "NetworkPolicy between server and client should support a 'default-deny-ingress' policy",
    ("NetworkPolicy between server and client should enforce policy to allow traffic from pods within server "
    "namespace based on PodSelector"),
    ("NetworkPolicy between server and client should enforce policy to allow traffic only from a different "
    "namespace, based on NamespaceSelector"),
    ("NetworkPolicy between server and client should enforce except clause while egress access to server in CIDR "
    "block"),
    ("NetworkPolicy between server and client should enforce egress policy allowing traffic to a server in a "
    "different namespace based on PodSelector and NamespaceSelector"),
    "NetworkPolicy between server and client should allow ingress access on one named port",
    "API should support creating NetworkPolicy API with endport field",
)
NETPOL_CI_FOCUS = r"\[sig-network\] Netpol (" + "|".join(literal(s) for s in NETPOL_CI_SPECS) + ")"

# One [Conformance] spec outside sig-network per image the all-conformance suite adds (busybox: two), the
# two kinds of webhook the API server calls, the aggregated API it proxies to, and a NoExecute taint (run
# alone after the others), each by its full name: the all-conformance-ci suite.
ALL_CONFORMANCE_CI_SPECS = (
    # httpd 2.4.38-4: readiness on /index.html, which the spec moves away and back
    ("[sig-apps] StatefulSet Basic StatefulSet functionality [StatefulSetBasic] Burst scaling should run to "
     "completion even with unhealthy pods [Slow] [Conformance]"),
    # httpd 2.4.38-4 replaced by agnhost
    "[sig-apps] Deployment RollingUpdateDeployment should delete old pods and create new ones [Conformance]",
    # nonewprivs: setuid nnp under no_new_privs
    ("[sig-node] Security Context when creating containers with AllowPrivilegeEscalation should not allow "
     "privilege escalation when false [LinuxOnly] [NodeConformance] [Conformance]"),
    # busybox: its sh passes on a variable named data-1 (envFrom a ConfigMap), as upstream's ash does
    "[sig-node] ConfigMap should be consumable via the environment [NodeConformance] [Conformance]",
    # busybox: its sh is ash, whose words for a read-only root the spec compares
    ("[sig-node] Kubelet when scheduling a read only busybox container should not write to root filesystem "
     "[LinuxOnly] [NodeConformance] [Conformance]"),
    # run alone after the parallel pass: it taints a Node NoExecute
    ("[sig-node] NoExecuteTaintManager Single Pod [Serial] removing taint cancels eviction [Disruptive] "
     "[Conformance]"),
    # nautilus: data.json through the Pod proxy
    "[sig-cli] Kubectl client Update Demo should create and stop a replication controller [Conformance]",
    # httpd through kubectl run
    "[sig-cli] Kubectl client Kubectl run pod should create a pod from an image when restart is Never [Conformance]",
    # the API server calls an admission webhook's and a conversion webhook's endpoints
    "[sig-api-machinery] AdmissionWebhook [Privileged:ClusterAdmin] should mutate configmap [Conformance]",
    ("[sig-api-machinery] CustomResourceConversionWebhook [Privileged:ClusterAdmin] should be able to convert from "
     "CR v1 to CR v2 [Conformance]"),
    # sample-apiserver and etcd: an APIService the API server proxies to with its front-proxy client certificate
    ("[sig-api-machinery] Aggregator Should be able to support the 1.17 Sample API Server using the current "
     "Aggregator [Conformance]"),
)
ALL_CONFORMANCE_CI_FOCUS = "|".join(literal(s) for s in ALL_CONFORMANCE_CI_SPECS)

SUITES = (
    Suite("conformance", DEFAULT_FOCUS, "sig-network's Conformance specs"),
    Suite("netpol", NETPOL_FOCUS, "sig-network's NetworkPolicy specs"),
    Suite("netpol-ci", NETPOL_CI_FOCUS, "7 of them, one per part of the API"),
    Suite("all", f"{DEFAULT_FOCUS}|{NETPOL_FOCUS}", "conformance and netpol"),
    Suite("ci", f"{DEFAULT_FOCUS}|{NETPOL_CI_FOCUS}|{ALL_CONFORMANCE_CI_FOCUS}",
          "conformance, netpol-ci and all-conformance-ci, on one cluster (what CI runs)"),
    Suite("all-conformance", ALL_CONFORMANCE_FOCUS, "every SIG's Conformance specs, not only sig-network's"),
    Suite("all-conformance-ci", ALL_CONFORMANCE_CI_FOCUS,
          "11 of them: one per image all-conformance adds, busybox's ash twice, the API server's webhooks, "
          "an aggregated API, a NoExecute taint"),
    # Not e2e's: sigs.k8s.io/network-policy-api's ClusterNetworkPolicy conformance tests; its focus
    # is the test binary's -test.run (lab.conformance.cnp.RUN)
    Suite("cnp", "^TestConformanceProfiles$", "the ClusterNetworkPolicy conformance suite (network-policy-api v0.3.0)",
          runner="cnp"),
)
SUITE_NAMES = tuple(s.name for s in SUITES)
DEFAULT_SUITE = SUITES[0]


def suite(name: str) -> Suite:
    for s in SUITES:
        if s.name == name:
            return s
    raise KeyError(f"no suite {name!r} (suites: {', '.join(SUITE_NAMES)})")


# ---------------------------------------------------------------- traffic modes

@dataclass(frozen=True)
class Mode:
    """A Ferry traffic mode as ``ferry-lab up`` flags: ``--mode``, ``--tunnel``, ``--fast-path``
    over a topology file (default: lab/topologies/default.yaml)."""

    name: str
    mode: str | None = None
    tunnel: str | None = None
    fast_path: bool = False
    topology: str | None = None  # a file name in lab/topologies

    def flags(self) -> str:
        """How ``ferry-lab up`` spells it."""
        out = [f"-f lab/topologies/{self.topology}"] if self.topology else []
        out += [f"--mode {self.mode}"] if self.mode else []
        out += [f"--tunnel {self.tunnel}"] if self.tunnel else []
        out += ["--fast-path"] if self.fast_path else []
        return " ".join(out)


CONFORMANCE_MODES = (
    Mode(f"{m_.ENCAP}-{m_.VXLAN}", m_.ENCAP, m_.VXLAN),
    Mode(f"{m_.ENCAP}-{m_.GENEVE}", m_.ENCAP, m_.GENEVE),
    Mode(f"{m_.ENCAP}-{m_.GRE}", m_.ENCAP, m_.GRE),
    Mode(m_.NO_ENCAP, m_.NO_ENCAP),
    Mode(m_.HYBRID, m_.HYBRID, m_.VXLAN),
    Mode(f"{m_.NO_ENCAP}-fastPath", m_.NO_ENCAP, fast_path=True),
    Mode(f"{m_.NO_ENCAP}-bgp", topology="bgp.yaml"),  # noEncap; the router learns Pod CIDRs over BGP
    Mode(m_.NETWORK_POLICY_ONLY, m_.NETWORK_POLICY_ONLY),
)
MODE_NAMES = tuple(m.name for m in CONFORMANCE_MODES)


def mode(name: str) -> Mode:
    for m in CONFORMANCE_MODES:
        if m.name == name:
            return m
    raise KeyError(f"no mode {name!r} (modes: {', '.join(MODE_NAMES)})")


POLICY_PEERS = ("cluster", "peerSlices")  # route-sync's policyPeers (issue 46: the e2e judges both)
DELIVERIES = peerslice.DELIVERIES  # ferry-controller's --delivery, with policyPeers peerSlices


def topology_doc(m: Mode, kube_proxy: str, family: str | None = None, policy_peers: str = "cluster",
                 delivery: str = peerslice.DELIVERY_LABELS) -> dict[str, Any]:
    """The topology document of ``ferry-lab up --kubernetes --kube-proxy K <m's flags>``; with
    ``policy_peers`` peerSlices, route-sync reads PeerSlices and the lab runs ferry-controller,
    which delivers them as ``delivery`` says (``kubernetes.controllerDelivery``)."""
    path = os.path.join(TOPOLOGIES, m.topology) if m.topology else DEFAULT_TOPOLOGY
    doc = overrides.load(path, overrides.Overrides(m.mode, m.tunnel, m.fast_path, family))
    doc["kubernetes"] = {**(doc.get("kubernetes") or {}), "kubeProxy": kube_proxy}
    if policy_peers != "cluster":
        doc["routeSync"] = {**(doc.get("routeSync") or {}), "policyPeers": policy_peers}
    if delivery != peerslice.DELIVERY_LABELS:
        doc["kubernetes"]["controllerDelivery"] = delivery
    return doc


# ---------------------------------------------------------------- skip rules

@dataclass(frozen=True)
class SkipRule:
    """Specs matching ``pattern`` (a regular expression, as ginkgo's ``--skip`` takes it) are not
    run here, because of ``reason``."""

    name: str
    pattern: str
    reason: str

    def matches(self, spec: str) -> bool:
        return re.search(self.pattern, spec) is not None


@dataclass(frozen=True)
class AloneRule:
    """Specs matching ``pattern`` run alone: after the parallel pass, on the same cluster, one at a
    time, with no other spec beside them, because of ``reason``."""

    name: str
    pattern: str
    reason: str

    def matches(self, spec: str) -> bool:
        return re.search(self.pattern, spec) is not None


# The whole [Conformance] set has two (NoExecuteTaintManager's): they taint a Node NoExecute, which
# evicts every Pod there without a toleration, other specs' Pods and CoreDNS included.
DISRUPTIVE = AloneRule(
    "disruptive", r"\[Disruptive\]",
    "taints Nodes or restarts what every spec of the run shares (Nodes, kubelets, the control plane), "
    "which would break the specs running beside it on the same one-machine cluster")
LOAD_BALANCER = SkipRule(
    "load-balancer", r"LoadBalancer",
    "needs a cloud's load balancer: no cloud controller or load-balancer implementation runs here")
# The specs that open SCTP sockets or load the sctp module: [Feature:SCTPConnectivity] (Granular
# Checks, Netpol's "using SCTP") and the two [Serial] ones; not every name with "SCTP" in it: two Netpol
# specs (a policy allowing SCTP, "even if the plugin doesn't support SCTP") probe over TCP, and must run.
SCTP = SkipRule(
    "sctp", r"\[Feature:SCTPConnectivity\]|SCTP HostPort|SCTP service",
    "this kernel has no SCTP sockets (socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) fails with "
    "EPROTONOSUPPORT)")



def kernel_has_sctp() -> bool:
    """Whether this kernel opens SCTP sockets (the lab's Nodes share it)."""
    import socket

    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_SCTP).close()
    except OSError:
        return False
    return True


def skip_rules(sctp: bool) -> tuple[SkipRule, ...]:
    """The rules that hold on this machine: ``sctp`` is whether the kernel has SCTP sockets. Each
    rule skips only specs of its kind, so every suite takes them all (a rule that skips none of a
    suite's specs says so in :func:`describe`)."""
    return (LOAD_BALANCER,) + (() if sctp else (SCTP,))


def ginkgo_args(focus: str, rules: Sequence[SkipRule], alone: AloneRule | None = DISRUPTIVE) -> list[str]:
    """e2e.test's ginkgo flags for ``focus`` and ``rules``; the parallel pass also leaves out what
    ``alone`` keeps for the pass after it (:func:`alone_focus`)."""
    skips = [*(r.pattern for r in rules), *([alone.pattern] if alone else [])]
    return [f"--ginkgo.focus={focus}", *(f"--ginkgo.skip={p}" for p in skips)]


def alone_focus(specs: Sequence[str]) -> str:
    """The focus of the pass that runs ``specs`` alone: each by its whole name (not anchored:
    ginkgo matches the focus against more than the name ``--list-tests`` prints)."""
    return "|".join(literal(s) for s in specs)


# ---------------------------------------------------------------- which specs

def list_tests(output: str) -> list[str]:
    """Spec names from ``e2e.test --list-tests`` (lines ``    <file>:<line>: <name>``)."""
    out = []
    for line in output.splitlines():
        m = re.match(r"^\s+\S+:\d+: (.+)$", line)
        if m:
            out.append(m.group(1).strip())
    return out


def focused(specs: Iterable[str], focus: str) -> list[str]:
    """The specs the focus selects (ginkgo matches it anywhere in the spec's full name)."""
    r = re.compile(focus)
    return [s for s in specs if r.search(s)]


def rule_of(spec: str, rules: Sequence[SkipRule]) -> SkipRule | None:
    """The first rule that skips ``spec``, if any."""
    return next((r for r in rules if r.matches(spec)), None)


@dataclass(frozen=True)
class Selection:
    run: tuple[str, ...]  # selected and run in the parallel pass
    skipped: dict[str, tuple[str, ...]]  # rule name -> the selected specs it skips (every rule listed)
    alone: tuple[str, ...] = ()  # selected and run alone, after the parallel pass


def select(specs: Iterable[str], focus: str, rules: Sequence[SkipRule],
           alone: AloneRule | None = DISRUPTIVE) -> Selection:
    """The focused specs by how they run: a skip rule first, then ``alone``, else in parallel."""
    run: list[str] = []
    later: list[str] = []
    skipped: dict[str, list[str]] = {r.name: [] for r in rules}
    for s in focused(specs, focus):
        r = rule_of(s, rules)
        (skipped[r.name] if r else later if alone and alone.matches(s) else run).append(s)
    return Selection(tuple(run), {k: tuple(v) for k, v in skipped.items()}, tuple(later))


def describe(selection: Selection, rules: Sequence[SkipRule], focus: str, alone: AloneRule = DISRUPTIVE) -> str:
    """The skip rules, each with its reason and the specs it skips; the specs run alone after the
    parallel pass, and why; then the count that runs."""
    ran = len(selection.run) + len(selection.alone)
    total = ran + sum(map(len, selection.skipped.values()))
    lines = [f"focus {focus}: {total} specs; skip rules:"]
    for r in rules:
        hit = selection.skipped.get(r.name, ())
        lines.append(f"  {r.name} /{r.pattern}/: {r.reason}")
        lines.append(f"    skips {len(hit)}" + (":" if hit else " of the selected specs"))
        lines += [f"      {s}" for s in hit]
    lines.append(f"run alone, after the parallel pass: {alone.name} /{alone.pattern}/: {alone.reason}")
    lines.append(f"    {len(selection.alone)}" + (":" if selection.alone else " of the selected specs"))
    lines += [f"      {s}" for s in selection.alone]
    lines.append(f"{ran} specs run per mode" + (f" ({len(selection.alone)} of them alone)" if selection.alone else ""))
    return "\n".join(lines)
