"""``make conformance CONFORMANCE="--suite cnp"``'s pure parts, without root: the conformance
binary's command line, reading its ``-test.v`` output (lines as v0.3.0's suite prints them) into
the table with the SCTP probe rule, its report's counts, the fixture's ports; the agnhost:2.45
image's definition and its wrapper, run on a stand-in agnhost."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from lab.conformance import cnp, plan
from lab.kube import e2eimages

SUB = "TestConformanceProfiles/CNPAdminTierPortRange/Should_support_egress_port_range_rules_across_different_protocols"


def _lines(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def _probe_failure(case: str, protocol: str, status: str, polls: int = 2) -> list[str]:
    lines = []
    for _ in range(polls):
        lines += [(f"    helper.go:71: FAILED Command was [/agnhost connect --timeout=3s --protocol={protocol} "
                  "10.244.2.2:9003]"),
                  (f"    helper.go:71: Expected connection to succeed from a/b to 10.244.2.2, but instead it miserably "
                  f"failed. stderr: {status}")]
    return [*lines, "    helper.go:70: ",
            "        \tError Trace:\tsigs.k8s.io/network-policy-api@v0.3.0/conformance/utils/kubernetes/helper.go:70",
            "        \tError:      \tCondition never satisfied", f"        \tTest:       \t{case}"]


def _output(tcp_status: str = "TIMEOUT", tcp_protocol: str = "tcp") -> str:
    """A run of three tests: one passes, one stops at SCTP probes only, one at a probe of
    ``tcp_protocol`` answered ``tcp_status``."""
    tcp_case = "TestConformanceProfiles/CNPAdminTierIngressTCP/Should_support_a_'deny-ingress'_policy"
    sctp_case = "TestConformanceProfiles/CNPAdminTierEgressSCTP/Should_support_an_'allow-egress'_policy_for_SCTP"
    lines = [
        "=== RUN   TestConformanceProfiles",
        "    conformance_profile_test.go:109: Running conformance profile tests with cleanup: true",
        "=== RUN   TestConformanceProfiles/CNPAdminTierEgressNamedPort",
        "    suite.go:221: Applying base/admin_tier/standard-egress-tcp-rules.yaml",
        "=== RUN   TestConformanceProfiles/CNPAdminTierEgressNamedPort/Should_support_an_'allow-egress'_policy",
        "=== NAME  TestConformanceProfiles/CNPAdminTierEgressNamedPort",
        "    apply.go:154: Deleting egress-tcp ClusterNetworkPolicy",
        "=== RUN   TestConformanceProfiles/CNPAdminTierEgressSCTP",
        f"=== RUN   {sctp_case}",
        *_probe_failure(sctp_case, "sctp", "OTHER: protocol not supported"),
        "=== RUN   TestConformanceProfiles/CNPAdminTierPortRange",
        f"=== RUN   {SUB}",
        # a TCP probe that failed twice before it passed, then the SCTP probe the case stopped at
        "    helper.go:71: FAILED Command was [/agnhost connect --timeout=3s --protocol=tcp 10.244.2.2:80]",
        "    helper.go:71: Expected connection to succeed from a/b to 10.244.2.2, but ... stderr: TIMEOUT",
        *_probe_failure(SUB, "sctp", "OTHER: protocol not supported"),
        "=== RUN   TestConformanceProfiles/CNPAdminTierPortRange/Should_support_ingress_port_range_rules",
        "=== RUN   TestConformanceProfiles/CNPAdminTierIngressTCP",
        f"=== RUN   {tcp_case}",
        *_probe_failure(tcp_case, tcp_protocol, tcp_status),
        "    conformance_profile_test.go:160: Conformance report:",
        "--- FAIL: TestConformanceProfiles (60.50s)",
        "    --- PASS: TestConformanceProfiles/CNPAdminTierEgressNamedPort (1.25s)",
        ("        --- PASS: TestConformanceProfiles/CNPAdminTierEgressNamedPort/Should_support_an_'allow-egress'_policy"
        " (1.00s)"),
        "    --- FAIL: TestConformanceProfiles/CNPAdminTierEgressSCTP (10.50s)",
        f"        --- FAIL: {sctp_case} (10.40s)",
        "    --- FAIL: TestConformanceProfiles/CNPAdminTierPortRange (12.00s)",
        f"        --- FAIL: {SUB} (11.00s)",
        ("        --- PASS: TestConformanceProfiles/CNPAdminTierPortRange/Should_support_ingress_port_range_rules"
        " (1.00s)"),
        "    --- FAIL: TestConformanceProfiles/CNPAdminTierIngressTCP (10.30s)",
        f"        --- FAIL: {tcp_case} (10.20s)",
        "FAIL",
    ]
    return "\n".join(lines) + "\n"


def test_argv_runs_the_profile_with_every_feature_and_writes_the_report() -> None:
    argv = cnp.argv("/b/cnp-conformance.test", "/k/admin.kubeconfig", "/o/report.yaml", "0.1.0")
    assert argv[0] == "/b/cnp-conformance.test"
    for flag in ("-test.run=^TestConformanceProfiles$", "-test.v", "--kubeconfig=/k/admin.kubeconfig",
                 "--conformance-profiles=ClusterNetworkPolicy", "--all-features", "--report-output=/o/report.yaml",
                 "--version=0.1.0"):
        assert flag in argv, flag
    one = "^TestConformanceProfiles$/^CNPAdminTierEgressNodePeers$"
    assert f"-test.run={one}" in cnp.argv("b", "k", "r", "v", one)
    assert plan.suite("cnp").runner == "cnp" and plan.suite("cnp").focus == cnp.FOCUS
    assert all(s.runner == "e2e" for s in plan.SUITES if s.name != "cnp")


def test_verbose_output_is_read_per_test_with_its_lines() -> None:
    tests = cnp.parse_verbose(_output())
    assert tests["TestConformanceProfiles"].outcome == "FAIL"
    assert tests["TestConformanceProfiles/CNPAdminTierEgressNamedPort"].outcome == "PASS"
    assert tests["TestConformanceProfiles/CNPAdminTierEgressNamedPort"].seconds == 1.25
    # the NAME line hands the lines back to the parent
    assert tests["TestConformanceProfiles/CNPAdminTierEgressNamedPort"].output == [
        "    suite.go:221: Applying base/admin_tier/standard-egress-tcp-rules.yaml",
        "    apply.go:154: Deleting egress-tcp ClusterNetworkPolicy"]
    probe = cnp.failed_probe(tests[SUB])
    assert probe == cnp.Probe("[/agnhost connect --timeout=3s --protocol=sctp 10.244.2.2:9003]",
                              "Expected connection to succeed from a/b to 10.244.2.2, but instead it miserably failed. "
                              "stderr: OTHER: protocol not supported")


def test_a_test_that_stopped_only_at_sctp_probes_is_skipped_by_the_rule_and_says_so() -> None:
    result = cnp.classify(cnp.parse_verbose(_output()), cnp.probe_rules(sctp=False))
    by = {c.name: c for c in result.cases}
    assert list(by) == ["CNPAdminTierEgressNamedPort", "CNPAdminTierEgressSCTP", "CNPAdminTierPortRange",
                        "CNPAdminTierIngressTCP"]
    assert by["CNPAdminTierEgressNamedPort"].outcome == "passed"
    for name in ("CNPAdminTierEgressSCTP", "CNPAdminTierPortRange"):
        assert by[name].outcome == "skipped" and by[name].rule == "sctp", by[name]
    assert by["CNPAdminTierPortRange"].reason.startswith(
        "sctp: 1 of its 2 cases stopped at an SCTP probe (1 passed): 'Should support egress port range rules across "
        "different protocols' at [/agnhost connect --timeout=3s --protocol=sctp 10.244.2.2:9003]; this kernel")
    # the TCP test failed on its probe, which no rule names: failed, with the probe and its answer
    assert by["CNPAdminTierIngressTCP"].outcome == "failed"
    assert by["CNPAdminTierIngressTCP"].reason == (
        "Should support a 'deny-ingress' policy: [/agnhost connect --timeout=3s --protocol=tcp 10.244.2.2:9003]: "
        "Expected connection to succeed from a/b to 10.244.2.2, but instead it miserably failed. stderr: TIMEOUT")
    assert (result.passed, result.failed, result.skipped) == (1, 1, 2)


@pytest.mark.parametrize(("protocol", "status"), [
    ("tcp", "TIMEOUT"),  # a policy that dropped what it should have let through
    ("tcp", "OTHER: protocol not supported"),  # not an SCTP probe
    ("sctp", "TIMEOUT"),  # an SCTP probe, but not refused by this kernel
])
def test_any_other_failed_probe_fails_the_test(protocol: str, status: str) -> None:
    result = cnp.classify(cnp.parse_verbose(_output(status, protocol)), cnp.probe_rules(sctp=False))
    tcp = next(c for c in result.cases if c.name == "CNPAdminTierIngressTCP")
    assert tcp.outcome == "failed" and f"--protocol={protocol}" in tcp.reason and status in tcp.reason
    assert result.failed == 1 and not result.ok


def test_with_sctp_sockets_no_rule_waives_an_sctp_probe() -> None:
    result = cnp.classify(cnp.parse_verbose(_output()), cnp.probe_rules(sctp=True))
    assert result.skipped == 0 and result.failed == 3 and not result.ok


def test_a_case_that_failed_otherwise_than_on_a_probe_is_not_waived() -> None:
    """A later failure (two Error Traces) after an SCTP probe's log is the test's own failure."""
    text = _output().replace("        \tTest:       \t" + SUB,
                             "        \tTest:       \t" + SUB + "\n        \tError Trace:\thelper.go:120\n"
                             "        \tError:      \tpods \"x\" not found")
    result = cnp.classify(cnp.parse_verbose(text), cnp.probe_rules(sctp=False))
    port_range = next(c for c in result.cases if c.name == "CNPAdminTierPortRange")
    assert port_range.outcome == "failed" and 'pods "x" not found' in port_range.reason


def test_a_run_that_failed_before_its_tests_counts_as_a_failed_setup() -> None:
    text = _lines("=== RUN   TestConformanceProfiles",
                  "    suite.go:160: Test Setup: Ensuring Namespaces and Pods from base manifests are ready",
                  "    helper.go:145: timed out waiting for the condition",
                  "--- FAIL: TestConformanceProfiles (300.10s)", "FAIL")
    result = cnp.classify(cnp.parse_verbose(text), ())
    assert [(c.name, c.outcome) for c in result.cases] == [("[setup] TestConformanceProfiles", "failed")]
    assert "timed out waiting" in result.cases[0].reason
    # no output at all (the binary did not start): failed too, never an empty pass
    assert cnp.classify(cnp.parse_verbose(""), ()).failed == 1
    # a run whose every test passed has no setup row
    ok = _lines("=== RUN   TestConformanceProfiles", "=== RUN   TestConformanceProfiles/A",
                "--- PASS: TestConformanceProfiles (1s)", "    --- PASS: TestConformanceProfiles/A (0.50s)")
    assert [(c.name, c.outcome) for c in cnp.classify(cnp.parse_verbose(ok), ()).cases] == [("A", "passed")]


def test_a_test_the_suite_skipped_says_why_or_counts_as_silent() -> None:
    text = _lines("=== RUN   TestConformanceProfiles", "=== RUN   TestConformanceProfiles/A",
                  "    suite.go:210: Skipping A: suite does not support ClusterNetworkPolicyNamedPorts",
                  "=== RUN   TestConformanceProfiles/B",
                  "--- PASS: TestConformanceProfiles (1s)", "    --- SKIP: TestConformanceProfiles/A (0.00s)",
                  "    --- SKIP: TestConformanceProfiles/B (0.00s)")
    a, b = cnp.classify(cnp.parse_verbose(text), ()).cases
    assert a.outcome == "skipped" and "does not support ClusterNetworkPolicyNamedPorts" in a.reason
    assert b.outcome == "silent"


def test_report_counts_per_profile() -> None:
    report = """apiVersion: policy.networking.k8s.io/v1alpha1
kind: ConformanceReport
networkPolicyBundleVersion: v0.3.0
profiles:
- experimental:
    result: success
    statistics: {Failed: 0, Passed: 6, Skipped: 0}
  name: ClusterNetworkPolicy
  standard:
    failedTests: [CNPAdminTierEgressSCTP, CNPAdminTierPortRange]
    result: failure
    statistics: {Failed: 2, Passed: 20, Skipped: 0}
"""
    assert cnp.report_counts(report).splitlines() == [
        "report (network policy bundle v0.3.0):",
        ("  ClusterNetworkPolicy standard: failure: 20 passed, 2 failed, 0 skipped "
        "(failed: CNPAdminTierEgressSCTP, CNPAdminTierPortRange)"),
        "  ClusterNetworkPolicy experimental: success: 6 passed, 0 failed, 0 skipped"]


def test_port_conflicts_name_what_listens_on_the_fixtures_ports() -> None:
    ss = ("tcp   LISTEN 0      4096   192.168.77.11:10250      0.0.0.0:*\n"
          "tcp   LISTEN 0      4096         0.0.0.0:34346      0.0.0.0:*\n"
          "udp   UNCONN 0      0               [::]:34352         [::]:*\n"
          "udp   UNCONN 0      0               [::]:34353         [::]:*\n")
    assert cnp.port_conflicts(ss) == ["tcp 0.0.0.0:34346", "udp [::]:34352"]
    assert cnp.HOST_NETWORK_PORTS == tuple(range(34345, 34353))


def test_describe_names_each_rule_and_its_reason() -> None:
    text = cnp.describe(cnp.probe_rules(sctp=False))
    assert "sctp: a case that stopped at a --protocol=sctp probe answered 'protocol not supported'" in text
    assert "EPROTONOSUPPORT" in text and "34345-34352" in text
    assert cnp.describe(()).endswith("  none")


def test_list_prints_the_cnp_suite_and_its_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from lab.conformance import cli

    class FakeRun:
        @staticmethod
        def refusal(m: plan.Mode, kube_proxy: str, family: str | None, policy_peers: str = "cluster",
                    delivery: str = "labels") -> str | None:
            return None

    monkeypatch.setattr(cli, "run_mod", lambda: FakeRun)
    monkeypatch.setattr(plan, "kernel_has_sctp", lambda: False)
    r = CliRunner().invoke(cli.conformance, ["--suite", "cnp", "--mode", "encap-vxlan", "--kube-proxy", "nftables",
                                             "--list"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("suite cnp: sigs.k8s.io/network-policy-api's conformance tests "
                               "(-test.run=^TestConformanceProfiles$")
    assert "\n  sctp: " in r.output and "encap-vxlan (kube-proxy nftables)" in r.output
    assert cli.default_out(plan.suite("cnp")) == cli.DEFAULT_OUT + "-cnp"


# ---------------------------------------------------------------- the image

def test_the_cnp_image_is_agnhost_2_45_over_the_shared_root_file_system() -> None:
    """The tag network-policy-api v0.3.0's base manifests name, when the module is in the cache."""
    (image,) = e2eimages.cnp_images("rootfs", "agnhost-cnp")
    assert image.name == e2eimages.AGNHOST_CNP == "registry.k8s.io/e2e-test-images/agnhost:2.45"
    assert image.layers == ("rootfs", "agnhost-cnp") and image.entrypoint == ("/agnhost",) and image.cmd == ("pause",)
    manifests = _cached_base_manifests()
    if manifests is None:
        pytest.skip("sigs.k8s.io/network-policy-api is not in the Go module cache (tools/build-go-tools.sh "
                    "network-policy-api)")
    assert f"image: {e2eimages.AGNHOST_CNP}" in manifests
    assert "SERVE_SCTP_PORT_9003" in manifests  # what the wrapper is for


def _cached_base_manifests() -> str | None:
    gomodcache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=False).stdout.strip()
    path = os.path.join(gomodcache or "/root/go/pkg/mod", "sigs.k8s.io", "network-policy-api@v0.3.0", "conformance",
                        "base", "manifests.yaml")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


def _wrapper(tmp_path: Path, agnhost_bin: str) -> Path:
    """The wrapper, pointed at a stand-in for /agnhost-bin that records its calls."""
    fake = tmp_path / "agnhost-bin"
    fake.write_text(f"#!/bin/bash\necho \"$*\" >> {tmp_path}/calls\n{agnhost_bin}")
    fake.chmod(0o755)
    w = tmp_path / "agnhost"
    w.write_text(e2eimages.agnhost_cnp_wrapper().replace("/agnhost-bin", str(fake)))
    w.chmod(0o755)
    return w


def test_wrapper_holds_porter_up_when_its_sctp_listener_is_refused(tmp_path: Path) -> None:
    refused = ('if [ "$1" = porter ]; then echo "I1204 log.go:244] Failed to listen SCTP. error:protocol not '
               'supported" >&2; exit 1; fi\n')
    w = _wrapper(tmp_path, refused)
    cp = subprocess.run([str(w), "porter"], capture_output=True, text=True, timeout=30, check=False)
    assert cp.returncode == 0, cp
    assert "its SCTP ports are not served, the Pod stays up" in cp.stdout
    assert (tmp_path / "calls").read_text().splitlines() == ["porter", "pause"]


def test_wrapper_passes_everything_else_through(tmp_path: Path) -> None:
    w = _wrapper(tmp_path, 'echo "out $*"; exit 3\n')
    for args in (["connect", "--protocol=sctp", "10.0.0.1:9003"], ["porter"]):
        (tmp_path / "calls").unlink(missing_ok=True)
        cp = subprocess.run([str(w), *args], capture_output=True, text=True, timeout=30, check=False)
        assert cp.returncode == 3 and cp.stdout == f"out {' '.join(args)}\n", cp
        assert (tmp_path / "calls").read_text().splitlines() == [" ".join(args)]


def test_the_per_test_table_has_a_column_per_mode_and_names_the_rule() -> None:
    from lab.conformance.junit import ModeRun

    result = cnp.classify(cnp.parse_verbose(_output()), cnp.probe_rules(sctp=False))
    runs = [ModeRun("encap-vxlan", "nftables", result), ModeRun("hybrid", "iptables", error="lab up failed")]
    assert cnp.test_table(runs).splitlines() == [
        "| test | encap-vxlan nftables |", "|---|---|",
        "| CNPAdminTierEgressNamedPort | passed |",
        "| CNPAdminTierEgressSCTP | skipped (sctp) |",
        "| CNPAdminTierPortRange | skipped (sctp) |",
        "| CNPAdminTierIngressTCP | failed |"]


def test_tests_are_the_modules_and_ci_runs_all_but_the_sctp_made_ones() -> None:
    """TESTS is v0.3.0's 30 ShortNames (read from the module when the Go module cache has it);
    CI's focus selects every test but the 8 made mostly of SCTP probes, each by its whole name."""
    import glob

    assert len(cnp.TESTS) == len(set(cnp.TESTS)) == 30 and len(cnp.CI_TESTS) == 22
    cp = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=False)
    src = os.path.join(cp.stdout.strip(), "sigs.k8s.io", "network-policy-api@v0.3.0", "conformance", "tests")
    if os.path.isdir(src):
        names = set()
        for f in glob.glob(os.path.join(src, "*.go")):
            with open(f, encoding="utf-8") as fh:
                names |= set(re.findall(r'ShortName:\s*"([^"]+)"', fh.read()))
        assert names == set(cnp.TESTS)
    run_re, sub = cnp.focus_of(cnp.CI_TESTS).split("/", 1)
    assert re.search(run_re, cnp.RUN)
    assert [t for t in cnp.TESTS if re.search(sub, t)] == list(cnp.CI_TESTS)
    assert not any(re.search(sub, t + "X") or re.search(sub, "X" + t) for t in cnp.TESTS)
