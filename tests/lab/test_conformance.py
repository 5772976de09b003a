"""``make conformance``'s pure parts, without root: the modes and their topology documents, the
skip rules and what they select, reading e2e's JUnit, the tables; the e2e images' names (against
e2e's own image manifest when the Go module cache has it) and their OCI archive."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from lab import topology as topo_mod
from lab.conformance import junit, plan
from lab.conformance.run import lab_name, refusal
from lab.kube import e2eimages, ociimage

SPECS = [
    "[sig-network] DNS should provide DNS for the cluster [Conformance]",
    "[sig-network] Services should serve a basic endpoint from pods [Conformance]",
    "[sig-network] Services should be able to create a functioning LoadBalancer service [Conformance]",
    ("[sig-network] Networking Granular Checks: Pods should function for node-pod communication: udp [LinuxOnly] "
     "[NodeConformance] [Conformance]"),
    "[sig-network] SCTP [LinuxOnly] should create a Pod with SCTP HostPort [Conformance]",
    "[sig-network] Services should work after restarting kube-proxy [Disruptive]",
    "[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]",
]


# ---------------------------------------------------------------- modes

def test_every_mode_of_the_issue_is_there() -> None:
    assert plan.MODE_NAMES == ("encap-vxlan", "encap-geneve", "encap-gre", "noEncap", "hybrid", "noEncap-fastPath",
                               "noEncap-bgp", "networkPolicyOnly")
    assert plan.mode("hybrid").flags() == "--mode hybrid --tunnel vxlan"
    assert plan.mode("noEncap-fastPath").flags() == "--mode noEncap --fast-path"
    assert plan.mode("noEncap-bgp").flags() == "-f lab/topologies/bgp.yaml"
    with pytest.raises(KeyError, match="modes: encap-vxlan"):
        plan.mode("vxlan")


def test_lab_names_are_valid_and_distinct() -> None:
    names = {lab_name(m, kp) for m in plan.CONFORMANCE_MODES for kp in plan.PROXY_MODES}
    assert len(names) == len(plan.CONFORMANCE_MODES) * len(plan.PROXY_MODES)
    for n in names:
        assert topo_mod.NAME_RE.match(n) and len(n) <= topo_mod.MAX_LAB_NAME, n


@pytest.mark.parametrize("m", plan.CONFORMANCE_MODES, ids=plan.MODE_NAMES)
@pytest.mark.parametrize("kube_proxy", plan.PROXY_MODES)
def test_topology_doc_is_what_ferry_lab_up_builds(m: plan.Mode, kube_proxy: str) -> None:
    doc = plan.topology_doc(m, kube_proxy)
    assert doc["kubernetes"] == {"kubeProxy": kube_proxy}
    assert refusal(m, kube_proxy, None) is None  # the lab builds every mode on Kubernetes
    t = topo_mod.parse(doc)
    assert t.kubernetes is not None and t.kubernetes.kube_proxy == kube_proxy
    rs = t.route_sync
    assert rs is not None
    assert rs.trafficEncapMode == (m.mode or "noEncap")
    if m.tunnel:
        assert rs.tunnelType == m.tunnel
    assert rs.fastPath is m.fast_path


def test_peer_slices_and_their_delivery_pass_through() -> None:
    """``--policy-peers peerSlices --delivery subscription``: route-sync reads PeerSlices and
    ferry-controller delivers them by subscription, on a lab of its own name; the delivery alone
    (without PeerSlices) is a run the lab refuses, naming the key."""
    vxlan = plan.mode("encap-vxlan")
    names = {lab_name(vxlan, "iptables", peers, how) for peers in plan.POLICY_PEERS[1:] for how in plan.DELIVERIES}
    assert len(names | {lab_name(vxlan, "iptables")}) == 1 + len(plan.DELIVERIES)
    t = topo_mod.parse(plan.topology_doc(vxlan, "iptables", None, "peerSlices", "subscription"))
    assert t.route_sync is not None and t.route_sync.policyPeers == "peerSlices"
    assert t.kubernetes is not None and t.kubernetes.controller_delivery == "subscription"
    why = refusal(vxlan, "iptables", None, "cluster", "subscription")
    assert why is not None and "controllerDelivery" in why


def test_family_passes_through() -> None:
    t = topo_mod.parse(plan.topology_doc(plan.mode("encap-vxlan"), "iptables", "4"))
    assert t.cluster_cidrs == ("10.244.0.0/16",)


# ---------------------------------------------------------------- skip rules and selection

def test_skip_rules_name_their_reason_and_sctp_follows_the_kernel() -> None:
    with_sctp, without = plan.skip_rules(sctp=True), plan.skip_rules(sctp=False)
    assert [r.name for r in with_sctp] == ["load-balancer"]
    assert [r.name for r in without] == ["load-balancer", "sctp"]
    assert all(r.reason and re.compile(r.pattern) for r in without)
    # the parallel pass leaves out what runs alone after it
    assert plan.ginkgo_args(plan.DEFAULT_FOCUS, without) == [
        r"--ginkgo.focus=\[sig-network\].*\[Conformance\]",
        "--ginkgo.skip=LoadBalancer", r"--ginkgo.skip=\[Feature:SCTPConnectivity\]|SCTP HostPort|SCTP service",
        r"--ginkgo.skip=\[Disruptive\]"]


def test_the_pass_run_alone_selects_exactly_its_specs() -> None:
    """Its focus is each spec's whole name: of the suite's specs, it selects those and no other."""
    other = TAINT_SPEC.replace("removing taint cancels eviction", "evicts pods with minTolerationSeconds")
    focus = plan.alone_focus([TAINT_SPEC])
    assert plan.focused([TAINT_SPEC, other, CONFORMANCE_SPEC, *OTHER_SIGS], focus) == [TAINT_SPEC]
    args = plan.ginkgo_args(focus, plan.skip_rules(sctp=False), alone=None)
    assert r"--ginkgo.skip=\[Disruptive\]" not in args and args[0] == f"--ginkgo.focus={focus}"


# ---------------------------------------------------------------- suites

# Names as e2e.test v1.34.4 --list-tests prints them: a few of test/e2e/network/netpol's 50, every one
# that names SCTP, and sig-network specs of the other suite or of none.
NETPOL_TCP = ("[sig-network] Netpol NetworkPolicy between server and client should support a "
              "'default-deny-ingress' policy [Feature:NetworkPolicy]")
NETPOL_UDP = ("[sig-network] Netpol [LinuxOnly] NetworkPolicy between server and client using UDP should "
              "enforce policy based on Ports [Feature:NetworkPolicy]")
NETPOL_API = "[sig-network] Netpol API should support creating NetworkPolicy API with endport field"
NETPOL_SCTP_BY_TCP = (
    ("[sig-network] Netpol NetworkPolicy between server and client should not mistakenly treat 'protocol: SCTP' "
     "as 'protocol: TCP', even if the plugin doesn't support SCTP [Feature:NetworkPolicy]"),
    ("[sig-network] Netpol NetworkPolicy between server and client should properly isolate pods that are "
     "selected by a policy allowing SCTP, even if the plugin doesn't support SCTP [Feature:NetworkPolicy]"),
)
NETPOL_SCTP = tuple(
    f"[sig-network] Netpol [Feature:SCTPConnectivity] [LinuxOnly] NetworkPolicy between server and client using "
    f"SCTP {it} [Feature:NetworkPolicy]"
    for it in ("should support a 'default-deny-ingress' policy", "should enforce policy based on Ports",
               ("should enforce policy to allow traffic only from a pod in a different namespace based on "
               "PodSelector and NamespaceSelector")))
OTHER_SCTP = (
    ("[sig-network] Networking Granular Checks: Pods should function for node-pod communication: sctp [LinuxOnly] "
    "[Feature:SCTPConnectivity]"),
    "[sig-network] Networking should allow creating a Pod with an SCTP HostPort [LinuxOnly] [Serial]",
    "[sig-network] Services should allow creating a basic SCTP service with pod and endpoints [LinuxOnly] [Serial]",
)
CONFORMANCE_SPEC = SPECS[1]
NEITHER = ("[sig-network] Services should work after restarting kube-proxy [Disruptive]",
           ("[sig-api-machinery] ValidatingAdmissionPolicy [Privileged:ClusterAdmin] should support "
           "ValidatingAdmissionPolicy API operations [Conformance]"))
ALL_SPECS = [CONFORMANCE_SPEC, NETPOL_TCP, NETPOL_UDP, NETPOL_API, *NETPOL_SCTP_BY_TCP, *NETPOL_SCTP, *OTHER_SCTP,
             *NEITHER]
# [Conformance] specs of other SIGs (e2e v1.34.4), for the all-conformance suite: the Aggregator's
# (sample-apiserver behind an APIService), one of NoExecuteTaintManager's two [Disruptive] ones,
# and some that run (one [Serial]; one that only shares its words with the Aggregator's).
AGGREGATOR_SPEC = ("[sig-api-machinery] Aggregator Should be able to support the 1.17 Sample API Server using the "
                   "current Aggregator [Conformance]")
TAINT_SPEC = ("[sig-node] NoExecuteTaintManager Single Pod [Serial] removing taint cancels eviction [Disruptive] "
              "[Conformance]")
OTHER_SIGS = (
    "[sig-apps] Deployment deployment should support rollover [Conformance]",
    ("[sig-node] Security Context when creating containers with AllowPrivilegeEscalation should not allow "
     "privilege escalation when false [LinuxOnly] [NodeConformance] [Conformance]"),
    "[sig-api-machinery] Namespaces [Serial] should patch a Namespace [Conformance]",
    ("[sig-api-machinery] AdmissionWebhook [Privileged:ClusterAdmin] should include webhook resources in discovery "
     "documents [Conformance]"),
    "[sig-cli] Kubectl client Update Demo should scale a replication controller [Conformance]",
)


def test_suites_and_their_focus() -> None:
    assert plan.SUITE_NAMES == ("conformance", "netpol", "netpol-ci", "all", "ci", "all-conformance",
                                "all-conformance-ci", "cnp")
    assert plan.DEFAULT_SUITE.name == "conformance" and plan.DEFAULT_SUITE.focus == plan.DEFAULT_FOCUS
    assert plan.suite("netpol").focus == r"\[sig-network\] Netpol\b"
    with pytest.raises(KeyError, match="suites: conformance, netpol, netpol-ci, all, ci, all-conformance, "
                                       "all-conformance-ci, cnp"):
        plan.suite("Netpol")
    netpol = (NETPOL_TCP, NETPOL_UDP, NETPOL_API, *NETPOL_SCTP_BY_TCP, *NETPOL_SCTP)
    assert tuple(plan.focused(ALL_SPECS, plan.suite("netpol").focus)) == netpol
    assert plan.focused(ALL_SPECS, plan.suite("conformance").focus) == [CONFORMANCE_SPEC]
    assert tuple(plan.focused(ALL_SPECS, plan.suite("all").focus)) == (CONFORMANCE_SPEC, *netpol)
    # Conformance, of Netpol only the CI subset, and of the other SIGs' Conformance specs the
    # all-conformance-ci ones (their images and webhooks): one cluster in CI
    specs = [*ALL_SPECS, *plan.ALL_CONFORMANCE_CI_SPECS, *OTHER_SIGS]
    ci = plan.focused(specs, plan.suite("ci").focus)
    assert CONFORMANCE_SPEC in ci \
        and set(ci) - {CONFORMANCE_SPEC} == set(plan.focused(ALL_SPECS, plan.suite("netpol-ci").focus)) \
        | set(plan.ALL_CONFORMANCE_CI_SPECS)


def test_all_conformance_is_every_sigs_conformance_specs_and_each_skip_names_its_rule() -> None:
    specs = [*ALL_SPECS, AGGREGATOR_SPEC, TAINT_SPEC, *OTHER_SIGS]
    focus = plan.suite("all-conformance").focus
    assert focus == r"\[Conformance\]"
    conformance = [s for s in specs if s.endswith("[Conformance]")]
    assert plan.focused(specs, focus) == conformance  # no Netpol spec, no spec without the tag
    assert set(plan.focused(specs, plan.DEFAULT_FOCUS)) < set(conformance)  # sig-network's are a part
    rules = plan.skip_rules(sctp=False)
    sel = plan.select(specs, focus, rules)
    assert sel.skipped == {"load-balancer": (), "sctp": ()}
    # webhooks, the aggregated API and [Serial] specs run in parallel
    assert sel.run == (CONFORMANCE_SPEC, NEITHER[1], AGGREGATOR_SPEC, *OTHER_SIGS)
    assert sel.alone == (TAINT_SPEC,)  # after them, alone on the cluster
    assert plan.rule_of(AGGREGATOR_SPEC, rules) is None and AGGREGATOR_SPEC in plan.ALL_CONFORMANCE_CI_SPECS
    text = plan.describe(sel, rules, focus)
    assert text.startswith(r"focus \[Conformance\]: 9 specs; skip rules:")
    assert text.endswith("9 specs run per mode (1 of them alone)")
    assert "run alone, after the parallel pass: disruptive /\\[Disruptive\\]/: " in text
    assert f"    1:\n      {TAINT_SPEC}\n" in text


def test_all_conformance_against_e2e_itself() -> None:
    """Against e2e.test v1.34.4 (when built): 424 [Conformance] specs, none skipped, the 2
    [Disruptive] ones run alone after the others, and the all-conformance-ci suite's each once among
    those that run."""
    from lab import tools

    if not os.access(tools.tool("e2e.test"), os.X_OK):
        pytest.skip("e2e.test not built (tools/build-go-tools.sh kube-e2e)")
    cp = subprocess.run([tools.tool("e2e.test"), "--list-tests"], capture_output=True, text=True, check=True,
                        timeout=300)
    specs = plan.list_tests(cp.stdout)
    rules = plan.skip_rules(sctp=False)
    sel = plan.select(specs, plan.suite("all-conformance").focus, rules)
    assert len(sel.run) + len(sel.alone) + sum(map(len, sel.skipped.values())) == 424
    assert {k: len(v) for k, v in sel.skipped.items()} == {"load-balancer": 0, "sctp": 0}
    assert len(sel.alone) == 2 and all("NoExecuteTaintManager" in s for s in sel.alone)
    assert len(sel.run) == 422
    ci = plan.select(specs, plan.suite("all-conformance-ci").focus, rules)  # each spec once, none skipped
    assert sorted(ci.run + ci.alone) == sorted(plan.ALL_CONFORMANCE_CI_SPECS) and not any(ci.skipped.values())
    assert set(ci.run) <= set(sel.run) and ci.alone == (plan.ALL_CONFORMANCE_CI_SPECS[5],) and ci.alone[0] in sel.alone


def test_sctp_rule_skips_what_needs_sctp_sockets_and_no_more() -> None:
    rules = plan.skip_rules(sctp=False)
    sel = plan.select(ALL_SPECS, plan.suite("netpol").focus, rules)
    assert sel.skipped["sctp"] == NETPOL_SCTP
    # a policy allowing SCTP, probed over TCP: a security test any plugin must pass, SCTP or not
    assert set(NETPOL_SCTP_BY_TCP) <= set(sel.run)
    assert sel.run == (NETPOL_TCP, NETPOL_UDP, NETPOL_API, *NETPOL_SCTP_BY_TCP)
    assert all(plan.rule_of(s, rules) == plan.SCTP for s in OTHER_SCTP)
    assert plan.select(ALL_SPECS, plan.suite("netpol").focus, plan.skip_rules(sctp=True)).run == (
        NETPOL_TCP, NETPOL_UDP, NETPOL_API, *NETPOL_SCTP_BY_TCP, *NETPOL_SCTP)
    text = plan.describe(sel, rules, plan.suite("netpol").focus)
    assert "8 specs; skip rules:" in text and "5 specs run per mode" in text


def test_netpol_ci_names_one_spec_per_part_and_not_its_twins() -> None:
    ci = plan.suite("netpol-ci").focus
    assert plan.literal("a 'b' (c) [d] e.f") == r"a 'b' \(c\) \[d\] e\.f"
    assert plan.focused(ALL_SPECS, ci) == [NETPOL_TCP, NETPOL_API]  # not the UDP or SCTP default-deny
    assert len(plan.NETPOL_CI_SPECS) == 7
    for s in plan.NETPOL_CI_SPECS:
        assert re.search(ci, f"[sig-network] Netpol {s}"), s
    assert not re.search(ci, "[sig-network] Netpol NetworkPolicy between server and client should allow ingress "
                             "access from namespace on one named port [Feature:NetworkPolicy]")


def test_netpol_ci_against_e2e_itself() -> None:
    """Each spec of netpol-ci is one e2e.test has (when it is built): a renamed spec must not drop out."""
    from lab import tools

    if not os.access(tools.tool("e2e.test"), os.X_OK):
        pytest.skip("e2e.test not built (tools/build-go-tools.sh kube-e2e)")
    cp = subprocess.run([tools.tool("e2e.test"), "--list-tests"], capture_output=True, text=True, check=True,
                        timeout=300)
    specs = plan.list_tests(cp.stdout)
    assert len(plan.focused(specs, plan.suite("netpol").focus)) == 50
    for s in plan.NETPOL_CI_SPECS:
        assert len(plan.focused(specs, plan.literal(f"[sig-network] Netpol {s}"))) == 1, s
    assert len(plan.focused(specs, plan.suite("netpol-ci").focus)) == 7
    sctp = [s for s in plan.focused(specs, plan.suite("netpol").focus) if plan.SCTP.matches(s)]
    assert len(sctp) == 3 and all("[Feature:SCTPConnectivity]" in s for s in sctp)


def test_ginkgo_takes_the_suites_focus_and_every_rule() -> None:
    rules = plan.skip_rules(sctp=False)
    args = plan.ginkgo_args(plan.suite("all").focus, rules)
    assert args[0] == r"--ginkgo.focus=\[sig-network\].*\[Conformance\]|\[sig-network\] Netpol\b"
    assert args[1:] == [f"--ginkgo.skip={r.pattern}" for r in rules] + [f"--ginkgo.skip={plan.DISRUPTIVE.pattern}"]


def test_list_tests_output_is_parsed() -> None:
    out = ("The following spec names can be used with 'ginkgo run --focus/skip':\n"
           "    k8s.io/kubernetes@v1.34.4/test/e2e/network/dns.go:54: [sig-network] DNS should provide DNS for the "
           "cluster [Conformance]\n"
           "    k8s.io/kubernetes@v1.34.4/test/e2e/network/service.go:740: [sig-network] Services should serve a "
           "basic endpoint from pods [Conformance]\n\n")
    assert plan.list_tests(out) == SPECS[:2]


def test_select_and_describe_every_rule_with_what_it_skips() -> None:
    rules = plan.skip_rules(sctp=False)
    sel = plan.select(SPECS, plan.DEFAULT_FOCUS, rules)
    assert sel.run == (SPECS[0], SPECS[1], SPECS[3])
    assert sel.skipped == {"load-balancer": (SPECS[2],), "sctp": (SPECS[4],)}
    text = plan.describe(sel, rules, plan.DEFAULT_FOCUS)
    assert "5 specs; skip rules:" in text and "3 specs run per mode" in text
    assert "load-balancer /LoadBalancer/: needs a cloud's load balancer" in text
    assert f"      {SPECS[2]}" in text and "\n    0 of the selected specs\n" in text  # none runs alone


# ---------------------------------------------------------------- JUnit

JUNIT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="9" disabled="5" errors="0" failures="1" time="300">
  <testsuite name="Kubernetes e2e suite" package="/" tests="9" disabled="0" skipped="5" errors="0" failures="1"
             time="300" timestamp="2026-12-01T15:00:00">
    <properties><property name="SuiteSucceeded" value="false"></property></properties>
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="3.1">
    </testcase>
    <testcase name="[It] {s0}" classname="Kubernetes e2e suite" status="passed" time="12.5"></testcase>
    <testcase name="[It] {s1}" classname="Kubernetes e2e suite" status="failed" time="125.0">
      <failure message="" type="failed">[FAILED] service is not reachable within 2m0s timeout on endpoint \
10.96.3.4:80 over TCP protocol
In [It] at: k8s.io/kubernetes@v1.34.4/test/e2e/network/service.go:790 @ 12/01/26 15:03:00.1
</failure>
      <system-err>long timeline</system-err>
    </testcase>
    <testcase name="[It] {s2}" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped></testcase>
    <testcase name="[It] {s3}" classname="Kubernetes e2e suite" status="skipped" time="0.4">
      <skipped message="skipped - Requires at least 2 nodes (not 1)"></skipped></testcase>
    <testcase name="[It] {s4}" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped></testcase>
    <testcase name="[It] {s5}" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped></testcase>
    <testcase name="[It] {s6}" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped></testcase>
    <testcase name="[It] [sig-network] Services should be silent [Conformance]" classname="Kubernetes e2e suite"
              status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
    <testcase name="[ReportAfterSuite] Kubernetes e2e suite report" classname="Kubernetes e2e suite"
              status="passed" time="0.01"></testcase>
  </testsuite>
</testsuites>
""".replace("{s0}", SPECS[0]).replace("{s1}", SPECS[1]).replace("{s2}", SPECS[2]).replace("{s3}", SPECS[3]) \
    .replace("{s4}", SPECS[4]).replace("{s5}", SPECS[5]).replace("{s6}", SPECS[6])


def test_junit_cases_are_classified_against_focus_and_rules() -> None:
    r = junit.parse(JUNIT, plan.DEFAULT_FOCUS, plan.skip_rules(sctp=False))
    by = {c.name: c for c in r.cases}
    assert by[SPECS[0]].outcome == "passed" and by[SPECS[0]].seconds == 12.5
    assert by[SPECS[1]].outcome == "failed"
    assert by[SPECS[1]].reason.startswith("[FAILED] service is not reachable within 2m0s")
    assert by[SPECS[2]].outcome == "skipped" and by[SPECS[2]].rule == "load-balancer"
    assert by[SPECS[3]].reason == "e2e: Requires at least 2 nodes (not 1)"
    assert by[SPECS[4]].rule == "sctp"
    assert SPECS[5] not in by and SPECS[6] not in by  # not selected: [Disruptive] lacks [Conformance]; sig-node
    silent = by["[sig-network] Services should be silent [Conformance]"]
    assert silent.outcome == "silent"  # selected, skipped, no rule, no message: a failure
    assert not any(c.node != "It" for c in r.cases)  # setup nodes that passed are not results
    assert (r.passed, r.failed, r.skipped, r.ok) == (1, 2, 3, False)


def test_junit_failed_setup_counts() -> None:
    xml = JUNIT.replace('<testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" '
                        'status="passed" time="3.1">\n    </testcase>',
                        '<testcase name="[SynchronizedBeforeSuite]" status="failed"><failure type="failed">'
                        '[FAILED] there are not ready nodes</failure></testcase>')
    r = junit.parse(xml, plan.DEFAULT_FOCUS, ())
    setup = [c for c in r.cases if c.node == "SynchronizedBeforeSuite"]
    assert setup and setup[0].outcome == "failed" and "not ready nodes" in setup[0].reason


def test_a_spec_run_alone_is_judged_by_its_own_pass_and_never_lost() -> None:
    """The parallel pass's JUnit lists the spec kept for later as skipped (by the pass's own skip):
    that pass does not judge it; the pass that runs it alone does, and a spec no pass reports (a
    focus that missed it) is a failure, not a disappearance."""
    tc = (f'<testcase name="[It] {TAINT_SPEC}" status="{{s}}" time="1">{{x}}</testcase>')
    skipped = tc.format(s="skipped", x='<skipped message="skipped"></skipped>')
    xml = JUNIT.replace("  </testsuite>", f"    {skipped}\n  </testsuite>")
    focus = r"\[Conformance\]"
    rules = plan.skip_rules(sctp=False)
    assert junit.parse(xml, focus, rules).of("silent")[-1].name == TAINT_SPEC  # judged by it, it would be silent
    parallel = junit.parse(xml, focus, rules, leave_out=(TAINT_SPEC,))
    assert TAINT_SPEC not in {c.name for c in parallel.cases}
    alone_xml = JUNIT.replace("  </testsuite>", f"    {tc.format(s='passed', x='')}\n  </testsuite>")
    alone = junit.parse(alone_xml, plan.alone_focus([TAINT_SPEC]), rules)
    assert [(c.name, c.outcome) for c in alone.cases] == [(TAINT_SPEC, "passed")]
    merged = junit.merge([parallel, alone], expected=(TAINT_SPEC,))
    assert merged.passed == parallel.passed + 1 and merged.failed == parallel.failed
    lost = junit.merge([parallel], expected=(TAINT_SPEC,))
    assert lost.failed == parallel.failed + 1 and lost.of("silent")[-1].name == TAINT_SPEC


def test_reports_and_table() -> None:
    r = junit.parse(JUNIT, plan.DEFAULT_FOCUS, plan.skip_rules(sctp=False))
    ran = junit.ModeRun("encap-vxlan", "iptables", r, seconds=240, junit="/x/junit_01.xml")
    refused = junit.ModeRun("networkPolicyOnly", "iptables", error="the lab refuses it: not deployed yet")
    text = junit.mode_report(ran)
    assert text.splitlines()[0] == "mode encap-vxlan, kube-proxy iptables: 1 passed, 2 failed, 3 skipped (4.0 min)"
    assert f"  FAILED  {SPECS[1]}" in text and f"  SKIPPED {SPECS[2]}" in text
    assert "          load-balancer: needs a cloud's load balancer" in text
    assert junit.mode_report(refused) == ("mode networkPolicyOnly, kube-proxy iptables: NOT RUN: the lab refuses "
                                          "it: not deployed yet")
    assert junit.table([ran, refused]).splitlines()[2:] == [
        "| encap-vxlan | iptables | 1 | 2 | 3 | 4.0 |",
        "| networkPolicyOnly | iptables | not run: the lab refuses it: not deployed yet | | | |"]
    assert not ran.ok and not refused.ok


# ---------------------------------------------------------------- the e2e images

def _gomodcache() -> str | None:
    try:
        cp = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=False, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return cp.stdout.strip() or None


def _manifest_go() -> str | None:
    cache = _gomodcache()
    with open(os.path.join(e2eimages.tools.REPO, "tools", "kubernetes", "go.mod")) as f:
        version = re.search(r"^\s*k8s\.io/kubernetes (v[0-9.]+)$", f.read(), re.MULTILINE)
    if not cache or not version:
        return None
    path = os.path.join(cache, f"k8s.io/kubernetes@{version.group(1)}", "test/utils/image/manifest.go")
    return path if os.path.exists(path) else None


def test_image_names_are_the_ones_e2e_asks_for() -> None:
    path = _manifest_go()
    if path is None:
        pytest.skip("k8s.io/kubernetes is not in the Go module cache (tools/build-go-tools.sh kubernetes)")
    with open(path) as f:
        src = f.read()
    registries = dict(re.findall(r"^\s*(\w+Registry):\s*\"([^\"]+)\"", src, re.MULTILINE))
    names = {f"{registries[reg]}/{name}:{tag}"
             for reg, name, tag in re.findall(r'Config\{list\.(\w+), "([^"]+)", "([^"]+)"\}', src)}
    assert set(e2eimages.NAMES) <= names, set(e2eimages.NAMES) - names
    assert [i.name for i in e2eimages.images(e2eimages.layer_names())] == list(e2eimages.NAMES)


def test_images_are_made_of_the_shared_layers_and_look_like_upstreams() -> None:
    by = {i.name: i for i in e2eimages.images(e2eimages.layer_names())}
    # every Debian-based image starts from the one root file system; agnhost's layer is shared too
    assert {n for n, i in by.items() if i.layers[0] == "rootfs"} == {
        e2eimages.AGNHOST, e2eimages.JESSIE_DNSUTILS, e2eimages.NGINX, e2eimages.NGINX_NEW, e2eimages.HTTPD,
        e2eimages.HTTPD_NEW, e2eimages.NAUTILUS, e2eimages.KITTEN, e2eimages.SAMPLE_APISERVER, e2eimages.ETCD}
    assert by[e2eimages.HTTPD].layers == by[e2eimages.HTTPD_NEW].layers == ("rootfs", "httpd")
    assert by[e2eimages.HTTPD_NEW].env[-1] == "HTTPD_VERSION=2.4.39-4"
    assert by[e2eimages.HTTPD].cmd[0] == "httpd"
    assert by[e2eimages.HTTPD].env[0].startswith("PATH=/usr/local/apache2/bin:")
    assert by[e2eimages.NAUTILUS].layers == ("rootfs", "agnhost", "nautilus")
    assert by[e2eimages.NAUTILUS].entrypoint == ("/agnhost",) and by[e2eimages.NAUTILUS].cmd == ("test-webserver",)
    assert by[e2eimages.NONEWPRIVS].layers == ("busybox", "nnp") and by[e2eimages.NONEWPRIVS].cmd == ("nnp",)
    assert by[e2eimages.NONROOT].user == "1234" and all(i.user == "" for n, i in by.items() if n != e2eimages.NONROOT)
    # the Aggregator spec's: upstream's ENTRYPOINT ["/sample-apiserver"] (the spec passes only args),
    # and etcd where the spec's command runs it
    assert by[e2eimages.SAMPLE_APISERVER].layers == ("rootfs", "sample_apiserver")
    assert by[e2eimages.SAMPLE_APISERVER].entrypoint == ("/sample-apiserver",)
    assert by[e2eimages.ETCD].layers == ("rootfs", "etcd") and by[e2eimages.ETCD].cmd == ("/usr/local/bin/etcd",)


def test_the_aggregator_specs_binaries_are_where_its_pod_runs_them(tmp_path: Path) -> None:
    """aggregator.go runs ``/usr/local/bin/etcd`` by command and sample-apiserver by the image's
    entrypoint: each layer holds its binary there, executable."""
    for path, name in ((e2eimages.SAMPLE_APISERVER_PATH, "sample-apiserver"), (e2eimages.ETCD_PATH, "etcd")):
        binary = tmp_path / name
        binary.write_bytes(b"\x7fELF " + name.encode())
        layer = ociimage.write_layer(e2eimages.binary_layer(path, str(binary)), str(tmp_path / f"{name}.tar"))
        with tarfile.open(layer) as tar:
            m = tar.getmember(path)
            assert m.isfile() and m.mode == 0o755 and tar.extractfile(m).read() == binary.read_bytes()  # type: ignore[union-attr]
    by = {i.name: i for i in e2eimages.images(e2eimages.layer_names())}
    assert by[e2eimages.SAMPLE_APISERVER].entrypoint == (f"/{e2eimages.SAMPLE_APISERVER_PATH}",)
    assert by[e2eimages.ETCD].cmd == (f"/{e2eimages.ETCD_PATH}",)


def test_httpd_serves_from_where_the_statefulset_specs_move_index_html() -> None:
    """test/e2e/apps/statefulset.go breaks and restores readiness with ``mv -v
    /usr/local/apache2/htdocs/index.html /tmp/`` and back; the readiness probe GETs /index.html on 80."""
    conf = e2eimages.httpd_conf()
    lines = conf.splitlines()
    assert "Listen 80" in lines and "DocumentRoot /usr/local/apache2/htdocs" in lines
    assert "DirectoryIndex index.html" in lines
    assert [ln.split()[1] for ln in lines if ln.startswith("LoadModule")] == [
        f"{m}_module" for m in e2eimages.APACHE_MODULES]
    assert "ErrorLog /proc/self/fd/2" in lines  # logs to the container's stderr, as upstream's image


def test_nonewprivs_nnp_is_setuid_root_in_its_layer(tmp_path: Path) -> None:
    nnp = tmp_path / "nnp"
    nnp.write_bytes(b"\x7fELF nnp")
    layer = ociimage.write_layer(e2eimages.nnp_layer(str(nnp)), str(tmp_path / "nnp.tar"))
    with tarfile.open(layer) as tar:
        m = tar.getmember("usr/local/bin/nnp")
    assert (m.mode, m.uid, m.gid) == (0o6755, 0, 0)


def _busybox_parts(busybox: str, applets: tuple[str, ...] = ("busybox", "sh", "cat")) -> e2eimages.Parts:
    return e2eimages.Parts(**{**{f.name: "" for f in dataclasses.fields(e2eimages.Parts)},
                              "busybox": busybox, "applets": applets})


def test_busybox_layer_has_a_world_writable_tmp(tmp_path: Path) -> None:
    # upstream's busybox has /tmp: "Probing container ... exec cat /tmp/health" writes there first,
    # and without it the probe fails and the container restarts
    bb = tmp_path / "busybox"
    bb.write_bytes(b"\x7fELF busybox")
    parts = _busybox_parts(str(bb))
    layer = ociimage.write_layer(e2eimages.busybox_layer(parts), str(tmp_path / "bb.tar"), e2eimages.BUSYBOX_DIRS)
    with tarfile.open(layer) as tar:
        m = tar.getmember("tmp")
        assert m.isdir() and m.mode == 0o1777
        assert tar.getmember("bin").mode == 0o755 and tar.getmember("bin/cat").linkname == "busybox"
        assert tar.getmember("bin/sh").linkname == "busybox"  # ash, as upstream's: no other shell
        assert tar.getmember("bin/busybox").isfile()


def _busybox_root(tmp_path: Path) -> Path:
    """The busybox images' layer, built from what ``tools/build-busybox.sh`` made, unpacked."""
    busybox = e2eimages.tools.tool("busybox")
    if not os.access(busybox, os.X_OK):
        pytest.fail(f"{busybox} missing: .ci/install.sh builds it (tools/build-busybox.sh)")
    parts = _busybox_parts(busybox, tuple(e2eimages.busybox_applets(busybox)))
    layer = ociimage.write_layer(e2eimages.busybox_layer(parts), str(tmp_path / "bb.tar"), e2eimages.BUSYBOX_DIRS)
    root = tmp_path / "root"
    with tarfile.open(layer) as tar:
        tar.extractall(root, filter="fully_trusted")
    return root


@pytest.mark.root
def test_busybox_images_sh_passes_every_environment_variable_on(tmp_path: Path) -> None:
    """The layer unpacked and run as a container runs it (chroot): ``sh -c env`` prints a variable
    whose name is no shell name, as upstream's busybox does (ConfigMap's and Secret's envFrom specs
    look for ``data-1=value-1``; Debian's busybox ash drops it)."""
    root = _busybox_root(tmp_path)
    cp = subprocess.run(["env", "-i", "data-1=value-1", "p-data-1=value-1", "PATH=/bin", "/usr/sbin/chroot", str(root),
                         "sh", "-c", "env; echo ok >/tmp/health && cat /tmp/health"],
                        capture_output=True, text=True, check=False)
    assert cp.returncode == 0, cp.stderr
    assert {"data-1=value-1", "p-data-1=value-1", "ok"} <= set(cp.stdout.splitlines()), cp.stdout


@pytest.mark.root
def test_busybox_images_sh_words_a_read_only_root_as_upstream(tmp_path: Path) -> None:
    """Kubelet's "read only busybox container should not write to root filesystem" runs ``/bin/sh -c
    'echo test > /file'`` on a read-only root and compares the log with ash's exact words."""
    root = _busybox_root(tmp_path)
    script = (f"mount --bind {root} {root} && mount -o remount,bind,ro {root} && "
              f"exec env -i PATH=/bin /usr/sbin/chroot {root} /bin/sh -c 'echo test > /file'")
    cp = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                        capture_output=True, text=True, check=False)
    assert cp.returncode != 0
    assert cp.stderr == "/bin/sh: can't create /file: Read-only file system\n"


def test_nonroot_user_reaches_the_image_config(tmp_path: Path) -> None:
    base = tmp_path / "b.tar"
    with tarfile.open(base, "w"):
        pass
    out = ociimage.write_layered_archive([ociimage.LayeredImage("x/nonroot:1", (str(base),), user="1234"),
                                          ociimage.LayeredImage("x/root:1", (str(base),))], str(tmp_path / "o.tar"))
    files = _members(Path(out))
    configs = [json.loads(v) for k, v in files.items() if k.startswith("blobs/") and b'"diff_ids"' in v]
    assert sorted(c["config"].get("User", "") for c in configs) == ["", "1234"]


def test_rootfs_key_is_build_image_sh_s() -> None:
    pkgs = ("openvswitch-common", "libnftables1", "iproute2")  # tools/build-image.sh's own list
    shell = subprocess.run(["bash", "-c", f'echo "bookworm essential {",".join(pkgs)}" | sha256sum | cut -c1-12'],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert e2eimages.rootfs_key(pkgs) == shell


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_layered_archive_shares_layers_and_names_every_image(tmp_path: Path) -> None:
    (tmp_path / "agnhost").write_bytes(b"\x7fELF agnhost")
    (tmp_path / "crt").write_bytes(b"cert")
    spec = ociimage.ImageSpec(name="", files={"agnhost": str(tmp_path / "agnhost"), "etc/x/crt": str(tmp_path / "crt")},
                              symlinks={"agnhost-2": "agnhost"})
    a = ociimage.write_layer(spec, str(tmp_path / "a.tar"), dirs=("uploads",))
    again = ociimage.write_layer(spec, str(tmp_path / "a2.tar"), dirs=("uploads",))
    assert Path(a).read_bytes() == Path(again).read_bytes()  # deterministic
    with tarfile.open(a) as tar:
        kinds = {m.name: (m.type, m.mtime, m.linkname) for m in tar.getmembers()}
    assert kinds["uploads"][0] == tarfile.DIRTYPE and kinds["etc"][0] == kinds["etc/x"][0] == tarfile.DIRTYPE
    assert kinds["agnhost-2"] == (tarfile.SYMTYPE, 0, "agnhost")
    base = tmp_path / "rootfs.tar"
    with tarfile.open(base, "w") as tar:
        info = tarfile.TarInfo("./etc/os-release")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"debian"))
    images = [ociimage.LayeredImage("registry.k8s.io/e2e-test-images/agnhost:2.56", (str(base), a),
                                    entrypoint=("/agnhost",), cmd=("pause",)),
              ociimage.LayeredImage("registry.k8s.io/pause:3.10.1", (a,), entrypoint=("/agnhost", "pause"))]
    out = ociimage.write_layered_archive(images, str(tmp_path / "out.tar"))
    files = _members(Path(out))
    index = json.loads(files["index.json"])
    assert [m["annotations"]["io.containerd.image.name"] for m in index["manifests"]] == [i.name for i in images]
    blobs = {k.removeprefix("blobs/sha256/"): v for k, v in files.items() if k.startswith("blobs/")}
    for k, v in blobs.items():
        assert hashlib.sha256(v).hexdigest() == k
    assert len(blobs) == 2 + 2 * 2  # two layers stored once, a config and a manifest per image
    m0 = json.loads(blobs[index["manifests"][0]["digest"].split(":")[1]])
    config = json.loads(blobs[m0["config"]["digest"].split(":")[1]])
    assert config["config"]["Entrypoint"] == ["/agnhost"] and config["config"]["Cmd"] == ["pause"]
    assert config["rootfs"]["diff_ids"] == [d["digest"] for d in m0["layers"]]
    assert config["rootfs"]["diff_ids"][0] == ociimage.file_digest(str(base))


# ---------------------------------------------------------------- the command (--list: nothing built)

class _FakeRun:
    """What cli takes from lab.conformance.run for --list: the spec list and the lab's refusals."""

    @staticmethod
    def list_specs() -> str:
        return "".join(f"    k8s.io/kubernetes@v1.34.4/test/e2e/network/x.go:{i}: {s}\n"
                       for i, s in enumerate(ALL_SPECS))

    @staticmethod
    def refusal(m: plan.Mode, kube_proxy: str, family: str | None, policy_peers: str = "cluster",
                delivery: str = "labels") -> str | None:
        return None


@pytest.mark.parametrize(("argv", "focus", "runs"), [
    ([], plan.DEFAULT_FOCUS, 1),
    (["--suite", "netpol"], plan.NETPOL_FOCUS, 5),
    (["--suite", "all"], f"{plan.DEFAULT_FOCUS}|{plan.NETPOL_FOCUS}", 6),
    (["--suite", "netpol-ci"], plan.NETPOL_CI_FOCUS, 2),
    (["--suite", "netpol", "--focus", "default-deny"], "default-deny", 1),
    (["--suite", "all-conformance"], plan.ALL_CONFORMANCE_FOCUS, 2),
])
def test_list_prints_the_suites_selection(monkeypatch: pytest.MonkeyPatch, argv: list[str], focus: str,
                                          runs: int) -> None:
    from click.testing import CliRunner

    from lab.conformance import cli

    monkeypatch.setattr(cli, "run_mod", lambda: _FakeRun)
    monkeypatch.setattr(plan, "kernel_has_sctp", lambda: False)
    r = CliRunner().invoke(cli.conformance, [*argv, "--mode", "encap-vxlan", "--list"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"focus {focus}: ")
    assert f"\n{runs} specs run per mode\n" in r.output
    assert "encap-vxlan (kube-proxy iptables): ferry-lab up --kubernetes --kube-proxy iptables" in r.output


def test_each_suite_has_its_own_results_directory() -> None:
    from lab.conformance import cli

    assert cli.default_out(plan.suite("conformance")) == cli.DEFAULT_OUT
    assert cli.default_out(plan.suite("netpol")) == cli.DEFAULT_OUT + "-netpol"
