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
(``since``), as they were and as they are.  Joined to a plain list (:func:`join`) it gives a
:class:`JoinedFlows` (``head``: the Node's flows, grouped as before; ``tail``: the tracked part),
and the applier takes the tail's changes when ``before``'s tail is the one ``after``'s follows.
Anything else (a pass whose flows were planned but never applied, a full pass in between) is
grouped in full, as before: the changes are a shortcut, never the only way to the flows."""

from __future__ import annotations

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
    when ``tail`` is tracked."""
    return JoinedFlows(head, tail) if isinstance(tail, TrackedFlows) else head + tail


class JoinedFlows(list[Flow]):
    """``head`` then ``tail`` as one list."""

    __slots__ = ("head", "tail")

    def __init__(self, head: list[Flow], tail: TrackedFlows) -> None:
        super().__init__(head)
        self.extend(tail)
        self.head = head
        self.tail = tail


class FlowTracker:
    """Makes each step's :class:`TrackedFlows` from a planner's delta (the flows it added and
    removed since the last step: ``routesync.policy.incremental.FlowDelta``) and, for a part
    planned whole (the ClusterNetworkPolicy tiers), its flows when they moved, grouped and
    compared (a part that is small).  Cookie groups may hold flows of both."""

    def __init__(self) -> None:
        self.last: TrackedFlows | None = None
        self._delta_groups: dict[int, list[Flow]] = {}
        self._whole_groups: dict[int, tuple[Flow, ...]] = {}

    def step(self, flows: list[Flow], added: Sequence[Flow], removed: Sequence[Flow],
             whole: Sequence[Flow] | None) -> TrackedFlows:
        """``flows``: every flow now (the delta's and the whole part's); ``whole``: the whole
        part's flows when they may have moved, None when they did not.  Nothing changed: the
        last list again."""
        prev = self.last
        if prev is not None and not added and not removed and whole is None:
            return prev
        dg, wg = self._delta_groups, self._whole_groups
        touched = {f.cookie.value for f in removed}
        touched.update(f.cookie.value for f in added)
        new_wg = wg
        if whole is not None:
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


def tail_changes(before: list[Flow], after: list[Flow]) -> tuple[list[Flow], list[Flow], TrackedFlows, Changed] | None:
    """``before``'s head, ``after``'s head, ``after``'s tail and the tail's changes since
    ``before``'s tail, when both are :class:`JoinedFlows` and ``after``'s tail follows
    ``before``'s (is it, or was made right after it); else None (group everything)."""
    if not isinstance(before, JoinedFlows) or not isinstance(after, JoinedFlows):
        return None
    old, new = before.tail, after.tail
    if new is old:
        return before.head, after.head, new, {}
    if new.since is not old:
        return None
    return before.head, after.head, new, new.changed
