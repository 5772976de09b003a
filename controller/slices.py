"""PeerSlices: the objects ferry-controller publishes a Pod to the Nodes that read it by (issue 46,
``docs/design/peerslices.md``).  Pure: plain data in, plain data out; the applier that writes them
and the watch that reads them are elsewhere.

A slice holds up to ``max_pods`` Pods (each as :func:`pod_to_entry`) that share one
:class:`Audience`, the Nodes a :class:`~routesync.policy.relevance.Span` is delivered to: the
span's own Nodes, or, for a span that is ``everywhere`` or ``populated``, every Node.  The
audience is written on the slice as labels (:func:`audience_labels`), and a Node's route-sync
watches the slices with a label selector (:func:`node_selectors`): the API server filters each
watch in its watch cache, so a Node receives only the slices labelled for it.

- :func:`plan_slices`: the full reference, every slice from every Pod and span.
- :class:`SliceBook`: the same incrementally, Pod change by Pod change, as the fewest object
  writes (:class:`Writes`); rebuilt from the objects alone after a failover
  (:meth:`SliceBook.from_objects`).

What a Node receives is ``relevance.per_node`` of the spans with ``populated`` taken as
``everywhere``: a Node without Pods also receives the Pods every Node with Pods reads.  That
Node plans nothing from them (it has no Pod to judge a packet for), and the superset saves a
label write on every slice of such Pods each time a Node gets its first Pod or loses its last."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from routesync.policy import selector as sel
from routesync.policy.model import NamedPort, Pod
from routesync.policy.relevance import Span

GROUP = "ferry.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PeerSlice"
PLURAL = "peerslices"
MAX_PODS = 100  # per slice, as an EndpointSlice's endpoints by default
MAX_PODS_LIMIT = 1000  # what the CRD admits (its pods' maxItems)

# The transport labels: a Node's route-sync selects by these (node_selectors), the API server filters by them.
NODE_LABEL_PREFIX = "span.ferry.io/"  # + node_label_name(node), value "": the slice is for that Node
SPAN_ALL_LABEL = "ferry.io/span-all"  # value "true": the slice is for every Node
SPAN_ALL_VALUE = "true"
SPAN_LABEL = "ferry.io/span"  # value: audience_hash, to find one audience's slices
HASHED_NAME_PREFIX = "h-"  # a Node name that cannot be a label key's name: h-<sha256 prefix>

_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_NAME_HASH_CHARS = 32  # 128 bits: no two Node names of a cluster share one
_AUDIENCE_HASH_CHARS = 16  # names and the span label; identity is the audience itself, not this


class SliceError(ValueError):
    """A PeerSlice (or one of its Pod entries) that cannot be read; the message names the field."""


@dataclass(frozen=True)
class Audience:
    """Who receives a slice: ``everyone`` (every Node), or exactly ``nodes``."""

    nodes: frozenset[str] = frozenset()
    everyone: bool = False

    def __post_init__(self) -> None:
        if self.everyone and self.nodes:
            raise ValueError("an audience of everyone names no Nodes")

    def receives(self, node: str) -> bool:
        return self.everyone or node in self.nodes


EVERYONE = Audience(everyone=True)


def audience(span: Span) -> Audience | None:
    """The Nodes a span's Pods are delivered to; None for a span that reaches no Node."""
    if span.everywhere or span.populated:
        return EVERYONE
    return Audience(span.nodes) if span.nodes else None


def audience_hash(aud: Audience) -> str:
    doc = {"everyone": aud.everyone, "nodes": sorted(aud.nodes)}
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:_AUDIENCE_HASH_CHARS]


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


def audience_labels(aud: Audience) -> dict[str, str]:
    """A slice's labels: its audience's hash, and who receives it."""
    labels = {SPAN_LABEL: audience_hash(aud)}
    if aud.everyone:
        labels[SPAN_ALL_LABEL] = SPAN_ALL_VALUE
    for node in aud.nodes:
        labels[node_label_key(node)] = ""
    return labels


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
    """One slice's content: its audience and its Pods, sorted by key."""

    audience: Audience
    pods: tuple[Pod, ...]

    @property
    def labels(self) -> dict[str, str]:
        return audience_labels(self.audience)

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
            "audience": {"everyone": spec.audience.everyone, "nodes": sorted(spec.audience.nodes)},
            "pods": spec.entries}


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
    if everyone == bool(nodes):
        raise SliceError(f"{where}: audience: either everyone or nodes")
    pods, seen = [], set()
    for i, entry in enumerate(_list(obj.get("pods"), f"{where}: pods")):
        pod = pod_from_entry(entry, f"{where}: pods[{i}]")
        if pod.key in seen:
            raise SliceError(f"{where}: pods[{i}]: {pod.key} twice")
        seen.add(pod.key)
        pods.append(pod)
    spec = SliceSpec(Audience(frozenset(nodes), everyone), tuple(sorted(pods, key=lambda p: p.key)))
    return ReadSlice(name, dict(labels), spec)


def slice_name(aud: Audience, n: int) -> str:
    return f"{audience_hash(aud)}-{n}"


def plan_slices(pods: Mapping[str, Pod], spans: Mapping[str, Span], max_pods: int = MAX_PODS) -> dict[str, SliceSpec]:
    """The reference: every Pod that has a record and a span reaching some Node, grouped by
    audience, sorted by key, ``max_pods`` to a slice, named ``<audience hash>-<n>``."""
    _check_max(max_pods)
    groups: dict[Audience, list[Pod]] = {}
    for key, span in spans.items():
        aud = audience(span)
        if aud is not None and key in pods:
            groups.setdefault(aud, []).append(pods[key])
    out: dict[str, SliceSpec] = {}
    for aud in sorted(groups, key=lambda a: (audience_hash(a), a.everyone, sorted(a.nodes))):
        members = sorted(groups[aud], key=lambda p: p.key)
        n = 0
        for i in range(0, len(members), max_pods):
            while slice_name(aud, n) in out:  # two audiences of one hash (never seen): numbered on
                n += 1
            out[slice_name(aud, n)] = SliceSpec(aud, tuple(members[i:i + max_pods]))
    return out


def _check_max(max_pods: int) -> None:
    if not 1 <= max_pods <= MAX_PODS_LIMIT:
        raise ValueError(f"max_pods {max_pods}: not within 1..{MAX_PODS_LIMIT} (the CRD's pods maxItems)")


# -- incremental --

@dataclass(frozen=True)
class Writes:
    """Object writes, full bodies for ``create`` and ``update``, names for ``delete``.  Written in
    this order (creates, updates, deletes), a Pod that moves slices is, for an instant, in both
    rather than in neither."""

    create: tuple[dict[str, Any], ...] = ()
    update: tuple[dict[str, Any], ...] = ()
    delete: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return len(self.create) + len(self.update) + len(self.delete)


@dataclass
class _Slice:
    audience: Audience
    members: dict[str, Pod] = field(default_factory=dict)


class SliceBook:
    """The cluster's PeerSlices, kept by Pod changes: :meth:`apply` takes what changed (a Pod's
    record, a Pod's span; None for gone) and returns the writes.  A Pod is published when it has a
    record and a span that reaches some Node.  A record change writes the one slice that holds the
    Pod; an audience change moves it from its slice to one of the new audience that has room (the
    ones this batch writes anyway first, then the fullest) or a new one; an emptied slice is
    deleted; a slice nothing changed in is not written.  Slices are not repacked: which Pods share a
    slice depends on history, not on :func:`plan_slices`."""

    def __init__(self, max_pods: int = MAX_PODS) -> None:
        _check_max(max_pods)
        self.max_pods = max_pods
        self._slices: dict[str, _Slice] = {}
        self._where: dict[str, str] = {}  # Pod key -> slice name
        self._room: dict[Audience, set[str]] = {}  # slices with fewer than max_pods
        self._records: dict[str, Pod] = {}
        self._audiences: dict[str, Audience] = {}
        # what from_objects found to repair, written by the next apply
        self._pending_keys: set[str] = set()
        self._pending_dirty: set[str] = set()
        self._pending_delete: set[str] = set()
        self.errors: tuple[str, ...] = ()

    @classmethod
    def from_objects(cls, objects: Iterable[Any], max_pods: int = MAX_PODS) -> SliceBook:
        """The book a new leader starts from: the PeerSlice objects as listed.  What they got
        wrong is repaired by the next :meth:`apply` (run it with every Pod and span, as the new
        leader knows them, and it writes only what differs): an object that cannot be read is
        deleted (its error kept in ``errors``), a Pod in two slices stays in the first by name,
        labels that are not the audience's are rewritten, a slice over ``max_pods`` gives its last
        Pods to others."""
        book = cls(max_pods)
        errors, read = [], []
        for obj in objects:
            try:
                read.append(from_object(obj))
            except SliceError as e:
                errors.append(str(e))
                meta = obj.get("metadata") if isinstance(obj, dict) else None
                name = meta.get("name") if isinstance(meta, dict) else None
                if isinstance(name, str) and name:
                    book._pending_delete.add(name)
        book.errors = tuple(errors)
        for rs in sorted(read, key=lambda r: r.name):
            s = book._slices[rs.name] = _Slice(rs.spec.audience)
            if rs.labels != rs.spec.labels:
                book._pending_dirty.add(rs.name)
            for pod in rs.spec.pods:
                if pod.key in book._where:
                    book._pending_dirty.add(rs.name)  # dropped: it stays in the first
                elif len(s.members) >= max_pods:
                    book._pending_dirty.add(rs.name)  # dropped here, placed again by apply
                    book._pending_keys.add(pod.key)
                    book._records[pod.key], book._audiences[pod.key] = pod, rs.spec.audience
                else:
                    s.members[pod.key] = pod
                    book._where[pod.key] = rs.name
                    book._records[pod.key], book._audiences[pod.key] = pod, rs.spec.audience
            if not s.members:
                book._pending_dirty.add(rs.name)
            book._refresh_room(rs.name)
        return book

    def specs(self) -> dict[str, SliceSpec]:
        """The slices as they are."""
        return {name: self._spec(name) for name in sorted(self._slices)}

    def objects(self) -> list[dict[str, Any]]:
        return [to_object(name, spec) for name, spec in self.specs().items()]

    def slice_of(self, key: str) -> str | None:
        return self._where.get(key)

    def apply(self, pods: Mapping[str, Pod | None] | None = None,
              spans: Mapping[str, Span | None] | None = None) -> Writes:
        """Take the changed Pod records and spans (None: gone); return the writes that bring the
        slices to them."""
        pods, spans = pods or {}, spans or {}
        for key, pod in pods.items():
            if pod is None:
                self._records.pop(key, None)
            else:
                self._records[key] = pod
        for key, span in spans.items():
            aud = audience(span) if span is not None else None
            if aud is None:
                self._audiences.pop(key, None)
            else:
                self._audiences[key] = aud
        existing = set(self._slices)
        reserved = set(self._pending_delete)
        dirty = set(self._pending_dirty)
        arrivals = []
        for key in sorted(set(pods) | set(spans) | self._pending_keys):
            pod, aud = self._records.get(key), self._audiences.get(key)
            name = self._where.get(key)
            if name is not None:
                s = self._slices[name]
                if pod is None or aud != s.audience:
                    del s.members[key], self._where[key]
                    dirty.add(name)
                    self._refresh_room(name)
                elif s.members[key] != pod:
                    s.members[key] = pod
                    dirty.add(name)
            if pod is not None and aud is not None and key not in self._where:
                arrivals.append((key, pod, aud))
        for key, pod, aud in arrivals:
            name = self._place(aud, dirty, reserved)
            self._slices[name].members[key] = pod
            self._where[key] = name
            dirty.add(name)
            self._refresh_room(name)
        create, update, delete = [], [], sorted(self._pending_delete)
        for name in sorted(dirty):
            s = self._slices[name]
            if not s.members:
                del self._slices[name]
                self._refresh_room(name, s.audience)
                if name in existing:
                    delete.append(name)
            elif name in existing:
                update.append(to_object(name, self._spec(name)))
            else:
                create.append(to_object(name, self._spec(name)))
        self._pending_keys, self._pending_dirty, self._pending_delete = set(), set(), set()
        return Writes(tuple(create), tuple(update), tuple(sorted(delete)))

    def _spec(self, name: str) -> SliceSpec:
        s = self._slices[name]
        return SliceSpec(s.audience, tuple(s.members[k] for k in sorted(s.members)))

    def _refresh_room(self, name: str, gone: Audience | None = None) -> None:
        """Keep ``_room`` right for slice ``name`` (``gone``: its audience, the slice deleted)."""
        s = self._slices.get(name)
        aud = s.audience if s is not None else gone
        if aud is None:
            return
        room = self._room.setdefault(aud, set())
        if s is not None and len(s.members) < self.max_pods:
            room.add(name)
        else:
            room.discard(name)
        if not room:
            del self._room[aud]

    def _place(self, aud: Audience, dirty: set[str], reserved: set[str]) -> str:
        """A slice of ``aud`` with room: one this batch writes anyway, else the fullest; or a new one."""
        candidates = self._room.get(aud)
        if candidates:
            return min(candidates, key=lambda n: (n not in dirty, -len(self._slices[n].members), n))
        n = 0
        while slice_name(aud, n) in self._slices or slice_name(aud, n) in reserved:
            n += 1
        name = slice_name(aud, n)
        self._slices[name] = _Slice(aud)
        return name
