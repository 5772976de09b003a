"""Ferry's own nftables tables, each written as a whole in one ``nft -f -`` transaction.

* ``table inet ferry``: sets of cluster/local Pod CIDRs and no-SNAT destinations per family; a
  ``postrouting`` nat chain masquerading Pod egress to anything outside the cluster Pod CIDRs
  and the Node's own addresses (absent with noSNAT); ``notrack`` for the tunnel's UDP port in
  raw prerouting/output.
* ``table netdev ferry_uplink``: with the uplink on a netdev bridge, drop everything at the
  renamed uplink's ingress hook so the kernel does not process what OVS already read
  (AF_PACKET taps see the packet before that hook).

Commands go to libnftables (the library ``nft`` is a front end of) in-process through ctypes,
on one thread of their own (in ``netns`` when given: setns(2) is per thread): a Node change
whose Pod CIDR set changed costs no ``nft``/``ip netns exec`` launch (~30 ms of wall time on a
busy 2-vCPU machine, the other floor of a change beside the flow bundle).  Without the library
(``native=False``, or it cannot be loaded) each command is an ``nft`` exec as before.

Replacement is atomic: ``table X {}`` + ``delete table X`` + the definition, in one transaction.
* ``table inet ferry_policy``: with NetworkPolicy on, the host's judge of the connections
  kube-proxy's NAT takes past OVS (:mod:`routesync.policy.hostjudge` renders it).

Each table carries ``comment "ferry:<sha>"`` of its rendering: ``sync`` reads it back and
writes nothing when it matches (a table deleted or rewritten by hand is restored).  Only these
three tables are ever touched.
"""

from __future__ import annotations

import bisect
import hashlib
import ipaddress
import logging
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import chain
from typing import TYPE_CHECKING, Any, TypeVar

from cni.kernel.netlink import NetlinkError
from routesync.model import NftPlan
from routesync.nftbody import NftBody, kept_set_changes, structure_commands

if TYPE_CHECKING:
    from .nftelements import SetElements

LOG = logging.getLogger(__name__)

UPLINK_TABLE = "ferry_uplink"
POLICY_TABLE = "ferry_policy"  # routesync.policy.hostjudge


class NftError(RuntimeError):
    pass


T = TypeVar("T")


class LibNft:
    """libnftables (``libnftables.so.1``) on one thread of its own.  ``run`` is ``nft -f`` of
    the text: (return code, output, error text).  In the process's namespace one context is
    kept; with ``netns`` (a name under /run/netns) each call enters it, runs on a fresh
    context and comes back, so nothing of this applier holds the namespace between calls."""

    def __init__(self, netns: str | None = None) -> None:
        import ctypes

        lib = ctypes.CDLL("libnftables.so.1", use_errno=True)
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        for name in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
            getattr(lib, name).restype = ctypes.c_int
        for name in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
            getattr(lib, name).restype = ctypes.c_char_p
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
        self._lib = lib
        self.netns = netns
        self._ctx: int | None = None  # the kept context (no netns)
        self._origin: int | None = None  # the worker thread's own namespace (netns)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ferry-nft")
        self.call(self._start)  # fails here (not at the first change) when it cannot work

    def _start(self) -> None:
        if self.netns:
            self._origin = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net",
                                   os.O_RDONLY | os.O_CLOEXEC)
            self._in_netns(lambda ctx: None)
        else:
            self._ctx = self._new()

    def _new(self) -> int:
        ctx: int | None = self._lib.nft_ctx_new(0)  # NFT_CTX_DEFAULT
        if not ctx:
            raise NftError("nft_ctx_new failed")
        self._lib.nft_ctx_buffer_output(ctx)
        self._lib.nft_ctx_buffer_error(ctx)
        return ctx

    def _in_netns(self, fn: Callable[[int], T]) -> T:
        from cni.kernel.netns import setns

        assert self._origin is not None
        fd = os.open(f"/run/netns/{self.netns}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            setns(fd)
        finally:
            os.close(fd)
        try:
            ctx = self._new()
            try:
                return fn(ctx)
            finally:
                self._lib.nft_ctx_free(ctx)
        finally:
            setns(self._origin)

    def call(self, fn: Callable[[], T]) -> T:
        return self._thread.submit(fn).result()

    def run(self, text: str) -> tuple[int, str, str]:
        return self.submit(text).result()

    def submit(self, text: str) -> Future[tuple[int, str, str]]:
        """:meth:`run` without waiting (commands run in the order submitted)."""
        def on(ctx: int) -> tuple[int, str, str]:
            lib = self._lib
            rc = lib.nft_run_cmd_from_buffer(ctx, text.encode())
            out = lib.nft_ctx_get_output_buffer(ctx) or b""
            err = lib.nft_ctx_get_error_buffer(ctx) or b""
            return rc, out.decode(errors="replace"), err.decode(errors="replace")

        def go() -> tuple[int, str, str]:
            if self.netns:
                return self._in_netns(on)
            assert self._ctx is not None
            return on(self._ctx)
        return self._thread.submit(go)

    def close(self) -> None:
        def stop() -> None:
            ctx, self._ctx = self._ctx, None
            if ctx:
                self._lib.nft_ctx_free(ctx)
            origin, self._origin = self._origin, None
            if origin is not None:
                os.close(origin)
        self.call(stop)
        self._thread.shutdown(wait=True)


def _span(cidr: str, version: int) -> tuple[int, int] | None:
    """The addresses of ``cidr`` (host bits off: strict=False) as (first, last); None when it is
    of the other version."""
    addr, _, plen = cidr.partition("/")
    if (":" in addr) != (version == 6):
        return None
    family, bits = (socket.AF_INET, 32) if version == 4 else (socket.AF_INET6, 128)
    start = int.from_bytes(socket.inet_pton(family, addr), "big")
    size = 1 << (bits - (int(plen) if plen else bits))
    start &= ~(size - 1)
    return start, start + size - 1


def _blocks(lo: int, hi: int, version: int) -> list[str]:
    """The span [lo, hi] as the fewest aligned blocks, in order."""
    bits = 32 if version == 4 else 128
    out = []
    while lo <= hi:
        size = lo & -lo if lo else 1 << bits
        while size > hi - lo + 1:
            size >>= 1
        out.append(f"{ipaddress.ip_address(lo) if version == 4 else ipaddress.IPv6Address(lo)}"
                   f"/{bits - size.bit_length() + 1}")
        lo += size
    return out


def _merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted spans, overlapping or adjacent ones merged."""
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def _collapse(cidrs: Iterable[str], version: int) -> list[str]:
    """The smallest sorted list of CIDRs covering the same addresses (what
    ``ipaddress.collapse_addresses`` gives), in integer arithmetic: 5,000 CIDRs in ~10 ms instead
    of ~150 ms of ``ipaddress`` objects."""
    spans = sorted(sp for c in cidrs if (sp := _span(c, version)) is not None)
    return [b for lo, hi in _merge(spans) for b in _blocks(lo, hi, version)]


def _outermost(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The spans (aligned blocks: nested or apart) no other one holds, sorted."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans, key=lambda sp: (sp[0], -sp[1])):
        if not out or lo > out[-1][1]:
            out.append((lo, hi))
    return out


class Collapsed:
    """:func:`_collapse` of a multiset of CIDRs of one version, kept up to date CIDR by CIDR (the
    cluster's Pod CIDRs: a Node change moves one or two of 5,000).  A CIDR inside another one
    present (the cluster CIDR around every Node's) changes nothing; otherwise only the merged
    span it touches is merged again, from the outermost CIDRs in it (a handful: those inside the
    cluster CIDR are not looked at)."""

    def __init__(self, cidrs: Iterable[str], version: int) -> None:
        self.version = version
        self.bits = 32 if version == 4 else 128
        self._count: dict[tuple[int, int], int] = {}  # span -> how many CIDRs are it
        for c in cidrs:
            sp = _span(c, version)
            if sp is not None:
                self._count[sp] = self._count.get(sp, 0) + 1
        self._spans = sorted(self._count)  # every distinct span, sorted
        self._tops = _outermost(self._spans)  # those no other one holds, sorted
        self._merged = _merge(self._tops)  # disjoint, non-adjacent, sorted
        self._blocks = {m: _blocks(*m, version) for m in self._merged}
        self._elements: list[str] | None = None

    def elements(self) -> list[str]:
        """:func:`_collapse` of the CIDRs now."""
        if self._elements is None:
            self._elements = list(chain.from_iterable(map(self._blocks.__getitem__, self._merged)))
        return self._elements

    def update(self, added: Iterable[str], removed: Iterable[str]) -> None:
        for c in removed:
            sp = _span(c, self.version)
            if sp is None:
                continue
            n = self._count[sp] - 1
            if n:
                self._count[sp] = n
                continue
            del self._count[sp]
            del self._spans[bisect.bisect_left(self._spans, sp)]
            if self._covered(sp):
                continue
            # it was outermost: the outermost of the spans inside it take its place
            tops = self._tops
            i = bisect.bisect_left(tops, sp)
            tops[i:i + 1] = _outermost(self._inside(self._spans, *sp))
            self._remerge(sp)
        for c in added:
            sp = _span(c, self.version)
            if sp is None:
                continue
            n = self._count.get(sp, 0)
            self._count[sp] = n + 1
            if n:
                continue
            bisect.insort(self._spans, sp)
            if self._covered(sp):
                continue
            # outermost now: in place of the outermost spans inside it
            tops = self._tops
            lo, hi = bisect.bisect_left(tops, (sp[0], -1)), bisect.bisect_right(tops, (sp[1], 1 << 129))
            tops[lo:hi] = [sp]
            self._remerge(sp)

    @staticmethod
    def _inside(spans: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
        """The spans of sorted ``spans`` that start in [lo, hi] (inside it, for a block)."""
        return spans[bisect.bisect_left(spans, (lo, -1)):bisect.bisect_right(spans, (hi, 1 << 129))]

    def _covered(self, sp: tuple[int, int]) -> bool:
        """Another span present holds ``sp`` (an aligned block: only a shorter prefix of it can)."""
        lo, hi = sp
        size = hi - lo + 1
        while size < 1 << self.bits:
            size <<= 1
            start = lo & ~(size - 1)
            if (start, start + size - 1) in self._count:
                return True
        return False

    def _remerge(self, sp: tuple[int, int]) -> None:
        """Merge again the region ``sp`` touches: it and the merged spans overlapping or next
        to it (the spans outside stay apart from it), from the outermost spans in it."""
        merged = self._merged
        first = bisect.bisect_left(merged, (sp[0] - 1, -1))
        if first and merged[first - 1][1] >= sp[0] - 1:
            first -= 1
        last = first
        while last < len(merged) and merged[last][0] <= sp[1] + 1:
            last += 1
        lo = min(sp[0], merged[first][0]) if first < last else sp[0]
        hi = max(sp[1], merged[last - 1][1]) if first < last else sp[1]
        fresh = _merge(self._inside(self._tops, lo, hi))
        for m in merged[first:last]:
            del self._blocks[m]
        for m in fresh:
            self._blocks[m] = _blocks(*m, self.version)
        merged[first:last] = fresh
        self._elements = None


def _set(name: str, version: int, elements: list[str]) -> str:
    kind = "ipv4_addr" if version == 4 else "ipv6_addr"
    elems = f" elements = {{ {', '.join(elements)} }}" if elements else ""
    return f"\tset {name} {{ type {kind}; flags interval;{elems} }}\n"


def _fingerprint(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def _wrap(family: str, table: str, body: str, fingerprint: str | None = None) -> str:
    """Atomic replace of one table, with its fingerprint comment (``fingerprint``: the body's
    own, when it has one: ``routesync.nftbody.NftBody.fingerprint``)."""
    return (f"table {family} {table} {{}}\ndelete table {family} {table}\n"
            f"table {family} {table} {{\n\tcomment \"ferry:{fingerprint or _fingerprint(body)}\"\n{body}}}\n")


def cluster_sets(plan: NftPlan) -> dict[int, Collapsed]:
    """The cluster sets' elements (the cluster's and this Node's Pod CIDRs), per IP version, as
    :class:`Collapsed` (kept up to date by the applier between Node changes)."""
    cidrs = tuple(plan.cluster_pod_cidrs) + tuple(plan.local_pod_cidrs)
    return {v: Collapsed(cidrs, v) for v in (4, 6)}


def inet_sets(plan: NftPlan, clusters: dict[int, Collapsed] | None = None) -> dict[str, tuple[int, list[str]]]:
    """The sets of ``table inet <plan.table>``: name -> (IP version, collapsed elements);
    ``clusters``: :func:`cluster_sets` of ``plan``, when the caller keeps them."""
    local = {v: _collapse(plan.local_pod_cidrs, v) for v in (4, 6)}
    clusters = clusters if clusters is not None else cluster_sets(plan)
    cluster = {v: clusters[v].elements() for v in (4, 6)}
    exclude = {v: _collapse(plan.snat_exclude, v) for v in (4, 6)}
    out: dict[str, tuple[int, list[str]]] = {}
    for v in (4, 6):
        out[f"cluster{v}"] = (v, cluster[v])
        out[f"local{v}"] = (v, local[v])
        out[f"nosnat{v}"] = (v, exclude[v])
    return out


def inet_shape(plan: NftPlan) -> tuple[object, ...]:
    """What of ``table inet`` is not set elements (chains, rules, the table's name): two plans of
    the same shape differ only by elements, which can change without re-creating the table."""
    return (plan.table, plan.masquerade, plan.tunnel_udp_port,
            bool(_collapse(plan.local_pod_cidrs, 4)), bool(_collapse(plan.local_pod_cidrs, 6)))


def _spans(elements: Iterable[str], version: int) -> list[tuple[int, int]]:
    family, bits = (socket.AF_INET, 32) if version == 4 else (socket.AF_INET6, 128)
    out = []
    for e in elements:
        a, _, plen = e.partition("/")
        start = int.from_bytes(socket.inet_pton(family, a), "big")
        out.append((start, start + (1 << (bits - int(plen or bits))) - 1))
    return out


def element_delta(old: NftPlan, new: NftPlan, before: dict[str, tuple[int, list[str]]] | None = None,
                  after: dict[str, tuple[int, list[str]]] | None = None) -> tuple[str, str, bool]:
    """(``add element`` commands, ``delete element`` commands, whether an added element overlaps
    a removed one) turning the sets of ``old`` into those of ``new`` (same :func:`inet_shape`).
    Without overlap the additions are valid before the removals (the removals may follow in a
    transaction of their own); with one, removals must come first in the same transaction.
    ``before``/``after``: the plans' :func:`inet_sets` when the caller has them."""
    before = before if before is not None else inet_sets(old)
    after = after if after is not None else inet_sets(new)
    adds, removes, overlap = [], [], False
    for name, (v, elements) in after.items():
        gone = sorted(set(before[name][1]) - set(elements))
        fresh = sorted(set(elements) - set(before[name][1]))
        if gone:
            removes.append(f"delete element inet {new.table} {name} {{ {', '.join(gone)} }}\n")
        if fresh:
            adds.append(f"add element inet {new.table} {name} {{ {', '.join(fresh)} }}\n")
        if gone and fresh:
            overlap = overlap or any(lo <= h and l2 <= hi for lo, hi in _spans(fresh, v)
                                     for l2, h in _spans(gone, v))
    return "".join(adds), "".join(removes), overlap


def render_inet(plan: NftPlan, sets: dict[str, tuple[int, list[str]]] | None = None) -> str:
    """The body (inside ``table inet <plan.table> { }``) for ``plan`` (``sets``: its
    :func:`inet_sets`, when the caller has them); pure."""
    body = ""
    sets = sets if sets is not None else inet_sets(plan)
    for name, (v, elements) in sets.items():
        body += _set(name, v, elements)
    rules = []
    if plan.masquerade:
        for v, ip in ((4, "ip"), (6, "ip6")):
            if sets[f"local{v}"][1]:
                rules.append(f"\t\t{ip} saddr @local{v} {ip} daddr != @cluster{v} "
                             f"{ip} daddr != @nosnat{v} masquerade\n")
    if rules:
        body += ("\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; "
                 "policy accept;\n" + "".join(rules) + "\t}\n")
    if plan.tunnel_udp_port:
        port = int(plan.tunnel_udp_port)
        for chain, hook in (("raw_prerouting", "prerouting"), ("raw_output", "output")):
            body += (f"\tchain {chain} {{\n\t\ttype filter hook {hook} priority raw; "
                     f"policy accept;\n\t\tudp dport {port} notrack\n\t}}\n")
    return body


def render_uplink(device: str) -> str:
    """Body of the netdev table dropping at ``device``'s ingress (multi-line: nft refuses the
    same text on one line)."""
    if not device or '"' in device or len(device) > 15:
        raise ValueError(f"bad device name {device!r}")
    return (f"\tchain uplink_in {{\n\t\ttype filter hook ingress device \"{device}\" "
            f"priority -500; policy drop;\n\t}}\n")


@dataclass
class NftDiff:
    inet_written: bool = False
    uplink_written: bool = False
    uplink_deleted: bool = False


class NftApplier:
    """nft in the current namespace, or in ``netns`` (via ``ip netns exec``)."""

    def __init__(self, netns: str | None = None, table: str = "ferry", native: bool = True,
                 policy_by_element: bool = True) -> None:
        self.netns = netns
        self.table = table
        # False: the policy judge is written whole whenever it changed (what bench_policy_pass
        # compares the element updates with)
        self.policy_by_element = policy_by_element
        self._lib: LibNft | None = None
        if native:
            try:
                self._lib = LibNft(netns)
            except (OSError, AttributeError, NftError) as e:
                LOG.info("libnftables not usable (%s): nft is executed", e)
        # fingerprint of the rendering each table holds, as this applier last wrote or verified it
        self._known: dict[tuple[str, str], str | None] = {}
        # tables whose set elements this applier changed in place since their comment was
        # written: the comment they still carry (their content is ``_known``'s)
        self._deltas: dict[tuple[str, str], str | None] = {}
        # the plan table inet holds, its fingerprint and sets
        self._inet_plan: tuple[NftPlan, str, dict[str, tuple[int, list[str]]]] | None = None
        self._pending: tuple[tuple[str, str], Future[tuple[int, str, str]]] | None = None  # deferred removals
        self._clusters: dict[int, Collapsed] | None = None  # the cluster sets of _inet_plan's plan
        self._policy: NftBody | None = None  # the judge's body this applier last wrote or changed to
        self._elements_socket: SetElements | None = None  # its element updates' (opened on first use)

    def _argv(self, *args: str) -> list[str]:
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        return [*prefix, "nft", *args]

    @property
    def native(self) -> bool:
        return self._lib is not None

    def close(self) -> None:
        self._settle()
        if self._elements_socket is not None:
            self._elements_socket.close()
            self._elements_socket = None
        lib, self._lib = self._lib, None
        if lib is not None:
            lib.close()

    def _nft(self, *args: str, stdin: str | None = None, check: bool = True
             ) -> subprocess.CompletedProcess[str]:
        proc: subprocess.CompletedProcess[Any]
        if self._lib is not None:
            text = (stdin or "") if args == ("-f", "-") else " ".join(args)
            rc, out, err = self._lib.run(text)
            proc = subprocess.CompletedProcess(self._argv(*args), rc, out, err)
        else:
            proc = subprocess.run(self._argv(*args), input=stdin, capture_output=True, text=True,
                                  check=False)
        if check and proc.returncode != 0:
            raise NftError(f"nft {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def fingerprint(self, family: str, table: str) -> str | None:
        """The ``ferry:<sha>`` comment of an installed table, None when absent/foreign."""
        proc = self._nft("list", "table", family, table, check=False)
        if proc.returncode != 0:
            return None
        for line in proc.stdout.splitlines():
            line = line.strip()
            if line.startswith('comment "ferry:'):
                return line.split(":", 1)[1].rstrip('"')
        return None

    def _write(self, family: str, table: str, body: str, verify: bool = True, want: str | None = None) -> bool:
        """Write unless the table already holds this rendering: its fingerprint read back from
        nft when ``verify`` (the comment; or, when it is still the comment of a table whose
        elements this applier changed since, what it changed them to), else as this applier
        last wrote it (no ``nft list``).  ``want``: the body's fingerprint when it has its own."""
        key = (family, table)
        want = want or _fingerprint(body)
        if verify:
            have = self.fingerprint(family, table)
            if key in self._deltas and self._deltas[key] == have:
                have = self._known.get(key)
            else:
                self._deltas.pop(key, None)
        else:
            have = self._known.get(key)
        self._known[key] = have
        if have == want:
            return False
        self._known.pop(key, None)  # unknown until nft succeeded
        self._deltas.pop(key, None)
        self._nft("-f", "-", stdin=_wrap(family, table, body, want))
        self._known[key] = want
        return True

    def _elements(self, key: tuple[str, str], old: tuple[NftPlan, str, dict[str, tuple[int, list[str]]]],
                  new: NftPlan, sets: dict[str, tuple[int, list[str]]], want: str, defer: bool) -> bool:
        """Turn table inet's sets from ``old`` into ``new`` by element (no table re-creation:
        that costs ~16 ms of kernel time, an element addition ~1 ms).  With ``defer`` (and
        libnftables), removals that no addition overlaps are committed after this returns, in
        a transaction of their own, before any later command (a removed Pod CIDR is only
        "still not masqueraded" meanwhile); :meth:`_settle` collects the outcome.  False when
        nft refused (the caller writes the table instead)."""
        adds, removes, overlap = element_delta(old[0], new, old[2], sets)
        comment = self._deltas.get(key, self._known.get(key))
        self._known.pop(key, None)
        self._deltas.pop(key, None)
        try:
            if removes and (overlap or not defer or self._lib is None):
                self._nft("-f", "-", stdin=removes + adds)
            else:
                if adds:
                    self._nft("-f", "-", stdin=adds)
                if removes:
                    assert self._lib is not None
                    self._pending = (key, self._lib.submit(removes))
        except NftError as e:
            LOG.info("nftables: element update refused (%s); the table is written whole", e)
            return False
        self._deltas[key] = comment
        self._known[key] = want
        return True

    def _settle(self) -> None:
        """Wait for deferred removals; when they failed the table is unknown (rewritten next)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        key, future = pending
        try:
            rc, _, err = future.result()
        except Exception as e:  # noqa: BLE001 - any failure: forget what the table holds
            rc, err = 1, str(e)
        if rc != 0:
            LOG.warning("nftables: deferred element removal failed (%s); the table is written whole next", err.strip())
            self._known.pop(key, None)
            self._deltas.pop(key, None)
            self._inet_plan = None

    def _delete(self, family: str, table: str, verify: bool = True) -> bool:
        key = (family, table)
        self._settle()
        self._deltas.pop(key, None)
        if not verify and key in self._known and self._known[key] is None:
            return False  # this applier saw it absent last
        self._known.pop(key, None)
        if self._nft("list", "table", family, table, check=False).returncode != 0:
            self._known[key] = None
            return False
        self._nft("-f", "-", stdin=f"table {family} {table} {{}}\ndelete table {family} {table}\n")
        self._known[key] = None
        return True

    def sync(self, plan: NftPlan, verify: bool = True, defer_removals: bool = False) -> NftDiff:
        """``verify`` False (a Node change between full passes): trust what this applier wrote
        last instead of reading the tables back; when only set elements changed since, they are
        changed in place (:meth:`_elements`; ``defer_removals`` lets removals trail)."""
        self._settle()
        key = ("inet", plan.table)
        last, self._inet_plan = self._inet_plan, None
        if last is not None and last[0] == plan:
            sets, want = last[2], last[1]
        else:
            sets = self._sets(last[0] if last is not None else None, last[2] if last is not None else None, plan)
            want = ""
        body = render_inet(plan, sets)
        want = want or _fingerprint(body)
        inet_written = False
        if (not verify and last is not None and last[1] != want and self._known.get(key) == last[1]
                and inet_shape(last[0]) == inet_shape(plan)):
            inet_written = self._elements(key, last, plan, sets, want, defer_removals)
        if not inet_written:
            inet_written = self._write("inet", plan.table, body, verify)
        self._inet_plan = (plan, want, sets)
        diff = NftDiff(inet_written=inet_written)
        diff.uplink_written, diff.uplink_deleted = self.set_uplink_drop(plan.uplink_ingress_drop, verify)
        if diff.inet_written or diff.uplink_written or diff.uplink_deleted:
            LOG.info("nftables: %s", diff)
        return diff

    def _sets(self, last: NftPlan | None, sets: dict[str, tuple[int, list[str]]] | None, plan: NftPlan
              ) -> dict[str, tuple[int, list[str]]]:
        """:func:`inet_sets` of ``plan``; when only the cluster's Pod CIDRs moved since ``last``
        (whose sets are ``sets``), its cluster sets changed by the CIDRs that came and went
        instead of collapsed again (5,000 peers: ~13 % of a Node change's CPU)."""
        clusters = self._clusters
        self._clusters = None
        if (last is not None and sets is not None and clusters is not None
                and replace(last, cluster_pod_cidrs=()) == replace(plan, cluster_pod_cidrs=())):
            changes = plan.cluster_changes
            if changes is not None and changes.since is last.cluster_pod_cidrs:  # the planner's word
                added: Iterable[str] = changes.added
                removed: Iterable[str] = changes.removed
            else:
                old, new = set(last.cluster_pod_cidrs), set(plan.cluster_pod_cidrs)
                added, removed = new - old, old - new
            out = dict(sets)
            for v in (4, 6):
                clusters[v].update(added, removed)
                out[f"cluster{v}"] = (v, clusters[v].elements())
        else:
            clusters = cluster_sets(plan)
            out = inet_sets(plan, clusters)
        self._clusters = clusters
        return out

    def set_uplink_drop(self, device: str | None, verify: bool = True) -> tuple[bool, bool]:
        """(written, deleted): the netdev ingress drop on ``device``, or none."""
        if device:
            return self._write("netdev", UPLINK_TABLE, render_uplink(device), verify), False
        return False, self._delete("netdev", UPLINK_TABLE, verify)

    def sync_policy(self, body: NftBody | None, verify: bool = True) -> bool:
        """The host's NetworkPolicy judge (``table inet ferry_policy``, its body from
        :func:`routesync.policy.hostjudge.render_body`), or none (policy off); True when written,
        changed or deleted.  Written whole and atomically when its fingerprint differs, except
        without ``verify`` (a pass between full ones) when the table holds the body this
        applier last gave it: then what moved is changed in place (a Pod event at 30,000 Pods
        moves a few elements of a table that holds megabytes of them) -- the sets' elements that
        came and went, in one transaction, and when rules or sets came or went too, those
        chains' rules and those sets after it, in a second one (an address a kept set gains or
        loses is in force before any rule that reads it; a new isolation before its allowing
        rules: never open in between)."""
        key = ("inet", POLICY_TABLE)
        last, self._policy = self._policy, None
        if body is None:
            return self._delete("inet", POLICY_TABLE, verify)
        if not verify and self._known.get(key) == body.fingerprint:
            self._policy = body  # what the table holds, as this applier wrote it: nothing to render
            return False
        if (self.policy_by_element and not verify and last is not None and last.fingerprint != body.fingerprint
                and self._known.get(key) == last.fingerprint):
            structure = "" if last.shape == body.shape else structure_commands(*key, last, body)
            if structure is not None:
                self._settle()
                if self._policy_changed(key, last, body, structure):
                    self._policy = body
                    return True
        written = self._write("inet", POLICY_TABLE, body.text, verify, want=body.fingerprint)
        self._policy = body
        if written:
            LOG.info("nftables: the host's policy judge written")
        return written

    def _policy_changed(self, key: tuple[str, str], last: NftBody, body: NftBody, structure: str) -> bool:
        """The judge from ``last`` to ``body`` in place: the kept sets' elements over netlink
        (:mod:`.nftelements`: libnftables would first read every element of the table), then
        ``structure`` (:func:`routesync.nftbody.structure_commands`: no element of a kept set
        in it) through nft.  False when either was refused (the caller writes the table whole,
        which replaces whatever the first left)."""
        changes = kept_set_changes(last, body)
        comment = self._deltas.get(key, self._known.get(key))
        self._known.pop(key, None)
        self._deltas.pop(key, None)
        try:
            if changes:
                if self._elements_socket is None:
                    from .nftelements import SetElements

                    self._elements_socket = SetElements(self.netns)
                self._elements_socket.apply(*key, changes)
            if structure:
                self._nft("-f", "-", stdin=structure)
        except (OSError, ValueError, NftError) as e:
            LOG.info("nftables: the policy judge's change in place refused (%s); it is written whole", e)
            if self._elements_socket is not None and not isinstance(e, (NetlinkError, NftError, ValueError)):
                self._elements_socket.close()  # a broken socket (a timeout): a new one next time
                self._elements_socket = None
            return False
        self._deltas[key] = comment
        self._known[key] = body.fingerprint
        return True

    def delete(self) -> None:
        self._delete("inet", self.table)
        self._delete("netdev", UPLINK_TABLE)
        self._delete("inet", POLICY_TABLE)
