"""What ferry-controller watches: every Pod, Namespace, NetworkPolicy and ClusterNetworkPolicy of
the cluster, each a :class:`routesync.sources.reflector.Reflector` (list + watch) with its journal
on, parsed by route-sync's own model parsers (the controller reads the objects as the Nodes'
planners do).  Nodes are not watched: a span names Nodes only through the Pods on them
(:mod:`routesync.policy.relevance`), and a ClusterNetworkPolicy's ``nodes`` peer reads no Pod.

A resource the API server does not serve (ClusterNetworkPolicies before their CRD) counts as
listed and empty, and is looked for again every 30 s, as route-sync does."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from routesync.policy.cnp import model as cnp
from routesync.policy.cnp.model import ClusterPolicy
from routesync.policy.model import Pod, Policy, namespace_from, pod_from, policy_from
from routesync.sources.reflector import Reflector

Labels = tuple[tuple[str, str], ...]
T_co = TypeVar("T_co", covariant=True)
CRD_RETRY = 30.0  # seconds between looks for a CRD the API server does not serve yet


class Journal(Protocol[T_co]):
    """What the sync loop reads of a Reflector: whether it has listed, and its journal."""

    @property
    def synced(self) -> threading.Event: ...

    def drain(self, snapshot: bool = False) -> tuple[int, Mapping[str, T_co | None], Sequence[T_co] | None]: ...


@dataclass(frozen=True)
class Feeds:
    """The four watched resources (key -> parsed object; a Namespace as ``(name, labels)``)."""

    pods: Journal[Pod]
    namespaces: Journal[tuple[str, Labels]]
    policies: Journal[Policy]
    cluster_policies: Journal[ClusterPolicy]

    def all(self) -> tuple[Journal[Any], ...]:
        return (self.pods, self.namespaces, self.policies, self.cluster_policies)

    def listed(self) -> bool:
        """Every resource listed once (an unserved one counts: it holds nothing)."""
        return all(f.synced.is_set() for f in self.all())


def reflectors(api_client: Any, on_change: Callable[[], None]) -> tuple[Feeds, tuple[Reflector[Any], ...]]:
    """The Reflectors (not started) on ``api_client``, ``on_change`` run after every change of
    any of them; as :class:`Feeds` and as the tuple to start and stop."""
    from kubernetes import client

    core, net = client.CoreV1Api(api_client), client.NetworkingV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    pods: Reflector[Pod] = Reflector("Pod", core.list_pod_for_all_namespaces, pod_from, on_change, journal=True)
    namespaces: Reflector[tuple[str, Labels]] = Reflector("Namespace", core.list_namespace, namespace_from,
                                                          on_change, journal=True)
    policies: Reflector[Policy] = Reflector("NetworkPolicy", net.list_network_policy_for_all_namespaces,
                                            policy_from, on_change, journal=True)
    cluster_policies: Reflector[ClusterPolicy] = Reflector(
        "ClusterNetworkPolicy", functools.partial(custom.list_cluster_custom_object, cnp.GROUP, cnp.VERSION,
                                                  cnp.PLURAL), cnp.cluster_policy_from, on_change, journal=True,
        unserved_retry=CRD_RETRY)
    return Feeds(pods, namespaces, policies, cluster_policies), (pods, namespaces, policies, cluster_policies)
