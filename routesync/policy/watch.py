"""The cluster's Pods, Namespaces and NetworkPolicies, watched for route-sync's policy planner
(and its ClusterNetworkPolicies, with the Nodes a ``nodes`` peer names: :meth:`tier_objects`).

Four :class:`routesync.sources.reflector.Reflector` caches (``pods``, ``namespaces``,
``networkpolicies``, cluster-wide: a rule's peers may be any Pod; ``servicecidrs``, the
addresses OVS hands to kube-proxy unjudged, :meth:`service_cidrs`).  ``changed`` is set on every
change; :meth:`inputs` hands the planner one consistent-enough snapshot and the generations it
was taken at, so the daemon re-plans policy only when one of them moved; :meth:`changes` hands
over only the objects that changed since the last call (the Reflectors' journals), which the
incremental planner applies (:mod:`.node`, :class:`.incremental.Changes`).  Until all three have
listed once, :meth:`inputs` raises :class:`SourceError`: route-sync must not plan "no policies"
from an empty cache (that would open every isolated Pod while it starts).

With ``peer_slices_for`` (route-sync's ``policyPeers: peerSlices``, ``docs/design/scale.md``)
``pods`` is not a watch of every Pod but a :class:`.podview.MergedPods` of this Node's own Pods
(a watch with the field selector ``spec.nodeName=<node>``) and the Pods of the PeerSlices
labelled for it (one watch per selector of :func:`.peerslice.node_selectors`); the planners
take it as they take the watch of every Pod.  Until the own watch and every slice watch have
listed, and while the API server serves no PeerSlices (the CRD not installed: looked for again
every 30 s), :meth:`inputs` raises :class:`SourceError` too: the remote Pods are not known.
Beside its own label, the Node asks for the slices of the groups it reads by their names
(delivery by subscription, ``ferry-controller --delivery subscription``): the groups told from
its own Pods, the Namespaces and the policies (:class:`SubscriptionTaps`), the watches kept by
:func:`.groupwatches.plan`, each pass; a slice is in one delivery's watches only (its labels), so
either controller delivery is read, and none twice."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from ..sources.base import SourceError
from ..sources.reflector import Reflector
from . import groupwatches, peerslice
from .cnp import model as cnp
from .cnp.model import ClusterPolicy, NodeInfo
from .incremental import Changes, Labels
from .model import Pod, Policy, namespace_from, pod_from, policy_from, service_cidrs_from
from .plan import Inputs
from .podview import MergedPods
from .subscription import Subscriptions

SYNC_TIMEOUT = 10.0  # seconds a pass waits for the first lists
CRD_RETRY = 30.0  # seconds between looks for a CRD the API server does not serve yet


def slice_pods(obj: dict[str, Any]) -> tuple[Pod, ...]:
    """A PeerSlice object → the Pods it holds; :class:`.peerslice.SliceError` (a ``ValueError``:
    the Reflector skips the object with a warning naming it) when it cannot be read."""
    return peerslice.from_object(obj).spec.pods


class SubscriptionTaps:
    """A Node's :class:`.subscription.Subscriptions`, told each change of its own Pods, the
    Namespaces, NetworkPolicies and ClusterNetworkPolicies by their Reflectors' taps (on the watch
    threads: hence the lock), read by the pass (:meth:`groups`)."""

    def __init__(self, node: str) -> None:
        self._subs = Subscriptions(node)
        self._lock = threading.Lock()

    def own_pod(self, key: str, pod: Pod | None) -> None:
        with self._lock:
            if pod is None:
                self._subs.delete_pod(key)
            else:
                self._subs.upsert_pod(pod)

    def namespace(self, key: str, value: tuple[str, Labels] | None) -> None:
        with self._lock:
            if value is None:
                self._subs.delete_namespace(key)
            else:
                self._subs.upsert_namespace(*value)

    def policy(self, key: str, policy: Policy | None) -> None:
        with self._lock:
            if policy is None:
                self._subs.delete_policy(key)
            else:
                self._subs.upsert_policy(policy)

    def cluster_policy(self, key: str, cp: ClusterPolicy | None) -> None:
        with self._lock:
            if cp is None:
                self._subs.delete_cluster_policy(key)
            else:
                self._subs.upsert_cluster_policy(cp)

    def groups(self) -> frozenset[str]:
        with self._lock:
            return self._subs.groups()


class PolicySource:
    def __init__(self, api_client: Any, on_change: Callable[[], None] | None = None,
                 peer_slices_for: str | None = None) -> None:
        """``peer_slices_for``: this Node's name, to receive only its own Pods and its PeerSlices'
        (``policyPeers: peerSlices``); None: every Pod of the cluster."""
        from kubernetes import client

        self.changed = threading.Event()
        self._on_change = on_change
        core, net = client.CoreV1Api(api_client), client.NetworkingV1Api(api_client)
        custom = client.CustomObjectsApi(api_client)
        self._api_client = api_client
        self.pods: Reflector[Pod] | MergedPods
        # what must have listed before a plan (the Pods' sources: the one watch, or own + slices)
        self.pod_sources: tuple[Reflector[Any], ...]
        self.peer_slices: tuple[Reflector[tuple[Pod, ...]], ...] = ()
        # delivery by subscription: the groups this Node reads, and one watch per group set asked for
        self.subscriptions: SubscriptionTaps | None = None
        self.group_watches: dict[int, tuple[frozenset[str], Reflector[tuple[Pod, ...]]]] = {}
        self._next_watch = 0
        self._planned = False  # the first plan waits for the group watches of its start
        self._list_slices = functools.partial(custom.list_cluster_custom_object, peerslice.GROUP, peerslice.VERSION,
                                              peerslice.PLURAL)
        taps = self.subscriptions = SubscriptionTaps(peer_slices_for) if peer_slices_for is not None else None
        if peer_slices_for is None:
            self.pods = Reflector("Pod", core.list_pod_for_all_namespaces, pod_from, self._changed, journal=True)
            self.pod_sources = (self.pods,)
        else:
            own: Reflector[Pod] = Reflector(
                "Pod", functools.partial(core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName="
                                         f"{peer_slices_for}"), pod_from, self._changed, journal=True,
                tap=taps.own_pod if taps else None)
            self.peer_slices = tuple(self._slice_watch(s) for s in peerslice.node_selectors(peer_slices_for))
            self.pods = MergedPods(own, self.peer_slices)
            sources: list[Reflector[Any]] = [own]
            sources.extend(self.peer_slices)
            self.pod_sources = tuple(sources)
        self.namespaces: Reflector[tuple[str, Labels]] = Reflector(
            "Namespace", core.list_namespace, namespace_from, self._changed, journal=True,
            tap=taps.namespace if taps else None)
        self.policies: Reflector[Policy] = Reflector(
            "NetworkPolicy", net.list_network_policy_for_all_namespaces, policy_from, self._changed, journal=True,
            tap=taps.policy if taps else None)
        # the Service CIDRs, from the cluster (an IPv6 one is not in any manifest's default)
        self.service_cidr_objects: Reflector[tuple[str, ...]] = Reflector(
            "ServiceCIDR", net.list_service_cidr, service_cidrs_from, self._changed)
        # the administrator's tiers (the CRD may come later: looked for again every 30 s), and the
        # Nodes, which only a ClusterNetworkPolicy's ``nodes`` peer reads (watched from its first)
        self.cluster_policies: Reflector[ClusterPolicy] = Reflector(
            "ClusterNetworkPolicy", functools.partial(custom.list_cluster_custom_object, cnp.GROUP, cnp.VERSION,
                                                      cnp.PLURAL), cnp.cluster_policy_from, self._changed,
            unserved_retry=CRD_RETRY, tap=taps.cluster_policy if taps else None)
        self.nodes: Reflector[NodeInfo] = Reflector("Node", core.list_node, cnp.node_info_from, self._changed)
        self._all = (self.pods, self.namespaces, self.policies, self.service_cidr_objects, self.cluster_policies,
                     self.nodes)

    def _slice_watch(self, selector: str) -> Reflector[tuple[Pod, ...]]:
        return Reflector("PeerSlice", functools.partial(self._list_slices, label_selector=selector), slice_pods,
                         self._changed, journal=True, unserved_retry=CRD_RETRY)

    def _follow_subscriptions(self) -> None:
        """The group watches brought to the groups this Node subscribes to
        (:func:`.groupwatches.plan`); the first plan waits for the watches of its start, a later
        one plans without a group whose watch has not listed yet (its peers not known: denied)."""
        if self.subscriptions is None or not isinstance(self.pods, MergedPods):
            return
        if not self.cluster_policies.synced.wait(timeout=SYNC_TIMEOUT):
            raise SourceError("Kubernetes ClusterNetworkPolicies not listed yet: policy not planned")
        watches = [groupwatches.Watch(i, groups, r.synced.is_set() and not r.unserved.is_set())
                   for i, (groups, r) in self.group_watches.items()]
        p = groupwatches.plan(watches, self.subscriptions.groups())
        for i in p.close:
            del self.group_watches[i]
        for groups in p.open:
            (selector,) = peerslice.group_selectors(groups, per_selector=len(groups))
            self.group_watches[self._next_watch] = (groups, self._slice_watch(selector))
            self._next_watch += 1
        if p.open or p.close:
            self.pods.set_extra([r for _g, r in self.group_watches.values()])
            logging.getLogger(__name__).info(
                "PeerSlices by subscription: %d groups asked for in %d watches (%d opened, %d closed)",
                len(frozenset().union(*(g for g, _r in self.group_watches.values()))), len(self.group_watches),
                len(p.open), len(p.close))
        if not self._planned:
            for _groups, gw in self.group_watches.values():
                if not gw.synced.wait(timeout=SYNC_TIMEOUT):
                    raise SourceError("PeerSlices of this Node's groups not listed yet: policy not planned")

    def _changed(self) -> None:
        self.changed.set()
        if self._on_change is not None:
            self._on_change()

    def start(self) -> None:
        for r in self._all:
            if r is not self.nodes:
                r.start()

    def reconnect(self) -> None:
        """Each watch opened again (``routesync.sources.base.NodeSource.reconnect``)."""
        for r in (*self.pod_sources, *(r for _g, r in self.group_watches.values()), *self._all[1:]):
            r.reconnect()

    def close(self) -> None:
        for r in self._all:
            r.stop()
        self._api_client.close()

    def generation(self) -> tuple[int, int, int]:
        return (self.pods.generation, self.namespaces.generation, self.policies.generation)

    def _synced(self) -> None:
        self.start()
        for r in (*self.pod_sources, self.namespaces, self.policies):
            if not r.synced.wait(timeout=SYNC_TIMEOUT):
                raise SourceError(f"Kubernetes {r.kind}s not listed yet: policy not planned")
        for r in self.peer_slices:
            if r.unserved.is_set():
                raise SourceError(f"the API server serves no {peerslice.KIND}s (policyPeers: peerSlices needs "
                                  f"the CRD {peerslice.PLURAL}.{peerslice.GROUP} and ferry-controller): policy "
                                  "not planned")
        self._follow_subscriptions()
        self._planned = True
        self.changed.clear()

    def inputs(self) -> tuple[tuple[int, int, int], Inputs]:
        """Everything, as of now (what changed before is handed over too: :meth:`changes`
        starts again from here)."""
        gen, _changes, inputs = self.inputs_and_changes()
        return gen, inputs

    def inputs_and_changes(self) -> tuple[tuple[int, int, int], Changes, Inputs]:
        """What changed since the last call and everything, each resource at one instant."""
        self._synced()
        gp, cp, pods = self.pods.drain(snapshot=True)
        gn, cn, namespaces = self.namespaces.drain(snapshot=True)
        gpol, cpol, policies = self.policies.drain(snapshot=True)
        assert pods is not None and namespaces is not None and policies is not None
        inputs = Inputs(tuple(sorted(pods, key=lambda p: p.key)), dict(namespaces),
                        tuple(sorted(policies, key=lambda p: p.key)))
        return (gp, gn, gpol), Changes(cp, {k: v[1] if v is not None else None for k, v in cn.items()}, cpol), inputs

    def changes(self) -> tuple[tuple[int, int, int], Changes]:
        """The objects that changed since the last call (or :meth:`inputs`), by key."""
        self._synced()
        gp, cp, _ = self.pods.drain()
        gn, cn, _ = self.namespaces.drain()
        gpol, cpol, _ = self.policies.drain()
        return (gp, gn, gpol), Changes(cp, {k: v[1] if v is not None else None for k, v in cn.items()}, cpol)

    def tier_generation(self) -> tuple[int, int]:
        return (self.cluster_policies.generation, self.nodes.generation)

    def tier_objects(self) -> tuple[tuple[int, int], tuple[ClusterPolicy, ...], tuple[NodeInfo, ...]]:
        """The ClusterNetworkPolicies and, when one has a ``nodes`` peer, the Nodes.  Raises
        :class:`SourceError` until they are listed (an Admin Deny not known yet must not allow)."""
        r = self.cluster_policies
        r.start()
        if not r.synced.wait(timeout=SYNC_TIMEOUT):
            raise SourceError("Kubernetes ClusterNetworkPolicies not listed yet: policy not planned")
        _g, policies = r.snapshot()
        nodes: list[NodeInfo] = []
        if any(p.nodes is not None for c in policies for rule in c.egress for p in rule.peers or ()):
            self.nodes.start()
            if not self.nodes.synced.wait(timeout=SYNC_TIMEOUT):
                raise SourceError("Kubernetes Nodes not listed yet: ClusterNetworkPolicy not planned")
            _g, nodes = self.nodes.snapshot()
        return (self.tier_generation(), tuple(sorted(policies, key=lambda p: p.name)),
                tuple(sorted(nodes, key=lambda n: n.name)))

    def service_cidrs(self, configured: tuple[str, ...]) -> tuple[str, ...]:
        """Every CIDR of the cluster's ServiceCIDR objects (those being deleted too: their
        addresses may still be in use); ``configured`` (route-sync's ``serviceCIDRs``) only
        when the API server serves no ServiceCIDRs.  Raises :class:`SourceError` until they
        are listed: egress to a Service CIDR not known yet would be judged on the ClusterIP."""
        r = self.service_cidr_objects
        r.start()
        if not r.synced.wait(timeout=SYNC_TIMEOUT):
            raise SourceError("Kubernetes ServiceCIDRs not listed yet: policy not planned")
        if r.unserved.is_set():
            return configured
        _gen, items = r.snapshot()
        return tuple(sorted({c for cidrs in items for c in cidrs}))
