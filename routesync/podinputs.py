"""What decides the Node's running Pods (``cni.pipeline.podnet.PodInputs``), kept across passes
so that a Node change costs what it changes.

``podnet.pod_inputs`` reduces every peer's Pod CIDR (the state's ``clusterCIDRs``: 5,000 at
5,000 Nodes) to the few prefixes a Pod routes: O(peers log peers) a pass, where a Node added,
removed or re-addressed inside the configured cluster CIDR changes nothing a Pod holds.  The
planner knows what came into the cluster set and what left it (``model.ClusterChanges``, from
the very tuple this kept its reduction of): a CIDR inside a prefix the last reduction kept, and
that did not leave, is covered before and after, so the reduction stands.  Anything else (no
changes known, this Node's own CIDRs, a CIDR outside every kept prefix) reduces again.

The reference is ``podnet.pod_inputs(state)`` itself: ``tests/routesync/test_podinputs.py``
holds the two equal over random sequences of cluster sets."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cni.lean import addr
from cni.pipeline import podnet

if TYPE_CHECKING:
    from cni.node.nodestate import NodeState

    from .model import ClusterChanges


def _span(cidr: str) -> tuple[int, int, int]:
    """(family bits, first address, last address) of ``cidr``."""
    value, plen, bits = addr.parse_cidr(cidr)
    first = addr.network(value, plen, bits)
    return bits, first, first | ((1 << (bits - plen)) - 1)


def _covered(cidr: str, prefixes: list[tuple[int, int, int]]) -> bool:
    bits, first, last = _span(cidr)
    return any(b == bits and f <= first and last <= lst for b, f, lst in prefixes)


class PodInputsTracker:
    """``podnet.pod_inputs`` of each pass's state, the cluster reduction kept while the planner's
    cluster changes stay inside it (see the module)."""

    def __init__(self) -> None:
        self._from: tuple[str, ...] | None = None  # the cluster tuple the reduction is of
        self._local: tuple[str, ...] = ()  # the Node's Pod CIDRs it was reduced with
        self._cluster: tuple[str, ...] = ()  # that reduction
        self.reductions = 0  # how often every peer's CIDRs were reduced (a full pass, a change outside)

    def inputs(self, state: NodeState, cluster: tuple[str, ...], changes: ClusterChanges | None) -> podnet.PodInputs:
        """``podnet.pod_inputs(state)``; ``cluster``: the plan's cluster tuple (``state.clusterCIDRs``
        is a list of it), ``changes``: what it gained and lost since the tuple it was made from
        (None: unknown)."""
        local = tuple(state.podCIDRs)
        if self._from is None or local != self._local or not self._stands(cluster, changes):
            self._cluster = tuple(podnet.aggregate(list(cluster), list(local)))
            self.reductions += 1
        self._from, self._local = cluster, local
        return podnet.pod_inputs(state, self._cluster)

    def _stands(self, cluster: tuple[str, ...], changes: ClusterChanges | None) -> bool:
        if cluster is self._from:
            return True
        if changes is None or changes.since is not self._from:
            return False
        left = {addr.canonical_network(c) for c in changes.removed}
        kept = [_span(c) for c in self._cluster if c not in left]
        kept += [_span(c) for c in self._local]
        return all(_covered(c, kept) for c in (*changes.added, *changes.removed))
