"""``conformance``: Kubernetes' own e2e specs on the lab, per Ferry traffic mode (``make
conformance``; ``python -m lab.conformance``).

    conformance [--suite conformance|netpol|netpol-ci|all|ci|all-conformance|all-conformance-ci]
                [--mode M ...] [--kube-proxy iptables|nftables ...] [--focus REGEX] [--procs N]
                [--out DIR] [--family 4|6|dual] [--keep] [--list]

The suite names the specs: ``conformance`` (the default) sig-network's ``[Conformance]`` specs,
``netpol`` the NetworkPolicy specs (``[sig-network] Netpol``), ``all`` both, ``all-conformance``
every SIG's ``[Conformance]`` specs; ``--focus`` replaces the suite's focus. Every mode by
default, kube-proxy in iptables mode; prints the skip rules and
the specs each skips first, then per mode the passed / failed / skipped specs (each skip with its reason), and writes
JUnit per mode plus ``summary.md`` into ``--out``. Exits non-zero when a spec failed, a spec was
skipped without a rule or reason, or a mode did not run."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import click

from lab import overrides, tools
from lab.conformance import junit, plan
from lab.sh import LabError

DEFAULT_OUT = os.path.join(tools.REPO, "build", "conformance")


def _log(s: str) -> None:
    click.echo(s, err=True)


@click.command("conformance", help=__doc__)
@click.option("--suite", "suite_name", default=plan.DEFAULT_SUITE.name, show_default=True,
              type=click.Choice(plan.SUITE_NAMES), help="which e2e specs: " + "; ".join(
                  f"{s.name}: {s.about} ({s.focus})" for s in plan.SUITES))
@click.option("--mode", "modes", multiple=True, type=click.Choice(plan.MODE_NAMES),
              help="a Ferry traffic mode (repeatable; default: all of them)")
@click.option("--kube-proxy", "kube_proxies", multiple=True, type=click.Choice(plan.PROXY_MODES),
              help="kube-proxy's mode (repeatable; default iptables)")
@click.option("--focus", default=None, help="which e2e specs (ginkgo focus), instead of the suite's")
@click.option("--procs", default=3, show_default=True, type=click.IntRange(1, 16),
              help="ginkgo's parallel processes")
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help=f"JUnit, logs and summary.md go here (default: {DEFAULT_OUT}, or {DEFAULT_OUT}-SUITE for "
                   "another suite than conformance)")
@click.option("--family", type=click.Choice(tuple(overrides.FAMILY_CHOICES)), default=None,
              help="address families of Pods and underlay (default: the topology's, dual-stack)")
@click.option("--policy-peers", default="cluster", show_default=True, type=click.Choice(plan.POLICY_PEERS),
              help="route-sync's policyPeers: peerSlices runs ferry-controller and has each Node read its PeerSlices")
@click.option("--delivery", default=plan.DELIVERIES[0], show_default=True, type=click.Choice(plan.DELIVERIES),
              help="with --policy-peers peerSlices, ferry-controller's --delivery: slices labelled with each "
                   "Node that reads them, or by subscription (each Node asks for its groups)")
@click.option("--keep", is_flag=True, default=False, help="leave the lab up after its run (one mode only)")
@click.option("--list", "list_only", is_flag=True, default=False,
              help="print the modes, the skip rules and the specs they select; build nothing")
def conformance(suite_name: str, modes: tuple[str, ...], kube_proxies: tuple[str, ...], focus: str | None,
                procs: int, out: str | None, family: str | None, policy_peers: str, delivery: str, keep: bool,
                list_only: bool) -> None:
    suite = plan.suite(suite_name)
    focus = focus or suite.focus
    out = out or default_out(suite)
    chosen = [plan.mode(n) for n in modes] if modes else list(plan.CONFORMANCE_MODES)
    proxies = list(kube_proxies) or ["iptables"]
    if keep and len(chosen) * len(proxies) > 1:
        raise click.UsageError("--keep: with one --mode and one --kube-proxy")
    if suite.runner == "cnp":
        _cnp(chosen, proxies, out, focus, family, keep, list_only, time.monotonic(), policy_peers, delivery)
        return
    rules = plan.skip_rules(sctp=plan.kernel_has_sctp())
    try:
        selection = plan.select(plan.list_tests(run_mod().list_specs()), focus, rules)
    except (LabError, OSError) as e:
        _fail(f"cannot list e2e's specs ({e}); build it: tools/build-go-tools.sh kube-e2e")
    click.echo(plan.describe(selection, rules, focus))
    if not selection.run and not selection.alone:
        _fail(f"focus {focus!r} selects no spec to run")
    refused = _modes(chosen, proxies, family, policy_peers, delivery)
    if list_only:
        return
    run = run_mod()
    missing = run.preflight()
    if missing:
        _fail("missing: " + "; ".join(missing))
    os.makedirs(out, exist_ok=True)
    try:
        archive = run.images_archive(_log)
    except LabError as e:
        _fail(str(e))
    opts = run.Options(focus=focus, rules=rules, out=os.path.abspath(out), procs=procs, family=family, keep=keep,
                       alone=selection.alone, policy_peers=policy_peers, delivery=delivery)
    t0 = time.monotonic()
    runs = _each_mode(chosen, proxies, refused, lambda m, kp: run.run_mode(m, kp, opts, archive, _log))
    summary = _summary(runs, rules, selection, suite, focus, time.monotonic() - t0)
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as f:
        f.write(summary + "\n")
    click.echo(junit.table(runs))
    click.echo(f"\nsummary: {os.path.join(out, 'summary.md')}")
    sys.exit(0 if all(r.ok for r in runs) else 1)


def _modes(chosen: list[plan.Mode], proxies: list[str], family: str | None,
           policy_peers: str = "cluster", delivery: str = plan.DELIVERIES[0]) -> dict[tuple[str, str], str]:
    """Prints the modes; returns those the lab refuses, with why."""
    refused = {(m.name, kp): why for m in chosen for kp in proxies
               if (why := run_mod().refusal(m, kp, family, policy_peers, delivery)) is not None}
    click.echo("modes:")
    for m in chosen:
        for kp in proxies:
            why = refused.get((m.name, kp))
            click.echo(f"  {m.name} (kube-proxy {kp}): ferry-lab up --kubernetes --kube-proxy {kp} {m.flags()}"
                       + (f"\n    NOT RUN: the lab refuses it: {why}" if why else ""))
    return refused


def _each_mode(chosen: list[plan.Mode], proxies: list[str], refused: dict[tuple[str, str], str],
               run_one: Callable[[plan.Mode, str], junit.ModeRun]) -> list[junit.ModeRun]:
    """``run_one`` per mode and kube-proxy mode, in order, each report printed as it ends; a mode
    the lab refuses is a run that did not happen, with why."""
    runs: list[junit.ModeRun] = []
    for m in chosen:
        for kp in proxies:
            if (m.name, kp) in refused:
                runs.append(junit.ModeRun(m.name, kp, error=f"the lab refuses it: {refused[(m.name, kp)]}"))
                continue
            runs.append(run_one(m, kp))
            click.echo("\n" + junit.mode_report(runs[-1]) + "\n")
    return runs


def _cnp(chosen: list[plan.Mode], proxies: list[str], out: str, focus: str, family: str | None, keep: bool,
         list_only: bool, t0: float, policy_peers: str = "cluster", delivery: str = plan.DELIVERIES[0]) -> None:
    """The cnp suite (lab.conformance.cnp): per mode, the conformance binary on a lab."""
    from lab.conformance import cnp

    rules = cnp.probe_rules(sctp=plan.kernel_has_sctp())
    click.echo(cnp.describe(rules, focus))
    refused = _modes(chosen, proxies, family, policy_peers, delivery)
    if list_only:
        return
    run = run_mod()
    missing = run.cnp_preflight()
    if missing:
        _fail("missing: " + "; ".join(missing))
    os.makedirs(out, exist_ok=True)
    try:
        archive = run.cnp_images_archive(_log)
    except LabError as e:
        _fail(str(e))
    opts = run.Options(focus=focus, rules=(), out=os.path.abspath(out), family=family, keep=keep, probes=rules,
                       policy_peers=policy_peers, delivery=delivery)
    runs = _each_mode(chosen, proxies, refused, lambda m, kp: run.run_cnp_mode(m, kp, opts, archive, _log))
    parts = [f"# ClusterNetworkPolicy conformance on ferry-lab ({(time.monotonic() - t0) / 60:.0f} min)", "",
             junit.table(runs), "", cnp.test_table(runs), "", "```", cnp.describe(rules, focus), "```", ""]
    for r in runs:
        parts += ["```", junit.mode_report(r), "```", ""]
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(parts) + "\n")
    click.echo(cnp.test_table(runs) + "\n")
    click.echo(junit.table(runs))
    click.echo(f"\nsummary: {os.path.join(out, 'summary.md')}")
    sys.exit(0 if all(r.ok for r in runs) else 1)


def default_out(suite: plan.Suite) -> str:
    """Where a suite's results go unless ``--out`` says: each suite its own directory, so that a
    netpol run leaves the conformance run's results in place."""
    return DEFAULT_OUT if suite is plan.DEFAULT_SUITE else f"{DEFAULT_OUT}-{suite.name}"


def _summary(runs: list[junit.ModeRun], rules, selection: plan.Selection,  # type: ignore[no-untyped-def]
             suite: plan.Suite, focus: str, seconds: float) -> str:
    title = f"suite {suite.name}" + ("" if focus == suite.focus else " (focus replaced)")
    parts = [f"# e2e on ferry-lab: {title} ({seconds / 60:.0f} min)", "", junit.table(runs), "",
             "```", plan.describe(selection, rules, focus), "```", ""]
    for r in runs:
        parts += ["```", junit.mode_report(r), "```", ""]
    return "\n".join(parts)


def run_mod():  # type: ignore[no-untyped-def]
    """lab.conformance.run, imported late: it loads lab.api (the lab's whole machinery), which
    --help and the pure parts do not need."""
    from lab.conformance import run

    return run


def _fail(msg: str) -> None:
    click.echo(f"conformance: {msg}", err=True)
    sys.exit(2)


main = conformance

if __name__ == "__main__":
    main()
