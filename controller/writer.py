"""The applier: :class:`controller.slices.Writes` onto the API server's PeerSlices (cluster-scoped,
``ferry.io/v1alpha1``), through ``CustomObjectsApi``.  Thin: what to write is decided elsewhere.

- Written in the order :class:`Writes` gives: creates, updates, deletes.
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
from collections.abc import Callable
from typing import Any

from routesync.policy import peerslice

from .slices import Writes

log = logging.getLogger(__name__)
TIMEOUT = 30  # seconds a request may take


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
        self.written = 0  # calls that changed the store

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
        for obj in writes.create:
            self._create(obj)
        for obj in writes.update:
            self._replace(obj)
        for name in writes.delete:
            self._delete(name)
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
        self.written += 1

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
            self.written += 1
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
            self.written += 1
        self._versions.pop(name, None)
