"""The Pods a Node's policy planners get when it receives only what concerns it
(``docs/design/scale.md``): its own Pods, from a watch of the Pods bound to it, merged with the
remote Pods the controller's PeerSlices hold for it, from label-selected watches of those.

:class:`PodMerge` is the pure part: it takes what changed in each source (own Pods by key, slices
by name with the Pods each holds now) and gives what changed in the merged view, by Pod key, in
the shape the incremental planner takes (:class:`.incremental.Changes`).  A Pod's own watch wins
over a slice (a slice may still hold a Pod deleted and recreated on this Node); among slices the
smallest name that holds it (a Pod moving between two slices is in both for a moment).
:class:`MergedPods` puts it behind the few members :class:`.watch.PolicySource` uses of a
:class:`..sources.reflector.Reflector`, so the rest of route-sync does not know the difference."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Protocol

from .model import Pod


class PodMerge:
    """Own Pods and slices in, the merged view's changes out."""

    def __init__(self) -> None:
        self.own: dict[str, Pod] = {}
        self.slices: dict[str, dict[str, Pod]] = {}  # slice name -> Pod key -> Pod
        self.holders: dict[str, set[str]] = {}  # Pod key -> the slices that hold it
        self.view: dict[str, Pod] = {}

    def _merged(self, key: str) -> Pod | None:
        pod = self.own.get(key)
        if pod is not None:
            return pod
        holders = self.holders.get(key)
        if not holders:
            return None
        return self.slices[min(holders)][key]

    def apply(self, own: Mapping[str, Pod | None], slices: Mapping[str, Sequence[Pod] | None]) -> dict[str, Pod | None]:
        """Apply what changed (None: gone) and return the merged view's changes (None: gone)."""
        touched: set[str] = set()
        for key, pod in own.items():
            if pod is None:
                self.own.pop(key, None)
            else:
                self.own[key] = pod
            touched.add(key)
        for name, pods in slices.items():
            before = self.slices.pop(name, {})
            after = {p.key: p for p in pods or ()}
            if after:
                self.slices[name] = after
            for key in before.keys() | after.keys():
                if before.get(key) == after.get(key):
                    continue
                touched.add(key)
                holders = self.holders.setdefault(key, set())
                if key in after:
                    holders.add(name)
                else:
                    holders.discard(name)
                    if not holders:
                        del self.holders[key]
        out: dict[str, Pod | None] = {}
        for key in touched:
            now = self._merged(key)
            if now == self.view.get(key):
                continue
            if now is None:
                del self.view[key]
            else:
                self.view[key] = now
            out[key] = now
        return out


class Source(Protocol):
    """What :class:`MergedPods` reads of a :class:`..sources.reflector.Reflector`."""

    kind: str
    generation: int
    synced: threading.Event

    def start(self) -> None: ...

    def stop(self) -> None: ...


class OwnSource(Source, Protocol):
    def drain(self, snapshot: bool = False) -> tuple[int, dict[str, Pod | None], list[Pod] | None]: ...


class SliceSource(Source, Protocol):
    def drain(self, snapshot: bool = False) -> tuple[int, dict[str, tuple[Pod, ...] | None],
                                                     list[tuple[Pod, ...]] | None]: ...


class _AllSynced:
    def __init__(self, sources: Sequence[Source]) -> None:
        self.sources = sources

    def wait(self, timeout: float | None = None) -> bool:
        return all(s.synced.wait(timeout) for s in self.sources)

    def is_set(self) -> bool:
        return all(s.synced.is_set() for s in self.sources)


class MergedPods:
    """A Reflector-like view (``drain``, ``snapshot``, ``generation``, ``synced``) of this
    Node's own Pods and the PeerSlices' Pods.  The slice sources must journal by slice name.
    ``slices`` are the sources there from the start (``synced`` waits for them); others come and
    go with :meth:`set_extra` (the watches of the groups a Node subscribes to): a source that goes
    takes its slices with it, unless another holds them too (each source's slices are kept apart,
    so one slice in two watches, for a moment or for good, is neither lost nor counted twice)."""

    kind = "Pod"

    def __init__(self, own: OwnSource, slices: Sequence[SliceSource]) -> None:
        self.own = own
        self.slice_sources = tuple(slices)
        self.extra: tuple[SliceSource, ...] = ()
        self.merge = PodMerge()
        self.lock = threading.Lock()
        self.synced = _AllSynced((own, *slices))
        self._pending: dict[str, Pod | None] = {}
        self._ids: dict[int, int] = {}  # id(source) -> its number in the slices' keys
        self._names: dict[int, set[str]] = {}  # a source's number -> the slice names it holds
        self._next = 0
        self._gone_generations = 0  # so that generation never goes back when a source goes

    @property
    def generation(self) -> int:
        return self._gone_generations + self.own.generation + \
            sum(s.generation for s in (*self.slice_sources, *self.extra))

    def start(self) -> None:
        for s in (self.own, *self.slice_sources, *self.extra):
            s.start()

    def stop(self) -> None:
        for s in (self.own, *self.slice_sources, *self.extra):
            s.stop()

    def set_extra(self, sources: Sequence[SliceSource]) -> None:
        """The sources beside the first ones from now on: new ones are started, gone ones
        stopped and their slices dropped."""
        with self.lock:
            self._pull()
            keep = {id(s) for s in sources}
            gone = [s for s in self.extra if id(s) not in keep]
            self.extra = tuple(sources)
            slices: dict[str, tuple[Pod, ...] | None] = {}
            for s in gone:
                n = self._ids.pop(id(s), None)
                for name in self._names.pop(n, set()) if n is not None else ():
                    slices[f"{name}#{n}"] = None
                self._gone_generations += s.generation + 1
            for key, pod in self.merge.apply({}, slices).items():
                self._pending[key] = pod
        for s in gone:
            s.stop()
        for s in sources:
            s.start()

    def _number(self, source: SliceSource) -> int:
        n = self._ids.get(id(source))
        if n is None:
            n = self._ids[id(source)] = self._next
            self._next += 1
        return n

    def _pull(self) -> int:
        gen, own, _ = self.own.drain()
        slices: dict[str, tuple[Pod, ...] | None] = {}
        for s in (*self.slice_sources, *self.extra):
            g, changed, _ = s.drain()
            gen += g
            n = self._number(s)
            names = self._names.setdefault(n, set())
            for name, pods in changed.items():
                slices[f"{name}#{n}"] = pods  # "#": in no object name, sorts the slice's name first
                if pods is None:
                    names.discard(name)
                else:
                    names.add(name)
        for key, pod in self.merge.apply(own, slices).items():
            self._pending[key] = pod
        return gen + self._gone_generations

    def drain(self, snapshot: bool = False) -> tuple[int, dict[str, Pod | None], list[Pod] | None]:
        with self.lock:
            gen = self._pull()
            changes, self._pending = self._pending, {}
            return gen, changes, list(self.merge.view.values()) if snapshot else None

    def snapshot(self) -> tuple[int, list[Pod]]:
        with self.lock:
            gen = self._pull()
            return gen, list(self.merge.view.values())
