"""What changed between two lists of Node records the source handed over, at the cost of what
changed: a Node change at 5,000 Nodes must not pay a Python call per Node (issue 40).

- :func:`changed_places`: the places where two lists of one length hold records that differ,
  found by comparing spans of the lists one after the other, and halves of a span that differs
  (a list comparison is C work that skips identical items: a source hands an unchanged Node's
  record over again as the same object), so one changed record costs n / 256 span comparisons
  and ~log2(256) of shrinking slices instead of n calls.
- :func:`common_ends`: how long two lists (of any lengths) stay the same from the front and
  from the back, chunk by chunk: a Node added or gone is the middle left between them.
- :class:`OwnSplit`: this Node's record and the others', as :func:`own_and_peers` splits them
  (the reference), reusing the last split's place of this Node while only other records changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from .model import NodeRecord

# below this many items a slice is compared item by item (a Python loop over a few items costs
# less than more slicing)
SMALL = 16

# the spans :func:`changed_places` compares one after the other before halving one that differs
# (halving the whole list copied each item ~6 times in slices; spans copy it once: 5,000 records,
# one changed, 62 -> 33-43 us on this machine)
SPAN = 256

# the slices compared at once from either end by :func:`common_ends`
CHUNK = 64

_NAME = attrgetter("name")


def changed_places(now: Sequence[Any], was: Sequence[Any]) -> list[int]:
    """The ascending places ``i`` where ``now[i]`` is neither ``was[i]`` nor equal to it; the two
    have one length (``ValueError`` otherwise)."""
    if len(now) != len(was):
        raise ValueError(f"changed_places: lists of {len(now)} and {len(was)} items")
    out: list[int] = []
    n = len(now)
    if now == was:  # C work that stops at the first difference, and copies nothing
        return out
    for start in range(0, n, SPAN):
        end = min(start + SPAN, n)
        if now[start:end] == was[start:end]:
            continue
        todo = [(start, end)]
        while todo:
            lo, hi = todo.pop()
            if hi - lo <= SMALL:
                out.extend(i for i in range(lo, hi) if not (now[i] is was[i] or now[i] == was[i]))
            elif now[lo:hi] != was[lo:hi]:
                mid = (lo + hi) // 2
                todo.append((mid, hi))  # popped after the lower half: the places come out ascending
                todo.append((lo, mid))
    return out


def _same(a: Any, b: Any) -> bool:
    return a is b or a == b


def common_ends(now: Sequence[Any], was: Sequence[Any]) -> tuple[int, int]:
    """``(front, back)``: the longest ``front`` with ``now[:front] == was[:front]`` and then the
    longest ``back`` with the last ``back`` items the same, ``front + back`` at most the shorter
    length (the middles ``now[front:len(now) - back]`` and ``was[front:len(was) - back]`` are
    what differs)."""
    n = min(len(now), len(was))
    front = 0
    while front < n:
        end = min(front + CHUNK, n)
        if now[front:end] == was[front:end]:
            front = end
            continue
        while _same(now[front], was[front]):
            front += 1
        break
    back, a, b = 0, len(now), len(was)
    while back < n - front:
        k = min(CHUNK, n - front - back)
        if now[a - back - k:a - back] == was[b - back - k:b - back]:
            back += k
            continue
        while _same(now[a - back - 1], was[b - back - 1]):
            back += 1
        break
    return front, back


def own_and_peers(nodes: Sequence[NodeRecord], name: str) -> tuple[NodeRecord | None, list[NodeRecord]]:
    """This Node's record (the first of its name) and every other Node's, in the source's order:
    by C work over the names (5,000 Nodes: a Python pass over them was ~0.5 ms of a change)."""
    names = list(map(_NAME, nodes))
    if name not in names:
        return None, list(nodes)
    i = names.index(name)
    if names.count(name) > 1:
        return nodes[i], [n for n in nodes if n.name != name]
    return nodes[i], [*nodes[:i], *nodes[i + 1:]]


class OwnSplit:
    """:func:`own_and_peers` across calls: when the records that changed (in place, or in the
    middle where Nodes came or went) are not this Node's and carry other names (before and
    after), this Node is where it was (or moved by as many places as came or went before it) and
    alone with its name, so the split is two slices (the names are not read again: ~0.3 ms at
    5,000 Nodes).  Anything else splits by the reference."""

    def __init__(self) -> None:
        self._last: Sequence[NodeRecord] | None = None
        self._at: int | None = None  # this Node's place in it, when it is there once

    def split(self, nodes: Sequence[NodeRecord], name: str) -> tuple[NodeRecord | None, list[NodeRecord]]:
        last, at = self._last, self._at
        self._last = nodes
        if last is not None and at is not None:
            if len(last) == len(nodes):
                moved = changed_places(nodes, last)
                if all(nodes[i].name != name and last[i].name != name for i in moved):
                    return nodes[at], [*nodes[:at], *nodes[at + 1:]]
            else:  # Nodes came or went: between the ends the two lists share
                front, back = common_ends(nodes, last)
                outside = at < front or at >= len(last) - back  # this Node is not in the middle
                if outside and all(n.name != name for n in nodes[front:len(nodes) - back]):
                    if at >= front:
                        at += len(nodes) - len(last)
                    self._at = at
                    return nodes[at], [*nodes[:at], *nodes[at + 1:]]
        local, peers = own_and_peers(nodes, name)
        self._at = None
        if local is not None and len(peers) == len(nodes) - 1:  # there once: its place is known
            self._at = next(i for i, n in enumerate(nodes) if n is local)
        return local, peers
