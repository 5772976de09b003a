"""The ClusterNetworkPolicy conformance suite (``--suite cnp``), as plain data (no system access):
sigs.k8s.io/network-policy-api's own tests (``conformance``, the version tools/network-policy-api
pins), its test binary's flags, the rule for its SCTP probes, and reading back what it wrote -- its
``go test -v`` output and its conformance report (YAML) -- into the table the e2e suites give
(:class:`lab.conformance.junit.Result`).

Its tests are Go subtests ``TestConformanceProfiles/<ShortName>/<case>``: one row per ShortName
(30 at v0.3.0: 24 standard, 6 experimental ones -- named ports and the ``nodes`` egress peer,
run with ``--all-features``). Each case pokes servers from client Pods (``agnhost connect``),
each poke a probe retried for 10 s (``require.Eventually``): a failed case stops at its first
failed probe.

No test is skipped before it runs: Go's ``-test.skip`` would make the suite's report count a
skipped test as passed (``t.Run`` returns true for a test it filtered out). So every test runs,
and a failed one counts as skipped by :data:`SCTP_PROBES` only when each of its failed cases
stopped at an SCTP probe that this kernel refused (``protocol not supported``); anything else
failed. The report YAML keeps upstream's own counts (those tests failed there), printed beside
the table."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from lab.conformance.junit import Case, ModeRun, Result
from lab.conformance.plan import SCTP

MODULE = "sigs.k8s.io/network-policy-api"
RUN = "TestConformanceProfiles"  # the profile run, which writes the report (TestConformance does not)
PROFILE = "ClusterNetworkPolicy"
# The hostNetwork fixture (the forbidden-forrest StatefulSet, "centaur") serves on the Nodes'
# own addresses, on the suite's default range (no flag sets another): 8 ports from 34345.
HOST_NETWORK_PORTS = tuple(range(34345, 34353))
TIMEOUT = "60m"  # the test binary's -test.timeout (a run takes ~10 min)


@dataclass(frozen=True)
class ProbeRule:
    """A failed case is waived by this rule when the probe it stopped at used ``protocol`` and
    failed with ``status`` (agnhost connect's words), because of ``reason``."""

    name: str
    protocol: str
    status: str
    reason: str


SCTP_PROBES = ProbeRule(
    SCTP.name, "sctp", "protocol not supported",
    f"{SCTP.reason}: agnhost connect --protocol=sctp answers 'OTHER: protocol not supported', whatever a policy "
    "says; SCTP matching is tested in the switch instead (tests/cni/pipeline/test_tiers_datapath.py)")


def probe_rules(sctp: bool) -> tuple[ProbeRule, ...]:
    """The rules that hold on this machine (``sctp``: whether the kernel has SCTP sockets)."""
    return () if sctp else (SCTP_PROBES,)


FOCUS = f"^{RUN}$"  # every test; e.g. "^TestConformanceProfiles$/^CNPAdminTierEgressNodePeers$" for one
# The suite's tests at v0.3.0 (their ShortNames: conformance/tests/*.go).
TESTS = tuple(f"CNP{tier}Tier{t}" for tier in ("Admin", "Baseline") for t in (
    "EgressInlineCIDRPeers", "EgressNamedPort", "EgressNodePeers", "EgressSCTP", "EgressTCP", "EgressUDP", "Gress",
    "IngressNamedPort", "IngressSCTP", "IngressTCP", "IngressUDP", "PodSelector", "PortRange", "SamePriority")) + (
    "CNPAdminTierIntegration", "CNPAdminTierPriorityField")
# What CI leaves to make conformance: the tests made mostly of SCTP probes (the SCTP ones, and
# Gress and PortRange, whose cases end in one), ~8 of the suite's ~18 min on a kernel without SCTP
# sockets, since each stopped case polls its probe for 10 s. The node and CIDR peers' tests stay:
# their TCP and UDP probes come first.
CI_LEFT_OUT = tuple(f"CNP{tier}Tier{t}" for tier in ("Admin", "Baseline")
                    for t in ("EgressSCTP", "IngressSCTP", "Gress", "PortRange"))
CI_TESTS = tuple(t for t in TESTS if t not in CI_LEFT_OUT)


def focus_of(tests: Sequence[str]) -> str:
    """Go's ``-test.run`` for these of the suite's tests (each by its whole name)."""
    return f"^{RUN}$/^({'|'.join(tests)})$"


def argv(binary: str, kubeconfig: str, report: str, version: str, focus: str = FOCUS) -> list[str]:
    """The conformance test binary's command line: the ClusterNetworkPolicy profile with every
    feature (standard and experimental), verbose (the table is read from its output); ``focus``
    is Go's ``-test.run``."""
    return [binary, f"-test.run={focus}", "-test.v", f"-test.timeout={TIMEOUT}", f"--kubeconfig={kubeconfig}",
            f"--conformance-profiles={PROFILE}", "--all-features", f"--report-output={report}",
            "--organization=ferry", "--project=ferry", "--url=https://ferry.dev", f"--version={version}",
            "--contact=ferry maintainers", "--additional-info=ferry-lab (make conformance CONFORMANCE=\"--suite cnp\")"]


def port_conflicts(ss_output: str, ports: Sequence[int] = HOST_NETWORK_PORTS) -> list[str]:
    """The listening sockets of ``ss -Hlntu`` (a Node's) on the fixture's ports: each one would
    keep the hostNetwork fixture from binding it."""
    out = []
    for line in ss_output.splitlines():
        cols = line.split()
        if len(cols) >= 5:
            port = cols[4].rpartition(":")[2]
            if port.isdigit() and int(port) in ports:
                out.append(f"{cols[0]} {cols[4]}")
    return out


# ---------------------------------------------------------------- go test -v output

@dataclass
class GoTest:
    """One test or subtest of a ``-test.v`` run: its outcome (PASS, FAIL, SKIP; empty when its
    result line is missing) and the lines it printed."""

    name: str
    outcome: str = ""
    seconds: float = 0.0
    output: list[str] = field(default_factory=list)


_SWITCH = re.compile(r"^=== (?:RUN|NAME|CONT|PAUSE)\s+(\S+)")
_RESULT = re.compile(r"^\s*--- (PASS|FAIL|SKIP): (\S+) \(([\d.]+)s\)")


def parse_verbose(text: str) -> dict[str, GoTest]:
    """Every test of ``-test.v`` output by full name, in order of appearance; a line of output
    belongs to the test named by the last ``=== RUN``/``NAME``/``CONT`` line (tests run one at a time)."""
    tests: dict[str, GoTest] = {}
    current: GoTest | None = None
    for line in text.splitlines():
        if m := _SWITCH.match(line):
            current = tests.setdefault(m.group(1), GoTest(m.group(1)))
        elif m := _RESULT.match(line):
            t = tests.setdefault(m.group(2), GoTest(m.group(2)))
            t.outcome, t.seconds = m.group(1), float(m.group(3))
        elif current is not None and line.strip() and not re.match(r"^(PASS|FAIL|ok\s|FAIL\s)", line):
            current.output.append(line)
    return tests


@dataclass(frozen=True)
class Probe:
    command: str  # agnhost connect's command line, as the suite logged it
    status: str  # what the suite logged after it (the expectation and agnhost's answer)


def failed_probe(case: GoTest) -> Probe | None:
    """The probe a failed case stopped at: the last one it logged as failed, when the case failed
    once, on a probe never satisfied (``require.Eventually``); None for any other failure."""
    text = "\n".join(case.output)
    if text.count("Error Trace:") != 1 or "Condition never satisfied" not in text:
        return None
    probe: Probe | None = None
    for i, line in enumerate(case.output):
        if m := re.search(r"FAILED Command was (\[.*\])", line):
            nxt = case.output[i + 1] if i + 1 < len(case.output) else ""
            probe = Probe(m.group(1), nxt.split(": ", 1)[-1].strip())
    return probe


def waived_by(probe: Probe | None, rules: Sequence[ProbeRule]) -> ProbeRule | None:
    if probe is None:
        return None
    return next((r for r in rules if f"--protocol={r.protocol} " in f"{probe.command} " and r.status in probe.status),
                None)


def _case_name(full: str) -> str:
    return full.split("/", 2)[2].replace("_", " ") if full.count("/") >= 2 else full


def classify(tests: dict[str, GoTest], rules: Sequence[ProbeRule]) -> Result:
    """One :class:`Case` per suite test (``RUN/<ShortName>``); a failure of the run itself (its
    setup, or the report) as ``[setup] RUN``."""
    prefix = f"{RUN}/"
    names = [n for n in tests if n.startswith(prefix) and n.count("/") == 1]
    cases: list[Case] = []
    for name in names:
        t = tests[name]
        short = name[len(prefix):]
        subs = [tests[n] for n in tests if n.startswith(f"{name}/")]
        if t.outcome == "PASS":
            cases.append(Case(short, "It", "passed", seconds=t.seconds))
        elif t.outcome == "SKIP":
            said = next((ln.strip() for ln in t.output if "Skipping" in ln), "")
            cases.append(Case(short, "It", "skipped" if said else "silent",
                              f"suite: {said}" if said else "skipped without a rule or a reason", seconds=t.seconds))
        elif t.outcome == "FAIL":
            failed = [s for s in subs if s.outcome == "FAIL"]
            waived = [(s, waived_by(failed_probe(s), rules)) for s in failed]
            if failed and all(r is not None for _, r in waived):
                rule = waived[0][1]
                assert rule is not None
                passed = sum(1 for s in subs if s.outcome == "PASS")
                stopped = "; ".join(f"'{_case_name(s.name)}' at {failed_probe(s).command}"  # type: ignore[union-attr]
                                    for s in failed)
                cases.append(Case(short, "It", "skipped",
                                  f"{rule.name}: {len(failed)} of its {len(subs)} cases stopped at an SCTP probe "
                                  f"({passed} passed): {stopped}; {rule.reason}", rule.name, t.seconds))
            else:
                cases.append(Case(short, "It", "failed", _failure(t, failed), seconds=t.seconds))
        else:
            cases.append(Case(short, "It", "failed", "no result line (the run ended inside it)", seconds=t.seconds))
    top = tests.get(RUN)
    explained = any(c.outcome == "failed" or c.rule for c in cases)  # a failed test fails the run too
    if top is None or top.outcome == "" or (top.outcome == "FAIL" and not explained):
        why = "\n".join(ln.strip() for ln in (top.output if top else [])[-6:]) or "no output"
        cases.append(Case(f"[setup] {RUN}", "SynchronizedBeforeSuite", "failed", why))
    return Result(tuple(cases))


def _failure(t: GoTest, failed: Sequence[GoTest]) -> str:
    lines = []
    for s in failed or [t]:
        probe = failed_probe(s)
        if probe is not None:
            lines.append(f"{_case_name(s.name)}: {probe.command}: {probe.status}")
        else:
            errs = [ln.strip() for ln in s.output if "Error:" in ln or "Messages:" in ln or ".go:" in ln]
            lines.append(f"{_case_name(s.name)}: {' | '.join(errs[-3:]) or 'failed'}")
    return "\n".join(ln[:400] for ln in lines[:6])


def test_table(runs: Sequence[ModeRun]) -> str:
    """Markdown: one row per test, one column per mode (``passed``, ``failed``, ``skipped (rule)``),
    then the counts per mode."""
    cols = [(f"{r.mode} {r.kube_proxy}", {c.name: c for c in r.result.cases}) for r in runs if r.result is not None]
    names = list(dict.fromkeys(name for _, cases in cols for name in cases))
    lines = ["| test | " + " | ".join(head for head, _ in cols) + " |", "|---|" + "---|" * len(cols)]
    for name in names:
        cells = []
        for _, cases in cols:
            c = cases.get(name)
            cells.append("-" if c is None else f"{c.outcome} ({c.rule})" if c.rule else c.outcome)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- the report

def report_counts(yaml_text: str) -> str:
    """The report's own counts per profile: standard, then experimental (and their failed tests)."""
    doc: dict[str, Any] = yaml.safe_load(yaml_text) or {}
    lines = [f"report (network policy bundle {doc.get('networkPolicyBundleVersion', '?')}):"]
    for p in doc.get("profiles") or []:
        for part in ("standard", "experimental"):
            s = p.get(part)
            if not s:
                continue
            st = s.get("statistics", {})
            failed = s.get("failedTests") or []
            lines.append(f"  {p.get('name')} {part}: {s.get('result')}: {st.get('Passed', 0)} passed, "
                         f"{st.get('Failed', 0)} failed, {st.get('Skipped', 0)} skipped"
                         + (f" (failed: {', '.join(failed)})" if failed else ""))
    return "\n".join(lines)


def describe(rules: Sequence[ProbeRule], focus: str = FOCUS) -> str:
    """What runs, and the rules, each with its reason."""
    lines = [(f"suite cnp: {MODULE}'s conformance tests (-test.run={focus}, profile {PROFILE}, --all-features); "
              f"hostNetwork fixture on the Nodes' ports {HOST_NETWORK_PORTS[0]}-{HOST_NETWORK_PORTS[-1]}; rules:")]
    lines += [f"  {r.name}: a case that stopped at a --protocol={r.protocol} probe answered '{r.status}': {r.reason}"
              for r in rules] or ["  none"]
    return "\n".join(lines)
