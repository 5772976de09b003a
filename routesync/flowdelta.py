"""Desired flows that say which of their cookie groups changed, so an applier writes what changed
without grouping every flow again to find it.

NetworkPolicy's flows come from a planner that knows, event by event, which flows it changed
(``routesync.policy.incremental.IncrementalPlanner.take_delta``); the policy feature appends them
to the Node's own flows (:func:`join`, ``routesync.policy.node.PolicyNode.desire``) and the OVS applier,
between full passes, installs the cookie groups that differ from what it installed last
(``routesync.apply.ovs.OvsApplier.sync_flow_delta``).  Grouping every flow by cookie there costs
a pass over all of them (32,000 policy flows at 10,000 Pods and 1,000 policies), whatever
changed.  So the policy flows are a :class:`TrackedFlows`: a plain list of the flows (what every
reader takes) that also carries the groups that changed since the :class:`TrackedFlows` before it
(``since``), as they were and as they are.  The Node's per-peer flows are one too (the planner's
memo, ``routesync.planner.PeerMemo``, knows which peers it re-planned: :class:`KeyedFlowTracker`),
so a Node change costs its peer's groups, not 15,000 flows grouped at 5,000 peers.  Joined
(:func:`join`) they give a :class:`JoinedFlows` (``head``: the base and Node flows, grouped as
before; ``tails``: the tracked parts, the peers' then the policy's), and the applier takes each
tail's changes when ``before``'s tail at its place is the one it follows.
Anything else (a pass whose flows were planned but never applied, a full pass in between) is
grouped in full, as before: the changes are a shortcut, never the only way to the flows."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence

from cni.pipeline.tables import Flow

# cookie value -> (its flows as they were, as they are); () where there were or are none
Changed = Mapping[int, tuple[tuple[Flow, ...], tuple[Flow, ...]]]


class TrackedFlows(list[Flow]):
    """``flows`` as a list, with the cookie groups that differ from ``since``'s (``changed``) and
    how many groups it has (``groups``).  ``since`` None: nothing to follow (group it all)."""

    __slots__ = ("changed", "groups", "since")

    def __init__(self, flows: Iterable[Flow], since: TrackedFlows | None, changed: Changed, groups: int) -> None:
        super().__init__(flows)
        self.since = since
        self.changed = changed
        self.groups = groups


def join(head: list[Flow], tail: list[Flow]) -> list[Flow]:
    """``head`` then ``tail`` as one list; a :class:`JoinedFlows` that keeps which part is which
    when ``tail`` is tracked (``head`` may be one already: the Node's own flows, whose per-peer
    part the planner tracks, then the policy's)."""
    if not isinstance(tail, TrackedFlows):
        return list(head) + tail if isinstance(head, JoinedFlows) else head + tail
    if isinstance(head, JoinedFlows):
        return JoinedFlows(head.head, (*head.tails, tail))
    return JoinedFlows(head, (tail,))


class JoinedFlows(list[Flow]):
    """``head`` then each of ``tails`` as one list."""

    __slots__ = ("head", "tails")

    def __init__(self, head: list[Flow], tails: tuple[TrackedFlows, ...]) -> None:
        super().__init__(head)
        for t in tails:
            self.extend(t)
        self.head = head
        self.tails = tails


class FlowTracker:
    """Makes each step's :class:`TrackedFlows` from a planner's delta (the flows it added and
    removed since the last step: ``routesync.policy.incremental.FlowDelta``) and, for a second
    part (the ClusterNetworkPolicy tiers), its flows when they moved: with what of them was added
    and removed when its planner knows (``whole_delta``: only those groups regrouped), else grouped
    and compared whole.  Cookie groups may hold flows of both."""

    def __init__(self) -> None:
        self.last: TrackedFlows | None = None
        self._delta_groups: dict[int, list[Flow]] = {}
        self._whole_groups: dict[int, tuple[Flow, ...]] = {}

    def step(self, flows: list[Flow], added: Sequence[Flow], removed: Sequence[Flow],
             whole: Sequence[Flow] | None,
             whole_delta: tuple[Sequence[Flow], Sequence[Flow]] | None = None) -> TrackedFlows:
        """``flows``: every flow now (the delta's and the whole part's); ``whole``: the whole
        part's flows when they may have moved, None when they did not; ``whole_delta``: with
        ``whole``, its flows (added, removed) since the last step's ``whole``, when its planner
        knows them (None: compared whole).  Nothing changed: the last list again."""
        prev = self.last
        if prev is not None and not added and not removed and whole is None:
            return prev
        dg, wg = self._delta_groups, self._whole_groups
        touched = {f.cookie.value for f in removed}
        touched.update(f.cookie.value for f in added)
        new_wg = wg
        if whole is not None and whole_delta is not None and prev is not None:
            new_wg = dict(wg)
            w_added, w_removed = whole_delta
            for f in w_removed:
                c = f.cookie.value
                kept = tuple(x for x in new_wg.get(c, ()) if x is not f)
                if kept:
                    new_wg[c] = kept
                else:
                    new_wg.pop(c, None)
                touched.add(c)
            for f in w_added:
                c = f.cookie.value
                new_wg[c] = (*new_wg.get(c, ()), f)
                touched.add(c)
        elif whole is not None:
            by: dict[int, list[Flow]] = {}
            for f in whole:
                by.setdefault(f.cookie.value, []).append(f)
            new_wg = {c: tuple(g) for c, g in by.items()}
            touched.update(c for c in wg.keys() | new_wg.keys() if wg.get(c) != new_wg.get(c))
        was = {c: (*dg.get(c, ()), *wg.get(c, ())) for c in touched}
        for f in removed:
            c = f.cookie.value
            g = [x for x in dg.get(c, ()) if x is not f]
            if g:
                dg[c] = g
            else:
                dg.pop(c, None)
        for f in added:
            dg.setdefault(f.cookie.value, []).append(f)
        self._whole_groups = new_wg
        changed = {c: (was[c], (*dg.get(c, ()), *new_wg.get(c, ()))) for c in touched}
        groups = len(dg) + sum(1 for c in new_wg if c not in dg)
        if prev is not None:
            prev.since = None  # one step back is all an applier follows: the older ones may go
        out = self.last = TrackedFlows(flows, prev, changed, groups)
        return out


class KeyedFlowTracker:
    """Makes each step's :class:`TrackedFlows` from flows owned by keys (the planner's peers:
    ``routesync.planner.PeerMemo``), told which keys' flows may have moved since the last step
    (added, removed, re-planned).  A key's flows are its own, in the list in key order; a cookie
    group is its keys' flows of that cookie, in key order (as grouping the list gives).  Only the
    named keys are looked at: a step costs what changed, not the flows."""

    def __init__(self) -> None:
        self.last: TrackedFlows | None = None
        self._groups: dict[str, dict[int, tuple[Flow, ...]]] = {}  # key -> cookie -> its flows
        self._keys: dict[int, list[str]] = {}  # cookie -> its keys, sorted

    def step(self, flows: list[Flow], owned: Mapping[str, Sequence[Flow]], moved: Iterable[str]) -> TrackedFlows:
        """``flows``: every key's flows, in key order; ``owned``: each key's; ``moved``: the keys
        whose flows may differ from the last step's (a key absent from ``owned`` is gone)."""
        prev = self.last
        touched: set[int] = set()
        regroup: dict[str, dict[int, tuple[Flow, ...]]] = {}
        for k in moved:
            old = self._groups.get(k, {})
            new = _by_cookie(owned.get(k, ()))
            if old.keys() == new.keys() and all(old[c] == new[c] for c in new):
                continue
            touched.update(old)
            touched.update(new)
            regroup[k] = new
        if prev is not None and not touched:
            return prev
        was = {c: self._concat(c) for c in touched}
        for k, new in regroup.items():
            old = self._groups.get(k, {})
            for c in old:
                if c not in new:
                    keys = self._keys[c]
                    keys.remove(k)
                    if not keys:
                        del self._keys[c]
            for c in new:
                if c not in old:
                    bisect.insort(self._keys.setdefault(c, []), k)
            if new:
                self._groups[k] = new
            else:
                self._groups.pop(k, None)
        changed = {c: (was[c], now) for c in touched if (now := self._concat(c)) != was[c]}
        if prev is not None:
            prev.since = None  # one step back is all an applier follows
        out = self.last = TrackedFlows(flows, prev, changed, len(self._keys))
        return out

    def _concat(self, cookie: int) -> tuple[Flow, ...]:
        groups = self._groups
        return tuple(f for k in self._keys.get(cookie, ()) for f in groups[k][cookie])


def _by_cookie(flows: Iterable[Flow]) -> dict[int, tuple[Flow, ...]]:
    out: dict[int, list[Flow]] = {}
    for f in flows:
        out.setdefault(f.cookie.value, []).append(f)
    return {c: tuple(g) for c, g in out.items()}


def tail_changes(before: list[Flow], after: list[Flow]
                 ) -> tuple[list[Flow], list[Flow], list[tuple[TrackedFlows, Changed]]] | None:
    """``before``'s head, ``after``'s head and each of ``after``'s tails with its changes since
    ``before``'s tail at the same place, when both are :class:`JoinedFlows` of as many tails and
    each of ``after``'s follows ``before``'s (is it, or was made right after it); else None
    (group everything)."""
    if not isinstance(before, JoinedFlows) or not isinstance(after, JoinedFlows):
        return None
    if len(before.tails) != len(after.tails):
        return None
    out: list[tuple[TrackedFlows, Changed]] = []
    for old, new in zip(before.tails, after.tails, strict=True):
        if new is old:
            out.append((new, {}))
        elif new.since is old:
            out.append((new, new.changed))
        else:
            return None
    return before.head, after.head, out
