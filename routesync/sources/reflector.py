"""List + watch of one Kubernetes resource into a cache, the way client-go's reflector does it.

* list, remember ``metadata.resourceVersion``, replace the cache;
* watch from that version with bookmarks; ADDED/MODIFIED/DELETED update the cache, BOOKMARK
  only advances the version;
* a watch that ends or breaks is opened again from the last version seen, after exponential
  backoff (0.2 s doubling to 30 s) when it failed; 410 Gone forces a re-list at once; a failed
  list or a refused watch waits with the same backoff and re-lists; a first list answered 404
  (a resource this API server does not serve, e.g. ServiceCIDRs before Kubernetes 1.33) sets
  ``unserved`` (and ``synced``: what there is to know is known) and ends the reflector, or, with
  ``unserved_retry``, lists again that often (a CRD installed later is followed).

Objects are kept as what ``parse`` makes of their JSON (``return_type=object``: the client's
model classes cost far more than the few fields Ferry reads); ``parse`` returning None drops an
object, raising ``ValueError`` skips it with a warning.  ``on_change`` runs (on the watch
thread) after every change to the cache, and only then: an event whose object parses to what the
cache holds already (a Pod's status conditions, a Node's heartbeat) moves nothing, so route-sync
does not plan again for fields it does not read (``unchanged`` counts them).

With ``journal`` on, every change is also noted by key (its value now; None: gone), a re-list
by the keys whose value it changed: :meth:`drain` hands them over, so a consumer that keeps its
own state (the incremental policy planner) applies what moved, not the whole cache.  A ``tap``
is told the same notes as they happen (on the watch thread, under the cache's lock): a second
consumer that keeps its own state (a Node's group subscriptions) without draining the journal."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
BACKOFF_MIN, BACKOFF_MAX = 0.2, 30.0
WATCH_TIMEOUT = 300  # seconds; the server closes the watch, we resume from the last version


def object_key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class Reflector(Generic[T]):
    def __init__(self, kind: str, list_fn: Callable[..., Any], parse: Callable[[dict[str, Any]], T | None],
                 on_change: Callable[[], None] | None = None, journal: bool = False,
                 unserved_retry: float | None = None, tap: Callable[[str, T | None], None] | None = None) -> None:
        self.kind = kind
        self.tap = tap  # told each change by key, under the lock, as the journal notes it
        # a resource a CRD brings (ClusterNetworkPolicies): unserved, listed again every that many
        # seconds, so that the CRD installed later is followed (None: an unserved resource ends it)
        self.unserved_retry = unserved_retry
        self.list_fn = list_fn
        self.parse = parse
        self.on_change = on_change
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self.unserved = threading.Event()  # the list answered 404: the API server has no such resource
        self._stop = threading.Event()
        self.items: dict[str, T] = {}
        self.generation = 0  # counts changes to ``items``
        self._journal: dict[str, T | None] | None = {} if journal else None  # key -> value now, since drain()
        self.resource_version: str | None = None
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        self._reconnecting = False  # reconnect() ended the watch: resume at once, no error
        self.relists = 0
        self.reconnects = 0  # watches ended by reconnect() and opened again
        self.errors = 0  # failed lists and watches (a 410 is not one)
        self.expired = 0  # watches answered 410 Gone
        self.unchanged = 0  # events that left the cache as it was (nothing Ferry reads moved)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"kube-{self.kind}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._break_watch()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def reconnect(self) -> None:
        """End the watch now and watch again from the version it reached (no re-list): its
        connection may have been opened before the Node's uplink moved onto the bridge, after
        which the server's events stalled in it until the server gave up (~15 s)."""
        if self._watch is None:
            return
        self._reconnecting = True
        self._break_watch()

    def _break_watch(self) -> None:
        w = self._watch
        if w is not None:
            w.stop()
            resp = getattr(w, "_resp", None)
            if resp is not None and hasattr(resp, "shutdown"):  # urllib3 >= 2.3: unblock the read
                try:
                    resp.shutdown()
                except Exception:  # noqa: BLE001, S110
                    pass

    def snapshot(self) -> tuple[int, list[T]]:
        with self.lock:
            return self.generation, list(self.items.values())

    def drain(self, snapshot: bool = False) -> tuple[int, dict[str, T | None], list[T] | None]:
        """The generation, what changed since the last drain (key -> value now, None: gone;
        empty without ``journal``) and, with ``snapshot``, every item, all at one instant."""
        with self.lock:
            changes: dict[str, T | None] = {}
            if self._journal is not None:
                changes, self._journal = self._journal, {}
            return self.generation, changes, list(self.items.values()) if snapshot else None

    def _note(self, key: str) -> None:
        if self._journal is not None:
            self._journal[key] = self.items.get(key)
        if self.tap is not None:
            self.tap(key, self.items.get(key))

    def _store(self, obj: dict[str, Any], into: dict[str, T]) -> bool:
        """``obj`` parsed into ``into``; whether that changed ``into``."""
        key = object_key(obj)
        try:
            value = self.parse(obj)
        except (ValueError, TypeError) as e:
            log.warning("kube: skipping %s %s: %s", self.kind, key, e)
            value = None
        if value is None:
            return into.pop(key, None) is not None
        if key in into and into[key] == value:
            return False
        into[key] = value
        return True

    def _changed(self) -> None:
        self.generation += 1
        if self.on_change is not None:
            self.on_change()

    def _relist(self) -> None:
        resp: Any = self.list_fn(_preload_content=False, _request_timeout=30)
        body = json.loads(resp.data)
        items: dict[str, T] = {}
        for item in body.get("items") or []:
            self._store(item, items)
        with self.lock:
            before, self.items = self.items, items
            if self._journal is not None or self.tap is not None:
                for key in before.keys() | items.keys():
                    if before.get(key) != items.get(key):
                        self._note(key)
            self._changed()
        self.resource_version = body["metadata"]["resourceVersion"]
        self.relists += 1
        self.unserved.clear()
        self.synced.set()

    def _watch_once(self) -> int:
        """One watch until the server ends it; the number of events it carried."""
        from kubernetes import watch

        self._watch = w = watch.Watch(return_type=object)
        events = 0
        if self._stop.is_set():
            return events
        for ev in w.stream(self.list_fn, resource_version=self.resource_version, allow_watch_bookmarks=True,
                           timeout_seconds=WATCH_TIMEOUT, _request_timeout=WATCH_TIMEOUT + 30):
            if self._stop.is_set():
                break
            events += 1
            kind, obj = ev.get("type"), ev.get("raw_object") or {}
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if kind == "BOOKMARK":
                self.resource_version = rv or self.resource_version
                continue
            if kind not in ("ADDED", "MODIFIED", "DELETED"):
                continue
            with self.lock:
                key = object_key(obj)
                if kind == "DELETED":
                    moved = self.items.pop(key, None) is not None
                else:
                    moved = self._store(obj, self.items)
                if moved:
                    self._note(key)
                    self._changed()
                else:
                    self.unchanged += 1
            if rv:
                self.resource_version = rv
        return events

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        need_list = True
        backoff = BACKOFF_MIN
        while not self._stop.is_set():
            try:
                if need_list:
                    self._relist()
                    need_list = False
                started = time.monotonic()
                events = self._watch_once()
                if self._reconnect_done():
                    continue
                if events == 0 and time.monotonic() - started < 1.0:
                    # closed at once with nothing in it (a proxy, a server shutting down): not a
                    # loop that hammers the server, the same backoff as a failure
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)
                else:
                    backoff = BACKOFF_MIN
            except ApiException as e:
                if e.status == 410:
                    self.expired += 1
                    log.info("kube: watch version %s expired (410 Gone), re-listing %ss", self.resource_version,
                             self.kind)
                    need_list = True
                    continue
                if e.status == 404 and need_list and (not self.synced.is_set() or self.unserved.is_set()):
                    if not self.unserved.is_set():
                        log.info("kube: the API server serves no %ss", self.kind)
                    self.unserved.set()
                    self.synced.set()  # known: nothing to list
                    if self.unserved_retry is None:
                        return
                    self._stop.wait(self.unserved_retry)
                    continue
                self._fail(e, "re-listing")
                need_list = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
            except Exception as e:  # noqa: BLE001
                if self._stop.is_set():
                    break
                if self._reconnect_done():
                    continue
                self._fail(e, "re-listing" if need_list else f"watching again from version {self.resource_version}")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)

    def _reconnect_done(self) -> bool:
        """Whether the watch that just ended was ended by :meth:`reconnect` (then counted)."""
        if not self._reconnecting:
            return False
        self._reconnecting = False
        self.reconnects += 1
        log.info("kube: %s watch opened again from version %s", self.kind, self.resource_version)
        return True

    def _fail(self, e: BaseException, then: str) -> None:
        self.errors += 1
        log.warning("kube: %s list/watch failed (%s: %s); %s", self.kind, type(e).__name__, e, then)
