"""The controller's loop: what the watches delivered, into the spans, into the slices, into writes.

One :meth:`Sync.step` per wake-up: it drains every resource's journal (all that arrived since the
last step, however many events: they coalesce), applies them to a
:class:`routesync.policy.spanindex.SpanIndex`, takes the groups whose members or reach changed,
hands those (by :func:`~routesync.policy.peerslice.group_name`) and the Pods whose record changed
to the :class:`controller.slices.SliceBook`, and gives the resulting writes to ``write``.

**Fails closed**: a step before every resource has listed drains nothing and writes nothing (a
plan from an empty cache would delete every slice, and the Nodes would deny what they allowed).

**A new leader writes only differences**: :class:`Sync` starts from the PeerSlice objects as
listed (:meth:`SliceBook.from_objects`); its first step reads every resource whole and gives the
book every Pod and every group it knows of, from the watches or from those objects, as they are
now, so the book writes what differs from the objects and nothing else."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from routesync.policy.model import Pod
from routesync.policy.peerslice import MAX_PODS, SliceError, from_object, group_name
from routesync.policy.spanindex import GroupView, SpanIndex

from .slices import SliceBook, Writes
from .sources import Feeds

log = logging.getLogger(__name__)


def pod_keys(objects: Iterable[Any]) -> set[str]:
    """The Pods the readable PeerSlice objects hold (an unreadable one the book deletes)."""
    out: set[str] = set()
    for obj in objects:
        try:
            out.update(p.key for p in from_object(obj).spec.pods)
        except SliceError:
            continue
    return out


class Sync:
    """The loop's state: the spans, the book, and whether the first (whole) step has run."""

    def __init__(self, feeds: Feeds, objects: Iterable[Any], write: Callable[[Writes], None],
                 max_pods: int | None = None, by_subscription: bool = False) -> None:
        objects = list(objects)
        self.feeds = feeds
        self.write = write
        # the slices' readers run policyPeers: peerSlices, which judges egress at its source only
        # (routesync.config.Config.remote_egress): no Pod is read for a remote client's egress
        self.index = SpanIndex(remote_egress=False)
        self.book = SliceBook.from_objects(objects, MAX_PODS if max_pods is None else max_pods, by_subscription)
        for e in self.book.errors:
            log.warning("PeerSlice not readable, deleting it: %s", e)
        self._listed_keys = pod_keys(objects)
        self._started = False
        self.steps = 0

    def step(self) -> Writes | None:
        """One pass; None (nothing drained, nothing written) while a resource has not listed."""
        if not self.feeds.listed():
            return None
        if self._started:
            pods = self._drain()
            groups = {group_name(g): v for g, v in self.index.take_group_changes().items()}
        else:
            pods, groups = self._first()
            self._started = True
        self.index.drop_span_changes()
        writes = self.book.apply(pods, groups)
        self.steps += 1
        if writes.count:
            self.write(writes)
        return writes

    def _first(self) -> tuple[dict[str, Pod | None], dict[str, GroupView | None]]:
        f = self.feeds
        pods = f.pods.drain(snapshot=True)[2]
        namespaces = f.namespaces.drain(snapshot=True)[2]
        policies = f.policies.drain(snapshot=True)[2]
        cluster_policies = f.cluster_policies.drain(snapshot=True)[2]
        for name, labels in namespaces or ():
            self.index.upsert_namespace(name, labels)
        for policy in policies or ():
            self.index.upsert_policy(policy)
        for cp in cluster_policies or ():
            self.index.upsert_cluster_policy(cp)
        records = {p.key: p for p in pods or ()}
        for pod in records.values():
            self.index.upsert_pod(pod)
        self.index.take_group_changes()
        groups: dict[str, GroupView | None] = {name: None for name in self.book.group_names()}
        groups.update((group_name(g), v) for g, v in self.index.groups().items())
        keys = set(records) | self._listed_keys
        self._listed_keys = set()
        return {k: records.get(k) for k in keys}, groups

    def _drain(self) -> dict[str, Pod | None]:
        """Every journal into the index; the Pods whose record changed."""
        f, idx = self.feeds, self.index
        namespaces = f.namespaces.drain()[1]
        policies = f.policies.drain()[1]
        cluster_policies = f.cluster_policies.drain()[1]
        pods = f.pods.drain()[1]
        for name, ns in namespaces.items():
            if ns is None:
                idx.delete_namespace(name)
            else:
                idx.upsert_namespace(*ns)
        for key, policy in policies.items():
            if policy is None:
                idx.delete_policy(key)
            else:
                idx.upsert_policy(policy)
        for name, cp in cluster_policies.items():
            if cp is None:
                idx.delete_cluster_policy(name)
            else:
                idx.upsert_cluster_policy(cp)
        for key, pod in pods.items():
            if pod is None:
                idx.delete_pod(key)
            else:
                idx.upsert_pod(pod)
        return dict(pods)


def run(sync: Sync, wake: threading.Event, stop: threading.Event) -> None:
    """Step on every wake-up until ``stop`` (set ``wake`` too, to end a wait): what arrives during a
    step sets ``wake`` again, and is the next step's."""
    while not stop.is_set():
        wake.clear()
        sync.step()
        wake.wait()
