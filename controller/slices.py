"""PeerSlices planned: which slices ferry-controller writes, from the Pods and their spans
(issue 46, ``docs/design/peerslices.md``; the object itself, its labels and readers:
:mod:`routesync.policy.peerslice`).  Pure: plain data in, plain data out; the applier that writes
them is elsewhere.

- :func:`plan_slices`: the full reference, every slice from every Pod and span.
- :class:`SliceBook`: the same incrementally, Pod change by Pod change, as the fewest object
  writes (:class:`Writes`); rebuilt from the objects alone after a failover
  (:meth:`SliceBook.from_objects`).

What a Node receives is ``relevance.per_node`` of the spans with ``populated`` taken as
``everywhere``: a Node without Pods also receives the Pods every Node with Pods reads.  That
Node plans nothing from them (it has no Pod to judge a packet for), and the superset saves a
label write on every slice of such Pods each time a Node gets its first Pod or loses its last."""


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
    audience_hash,
    from_object,
    slice_name,
    to_object,
)
from routesync.policy.relevance import Span


def plan_slices(pods: Mapping[str, Pod], spans: Mapping[str, Span], max_pods: int = MAX_PODS) -> dict[str, SliceSpec]:
    """The reference: every Pod that has a record and a span reaching some Node, grouped by
    audience, sorted by key, ``max_pods`` to a slice, named ``<audience hash>-<n>``."""
    _check_max(max_pods)
    groups: dict[Audience, list[Pod]] = {}
    for key, span in spans.items():
        aud = audience(span)
        if aud is not None and key in pods:
            groups.setdefault(aud, []).append(pods[key])
    out: dict[str, SliceSpec] = {}
    for aud in sorted(groups, key=lambda a: (audience_hash(a), a.everyone, sorted(a.nodes))):
        members = sorted(groups[aud], key=lambda p: p.key)
        n = 0
        for i in range(0, len(members), max_pods):
            while slice_name(aud, n) in out:  # two audiences of one hash (never seen): numbered on
                n += 1
            out[slice_name(aud, n)] = SliceSpec(aud, tuple(members[i:i + max_pods]))
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
    audience: Audience
    members: dict[str, Pod] = field(default_factory=dict)


class SliceBook:
    """The cluster's PeerSlices, kept by Pod changes: :meth:`apply` takes what changed (a Pod's
    record, a Pod's span; None for gone) and returns the writes.  A Pod is published when it has a
    record and a span that reaches some Node.  A record change writes the one slice that holds the
    Pod; an audience change moves it from its slice to one of the new audience that has room (the
    ones this batch writes anyway first, then the fullest) or a new one; an emptied slice is
    deleted; a slice nothing changed in is not written.  Slices are not repacked: which Pods share a
    slice depends on history, not on :func:`plan_slices`."""

    def __init__(self, max_pods: int = MAX_PODS) -> None:
        _check_max(max_pods)
        self.max_pods = max_pods
        self._slices: dict[str, _Slice] = {}
        self._where: dict[str, str] = {}  # Pod key -> slice name
        self._room: dict[Audience, set[str]] = {}  # slices with fewer than max_pods
        self._records: dict[str, Pod] = {}
        self._audiences: dict[str, Audience] = {}
        # what from_objects found to repair, written by the next apply
        self._pending_keys: set[str] = set()
        self._pending_dirty: set[str] = set()
        self._pending_delete: set[str] = set()
        self.errors: tuple[str, ...] = ()

    @classmethod
    def from_objects(cls, objects: Iterable[Any], max_pods: int = MAX_PODS) -> SliceBook:
        """The book a new leader starts from: the PeerSlice objects as listed.  What they got
        wrong is repaired by the next :meth:`apply` (run it with every Pod and span, as the new
        leader knows them, and it writes only what differs): an object that cannot be read is
        deleted (its error kept in ``errors``), a Pod in two slices stays in the first by name,
        labels that are not the audience's are rewritten, a slice over ``max_pods`` gives its last
        Pods to others."""
        book = cls(max_pods)
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
            s = book._slices[rs.name] = _Slice(rs.spec.audience)
            if rs.labels != rs.spec.labels:
                book._pending_dirty.add(rs.name)
            for pod in rs.spec.pods:
                if pod.key in book._where:
                    book._pending_dirty.add(rs.name)  # dropped: it stays in the first
                elif len(s.members) >= max_pods:
                    book._pending_dirty.add(rs.name)  # dropped here, placed again by apply
                    book._pending_keys.add(pod.key)
                    book._records[pod.key], book._audiences[pod.key] = pod, rs.spec.audience
                else:
                    s.members[pod.key] = pod
                    book._where[pod.key] = rs.name
                    book._records[pod.key], book._audiences[pod.key] = pod, rs.spec.audience
            if not s.members:
                book._pending_dirty.add(rs.name)
            book._refresh_room(rs.name)
        return book

    def specs(self) -> dict[str, SliceSpec]:
        """The slices as they are."""
        return {name: self._spec(name) for name in sorted(self._slices)}

    def objects(self) -> list[dict[str, Any]]:
        return [to_object(name, spec) for name, spec in self.specs().items()]

    def slice_of(self, key: str) -> str | None:
        return self._where.get(key)

    def apply(self, pods: Mapping[str, Pod | None] | None = None,
              spans: Mapping[str, Span | None] | None = None) -> Writes:
        """Take the changed Pod records and spans (None: gone); return the writes that bring the
        slices to them."""
        pods, spans = pods or {}, spans or {}
        for key, pod in pods.items():
            if pod is None:
                self._records.pop(key, None)
            else:
                self._records[key] = pod
        for key, span in spans.items():
            aud = audience(span) if span is not None else None
            if aud is None:
                self._audiences.pop(key, None)
            else:
                self._audiences[key] = aud
        existing = set(self._slices)
        reserved = set(self._pending_delete)
        dirty = set(self._pending_dirty)
        arrivals = []
        for key in sorted(set(pods) | set(spans) | self._pending_keys):
            pod, aud = self._records.get(key), self._audiences.get(key)
            name = self._where.get(key)
            if name is not None:
                s = self._slices[name]
                if pod is None or aud != s.audience:
                    del s.members[key], self._where[key]
                    dirty.add(name)
                    self._refresh_room(name)
                elif s.members[key] != pod:
                    s.members[key] = pod
                    dirty.add(name)
            if pod is not None and aud is not None and key not in self._where:
                arrivals.append((key, pod, aud))
        for key, pod, aud in arrivals:
            name = self._place(aud, dirty, reserved)
            self._slices[name].members[key] = pod
            self._where[key] = name
            dirty.add(name)
            self._refresh_room(name)
        create, update, delete = [], [], sorted(self._pending_delete)
        for name in sorted(dirty):
            s = self._slices[name]
            if not s.members:
                del self._slices[name]
                self._refresh_room(name, s.audience)
                if name in existing:
                    delete.append(name)
            elif name in existing:
                update.append(to_object(name, self._spec(name)))
            else:
                create.append(to_object(name, self._spec(name)))
        self._pending_keys, self._pending_dirty, self._pending_delete = set(), set(), set()
        return Writes(tuple(create), tuple(update), tuple(sorted(delete)))

    def _spec(self, name: str) -> SliceSpec:
        s = self._slices[name]
        return SliceSpec(s.audience, tuple(s.members[k] for k in sorted(s.members)))

    def _refresh_room(self, name: str, gone: Audience | None = None) -> None:
        """Keep ``_room`` right for slice ``name`` (``gone``: its audience, the slice deleted)."""
        s = self._slices.get(name)
        aud = s.audience if s is not None else gone
        if aud is None:
            return
        room = self._room.setdefault(aud, set())
        if s is not None and len(s.members) < self.max_pods:
            room.add(name)
        else:
            room.discard(name)
        if not room:
            del self._room[aud]

    def _place(self, aud: Audience, dirty: set[str], reserved: set[str]) -> str:
        """A slice of ``aud`` with room: one this batch writes anyway, else the fullest; or a new one."""
        candidates = self._room.get(aud)
        if candidates:
            return min(candidates, key=lambda n: (n not in dirty, -len(self._slices[n].members), n))
        n = 0
        while slice_name(aud, n) in self._slices or slice_name(aud, n) in reserved:
            n += 1
        name = slice_name(aud, n)
        self._slices[name] = _Slice(aud)
        return name
