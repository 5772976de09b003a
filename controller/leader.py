"""Leader election: one ferry-controller replica writes, by a ``coordination.k8s.io/v1`` Lease,
with the kubernetes client's own ``leaderelection`` (its ``LeaseLock``: the Lease is read, created
when missing, and updated to renew or take it over; client-go's scheme of a lease duration, a renew
deadline and a retry period).

On becoming leader ``lead(leading)`` runs in a thread; ``leading()`` turns False the moment the
renewals have failed for the renew deadline, before another candidate may take the Lease (the
lease duration is longer); :func:`elect` then returns 1 and the process exits: the Deployment
restarts it, and it stands again as a candidate."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timing:
    """Seconds, as client-go's defaults (the library wants whole seconds of at least 1)."""

    lease_duration: int = 15
    renew_deadline: int = 10
    retry_period: int = 2


def election(api_client: Any, namespace: str, name: str, identity: str, lead: Callable[[], None],
             lost: Callable[[], None], timing: Timing = Timing()) -> Any:
    """A ``kubernetes.leaderelection.leaderelection.LeaderElection`` on the Lease
    ``namespace/name`` through ``api_client``; ``lead`` runs when it leads, ``lost`` when it
    stops."""
    from kubernetes import client
    from kubernetes.leaderelection import electionconfig, leaderelection
    from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

    class Lock(LeaseLock):  # type: ignore[misc]
        """LeaseLock, with a request that failed on the way (the API server unreachable: not an
        ``ApiException``, which LeaseLock handles) counted as a failed try, as client-go does, and
        not as an exception that ends the election."""

        def get(self, name: str, namespace: str) -> tuple[bool, Any]:
            try:
                return super().get(name, namespace)  # type: ignore[no-any-return]
            except Exception as e:  # noqa: BLE001  # the library retries after retry_period
                log.warning("Lease %s/%s not read: %s", namespace, name, e)
                return False, e

        def create(self, name: str, namespace: str, election_record: Any) -> bool:
            try:
                return super().create(name, namespace, election_record)  # type: ignore[no-any-return]
            except Exception as e:  # noqa: BLE001
                log.warning("Lease %s/%s not created: %s", namespace, name, e)
                return False

        def update(self, name: str, namespace: str, updated_record: Any) -> bool:
            try:
                return super().update(name, namespace, updated_record)  # type: ignore[no-any-return]
            except Exception as e:  # noqa: BLE001
                log.warning("Lease %s/%s not updated: %s", namespace, name, e)
                return False

    lock = Lock(name, namespace, identity)
    lock.api_instance = client.CoordinationV1Api(api_client)  # not the default client's configuration
    cfg = electionconfig.Config(lock, timing.lease_duration, timing.renew_deadline, timing.retry_period, lead, lost)
    return leaderelection.LeaderElection(cfg)


def elect(api_client: Any, namespace: str, name: str, identity: str,
          lead: Callable[[Callable[[], bool]], None], timing: Timing = Timing()) -> int:
    """Stand as a candidate; lead while the Lease is ours; 1 once it is lost (or ``lead`` failed)."""
    lost = threading.Event()

    def leading() -> bool:
        return not lost.is_set()

    def stopped() -> None:
        lost.set()
        log.error("%s: no longer the leader (Lease %s/%s): stopping", identity, namespace, name)

    log.info("%s: candidate for Lease %s/%s", identity, namespace, name)
    try:
        election(api_client, namespace, name, identity, lambda: lead(leading), stopped, timing).run()
    finally:  # the library's loop also ends by an exception (the API server unreachable): no write after
        lost.set()
    return 1
