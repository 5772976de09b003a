"""Which remote Pods a Node's policy plans read: the contract under "a Node receives what
concerns it" (issue 46, ``docs/design/scale.md``).

A Node's NetworkPolicy plan (:func:`.plan.plan`) and ClusterNetworkPolicy plan
(:func:`.cnp.plan.plan`) read every Pod of the cluster, but only some of them change what they
compute.  :func:`reads` names those, for one Node, from the planners' own rules; :func:`spans`
computes the same relation the other way round (for each Pod, the Nodes that read it) in one
pass over the policies, as a controller publishing Pods to Nodes would.  Two properties hold,
and ``tests/routesync/policy/test_relevance.py`` checks both on random clusters:

- the Node's plans computed from its own Pods and the Pods :func:`reads` names equal, field for
  field and flow for flow, the plans computed from every Pod;
- ``spans(...)[pod]`` holds a Node exactly when ``reads(node, ...)`` holds the Pod.

What a Node reads (each Pod counted on the Nodes other than its own; its own Node watches it):

- **NetworkPolicy, a rule's peers**: a policy that selects a Pod on Node N reads, on N, the Pods
  its rules' pod peers pick, in each direction it isolates; an egress rule without ``to`` that
  names a port reads the Pods that have a container port of that name and protocol.
- **NetworkPolicy, a remote client's egress** (judged at the destination too): a policy that
  isolates egress reads its selected Pods on every Node that has a Pod.
- **ClusterNetworkPolicy**: its egress rules apply to every subject of the cluster, so a policy
  with egress rules reads its subjects, and its egress rules' pod peers, on every Node; its
  ingress rules' pod peers are read where it has a subject.

``remote_egress`` is the planners' flag (:attr:`.plan.NodeFacts.remote_egress`, route-sync's
``policyPeers: peerSlices`` sets it False).  False, egress is judged at its source only: the
remote client's row is gone, and a ClusterNetworkPolicy's egress rules apply to the Node's own
subjects, so their pod peers are read where it has a subject (as its ingress peers are) and its
subjects nowhere else.  No row is "everywhere" then.

A precondition, the API server's own invariant: every Pod's Namespace exists (admission refuses
a Pod in a missing namespace, and a Namespace goes only after its Pods).  A Pod whose Namespace
object a Node has not seen yet would be picked by a ``namespaceSelector: {}`` from the full
view and by nothing from a filtered one."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from . import selector as sel
from .cnp.model import ClusterPolicy, Selection
from .cnp.model import Rule as TierRule
from .model import Peer, Pod, Policy, Rule
from .plan import Inputs, PodIndex

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Span:
    """The Nodes that read a Pod: ``nodes``, and with ``everywhere`` every Node (the tiers'
    egress), or with ``populated`` every Node that has a Pod (a remote client's egress).  Never
    the Pod's own Node."""

    nodes: frozenset[str] = frozenset()
    everywhere: bool = False
    populated: bool = False

    def on(self, nodes_with_pods: Iterable[str], all_nodes: Iterable[str], own: str) -> frozenset[str]:
        """The span as a set of names, given the Nodes that have Pods and every known Node."""
        out = set(self.nodes)
        if self.everywhere:
            out.update(all_nodes)
        if self.populated:
            out.update(nodes_with_pods)
        out.discard(own)
        return frozenset(out)


def _pod_peers(rule_peers: Sequence[Peer] | None) -> list[Peer]:
    return [p for p in rule_peers or () if p.ip_block is None]


def _np_peer_pods(index: PodIndex, policy: Policy, rule: Rule, direction: str) -> Iterable[Pod]:
    """The Pods a NetworkPolicy rule's peers (or its named port's group) may pick."""
    for peer in _pod_peers(rule.peers):
        yield from index.peers(policy.namespace, peer)
    if direction == "egress" and rule.peers is None:
        named = {(p.port, p.protocol) for p in rule.ports if isinstance(p.port, str)}
        if named:
            for pods in index.by_ns.values():
                for pod in pods:
                    if any(pod.port_number(name, proto) is not None for name, proto in named):
                        yield pod


def _isolating_rules(policy: Policy) -> Iterable[tuple[str, Rule]]:
    if policy.isolates_ingress:
        for rule in policy.ingress:
            yield "ingress", rule
    if policy.isolates_egress:
        for rule in policy.egress:
            yield "egress", rule


def _cnp_selection_pods(index: PodIndex, s: Selection) -> list[Pod]:
    pod_sel = s.pods or sel.EVERYTHING
    return [p for ns in index.namespaces(s.namespaces) for p in index.in_namespace(ns, pod_sel)]


def _cnp_peer_pods(index: PodIndex, rules: Iterable[TierRule]) -> Iterable[Pod]:
    for rule in rules:
        for peer in rule.peers or ():
            if peer.pods is not None:
                yield from _cnp_selection_pods(index, peer.pods)


def reads(node: str, inputs: Inputs, tiers: Sequence[ClusterPolicy] = (), remote_egress: bool = True
          ) -> frozenset[str]:
    """The keys of the Pods on other Nodes that ``node``'s plans read (the reference: one Node
    at a time, the planners' conditions spelled out); ``remote_egress``: the planners' flag."""
    index = PodIndex(inputs.pods, inputs.namespaces, node)
    local = [p for p in inputs.pods if p.node == node]
    out: set[str] = set()
    for policy in inputs.policies:
        selected = index.in_namespace(policy.namespace, policy.pod_selector)
        if remote_egress and policy.isolates_egress and local:
            out.update(p.key for p in selected)
        if any(p.node == node for p in selected):
            for direction, rule in _isolating_rules(policy):
                out.update(p.key for p in _np_peer_pods(index, policy, rule, direction))
    for cp in tiers:
        subjects = _cnp_selection_pods(index, cp.subject)
        here = any(p.node == node for p in subjects)
        if remote_egress and cp.egress and subjects:
            out.update(p.key for p in subjects)
            out.update(p.key for p in _cnp_peer_pods(index, cp.egress))
        elif cp.egress and here:
            out.update(p.key for p in _cnp_peer_pods(index, cp.egress))
        if cp.ingress and here:
            out.update(p.key for p in _cnp_peer_pods(index, cp.ingress))
    out.difference_update(p.key for p in local)
    return frozenset(out)


def spans(inputs: Inputs, tiers: Sequence[ClusterPolicy] = (), remote_egress: bool = True) -> dict[str, Span]:
    """For every Pod that some Node reads, the Nodes that read it (one pass over the policies:
    each one's peers get the Nodes of the Pods it selects); ``remote_egress``: the planners' flag
    (False: no span is ``everywhere`` or ``populated``)."""
    index = PodIndex(inputs.pods, inputs.namespaces)
    nodes: dict[str, set[str]] = defaultdict(set)
    everywhere: set[str] = set()
    populated: set[str] = set()
    for policy in inputs.policies:
        selected = index.in_namespace(policy.namespace, policy.pod_selector)
        if not selected:
            continue
        if remote_egress and policy.isolates_egress:
            populated.update(p.key for p in selected)
        where = {p.node for p in selected}
        for direction, rule in _isolating_rules(policy):
            for p in _np_peer_pods(index, policy, rule, direction):
                nodes[p.key] |= where
    for cp in tiers:
        subjects = _cnp_selection_pods(index, cp.subject)
        if not subjects:
            continue
        where = {p.node for p in subjects}
        if cp.egress and remote_egress:
            everywhere.update(p.key for p in subjects)
            everywhere.update(p.key for p in _cnp_peer_pods(index, cp.egress))
        elif cp.egress:
            for p in _cnp_peer_pods(index, cp.egress):
                nodes[p.key] |= where
        if cp.ingress:
            for p in _cnp_peer_pods(index, cp.ingress):
                nodes[p.key] |= where
    out: dict[str, Span] = {}
    for pod in inputs.pods:
        k = pod.key
        if k in nodes or k in everywhere or k in populated:
            out[k] = Span(frozenset(nodes.get(k, ())) - {pod.node}, k in everywhere, k in populated)
    return out


def view(node: str, inputs: Inputs, keep: Iterable[str]) -> Inputs:
    """``inputs`` as the Node would hold them: its own Pods and the Pods ``keep`` names."""
    wanted = set(keep)
    return Inputs(tuple(p for p in inputs.pods if p.node == node or p.key in wanted), inputs.namespaces,
                  inputs.policies)


def per_node(spans_by_pod: Mapping[str, Span], pods: Iterable[Pod], all_nodes: Iterable[str]) -> dict[str, set[str]]:
    """``spans_by_pod`` turned around: Node -> the keys of the Pods it reads."""
    pods = list(pods)
    populated = {p.node for p in pods}
    known = set(all_nodes) | populated
    out: dict[str, set[str]] = {n: set() for n in known}
    node_of = {p.key: p.node for p in pods}
    for key, span in spans_by_pod.items():
        for n in span.on(populated, known, node_of[key]):
            out[n].add(key)
    return out
