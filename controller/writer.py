"""The applier: :class:`controller.slices.Writes` onto the API server's PeerSlices (cluster-scoped,
``ferry.io/v1alpha1``), through ``CustomObjectsApi``.  Thin: what to write is decided elsewhere.

- Written in the order :class:`Writes` gives: creates, then updates, then deletes; within each, up
  to ``WORKERS`` at once (distinct slices: no two calls touch one object).  One at a time, the
  round trips of a Pod change's several slices queued up behind each other (bench_scale: seconds
  under churn).
- A PeerSlice is a custom resource: an update must name the ``resourceVersion`` it replaces.  The
  writer keeps each slice's last known version (from the listing, then from each answer); the
  controller is the only writer, so it is right unless another writer came between.
- A create answered 409 (the slice is there: made between the listing and now) reads the object
  and replaces it; an update answered 409 (its version is stale) reads and replaces again; an
  update answered 404 (someone deleted it) creates it; a delete answered 404 is done.
- Before every call, ``leading()``: once the lease is lost, nothing more is written
  (:class:`NotLeading`).
- Any other error (the API server away, a 500) goes up: the process exits and its restart
  rebuilds from the objects, writing what differs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from routesync.policy import peerslice

from .slices import Writes

log = logging.getLogger(__name__)
TIMEOUT = 30  # seconds a request may take
WORKERS = 8  # requests in flight at once (the client's connection pool holds more)
_T = TypeVar("_T")


class NotLeading(RuntimeError):
    """The lease is lost: not one more write."""


def _status(e: BaseException) -> int | None:
    status = getattr(e, "status", None)
    return status if isinstance(status, int) else None


class SliceWriter:
    def __init__(self, api_client: Any, leading: Callable[[], bool]) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        self._api = client.CustomObjectsApi(api_client)
        self._api_exception = ApiException
        self._leading = leading
        self._versions: dict[str, str] = {}  # slice name -> its last known resourceVersion
        self._count = threading.Lock()
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="peerslice-write")
        self.written = 0  # calls that changed the store

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _wrote(self) -> None:
        with self._count:
            self.written += 1

    def _each(self, call: Callable[[_T], None], items: Iterable[_T]) -> None:
        """``call`` on every item, up to ``WORKERS`` at once; the first error goes up once all ended."""
        items = list(items)
        if len(items) <= 1:
            for item in items:
                call(item)
            return
        futures = [self._pool.submit(call, item) for item in items]
        errors = [e for e in (f.exception() for f in futures) if e is not None]
        if errors:
            raise errors[0]

    def _args(self) -> tuple[str, str, str]:
        return peerslice.GROUP, peerslice.VERSION, peerslice.PLURAL

    def _check(self) -> None:
        if not self._leading():
            raise NotLeading("the lease is lost: PeerSlices not written")

    def _keep(self, obj: Any) -> None:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if isinstance(meta, dict) and isinstance(meta.get("name"), str) and meta.get("resourceVersion"):
            self._versions[meta["name"]] = str(meta["resourceVersion"])

    def list(self) -> list[dict[str, Any]]:
        """Every PeerSlice object as the API server holds it (a new leader's book is made of them)."""
        body: Any = self._api.list_cluster_custom_object(*self._args(), _request_timeout=TIMEOUT)
        items = list(body.get("items") or [])
        self._versions.clear()
        for obj in items:
            self._keep(obj)
        return items

    def write(self, writes: Writes) -> None:
        self._each(self._create, writes.create)
        self._each(self._replace, writes.update)
        self._each(self._delete, writes.delete)
        log.info("PeerSlices: %d created, %d updated, %d deleted", len(writes.create), len(writes.update),
                 len(writes.delete))

    def _create(self, obj: dict[str, Any]) -> None:
        self._check()
        try:
            self._keep(self._api.create_cluster_custom_object(*self._args(), obj, _request_timeout=TIMEOUT))
        except self._api_exception as e:
            if _status(e) != 409:
                raise
            log.info("PeerSlice %s exists already: replacing it", obj["metadata"]["name"])
            self._replace(obj, reread=True)
            return
        self._wrote()

    def _replace(self, obj: dict[str, Any], reread: bool = False) -> None:
        name = obj["metadata"]["name"]
        for _attempt in range(3):
            self._check()
            if reread or name not in self._versions:
                try:
                    self._keep(self._api.get_cluster_custom_object(*self._args(), name, _request_timeout=TIMEOUT))
                except self._api_exception as e:
                    if _status(e) != 404:
                        raise
                    self._versions.pop(name, None)
                    self._create(obj)
                    return
            body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": self._versions[name]}}
            self._check()
            try:
                self._keep(self._api.replace_cluster_custom_object(*self._args(), name, body,
                                                                   _request_timeout=TIMEOUT))
            except self._api_exception as e:
                if _status(e) == 404:
                    self._versions.pop(name, None)
                    self._create(obj)
                    return
                if _status(e) != 409:
                    raise
                log.info("PeerSlice %s changed under us: reading it again", name)
                reread = True
                continue
            self._wrote()
            return
        raise RuntimeError(f"PeerSlice {name}: changed by someone else at every try")

    def _delete(self, name: str) -> None:
        self._check()
        try:
            self._api.delete_cluster_custom_object(*self._args(), name, _request_timeout=TIMEOUT)
        except self._api_exception as e:
            if _status(e) != 404:
                raise
        else:
            self._wrote()
        self._versions.pop(name, None)
