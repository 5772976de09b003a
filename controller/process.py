"""What the leader runs (:func:`lead`): list the PeerSlices as they are, start the watches, wait
until every resource has listed (fail closed), then step the loop (:mod:`.sync`) on every change
until told to stop or the lease is lost."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .sources import reflectors
from .sync import Sync, run
from .writer import NotLeading, SliceWriter

log = logging.getLogger(__name__)
LIST_WAIT = 10.0  # seconds between log lines while a resource has not listed


def lead(api_client: Any, leading: Callable[[], bool], stop: threading.Event | None = None,
         wake: threading.Event | None = None, max_pods: int | None = None, by_subscription: bool = False) -> None:
    """Lead until ``stop`` is set (with ``wake``, to end a wait) or :class:`NotLeading`."""
    stop = stop or threading.Event()
    wake = wake or threading.Event()
    writer = SliceWriter(api_client, leading)
    try:
        objects = writer.list()
    except Exception as e:
        writer.close()
        if getattr(e, "status", None) == 404:
            log.error("the API server serves no PeerSlices: apply deploy/crds/ferry.io_peerslices.yaml")
        raise
    log.info("leading: %d PeerSlices as they are", len(objects))
    feeds, started = reflectors(api_client, wake.set)
    for r in started:
        r.start()
    try:
        for r in started:
            while not r.synced.wait(LIST_WAIT):
                if stop.is_set():
                    return
                log.info("waiting for the %ss to list: nothing written until then", r.kind)
        if stop.is_set() or not leading():
            return
        sync = Sync(feeds, objects, writer.write, max_pods, by_subscription)
        log.info("every resource listed: writing what differs")
        run(sync, wake, stop)
    except NotLeading as e:
        log.error("%s", e)
    finally:
        for r in started:
            r.stop()
        writer.close()
