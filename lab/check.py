"""The connectivity matrix: which probes to run (pure), running them, and the table.

Categories (``lab.topology.CATEGORIES``): same-node (Pod↔Pod on one Node), same-subnet (Pods
on two Nodes of one segment), other-subnet (Pods on Nodes of two segments, across the router),
pod-to-node (a Pod to its own Node's transport address), pod-to-remote-node, pod-to-external.
Each probe is ping and TCP, in every address family both ends are configured with: a Pod's are
its Node's Pod CIDRs', a Node's its segment's, the external host's its link's.  A family one end
lacks by configuration is not probed (an IPv4-only cluster has no IPv6 probes); a configured
family that fails, or a Pod missing an address of a configured family, is a failure.
Categories the configuration does not promise (e.g. cross-Node without route-sync) are listed
as "not configured" and never fail."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cni.pipeline.modes import NETWORK_POLICY_ONLY
from lab.api import Lab, Node, Pod, Probe
from lab.topology import CATEGORIES, FAMILIES, expectation, families_of, router_routes


@dataclass(frozen=True)
class Spec:
    category: str
    src: str  # "node/pod"
    dst: str  # label: "node/pod", "node-2", "external"
    family: int
    addr: str | None  # None: the destination has no address of this family
    expect_source: str | None = None  # tcp: the source address the server must see (SNAT)


@dataclass(frozen=True)
class Row:
    spec: Spec
    configured: bool
    ping: Probe | None = None
    tcp: Probe | None = None

    @property
    def ok(self) -> bool:
        if not self.configured:
            return True
        return bool(self.ping) and bool(self.tcp) and self.source_ok

    @property
    def source_ok(self) -> bool:
        if self.spec.expect_source is None or self.tcp is None or not self.tcp:
            return True
        return self.tcp.peer == self.spec.expect_source


def pod_families(node: Node) -> tuple[int, ...]:
    """The families a Pod on ``node`` is configured with (its Node's Pod CIDRs)."""
    return families_of(node.spec.pod_cidrs)


def node_families(node: Node) -> tuple[int, ...]:
    return tuple(f for f in FAMILIES if node.address(f))


def plan(lab: Lab, only: tuple[str, ...] = ()) -> list[Spec]:
    """The probes for the Pods that exist now.  One source Pod per Node (its first Pod)."""
    specs: list[Spec] = []
    nodes = lab.nodes
    pods = {n.name: n.pods() for n in nodes}
    rs = lab.topology.route_sync
    snat = lab.route_sync and rs is not None and not rs.noSNAT and rs.trafficEncapMode != NETWORK_POLICY_ONLY
    ext = lab.external
    ext_families = tuple(f for f in FAMILIES if ext.address(f))

    def pod_label(p: Pod) -> str:
        return f"{p.node}/{p.name}"

    def add(category: str, src: Pod, dst: str, families: tuple[int, ...], addr_of, expect=None  # type: ignore[no-untyped-def]
            ) -> None:
        for fam in families:
            specs.append(Spec(category, pod_label(src), dst, fam, addr_of(fam), expect(fam) if expect else None))

    def both(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(f for f in a if f in b)

    for i, n in enumerate(nodes):
        mine = pods[n.name]
        if not mine:
            continue
        a = mine[0]
        fams = pod_families(n)
        if len(mine) > 1:
            b = mine[1]
            add("same-node", a, pod_label(b), fams, b.address)
        add("pod-to-node", a, n.name, both(fams, node_families(n)), n.address)
        for m in nodes[i + 1:]:
            if not pods[m.name]:
                continue
            b = pods[m.name][0]
            cat = "same-subnet" if m.spec.segment == n.spec.segment else "other-subnet"
            add(cat, a, pod_label(b), both(fams, pod_families(m)), b.address)
        if len(nodes) > 1:
            r = nodes[(i + 1) % len(nodes)]
            add("pod-to-remote-node", a, r.name, both(fams, node_families(r)), r.address)
        add("pod-to-external", a, "external", both(fams, ext_families), ext.address, n.address if snat else None)
    if only:
        specs = [s for s in specs if s.category in only]
    return sorted(specs, key=lambda s: CATEGORIES.index(s.category))


def run(lab: Lab, only: tuple[str, ...] = (), workers: int = 6) -> list[Row]:
    exp = expectation(lab.topology, lab.route_sync)
    specs = plan(lab, only)
    pods = {f"{p.node}/{p.name}": p for p in lab.pods()}

    def one(s: Spec) -> Row:
        if s.category not in exp.configured:
            return Row(s, False)
        if s.addr is None:
            return Row(s, True, Probe(False, "no address of this family"), Probe(False, "no address"))
        src = pods[s.src]
        return Row(s, True, lab.ping(src, s.addr), lab.tcp(src, s.addr))

    # Start the echo servers first, one per destination namespace, so probes do not race.
    for s in specs:
        if s.category in exp.configured and s.addr:
            lab.ensure_echo(lab._where(s.addr))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, specs))


def _mark(p: Probe | None) -> str:
    if p is None:
        return "-"
    return f"ok {p.ms:.0f}ms" if p.ok and p.ms is not None else ("ok" if p.ok else "FAIL")


def table(lab: Lab, rows: list[Row]) -> str:
    exp = expectation(lab.topology, lab.route_sync)
    head = ("category", "from", "to", "ip", "address", "ping", "tcp", "note")
    lines = []
    for r in rows:
        s = r.spec
        if not r.configured:
            lines.append((s.category, s.src, s.dst, f"v{s.family}", s.addr or "-", "-", "-", "not configured"))
            continue
        notes = []
        for what, p in (("ping", r.ping), ("tcp", r.tcp)):
            if p is not None and not p.ok and p.detail:
                notes.append(f"{what}: {p.detail}")
        if r.tcp is not None and r.tcp.ok and s.category == "pod-to-external":
            notes.append(f"seen as {r.tcp.peer}" + ("" if r.source_ok else f", expected {s.expect_source}"))
        lines.append((s.category, s.src, s.dst, f"v{s.family}", s.addr or "-", _mark(r.ping), _mark(r.tcp),
                      "; ".join(notes)))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*line) for line in lines]
    ran = [r for r in rows if r.configured]
    failed = [r for r in ran if not r.ok]
    mode = "route-sync" if lab.route_sync else "lone Nodes (no route-sync)"
    out.append("")
    fams = " + ".join(f"IPv{f}" for f in FAMILIES if any(r.spec.family == f for r in rows)) or "none"
    out.append(f"mode: {mode}; router routes Pod CIDRs: {router_routes(lab.topology)}; families probed: {fams}")
    out.append(f"configured categories: {', '.join(c for c in CATEGORIES if c in exp.configured)}")
    skipped = sorted({r.spec.category for r in rows if not r.configured})
    if skipped:
        out.append(f"not configured here: {', '.join(skipped)} ({exp.reason[skipped[0]].split(': ', 1)[1]})")
    out.append(f"{len(ran) - len(failed)}/{len(ran)} probes passed" + (f", {len(failed)} FAILED" if failed else ""))
    return "\n".join(out)
