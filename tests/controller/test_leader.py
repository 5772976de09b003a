"""The Lease (controller/leader.py) over the recording API server of test_rbac: taken, renewed,
held against another candidate; an API server that cannot be reached is a failed try (the library
tries again after its retry period, and a leader that cannot renew stops leading), not an exception
that ends the process's election."""

from __future__ import annotations

from typing import Any

import urllib3

from controller import leader
from tests.controller.test_rbac import ApiServer, api_client


class Unreachable(ApiServer):
    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if self.down:
            raise urllib3.exceptions.MaxRetryError(None, url, OSError("connection refused"))  # type: ignore[arg-type]
        return super().request(method, url, *args, **kwargs)


def nothing() -> None:
    return None


def test_the_lease_is_taken_renewed_and_held_and_an_unreachable_server_is_a_failed_try() -> None:
    server = Unreachable()
    me = leader.election(api_client(server), "kube-system", "ferry-controller", "me", nothing, nothing)
    other = leader.election(api_client(server), "kube-system", "ferry-controller", "other", nothing, nothing)
    server.down = True
    assert me.try_acquire_or_renew() is False  # not taken, and no exception
    server.down = False
    assert me.try_acquire_or_renew() is True
    lease = server.of("coordination.k8s.io", "leases")["ferry-controller"]
    assert lease["spec"]["holderIdentity"] == "me" and lease["spec"]["leaseDurationSeconds"] == 15
    assert other.try_acquire_or_renew() is False
    server.down = True
    assert me.try_acquire_or_renew() is False  # a renewal that cannot reach the server fails
    server.down = False
    assert me.try_acquire_or_renew() is True
    assert server.of("coordination.k8s.io", "leases")["ferry-controller"]["spec"]["holderIdentity"] == "me"
