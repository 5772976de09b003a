"""The groups a Node subscribes to, told from what the Node watches itself (issue 46, delivery of
PeerSlices by subscription: ``docs/design/peerslices.md``).  Pure.

With ``policyPeers: peerSlices`` egress is judged at its source (the planners' ``remote_egress``
off), and every term of :mod:`.spanindex` is ``NODES S→T``: the members of group T are read on the
Nodes where group S has a member.  So Node X reads T exactly when some policy names T as a peer of
a group S that holds one of X's own Pods, and that X's route-sync can tell from its own Pods, the
Namespaces and the policies, all of which it watches anyway.  It then asks the API server for T's
slices by name (:func:`.peerslice.group_selectors`), and the controller labels a slice with its
group alone (:data:`.peerslice.SUBSCRIBERS`): a change of which Nodes read a group, the event that
relabels every slice of the group when the slices carry their audience, writes nothing.

- :func:`subscribed`: the reference, from :func:`.spanindex.group_views` over the whole cluster
  (what the controller computes): the groups whose reach holds the Node.
- :class:`Subscriptions`: the same from the Node's own Pods only, event by event
  (``tests/routesync/policy/test_subscription.py`` holds the two equal on random clusters)."""

from __future__ import annotations

from collections.abc import Sequence

from .cnp.model import ClusterPolicy
from .model import Pod, Policy
from .peerslice import group_name
from .plan import Inputs
from .relevance import Labels
from .spanindex import SpanIndex, group_views


def subscribed(node: str, inputs: Inputs, tiers: Sequence[ClusterPolicy] = ()) -> frozenset[str]:
    """The names of the groups ``node`` reads, as the controller sees them: those whose reach
    (egress judged at its source) holds ``node``."""
    return frozenset(group_name(g) for g, view in group_views(inputs, tiers, remote_egress=False).items()
                     if node in view.reach.nodes)


class Subscriptions:
    """:func:`subscribed` for one Node, kept event by event from what its route-sync watches: its
    own Pods, every Namespace, NetworkPolicy and ClusterNetworkPolicy.  A Pod of another Node (one
    that moved away) counts as deleted.  Events are taken as the watches deliver them (the last
    delivery wins, a delete of what is not there is nothing), as :class:`.spanindex.SpanIndex` takes them;
    its index holds only this Node's Pods, so each event costs what :class:`SpanIndex` does for it."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._index = SpanIndex(remote_egress=False)
        self._groups: set[str] = set()
        self._added: set[str] = set()
        self._removed: set[str] = set()

    def upsert_pod(self, pod: Pod) -> None:
        if pod.node == self.node:
            self._index.upsert_pod(pod)
        else:
            self._index.delete_pod(pod.key)

    def delete_pod(self, key: str) -> None:
        self._index.delete_pod(key)

    def upsert_namespace(self, name: str, labels: Labels) -> None:
        self._index.upsert_namespace(name, labels)

    def delete_namespace(self, name: str) -> None:
        self._index.delete_namespace(name)

    def upsert_policy(self, policy: Policy) -> None:
        self._index.upsert_policy(policy)

    def delete_policy(self, key: str) -> None:
        self._index.delete_policy(key)

    def upsert_cluster_policy(self, cp: ClusterPolicy) -> None:
        self._index.upsert_cluster_policy(cp)

    def delete_cluster_policy(self, name: str) -> None:
        self._index.delete_cluster_policy(name)

    def groups(self) -> frozenset[str]:
        """The groups this Node subscribes to now."""
        self._sync()
        return frozenset(self._groups)

    def take_changes(self) -> tuple[frozenset[str], frozenset[str]]:
        """The groups subscribed to and unsubscribed from since the last call (a group that came
        and went in between is in neither)."""
        self._sync()
        added, removed = frozenset(self._added), frozenset(self._removed)
        self._added, self._removed = set(), set()
        return added, removed

    def _sync(self) -> None:
        self._index.drop_span_changes()  # this Node's spans are nobody's business here
        for g, view in self._index.take_group_changes().items():
            name = group_name(g)
            if view is not None and self.node in view.reach.nodes:
                if name not in self._groups:
                    self._groups.add(name)
                    if name in self._removed:
                        self._removed.discard(name)
                    else:
                        self._added.add(name)
            elif name in self._groups:
                self._groups.discard(name)
                if name in self._added:
                    self._added.discard(name)
                else:
                    self._removed.add(name)
