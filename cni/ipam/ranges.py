"""Address ranges as plain data: parsing and validating host-local's ``ranges`` format.

A *range* is ``{subnet, rangeStart, rangeEnd, gateway}``; a *range set* is a list of ranges of
one family from which one address is handed out per attachment.  Addresses are kept as ints
(with the family's bit width) so stepping through a range costs an addition, not an object.
Pure: no I/O.  Every error is ``CniError(7)`` naming the offending field."""

from __future__ import annotations

from cni.lean import addr as _addr
from cni.lean.record import record
from cni.lean.typecheck import TYPE_CHECKING
from cni.spec.errors import INVALID_CONFIG, CniError

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from typing import Any


@record(frozen=True)
class Range:
    """One contiguous pool: ``start..end`` (inclusive) inside ``subnet``; ints of ``bits`` width."""

    network: int  # the subnet's first address
    prefixlen: int
    bits: int  # 32 or 128
    start: int
    end: int
    gateway: int

    @property
    def version(self) -> int:
        return 4 if self.bits == 32 else 6

    @property
    def last(self) -> int:
        """The subnet's last address (IPv4 broadcast)."""
        return self.network | ((1 << (self.bits - self.prefixlen)) - 1)

    @property
    def subnet(self) -> str:
        return f"{fmt(self.network, self.bits)}/{self.prefixlen}"

    def contains(self, addr: int) -> bool:
        return self.start <= addr <= self.end

    def usable(self, addr: int) -> bool:
        """In the pool and never the gateway, nor an IPv4 subnet's network/broadcast address."""
        if not self.start <= addr <= self.end or addr == self.gateway:
            return False
        return self.bits != 32 or (addr != self.network and addr != self.last)

    def capacity(self) -> int:
        """How many addresses :meth:`usable` accepts."""
        n = self.end - self.start + 1
        for special in {self.gateway} | ({self.network, self.last} if self.bits == 32 else set()):
            if self.start <= special <= self.end:
                n -= 1
        return n

    def cidr(self, addr: int) -> str:
        """``addr`` in CIDR form with this subnet's prefix length."""
        return f"{fmt(addr, self.bits)}/{self.prefixlen}"

    def describe(self) -> str:
        return f"{self.subnet} ({fmt(self.start, self.bits)}-{fmt(self.end, self.bits)})"


RangeSet = tuple[Range, ...]


def fmt(addr: int, bits: int) -> str:
    return _addr.format_ip(addr, bits)


def parse_address(text: str) -> tuple[int, int]:
    """``(int, bits)`` of an address, with or without a ``/prefix``; ValueError when invalid."""
    text = str(text)
    value, _, bits = _addr.parse_interface(text.strip())
    return value, bits


def _field_addr(d: dict[str, Any], key: str, where: str, bits: int) -> int | None:
    if d.get(key) in (None, ""):
        return None
    try:
        value, vbits = parse_address(d[key])
    except ValueError:
        raise CniError(INVALID_CONFIG, f"{where}.{key}: {d[key]!r} is not an IP address") from None
    if vbits != bits:
        raise CniError(INVALID_CONFIG, f"{where}.{key}: {d[key]} is not of the subnet's IP family")
    return value


def parse_range(d: Any, where: str) -> Range:
    """One range object; defaults as host-local: start = network+1, end = last usable, gateway = network+1."""
    if not isinstance(d, dict):
        raise CniError(INVALID_CONFIG, f"{where}: must be an object")
    subnet_text = d.get("subnet")
    if not isinstance(subnet_text, str) or not subnet_text:
        raise CniError(INVALID_CONFIG, f"{where}.subnet: missing")
    try:
        if "/" not in subnet_text:
            raise ValueError(subnet_text)
        value, prefixlen, bits = _addr.parse_cidr(subnet_text)
    except ValueError:
        raise CniError(INVALID_CONFIG, f"{where}.subnet: {subnet_text!r} is not a CIDR") from None
    network = _addr.network(value, prefixlen, bits)
    net = f"{_addr.format_ip(network, bits)}/{prefixlen}"
    if value != network:
        raise CniError(INVALID_CONFIG, f"{where}.subnet: {subnet_text} has host bits set "
                                       f"(the network is {net})")
    if prefixlen > bits - 2:
        raise CniError(INVALID_CONFIG, f"{where}.subnet: {net} is too small to allocate from")
    last = _addr.last(value, prefixlen, bits)
    default_end = last - 1 if bits == 32 else last
    start = _field_addr(d, "rangeStart", where, bits)
    end = _field_addr(d, "rangeEnd", where, bits)
    gateway = _field_addr(d, "gateway", where, bits)
    start = network + 1 if start is None else start
    end = default_end if end is None else end
    gateway = network + 1 if gateway is None else gateway
    for key, value in (("rangeStart", start), ("rangeEnd", end), ("gateway", gateway)):
        if not network <= value <= last:
            raise CniError(INVALID_CONFIG, f"{where}.{key}: {fmt(value, bits)} is outside the subnet {net}")
    if start > end:
        raise CniError(INVALID_CONFIG, f"{where}.rangeStart: {fmt(start, bits)} is after rangeEnd "
                                       f"{fmt(end, bits)}")
    r = Range(network=network, prefixlen=prefixlen, bits=bits, start=start, end=end, gateway=gateway)
    if r.capacity() < 1:
        raise CniError(INVALID_CONFIG, f"{where}: range {r.describe()} holds no usable address")
    return r


def _overlap(a: Range, b: Range) -> bool:
    return a.bits == b.bits and a.start <= b.end and b.start <= a.end


def parse_range_sets(obj: Any, where: str = "ipam.ranges") -> tuple[RangeSet, ...]:
    """host-local's ``ranges``: a list of range sets, each a non-empty list of ranges of one family.
    No two ranges anywhere may overlap; no two range sets may be of the same family."""
    if not isinstance(obj, list) or not obj:
        raise CniError(INVALID_CONFIG, f"{where}: must be a non-empty list of range sets")
    sets: list[RangeSet] = []
    seen: list[tuple[str, Range]] = []
    for i, rs in enumerate(obj):
        if not isinstance(rs, list) or not rs:
            raise CniError(INVALID_CONFIG, f"{where}[{i}]: must be a non-empty list of ranges")
        ranges: list[Range] = []
        for j, rd in enumerate(rs):
            w = f"{where}[{i}][{j}]"
            r = parse_range(rd, w)
            if ranges and r.bits != ranges[0].bits:
                raise CniError(INVALID_CONFIG, f"{w}.subnet: {r.subnet} mixes IP families in range set {i}")
            for other_where, other in seen:
                if _overlap(r, other):
                    raise CniError(INVALID_CONFIG, f"{w}: range {r.describe()} overlaps {other_where} "
                                                   f"{other.describe()}")
            seen.append((w, r))
            ranges.append(r)
        for k, prev in enumerate(sets):
            if prev[0].bits == ranges[0].bits:
                raise CniError(INVALID_CONFIG, f"{where}[{i}]: a second IPv{ranges[0].version} range set "
                                               f"(range set {k} is already IPv{prev[0].version})")
        sets.append(tuple(ranges))
    return tuple(sets)


def range_sets_from_cidrs(cidrs: Sequence[str], where: str = "podCIDRs") -> tuple[RangeSet, ...]:
    """One range set of one whole-subnet range per Pod CIDR (the Node's CIDRs from the state file)."""
    return parse_range_sets([[{"subnet": c}] for c in cidrs], where)


def find_range(range_set: RangeSet, addr: int) -> Range | None:
    for r in range_set:
        if r.contains(addr):
            return r
    return None


def iter_from(range_set: RangeSet, cursor: int | None) -> Iterator[tuple[Range, int]]:
    """Every usable address of the set once, starting just after ``cursor`` and wrapping around
    (from the first range's start when the cursor is absent or outside the set)."""
    ri, addr = 0, None
    if cursor is not None:
        for k, r in enumerate(range_set):
            if r.contains(cursor):
                ri, addr = k, cursor
                break
    n = len(range_set)
    if addr is None:
        ri, first_pass_start = 0, range_set[0].start
    else:
        first_pass_start = addr + 1
    # Visit range ri from first_pass_start, the other ranges whole, then range ri up to the cursor.
    r = range_set[ri]
    for a in range(first_pass_start, r.end + 1):
        if r.usable(a):
            yield r, a
    for k in range(1, n):
        r2 = range_set[(ri + k) % n]
        for a in range(r2.start, r2.end + 1):
            if r2.usable(a):
                yield r2, a
    for a in range(r.start, first_pass_start):
        if r.usable(a):
            yield r, a
