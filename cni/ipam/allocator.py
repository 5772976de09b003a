"""Choosing addresses: pure logic over range sets, a cursor and an "is this address taken" test.

The disk layer (``cni.ipam.store``) answers ``taken(addr, bits)`` in O(1) (one ``lstat``), so picking
costs O(1) in the common case: the cursor sits just after the last address handed out and the
next one is usually free (host-local's ``last_reserved_ip`` scheme).  Only a nearly full set
pays a walk, and only up to the next hole."""

from __future__ import annotations

from cni.ipam.ranges import Range, RangeSet, find_range, fmt, iter_from, parse_address
from cni.lean.record import record
from cni.lean.typecheck import TYPE_CHECKING
from cni.spec.errors import INVALID_CONFIG, IPAM_EXHAUSTED, CniError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    Taken = Callable[[int, int], bool]  # (addr, bits) -> held by some attachment


@record(frozen=True)
class Pick:
    set_index: int
    range: Range
    addr: int

    @property
    def text(self) -> str:
        return fmt(self.addr, self.range.bits)


def describe_set(range_set: RangeSet) -> str:
    return ", ".join(r.describe() for r in range_set)


def match_requested(range_sets: Sequence[RangeSet], requested: Sequence[str]) -> dict[int, Pick]:
    """Map each requested address to the range set (and range) that holds it.
    ``CniError(7)`` for an address that is not one, is outside every range, is a gateway or an
    IPv4 network/broadcast address, or when two requests fall in one range set."""
    out: dict[int, Pick] = {}
    for text in requested:
        try:
            addr, bits = parse_address(text)
        except ValueError:
            raise CniError(INVALID_CONFIG, f"requested address {text!r} is not an IP address") from None
        hit = None
        for i, rs in enumerate(range_sets):
            if rs[0].bits != bits:
                continue
            r = find_range(rs, addr)
            if r is not None:
                hit = Pick(i, r, addr)
                break
        shown = fmt(addr, bits)
        if hit is None:
            raise CniError(INVALID_CONFIG, f"requested address {shown} is outside every configured range")
        if not hit.range.usable(addr):
            raise CniError(INVALID_CONFIG, f"requested address {shown} is the gateway, network or broadcast "
                                           f"address of {hit.range.subnet}")
        if hit.set_index in out:
            raise CniError(INVALID_CONFIG, f"requested addresses {out[hit.set_index].text} and {shown} "
                                           f"both fall in range set {hit.set_index}")
        out[hit.set_index] = hit
    return out


def pick_free(set_index: int, range_set: RangeSet, cursor: int | None, taken: Taken,
              exclude: frozenset[int] = frozenset()) -> Pick:
    """The first usable address after ``cursor`` that is not taken; ``CniError(110)`` naming the
    range set when every address is held."""
    bits = range_set[0].bits
    for r, addr in iter_from(range_set, cursor):
        if addr not in exclude and not taken(addr, bits):
            return Pick(set_index, r, addr)
    raise CniError(IPAM_EXHAUSTED, f"no free address left in range set {set_index}: {describe_set(range_set)}")


def parse_cursor(text: str | None, range_set: RangeSet) -> int | None:
    """A stored cursor, or None when absent, unparsable or of another family (then start over)."""
    if not text:
        return None
    try:
        addr, bits = parse_address(text)
    except ValueError:
        return None
    return addr if bits == range_set[0].bits else None
