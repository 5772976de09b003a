"""Which PeerSlice watches a Node keeps open when slices are delivered by subscription (issue 46,
``docs/design/peerslices.md``): planned from the groups it subscribes to
(:class:`.subscription.Subscriptions`) and the watches it has.  Pure: :func:`plan` returns what
to open and close; the watches themselves are the caller's.

A watch asks for up to ``per_selector`` groups by name (:func:`.peerslice.group_selectors`) and
cannot be changed once open, so a Node's set of groups is covered by several watches as it grows.
The rules, safe first:

- a group subscribed to that no watch asks for gets a new watch (its slices are held back from
  the plan until that watch has listed: a new group fails closed);
- a watch is closed only when every subscribed group it asks for is asked for by another watch
  that has listed and stays open, so closing one never takes away a group the Node reads (a
  watch none of whose groups is subscribed to any more is closed at once; one that has not listed
  yet is otherwise kept until it has, or a set asked for again would be closed before it served);
- when more than ``max_watches`` are open and all have listed, the whole set is asked for again
  in as few watches as it takes; once those have listed, the older ones fall under the rule
  above and close, so the count comes back down without a moment uncovered."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .peerslice import GROUPS_PER_SELECTOR

MAX_WATCHES = 8  # open at once before the set is asked for again in one go


@dataclass(frozen=True)
class Watch:
    """One open watch: its number (they are opened in rising order), the groups it asks for,
    whether it has listed."""

    ident: int
    groups: frozenset[str]
    listed: bool = False


@dataclass(frozen=True)
class Plan:
    """Watches to open (each a set of groups, at most ``per_selector``) and to close (by ident)."""

    open: tuple[frozenset[str], ...] = ()
    close: tuple[int, ...] = ()


def chunks(groups: frozenset[str] | set[str], per_selector: int) -> tuple[frozenset[str], ...]:
    names = sorted(groups)
    return tuple(frozenset(names[i:i + per_selector]) for i in range(0, len(names), per_selector))


def plan(watches: Sequence[Watch], subscribed: frozenset[str], max_watches: int = MAX_WATCHES,
         per_selector: int = GROUPS_PER_SELECTOR) -> Plan:
    """What to open and close, by the module's rules."""
    if max_watches < 1 or per_selector < 1:
        raise ValueError("max_watches and per_selector: at least 1")
    asked = frozenset().union(*(w.groups for w in watches))
    opens = list(chunks(subscribed - asked, per_selector))
    keep = sorted(watches, key=lambda w: w.ident)
    closes: list[int] = []
    for w in list(keep):  # oldest first, so that a newer watch that asks for the same stays
        needed = w.groups & subscribed
        if needed and not w.listed:
            continue  # opened for a reason (a new group, or the set asked again): let it list first
        others = frozenset().union(*(o.groups for o in keep if o is not w and o.listed))
        if needed <= others:
            keep.remove(w)
            closes.append(w.ident)
    if not opens and len(keep) > max_watches and all(w.listed for w in keep) and \
            len(chunks(subscribed, per_selector)) < len(keep):
        opens = list(chunks(subscribed, per_selector))
    return Plan(tuple(opens), tuple(closes))
