"""What an encrypted lab looks like at the moment a probe failed, for the failure's message: the
WireGuard peers as each Node's wireguard-go reports them (endpoint, last handshake, rx/tx),
a second probe of each failing pair made right then with the counters before and after it (a
transient blackout crosses now, a lasting one does not, and the counters say which side's device
saw the packets), then each Node's route-sync log tail, ``ip -4 neigh`` / ``ip -6 neigh``, routes,
the device's link counters and OVS's tunnel neighbour cache, and the router's neighbours.

Only the lab's own namespaces are read (its Nodes, its router), never the machine's others: a
parallel test's lab may be there.  Call it where the assertion fails, before the lab is torn down
(an ``assert ..., msg`` evaluates ``msg`` only when it fails, before any ``finally``/fixture
teardown runs).  It never raises: each part that fails says so in its place; the text is also
written to a file (``$FERRY_TEST_FAILURES``, else :data:`DEFAULT_DIR`) whose path it names."""

from __future__ import annotations

import os
import re
import subprocess
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import yaml

from lab import check, layout
from lab.api import Lab, Node, Pod
from routesync.config import WireGuardConfig
from routesync.wireguard.model import PUBLIC_KEY_ANNOTATION, WgDeviceState
from routesync.wireguard.uapi import Uapi

DEFAULT_DIR = "/tmp/ferry-test-failures"
DIR_ENV = "FERRY_TEST_FAILURES"
LOG_TAIL = 25  # lines of each Node's route-sync log
CMD_TIMEOUT = 5.0  # s per command: a diagnostic must not hang the run
MAX_REPROBES = 8  # failing pairs probed again (in parallel, ~3 s each when lost)


@dataclass(frozen=True)
class Pair:
    """A probe to make again: from ``src`` (a Pod, "node/pod", or a Node) to ``addr`` (labelled ``dst``)."""

    src: str
    dst: str
    addr: str


def pairs_of(rows: Iterable[check.Row]) -> list[Pair]:
    """The failing rows of ``ferry-lab check``'s matrix as pairs to probe again."""
    return [Pair(r.spec.src, r.spec.dst, r.spec.addr) for r in rows if not r.ok and r.spec.addr]


def _guard(what: str, f: Callable[[], str]) -> str:
    try:
        return f()
    except Exception as e:  # noqa: BLE001 - a diagnostic never masks the failure it explains
        return f"[{what}: could not collect: {type(e).__name__}: {e}]"


def _cmd(ns_exec: Callable[..., subprocess.CompletedProcess[str]], argv: Sequence[str]) -> str:
    cp = ns_exec(list(argv), timeout=CMD_TIMEOUT)
    text = (cp.stdout + cp.stderr).rstrip() or "(none)"
    return text + (f"\n[rc={cp.returncode}]" if cp.returncode else "")


def _key_names(lab: Lab) -> dict[str, str]:
    """Public key -> Node, from the registry records (the keys the Nodes published)."""
    out = {}
    for n in lab.nodes:
        try:
            with open(os.path.join(layout.registry_dir(lab.dir), f"{n.name}.yaml")) as f:
                key = ((yaml.safe_load(f) or {}).get("annotations") or {}).get(PUBLIC_KEY_ANNOTATION)
        except (OSError, ValueError, AttributeError, yaml.YAMLError):
            continue
        if key:
            out[key] = n.name
    return out


def _read_device(n: Node) -> WgDeviceState:
    return Uapi(n.paths.wireguard_run).read(WireGuardConfig().interface)


def _peers(lab: Lab, names: dict[str, str], before: dict[str, WgDeviceState] | None = None
           ) -> tuple[str, dict[str, WgDeviceState]]:
    """Every Node's device peers, one line each; with ``before``, the rx/tx since then."""
    now = time.time()
    lines, states = [], {}
    for n in lab.nodes:
        try:
            st = _read_device(n)
        except (LookupError, OSError, ValueError) as e:
            lines.append(f"  {n.name}: device not readable: {type(e).__name__}: {e}")
            continue
        states[n.name] = st
        lines.append(f"  {n.name} ({names.get(st.public_key or '', '?')} by key, port {st.listen_port}):")
        old = {p.public_key: p for p in before[n.name].peers} if before and n.name in before else {}
        for p in st.peers:
            hs = f"{now - p.last_handshake:.1f} s ago" if p.last_handshake else "never"
            delta = ""
            if p.public_key in old:
                o = old[p.public_key]
                delta = f" (since: rx +{p.rx_bytes - o.rx_bytes} tx +{p.tx_bytes - o.tx_bytes})"
            lines.append(f"    -> {names.get(p.public_key, p.public_key[:10] + '...')}: endpoint {p.endpoint}, "
                         f"handshake {hs}, rx {p.rx_bytes} tx {p.tx_bytes}{delta}, keepalive {p.keepalive}, "
                         f"allowed {','.join(p.allowed_ips)}")
    return "\n".join(lines), states


def _reprobe(lab: Lab, pairs: Sequence[Pair]) -> str:
    """Each pair probed again (ping x3 and TCP), in parallel: from its Pod, or its Node."""
    srcs: dict[str, Pod | Node] = {n.name: n for n in lab.nodes}
    srcs.update({f"{p.node}/{p.name}": p for p in lab.pods()})
    todo = list(dict.fromkeys(pairs))[:MAX_REPROBES]

    def one(pr: Pair) -> str:
        head = f"  {pr.src} -> {pr.dst} ({pr.addr}):"
        src = srcs.get(pr.src)
        if src is None:
            return f"{head} no such source now"
        t0 = time.monotonic()
        ping = lab.ping(src, pr.addr, count=3, interval=0.2, timeout=1.0)
        tcp = lab.tcp(src, pr.addr, size=1000, timeout=2.0)
        verdict = "crosses now (transient)" if ping and tcp else "still lost (lasting)" if not (ping or tcp) \
            else "half crosses"
        return (f"{head} ping {'ok' if ping else 'FAIL ' + ping.detail}, tcp {'ok' if tcp else 'FAIL ' + tcp.detail}"
                f" ({time.monotonic() - t0:.1f} s): {verdict}")

    with ThreadPoolExecutor(max_workers=6) as pool:
        lines = list(pool.map(lambda pr: _guard(f"{pr.src} -> {pr.addr}", lambda: one(pr)), todo))
    if len(set(pairs)) > len(todo):
        lines.append(f"  ({len(set(pairs)) - len(todo)} more failing pairs not probed again)")
    return "\n".join(lines) or "  (no pair to probe)"


def _tail(path: str, n: int) -> str:
    """The last ``n`` lines of ``path`` (wireguard-go's boxed banner left out)."""
    with open(path, errors="replace") as f:
        lines = [line for line in f if not line.startswith(("\u2502", "\u250c", "\u2514"))]
    return "".join(lines[-n:]).rstrip()


def _node_state(n: Node, wg_if: str) -> str:
    parts = [f"--- {n.name} ({n.netns}) ---"]
    for title, argv in (("ip -4 neigh", ["ip", "-4", "neigh"]), ("ip -6 neigh", ["ip", "-6", "neigh"]),
                        ("ip -4 route", ["ip", "-4", "route"]), ("ip -6 route", ["ip", "-6", "route"]),
                        (f"ip -s link show {wg_if}", ["ip", "-s", "link", "show", wg_if]),
                        ("ovs-appctl tnl/neigh/show", ["ovs-appctl", "tnl/neigh/show"])):
        parts.append(f"# {title}\n" + _guard(title, partial(_cmd, n.exec, argv)))
    parts.append(f"# route-sync log, last {LOG_TAIL} lines ({n.paths.route_sync_log})\n"
                 + _guard("route-sync log", lambda: _tail(n.paths.route_sync_log, LOG_TAIL)))
    wg_log = os.path.join(n.paths.log, f"{wg_if}.log")
    wg_tail = _guard("wireguard-go log", lambda: _tail(wg_log, LOG_TAIL)) if os.path.exists(wg_log) else ""
    if wg_tail:  # only FERRY_WG_LOG_LEVEL=verbose (or error) makes it say more than its banner
        parts.append(f"# {wg_log}, last {LOG_TAIL} lines\n{wg_tail}")
    return "\n".join(parts)


def _write(lab: Lab, text: str) -> str:
    d = os.environ.get(DIR_ENV) or DEFAULT_DIR
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{lab.name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.txt")
    with open(path, "w") as f:
        f.write(text + "\n")
    return path


def _collect(lab: Lab, pairs: Sequence[Pair], what: str) -> str:
    wg_if = WireGuardConfig().interface
    names = _key_names(lab)
    out = [f"=== diagnostics of lab {lab.name} ({what}), {time.strftime('%H:%M:%S')} ==="]
    first: dict[str, WgDeviceState] = {}

    def peers_now() -> str:
        text, states = _peers(lab, names)
        first.update(states)
        return text

    out.append("WireGuard peers (wireguard-go's UAPI) at the failure:\n" + _guard("peers", peers_now))
    out.append("second probe of the failing pairs, now:\n" + _guard("second probe", lambda: _reprobe(lab, pairs)))
    out.append("WireGuard peers after the second probe:\n"
               + _guard("peers", lambda: _peers(lab, names, first)[0]))
    for n in lab.nodes:
        out.append(_guard(n.name, partial(_node_state, n, wg_if)))
    router = lab.router
    for title, argv in (("ip -4 neigh", ["ip", "-4", "neigh"]), ("ip -6 neigh", ["ip", "-6", "neigh"])):
        out.append(f"--- router ({router.netns}): {title} ---\n"
                   + _guard(f"router {title}", partial(_cmd, router.exec, argv)))
    return "\n".join(out)


def diagnose(lab: Lab, pairs: Sequence[Pair] = (), what: str = "a probe failed") -> str:
    """The lab's state now and a second probe of ``pairs``, as text for an assertion's message
    (ending with the file it was also written to).  Never raises."""
    try:
        text = _collect(lab, pairs, what)
    except Exception:  # noqa: BLE001 - never mask the assertion this explains
        text = f"[diagnostics of lab {getattr(lab, 'name', '?')} failed:\n{traceback.format_exc()}]"
    try:
        path = _write(lab, re.sub(r"\n{3,}", "\n\n", text))
        return f"{text}\n(also in {path})"
    except OSError as e:
        return f"{text}\n(not written to a file: {e})"


def explain(lab: Lab, rows: Iterable[check.Row], what: str = "") -> str:
    """``check.table`` of ``rows`` followed by :func:`diagnose` of those that failed."""
    rows = list(rows)
    table = _guard("check.table", lambda: check.table(lab, rows))
    return f"{what}\n{table}\n{diagnose(lab, pairs_of(rows), what or 'a probe failed')}"


__all__ = ["DEFAULT_DIR", "DIR_ENV", "Pair", "diagnose", "explain", "pairs_of"]
