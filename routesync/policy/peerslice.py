"""PeerSlices on the wire: the object ferry-controller writes and a Node's route-sync reads
(issue 46, ``docs/design/peerslices.md``), declared once for both.  Pure.

A slice holds up to ``MAX_PODS`` Pods (each as :func:`pod_to_entry`) of one *group*, a set of
Pods a policy names (:class:`~routesync.policy.spanindex.Group`, named by :func:`group_name`),
and carries the group's :class:`Audience`, the Nodes its
:class:`~routesync.policy.spanindex.GroupReach` is delivered to: the reach's Nodes, or, when it
is ``everywhere`` or ``populated``, every Node.  The audience is written on the slice as labels
(:func:`slice_labels`), and a Node's route-sync watches the slices with a label selector
(:func:`node_selectors`): the API server filters each watch in its watch cache, so a Node
receives only the slices labelled for it.  A Pod in several groups is in several slices; a Node
keys what it receives by Pod.  The controller's planning of them is ``controller/slices.py``."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from routesync.policy import selector as sel
from routesync.policy.model import NamedPort, Pod
from routesync.policy.spanindex import Group, GroupReach

GROUP = "ferry.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PeerSlice"
PLURAL = "peerslices"
# per slice (ferry-controller --max-pods); EndpointSlice takes 100, but a Pod is in several groups
# and each of its changes rewrites one slice of each (bench_scale --quick, 100 vs 20: Pod added p50
# 1.03 s vs 0.35 s, the API server's bytes the cause)
MAX_PODS = 20
MAX_PODS_LIMIT = 1000  # what the CRD admits (its pods' maxItems)

# The transport labels: a Node's route-sync selects by these (node_selectors), the API server filters by them.
NODE_LABEL_PREFIX = "span.ferry.io/"  # + node_label_name(node), value "": the slice is for that Node
SPAN_ALL_LABEL = "ferry.io/span-all"  # value "true": the slice is for every Node
SPAN_ALL_VALUE = "true"
GROUP_LABEL = "ferry.io/group"  # value: group_name, to find one group's slices
# value "subscription": the slice is for the Nodes that ask for its group (group_selectors); a Node
# watches these and its own label at once, so it reads either delivery, and none twice
DELIVERY_LABEL = "ferry.io/delivery"
DELIVERY_SUBSCRIPTION = "subscription"
DELIVERY_LABELS = "labels"  # the slice labelled with each Node of its audience (NODE_LABEL_PREFIX)
DELIVERIES = (DELIVERY_LABELS, DELIVERY_SUBSCRIPTION)  # ferry-controller's --delivery
# a Node subscribed to ~53 groups at 1,000 Nodes / 29,000 Pods / 3,000 policies (bench_spans): one
# selector of 100 names is ~1.8 KB of query string
GROUPS_PER_SELECTOR = 100
HASHED_NAME_PREFIX = "h-"  # a Node name that cannot be a label key's name: h-<sha256 prefix>

_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_NAME_HASH_CHARS = 32  # 128 bits: no two Node names of a cluster share one
_GROUP_HASH_CHARS = 16  # names and the group label


class SliceError(ValueError):
    """A PeerSlice (or one of its Pod entries) that cannot be read; the message names the field."""


@dataclass(frozen=True)
class Audience:
    """Who receives a slice: ``everyone`` (every Node), exactly ``nodes``, or (``subscribers``) the
    Nodes that ask for its group by name (:mod:`routesync.policy.subscription`), so that the
    slice names no Node and a change of who reads the group writes nothing."""

    nodes: frozenset[str] = frozenset()
    everyone: bool = False
    subscribers: bool = False

    def __post_init__(self) -> None:
        if (self.everyone + self.subscribers + bool(self.nodes)) > 1:
            raise ValueError("an audience is everyone, its subscribers or the Nodes it names: one of them")

    def receives(self, node: str, subscribed: Collection[str] = (), group: str = "") -> bool:
        """Whether ``node`` receives a slice of ``group`` with this audience, when it subscribes
        to the groups ``subscribed``."""
        return self.everyone or node in self.nodes or (self.subscribers and group in subscribed)


EVERYONE = Audience(everyone=True)
SUBSCRIBERS = Audience(subscribers=True)


def audience(reach: GroupReach, by_subscription: bool = False) -> Audience | None:
    """The Nodes a group's members are delivered to; None for a reach of no Node.  With
    ``by_subscription``, the Nodes that subscribe to the group, whichever they are."""
    if not reach.anywhere:
        return None
    if by_subscription:
        return SUBSCRIBERS
    if reach.everywhere or reach.populated:
        return EVERYONE
    return Audience(reach.nodes)


def _selector_doc(s: sel.Selector | None) -> list[list[Any]] | None:
    if s is None:
        return None
    return sorted([r.key, r.operator, sorted(r.values)] for r in s.requirements)


def group_name(g: Group) -> str:
    """A group's name on the wire (its slices are ``<name>-<n>``): a hash of its canonical form,
    the same in every process and version that reads groups alike."""
    doc = {"namespace": g.namespace, "namespaces": _selector_doc(g.namespaces), "pods": _selector_doc(g.pods),
           "ports": sorted(list(p) for p in g.ports)}
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return "g" + hashlib.sha256(canonical.encode()).hexdigest()[:_GROUP_HASH_CHARS]


def node_label_key(node: str) -> str:
    """The label that puts a slice in ``node``'s watch: ``span.ferry.io/<node>``, or, for a name
    that is no label key's name (longer than 63 characters, or not a qualified name) or that starts
    with ``h-`` (so a Node's own name never equals another's hash form),
    ``span.ferry.io/h-<sha256 prefix>``."""
    if len(node) <= 63 and _QUALIFIED_NAME.match(node) and not node.startswith(HASHED_NAME_PREFIX):
        return NODE_LABEL_PREFIX + node
    digest = hashlib.sha256(node.encode()).hexdigest()[:_NAME_HASH_CHARS]
    return f"{NODE_LABEL_PREFIX}{HASHED_NAME_PREFIX}{digest}"


def node_selectors(node: str) -> list[str]:
    """The label selectors ``node``'s route-sync watches PeerSlices with, one watch each (a
    selector cannot say "or"): the slices labelled for it, and the slices for every Node."""
    return [node_label_key(node), f"{SPAN_ALL_LABEL}={SPAN_ALL_VALUE}"]


def slice_labels(group: str, aud: Audience) -> dict[str, str]:
    """A slice's labels: its group's name, and who receives it (nothing more for its subscribers:
    they select it by its group's name, :func:`group_selectors`)."""
    labels = {GROUP_LABEL: group}
    if aud.subscribers:
        labels[DELIVERY_LABEL] = DELIVERY_SUBSCRIPTION
    if aud.everyone:
        labels[SPAN_ALL_LABEL] = SPAN_ALL_VALUE
    for node in aud.nodes:
        labels[node_label_key(node)] = ""
    return labels


def group_selectors(groups: Iterable[str], per_selector: int = GROUPS_PER_SELECTOR) -> list[str]:
    """The label selectors a Node watches the slices of ``groups`` with (delivery by subscription):
    ``ferry.io/delivery=subscription,ferry.io/group in (...)``, ``per_selector`` names to one,
    sorted so that a set of groups always asks alike."""
    if per_selector < 1:
        raise ValueError(f"per_selector {per_selector}: not at least 1")
    names = sorted(set(groups))
    return [f"{DELIVERY_LABEL}={DELIVERY_SUBSCRIPTION},{GROUP_LABEL} in ({','.join(names[i:i + per_selector])})"
            for i in range(0, len(names), per_selector)]


# -- label selectors as strings (what a watch's labelSelector parameter holds) --

_SET_REQUIREMENT = re.compile(r"^(\S+)\s+(in|notin)\s*\(([^()]*)\)$")


def _split_requirements(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def parse_selector(text: str) -> sel.Selector:
    """A label selector in its string form (``a``, ``!a``, ``a=b``, ``a==b``, ``a!=b``,
    ``a in (b,c)``, ``a notin (b,c)``, comma-separated, all of them); the empty string selects
    everything, as the API server reads it."""
    if not text.strip():
        return sel.EVERYTHING
    reqs = []
    for part in _split_requirements(text):
        m = _SET_REQUIREMENT.match(part)
        if m:
            values = frozenset(v.strip() for v in m.group(3).split(","))
            reqs.append(sel.Requirement(m.group(1), "In" if m.group(2) == "in" else "NotIn", values))
        elif part.startswith("!"):
            reqs.append(sel.Requirement(part[1:].strip(), "DoesNotExist"))
        elif "!=" in part:
            key, value = part.split("!=", 1)
            reqs.append(sel.Requirement(key.strip(), "NotIn", frozenset((value.strip(),))))
        elif "=" in part:
            key, value = part.split("==", 1) if "==" in part else part.split("=", 1)
            reqs.append(sel.Requirement(key.strip(), "In", frozenset((value.strip(),))))
        else:
            reqs.append(sel.Requirement(part, "Exists"))
    for r in reqs:
        if not r.key or any(c.isspace() or c in "=!(),<>" for c in r.key):
            raise sel.SelectorError(f"label selector {text!r}: {r.key!r} is not a label key")
    return sel.Selector(tuple(reqs))


def matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether an object with ``labels`` is in a watch with label selector ``selector``."""
    return parse_selector(selector).matches(labels)


# -- a Pod's entry in a slice --

def pod_to_entry(pod: Pod) -> dict[str, Any]:
    """The fields of :class:`Pod` as JSON; the labels as a map (a Pod's labels are sorted and
    unique, as :func:`routesync.policy.model.pod_from` makes them)."""
    return {"namespace": pod.namespace, "name": pod.name, "node": pod.node, "labels": dict(pod.labels),
            "ips": list(pod.ips), "ports": [{"name": p.name, "protocol": p.protocol, "number": p.number}
                                            for p in pod.ports]}


def _string(doc: Mapping[str, Any], key: str, where: str, required: bool = True) -> str:
    value = doc.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise SliceError(f"{where}.{key}: not a string")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise SliceError(f"{where}: not a list")
    return value


def pod_from_entry(entry: Any, where: str = "pod") -> Pod:
    """A slice's entry → :class:`Pod`; :class:`SliceError` naming the field (under ``where``)."""
    if not isinstance(entry, dict):
        raise SliceError(f"{where}: not an object")
    namespace, name = _string(entry, "namespace", where), _string(entry, "name", where)
    if not namespace or not name:
        raise SliceError(f"{where}: namespace and name must not be empty")
    node = _string(entry, "node", where)
    labels = entry.get("labels")
    labels = {} if labels is None else labels
    if not isinstance(labels, dict):
        raise SliceError(f"{where}.labels: not an object")
    for k, v in labels.items():
        if not isinstance(v, str):
            raise SliceError(f"{where}.labels[{k!r}]: not a string")
    ips = []
    for i, ip in enumerate(_list(entry.get("ips"), f"{where}.ips")):
        try:
            ips.append(str(ipaddress.ip_address(ip if isinstance(ip, str) else "")))
        except ValueError:
            raise SliceError(f"{where}.ips[{i}]: {ip!r} is not an address") from None
    ports = []
    for i, p in enumerate(_list(entry.get("ports"), f"{where}.ports")):
        w = f"{where}.ports[{i}]"
        if not isinstance(p, dict):
            raise SliceError(f"{w}: not an object")
        number = p.get("number")
        if not isinstance(number, int) or isinstance(number, bool):
            raise SliceError(f"{w}.number: not an integer")
        ports.append(NamedPort(_string(p, "name", w), _string(p, "protocol", w), number))
    return Pod(namespace, name, node, tuple(sorted(labels.items())), tuple(ips), tuple(ports))


# -- the objects --

@dataclass(frozen=True)
class SliceSpec:
    """One slice's content: its group's name, its audience and its Pods, sorted by key."""

    group: str
    audience: Audience
    pods: tuple[Pod, ...]

    @property
    def labels(self) -> dict[str, str]:
        return slice_labels(self.group, self.audience)

    @property
    def entries(self) -> list[dict[str, Any]]:
        return [pod_to_entry(p) for p in self.pods]


@dataclass(frozen=True)
class ReadSlice:
    """A PeerSlice object as read: its name, the labels it carries, its content."""

    name: str
    labels: dict[str, str]
    spec: SliceSpec


def to_object(name: str, spec: SliceSpec) -> dict[str, Any]:
    """The PeerSlice object (``ferry.io/v1alpha1``, cluster-scoped)."""
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "labels": spec.labels},
            "group": spec.group, "audience": _audience_doc(spec.audience), "pods": spec.entries}


def _audience_doc(aud: Audience) -> dict[str, Any]:
    doc: dict[str, Any] = {"everyone": aud.everyone, "nodes": sorted(aud.nodes)}
    if aud.subscribers:  # only then: a slice of an explicit audience reads as every version wrote it
        doc["subscribers"] = True
    return doc


def from_object(obj: Any) -> ReadSlice:
    """A PeerSlice object → :class:`ReadSlice`; :class:`SliceError` naming the field."""
    if not isinstance(obj, dict):
        raise SliceError("PeerSlice: not an object")
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise SliceError("PeerSlice: metadata: not an object")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise SliceError("PeerSlice: metadata.name: missing")
    where = f"PeerSlice {name}"
    if obj.get("apiVersion") != API_VERSION or obj.get("kind") != KIND:
        raise SliceError(f"{where}: apiVersion/kind: {obj.get('apiVersion')}/{obj.get('kind')} is not "
                         f"{API_VERSION}/{KIND}")
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise SliceError(f"{where}: metadata.labels: not a map of strings")
    group = obj.get("group", "")  # "": written by the version that grouped by audience (its Pods still read)
    if not isinstance(group, str):
        raise SliceError(f"{where}: group: not a string")
    aud_doc = obj.get("audience")
    if not isinstance(aud_doc, dict):
        raise SliceError(f"{where}: audience: not an object")
    everyone = aud_doc.get("everyone", False)
    if not isinstance(everyone, bool):
        raise SliceError(f"{where}: audience.everyone: not a boolean")
    nodes = _list(aud_doc.get("nodes"), f"{where}: audience.nodes")
    for i, n in enumerate(nodes):
        if not isinstance(n, str) or not n:
            raise SliceError(f"{where}: audience.nodes[{i}]: not a Node name")
    subscribers = aud_doc.get("subscribers", False)
    if not isinstance(subscribers, bool):
        raise SliceError(f"{where}: audience.subscribers: not a boolean")
    if everyone + subscribers + bool(nodes) != 1:
        raise SliceError(f"{where}: audience: one of everyone, subscribers or nodes")
    pods, seen = [], set()
    for i, entry in enumerate(_list(obj.get("pods"), f"{where}: pods")):
        pod = pod_from_entry(entry, f"{where}: pods[{i}]")
        if pod.key in seen:
            raise SliceError(f"{where}: pods[{i}]: {pod.key} twice")
        seen.add(pod.key)
        pods.append(pod)
    if subscribers and not group:
        raise SliceError(f"{where}: audience.subscribers: a slice without a group has none")
    spec = SliceSpec(group, Audience(frozenset(nodes), everyone, subscribers), tuple(sorted(pods, key=lambda p: p.key)))
    return ReadSlice(name, dict(labels), spec)


def slice_name(group: str, n: int) -> str:
    return f"{group}-{n}"
