"""Reading the JUnit file e2e writes (``--report-dir``: ``junit_01.xml``) and the table of a run.
Pure: text in, results and text out.

e2e's JUnit lists every spec of the binary (~7,000), the ones the focus did not select as
``<skipped message="skipped">``, like those a ``--ginkgo.skip`` rule skipped; a spec that skipped
itself at run time says why (``skipped - <reason>``, e.g. "Requires at least 2 nodes").  So each
test case is classified against the same focus and rules the run used:

* ``passed``; ``failed`` (failed, timed out, aborted, panicked, interrupted: ginkgo's other states);
* ``skipped`` by a rule (its name and reason), or by e2e itself (its message);
* ``silent``: selected, skipped, and neither a rule nor a message says why -- counted as a failure,
  since no spec may be skipped silently;
* not selected: left out of the results.

Setup and teardown nodes (``[SynchronizedBeforeSuite]``, ``[ReportAfterSuite]``, ...) count only
when they failed (a suite that never ran its specs)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from lab.conformance.plan import SkipRule, rule_of

FAILED_STATES = ("failure", "error")


@dataclass(frozen=True)
class Case:
    name: str  # the spec's full text (without ginkgo's "[It] ")
    node: str  # It, SynchronizedBeforeSuite, ...
    outcome: str  # passed | failed | skipped | silent
    reason: str = ""  # failed: the failure's first lines; skipped: the rule or e2e's message
    rule: str = ""  # the skip rule's name, when a rule skipped it
    seconds: float = 0.0


@dataclass(frozen=True)
class Result:
    cases: tuple[Case, ...]

    def of(self, outcome: str) -> list[Case]:
        return [c for c in self.cases if c.outcome == outcome]

    @property
    def passed(self) -> int:
        return len(self.of("passed"))

    @property
    def failed(self) -> int:
        return len(self.of("failed")) + len(self.of("silent"))

    @property
    def skipped(self) -> int:
        return len(self.of("skipped"))

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.passed + self.skipped > 0


def _split(name: str) -> tuple[str, str]:
    m = re.match(r"^\[([A-Za-z]+(?: \([A-Za-z ]+\))?)\]\s*(.*)$", name)
    return (m.group(1), m.group(2)) if m else ("It", name)


def _first_lines(text: str | None, n: int = 6, width: int = 400) -> str:
    lines = [ln.rstrip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return "\n".join(ln[:width] for ln in lines[:n])


def parse(xml_text: str, focus: str, rules: Sequence[SkipRule], leave_out: Collection[str] = ()) -> Result:
    """The selected specs of a JUnit report, classified (see the module's docstring); ``leave_out``:
    specs this report does not judge (the parallel pass's, which another pass runs alone)."""
    root = ET.fromstring(xml_text)
    focus_re = re.compile(focus)
    leave = frozenset(leave_out)
    cases = []
    for tc in root.iter("testcase"):
        node, name = _split(tc.get("name", ""))
        seconds = float(tc.get("time") or 0)
        failure = next((tc.find(t) for t in FAILED_STATES if tc.find(t) is not None), None)
        if node != "It":
            if failure is not None:
                text = failure.get("message") or failure.text or failure.get("type", "")
                cases.append(Case(f"[{node}] {name}".strip(), node, "failed", _first_lines(text), seconds=seconds))
            continue
        if not focus_re.search(name) or name in leave:
            continue
        skipped = tc.find("skipped")
        if failure is not None:
            text = failure.get("message") or failure.text or failure.get("type", "")
            cases.append(Case(name, node, "failed", _first_lines(text), seconds=seconds))
        elif skipped is not None:
            message = skipped.get("message", "")
            own = message.split(" - ", 1)[1].strip() if " - " in message else ""
            rule = rule_of(name, rules)
            if rule is not None:
                cases.append(Case(name, node, "skipped", f"{rule.name}: {rule.reason}", rule.name, seconds))
            elif own:
                cases.append(Case(name, node, "skipped", f"e2e: {_first_lines(own, 2)}", seconds=seconds))
            else:
                cases.append(Case(name, node, "silent", "skipped without a rule or a reason", seconds=seconds))
        elif tc.get("status", "passed") == "passed":
            cases.append(Case(name, node, "passed", seconds=seconds))
        else:  # a state ginkgo reports without a failure element
            cases.append(Case(name, node, "failed", f"state {tc.get('status')}", seconds=seconds))
    return Result(tuple(cases))


def read(path: str, focus: str, rules: Sequence[SkipRule], leave_out: Collection[str] = ()) -> Result:
    with open(path, encoding="utf-8") as f:
        return parse(f.read(), focus, rules, leave_out)


def merge(results: Sequence[Result], expected: Collection[str] = ()) -> Result:
    """The passes of one mode as one result (each spec is judged by exactly one pass); a spec of
    ``expected`` that no pass reports counts as silent (a focus that missed it runs nothing)."""
    cases = tuple(c for r in results for c in r.cases)
    seen = {c.name for c in cases}
    lost = tuple(Case(n, "It", "silent", "no pass reported it") for n in expected if n not in seen)
    return Result(cases + lost)


# ---------------------------------------------------------------- the tables

@dataclass(frozen=True)
class ModeRun:
    """One mode's outcome: its result, or why it did not run (``error``)."""

    mode: str
    kube_proxy: str
    result: Result | None = None
    error: str = ""
    seconds: float = 0.0
    junit: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.result is not None and self.result.ok


def mode_report(run: ModeRun) -> str:
    """One mode: its counts, then every failed and skipped spec with its reason."""
    head = f"mode {run.mode}, kube-proxy {run.kube_proxy}"
    if run.result is None:
        return f"{head}: NOT RUN: {run.error}"
    r = run.result
    note = f"; {run.error}" if run.error else ""
    lines = [f"{head}: {r.passed} passed, {r.failed} failed, {r.skipped} skipped ({run.seconds / 60:.1f} min){note}"]
    for c in r.of("failed") + r.of("silent"):
        lines.append(f"  FAILED  {c.name}")
        lines += [f"          {ln}" for ln in c.reason.splitlines()]
    for c in r.of("skipped"):
        lines.append(f"  SKIPPED {c.name}\n          {c.reason.splitlines()[0] if c.reason else ''}")
    if run.junit:
        lines.append(f"  JUnit: {run.junit}")
    return "\n".join(lines)


def table(runs: Sequence[ModeRun]) -> str:
    """Markdown: one row per mode and kube-proxy mode."""
    lines = ["| mode | kube-proxy | passed | failed | skipped | minutes |", "|---|---|---|---|---|---|"]
    for run in runs:
        if run.result is None:
            lines.append(f"| {run.mode} | {run.kube_proxy} | not run: {run.error.splitlines()[0] if run.error else '?'}"
                         " | | | |")
        else:
            r = run.result
            lines.append(f"| {run.mode} | {run.kube_proxy} | {r.passed} | {r.failed} | {r.skipped} "
                         f"| {run.seconds / 60:.1f} |")
    return "\n".join(lines)
