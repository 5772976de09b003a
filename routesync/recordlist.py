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
- :class:`NodeList`: a source's list that says itself what changed since the list before it (the
  Kubernetes source drains its watch by name already), so that neither :class:`OwnSplit` nor the
  planner compares 5,000 records to find the one that changed; the comparisons above remain for
  lists that do not say (the registry's), or that follow a list the caller did not see.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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

# what a name held in the list a NodeList follows, and holds in it (None: no record of that name)
Change = tuple[NodeRecord | None, NodeRecord | None]


class NodeList(list[NodeRecord]):
    """Node records, each name once, in name order, that say what changed since the list they
    follow.

    ``key`` names this list and ``follows`` the one before it (None: follows none that can be
    named); ``changes`` holds, for every name whose record is another object than there, what
    it held there and what it holds here (None: no record of that name).  A caller trusts
    ``changes`` only when ``follows`` is the key of the very list it used last, and never edits
    the list (it may keep it, instead of a copy)."""

    __slots__ = ("changes", "follows", "key")

    def __init__(self, records: Iterable[NodeRecord], key: Any, follows: Any, changes: Mapping[str, Change]) -> None:
        super().__init__(records)
        self.key = key
        self.follows = follows
        self.changes = changes

    def changes_since(self, key: Any) -> Mapping[str, Change] | None:
        """``changes`` when this list follows the one named ``key``; else None."""
        return self.changes if key is not None and self.follows == key else None


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
    alone with its name, so the split is a copy of the list less that place (the names are not
    read again: ~0.3 ms at 5,000 Nodes).  A :class:`NodeList` that follows the last list says what changed; any other
    list is compared with the last one (:func:`changed_places`, :func:`common_ends`).  Anything
    else splits by the reference.  From a NodeList the peers come as one too, following the
    peers of the list it follows (the changes but this Node's name's: the peers are the list
    without that name, whichever way it was split)."""

    def __init__(self) -> None:
        self._last: Sequence[NodeRecord] | None = None
        self._at: int | None = None  # this Node's place in it, when it is there once

    def split(self, nodes: Sequence[NodeRecord], name: str) -> tuple[NodeRecord | None, list[NodeRecord]]:
        at = self._place(nodes, name)
        if at is None:
            local, peers = own_and_peers(nodes, name)
            if local is not None and len(peers) == len(nodes) - 1:  # there once: its place is known
                self._at = next(i for i, n in enumerate(nodes) if n is local)
        else:
            local, self._at = nodes[at], at
        out: list[NodeRecord]
        if isinstance(nodes, NodeList):
            changes = {n: c for n, c in nodes.changes.items() if n != name}
            follows = None if nodes.follows is None else (nodes.follows, name)
            out = NodeList(nodes if at is not None else peers, (nodes.key, name), follows, changes)
        else:
            out = list(nodes) if at is not None else peers
        if at is not None:
            del out[at]  # one copy and a memory move (two slices joined copied each reference thrice)
        return local, out

    def _place(self, nodes: Sequence[NodeRecord], name: str) -> int | None:
        """This Node's place in ``nodes``, found from the last list's, when it is there once;
        None: split by the reference."""
        last, at = self._last, self._at
        self._last, self._at = nodes, None
        if last is None or at is None:
            return None
        changes = nodes.changes_since(getattr(last, "key", None)) if isinstance(nodes, NodeList) else None
        if changes is not None:
            if name in changes:
                return None
            # moved by the Nodes that came or went before it (the list is in name order)
            at += sum((now is not None) - (was is not None) for n, (was, now) in changes.items() if n < name)
            return at if 0 <= at < len(nodes) and nodes[at].name == name else None
        if len(last) == len(nodes):
            moved = changed_places(nodes, last)
            return at if all(nodes[i].name != name and last[i].name != name for i in moved) else None
        # Nodes came or went: between the ends the two lists share
        front, back = common_ends(nodes, last)
        outside = at < front or at >= len(last) - back  # this Node is not in the middle
        if outside and all(n.name != name for n in nodes[front:len(nodes) - back]):
            return at + (len(nodes) - len(last) if at >= front else 0)
        return None
