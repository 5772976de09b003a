"""PeerSlices planned: which slices ferry-controller writes, from the Pods and the groups the
policies name (issue 46, ``docs/design/peerslices.md``; the object itself, its labels and readers:
:mod:`routesync.policy.peerslice`).  Pure: plain data in, plain data out; the applier that writes
them is elsewhere.

A group (:class:`routesync.policy.spanindex.Group`, by its :func:`~routesync.policy.peerslice.group_name`)
is published while its reach reaches some Node: its members that have a record, ``max_pods`` to a
slice, every slice of it labelled with its audience.  So:

- a Pod's record change rewrites the one slice of each published group that holds it;
- a Pod joining or leaving a group writes one slice of that group;
- a group's reach changing (a Node getting its first Pod a policy selects, or losing its last)
  relabels the group's slices and moves no Pod: the Nodes that start or stop matching see the
  slices come or go, as the API server's watch cache delivers a label change;
- or, delivered by subscription (``by_subscription``: the Nodes ask for the groups they read by
  name, :mod:`routesync.policy.subscription`), a reach change writes nothing unless the group
  starts or stops reaching any Node at all.

- :func:`plan_slices`: the full reference, every slice from every Pod and group.
- :class:`SliceBook`: the same incrementally, as the fewest object writes (:class:`Writes`);
  rebuilt from the objects alone after a failover (:meth:`SliceBook.from_objects`)."""


from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from routesync.policy.model import Pod
from routesync.policy.peerslice import (
    MAX_PODS,
    MAX_PODS_LIMIT,
    Audience,
    SliceError,
    SliceSpec,
    audience,
    from_object,
    slice_name,
    to_object,
)
from routesync.policy.spanindex import GroupView


def plan_slices(pods: Mapping[str, Pod], groups: Mapping[str, GroupView],
                max_pods: int = MAX_PODS, by_subscription: bool = False) -> dict[str, SliceSpec]:
    """The reference: for every group (by name) whose reach reaches some Node, its members that
    have a record, sorted by key, ``max_pods`` to a slice, named ``<group>-<n>``; each slice
    labelled with the group's audience, or (``by_subscription``) for its subscribers."""
    _check_max(max_pods)
    out: dict[str, SliceSpec] = {}
    for name in sorted(groups):
        view = groups[name]
        aud = audience(view.reach, by_subscription)
        if aud is None:
            continue
        members = [pods[k] for k in sorted(view.members) if k in pods]
        for n, i in enumerate(range(0, len(members), max_pods)):
            out[slice_name(name, n)] = SliceSpec(name, aud, tuple(members[i:i + max_pods]))
    return out


def _check_max(max_pods: int) -> None:
    if not 1 <= max_pods <= MAX_PODS_LIMIT:
        raise ValueError(f"max_pods {max_pods}: not within 1..{MAX_PODS_LIMIT} (the CRD's pods maxItems)")


# -- incremental --

@dataclass(frozen=True)
class Writes:
    """Object writes, full bodies for ``create`` and ``update``, names for ``delete``.  Written in
    this order (creates, updates, deletes), a Pod that moves slices is, for an instant, in both
    rather than in neither."""

    create: tuple[dict[str, Any], ...] = ()
    update: tuple[dict[str, Any], ...] = ()
    delete: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return len(self.create) + len(self.update) + len(self.delete)


@dataclass
class _Slice:
    group: str
    audience: Audience
    members: dict[str, Pod] = field(default_factory=dict)


@dataclass
class _Group:
    """What the book knows of a group: its members (with a record or not) and its audience
    (None: published nowhere)."""

    members: set[str] = field(default_factory=set)
    audience: Audience | None = None
    slices: set[str] = field(default_factory=set)
    room: set[str] = field(default_factory=set)  # its slices with fewer than max_pods


class SliceBook:
    """The cluster's PeerSlices, kept by changes: :meth:`apply` takes the Pod records and the
    groups that changed (None: gone) and returns the writes.  A Pod is in one slice of each
    published group it is a member of, while it has a record.  An emptied slice is deleted; a
    slice nothing changed in is not written.  Slices are not repacked: which Pods share a slice
    depends on history, not on :func:`plan_slices`."""

    def __init__(self, max_pods: int = MAX_PODS, by_subscription: bool = False) -> None:
        _check_max(max_pods)
        self.max_pods = max_pods
        self.by_subscription = by_subscription
        self._slices: dict[str, _Slice] = {}
        self._groups: dict[str, _Group] = {}
        self._where: dict[tuple[str, str], str] = {}  # (group, Pod key) -> slice name
        self._member_of: dict[str, set[str]] = {}  # Pod key -> the groups it is a member of
        self._records: dict[str, Pod] = {}
        # what from_objects found to repair, written by the next apply
        self._pending_dirty: set[str] = set()
        self._pending_delete: set[str] = set()
        self.errors: tuple[str, ...] = ()

    @classmethod
    def from_objects(cls, objects: Iterable[Any], max_pods: int = MAX_PODS,
                     by_subscription: bool = False) -> SliceBook:
        """The book a new leader starts from: the PeerSlice objects as listed.  What they got
        wrong is repaired by the next :meth:`apply` (run it with every Pod and group, as the new
        leader knows them, and it writes only what differs): an object that cannot be read is
        deleted (its error kept in ``errors``), a Pod twice in one group stays in the first slice
        by name, labels or an audience that are not the group's are rewritten, a slice over
        ``max_pods`` gives its last Pods to others, a slice without a group (the version that grouped
        by audience) is deleted once the groups' slices are written; slices of the other delivery
        (``by_subscription``) are relabelled."""
        book = cls(max_pods, by_subscription)
        errors, read = [], []
        for obj in objects:
            try:
                read.append(from_object(obj))
            except SliceError as e:
                errors.append(str(e))
                meta = obj.get("metadata") if isinstance(obj, dict) else None
                name = meta.get("name") if isinstance(meta, dict) else None
                if isinstance(name, str) and name:
                    book._pending_delete.add(name)
        book.errors = tuple(errors)
        for rs in sorted(read, key=lambda r: r.name):
            gname = rs.spec.group
            if not gname:  # the audience-grouped version's: its Pods are read until the groups' are written
                book._pending_delete.add(rs.name)
                continue
            g = book._groups.setdefault(gname, _Group(audience=rs.spec.audience))
            s = book._slices[rs.name] = _Slice(gname, rs.spec.audience)
            g.slices.add(rs.name)
            if rs.labels != rs.spec.labels or rs.spec.audience != g.audience:
                book._pending_dirty.add(rs.name)
            for pod in rs.spec.pods:
                if (gname, pod.key) in book._where or len(s.members) >= max_pods:
                    book._pending_dirty.add(rs.name)  # dropped here; apply places it again if it belongs
                    continue
                s.members[pod.key] = pod
                book._where[(gname, pod.key)] = rs.name
                g.members.add(pod.key)
                book._member_of.setdefault(pod.key, set()).add(gname)
                book._records.setdefault(pod.key, pod)
            if not s.members:
                book._pending_dirty.add(rs.name)
            book._refresh_room(rs.name)
        return book

    def specs(self) -> dict[str, SliceSpec]:
        """The slices as they are."""
        return {name: self._spec(name) for name in sorted(self._slices)}

    def objects(self) -> list[dict[str, Any]]:
        return [to_object(name, spec) for name, spec in self.specs().items()]

    def group_names(self) -> set[str]:
        """The groups the book holds (members or slices)."""
        return set(self._groups)

    def slices_of(self, key: str) -> set[str]:
        """The slices that hold Pod ``key``."""
        return {self._where[(g, key)] for g in self._member_of.get(key, ()) if (g, key) in self._where}

    def apply(self, pods: Mapping[str, Pod | None] | None = None,
              groups: Mapping[str, GroupView | None] | None = None) -> Writes:
        """Take the changed Pod records and groups by name (None: gone); return the writes that
        bring the slices to them."""
        pods, groups = pods or {}, groups or {}
        dirty = set(self._pending_dirty)
        existing = set(self._slices)
        touched: set[tuple[str, str]] = set()  # (group, Pod key) to bring to what it should be
        for key, pod in pods.items():
            if pod is None:
                self._records.pop(key, None)
            else:
                self._records[key] = pod
            touched.update((g, key) for g in self._member_of.get(key, ()))
        for gname, view in groups.items():
            g = self._groups.get(gname)
            if g is None:
                if view is None:
                    continue
                g = self._groups[gname] = _Group()
            new_members = set(view.members) if view is not None else set()
            aud = audience(view.reach, self.by_subscription) if view is not None else None
            for key in g.members - new_members:
                self._unmember(gname, key)
                touched.add((gname, key))
            for key in new_members - g.members:
                self._member_of.setdefault(key, set()).add(gname)
                touched.add((gname, key))
            g.members = new_members
            if aud != g.audience:
                g.audience = aud
                touched.update((gname, k) for k in new_members)  # published or not: every member again
                for name in g.slices:
                    self._slices[name].audience = aud if aud is not None else self._slices[name].audience
                    dirty.add(name)
        arrivals: list[tuple[str, str, Pod]] = []
        for gname, key in sorted(touched):
            g = self._groups.get(gname)
            pod = self._records.get(key)
            want = g is not None and g.audience is not None and pod is not None and key in g.members
            at = self._where.get((gname, key))
            if at is not None:
                s = self._slices[at]
                if not want:
                    del s.members[key], self._where[(gname, key)]
                    dirty.add(at)
                    self._refresh_room(at)
                elif s.members[key] != pod:
                    assert pod is not None
                    s.members[key] = pod
                    dirty.add(at)
            elif want:
                assert pod is not None
                arrivals.append((gname, key, pod))
        for gname, key, pod in arrivals:
            name = self._place(gname, dirty)
            self._slices[name].members[key] = pod
            self._where[(gname, key)] = name
            dirty.add(name)
            self._refresh_room(name)
        create, update, delete = [], [], set(self._pending_delete)
        seen = set(groups) | {self._slices[n].group for n in dirty}
        for name in sorted(dirty):
            s = self._slices[name]
            g = self._groups[s.group]
            if not s.members or g.audience is None:
                assert not s.members, f"{name}: a group published nowhere kept a Pod"
                del self._slices[name]
                g.slices.discard(name)
                g.room.discard(name)
                if name in existing:
                    delete.add(name)
            elif name in existing:
                update.append(to_object(name, self._spec(name)))
            else:
                create.append(to_object(name, self._spec(name)))
        for gname in seen:
            g = self._groups.get(gname)
            if g is not None and not g.members and not g.slices:
                del self._groups[gname]
        self._pending_dirty, self._pending_delete = set(), set()
        return Writes(tuple(create), tuple(update), tuple(sorted(delete)))

    def _unmember(self, gname: str, key: str) -> None:
        groups = self._member_of.get(key)
        if groups is not None:
            groups.discard(gname)
            if not groups:
                del self._member_of[key]

    def _spec(self, name: str) -> SliceSpec:
        s = self._slices[name]
        return SliceSpec(s.group, s.audience, tuple(s.members[k] for k in sorted(s.members)))

    def _refresh_room(self, name: str) -> None:
        s = self._slices[name]
        room = self._groups[s.group].room
        if len(s.members) < self.max_pods:
            room.add(name)
        else:
            room.discard(name)

    def _place(self, gname: str, dirty: set[str]) -> str:
        """A slice of group ``gname`` with room: one this batch writes anyway, else the fullest;
        or a new one."""
        g = self._groups[gname]
        if g.room:
            return min(g.room, key=lambda n: (n not in dirty, -len(self._slices[n].members), n))
        n = 0
        while slice_name(gname, n) in self._slices or slice_name(gname, n) in self._pending_delete:
            n += 1
        name = slice_name(gname, n)
        assert g.audience is not None
        self._slices[name] = _Slice(gname, g.audience)
        g.slices.add(name)
        return name
