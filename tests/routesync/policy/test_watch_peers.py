"""route-sync's policy source with ``policyPeers: peerSlices`` (``docs/design/scale.md``), without
an API server: what it asks the API server for (its own Pods by field selector, the PeerSlices
labelled for its Node by label selector, the same labels ferry-controller writes), what it makes
of a slice object, and that it plans nothing until every one of those watches has listed, nor
while the API server serves no PeerSlices.  The reflectors are built against a client pointed at
nowhere and never started; a test sets their ``synced``/``unserved`` events as their first list
would.  The watches against a real API server are the kube e2e's to test."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from routesync.policy import peerslice, watch
from routesync.policy.model import Pod
from routesync.policy.peerslice import Audience, SliceSpec
from routesync.policy.plan import Inputs
from routesync.policy.podview import MergedPods
from routesync.policy.watch import PolicySource, slice_pods
from routesync.sources.base import SourceError
from routesync.sources.reflector import Reflector

NODE = "node-a"


def nowhere() -> k8s.ApiClient:
    return k8s.ApiClient(k8s.Configuration(host="http://127.0.0.1:9"))


@pytest.fixture
def sliced() -> Iterator[PolicySource]:
    src = PolicySource(nowhere(), peer_slices_for=NODE)
    yield src
    src.close()


def partial_of(r: Reflector) -> functools.partial:  # type: ignore[type-arg]
    assert isinstance(r.list_fn, functools.partial)
    return r.list_fn


def test_by_default_the_source_watches_every_pod() -> None:
    src = PolicySource(nowhere())
    try:
        assert isinstance(src.pods, Reflector) and src.peer_slices == ()
        assert src.pod_sources == (src.pods,)
        assert not isinstance(src.pods.list_fn, functools.partial)  # no selector: every Pod
        assert src.pods.list_fn.__name__ == "list_pod_for_all_namespaces"
    finally:
        src.close()


def test_peer_slices_watch_the_nodes_own_pods_and_its_slices(sliced: PolicySource) -> None:
    assert isinstance(sliced.pods, MergedPods)
    own, *slices = sliced.pod_sources
    assert sliced.pods.own is own and sliced.pods.slice_sources == tuple(slices) == sliced.peer_slices
    p = partial_of(own)
    assert (p.func.__name__, p.args, p.keywords) == ("list_pod_for_all_namespaces", (),
                                                      {"field_selector": f"spec.nodeName={NODE}"})
    selectors = []
    for r in slices:
        p = partial_of(r)
        assert (p.func.__name__, p.args) == ("list_cluster_custom_object",
                                             (peerslice.GROUP, peerslice.VERSION, peerslice.PLURAL))
        assert set(p.keywords) == {"label_selector"}
        assert r.parse is slice_pods and r.unserved_retry == watch.CRD_RETRY  # the CRD may come later
        selectors.append(p.keywords["label_selector"])
    assert selectors == peerslice.node_selectors(NODE)


@pytest.mark.parametrize("node", [NODE, "h-node", "n" * 70, "Node_with.odd-chars"])
def test_the_slices_watched_are_exactly_those_the_controller_labels_for_the_node(node: str) -> None:
    """The label selectors the source watches with, read as the API server reads them, select a
    slice whose audience holds the Node or is everyone, and no other Node's."""
    src = PolicySource(nowhere(), peer_slices_for=node)
    try:
        selectors = [partial_of(r).keywords["label_selector"] for r in src.peer_slices]
    finally:
        src.close()
    for aud, wanted in ((Audience(frozenset({node})), True), (Audience(frozenset({node, "other"})), True),
                        (peerslice.EVERYONE, True), (Audience(frozenset({"other"})), False),
                        (Audience(frozenset({node + "x"})), False)):
        labels = SliceSpec("g", aud, ()).labels
        assert sum(peerslice.matches(s, labels) for s in selectors) == int(wanted), (aud, selectors)


def test_a_slice_object_is_read_as_its_pods_and_a_broken_one_is_a_value_error() -> None:
    pods = (Pod("a", "web", "node-b", (("app", "web"),), ("10.244.2.5",)), Pod("b", "db", "node-c", (), ()))
    obj = peerslice.to_object("s-0", SliceSpec("g", Audience(frozenset({NODE})), pods))
    assert slice_pods(obj) == pods
    older = dict(obj)
    del older["group"]  # the audience-grouped version's slice: still read, through an upgrade
    assert slice_pods(older) == pods
    obj["pods"][1]["ips"] = ["not-an-address"]
    with pytest.raises(ValueError, match=r"PeerSlice s-0: pods\[1\]\.ips\[0\]"):  # the Reflector skips it
        slice_pods(obj)


def listed(*rs: Reflector) -> None:  # type: ignore[type-arg]
    for r in rs:
        r.synced.set()


def test_nothing_is_planned_until_the_own_pods_and_every_slice_watch_have_listed(
        sliced: PolicySource, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "SYNC_TIMEOUT", 0)
    monkeypatch.setattr(sliced, "start", lambda: None)  # the reflectors stay unstarted
    own, first, second = sliced.pod_sources
    listed(sliced.namespaces, sliced.policies, sliced.cluster_policies)
    with pytest.raises(SourceError, match="Pods not listed"):
        sliced.inputs()
    listed(own, first)
    with pytest.raises(SourceError, match="PeerSlices not listed"):
        sliced.inputs()
    with pytest.raises(SourceError, match="PeerSlices not listed"):
        sliced.changes()
    listed(second)
    assert sliced.inputs() == ((0, 0, 0), Inputs((), {}, ()))
    second.unserved.set()  # the first list answered 404: no CRD, so nothing is known of remote Pods
    with pytest.raises(SourceError, match="serves no PeerSlices"):
        sliced.inputs()


def test_by_default_the_one_pod_watch_gates_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    src = PolicySource(nowhere())
    try:
        monkeypatch.setattr(watch, "SYNC_TIMEOUT", 0)
        monkeypatch.setattr(src, "start", lambda: None)
        listed(src.namespaces, src.policies)
        with pytest.raises(SourceError, match="Pods not listed"):
            src.inputs()
        listed(*src.pod_sources)
        assert src.inputs() == ((0, 0, 0), Inputs((), {}, ()))
    finally:
        src.close()


class FakeSource:
    """A journalled source as :class:`MergedPods` reads it (a Reflector's drain)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.generation = 0
        self.synced = threading.Event()
        self.items: dict[str, object] = {}
        self.journal: dict[str, object] = {}

    def put(self, key: str, value: object) -> None:
        if value is None:
            self.items.pop(key, None)
        else:
            self.items[key] = value
        self.journal[key] = value
        self.generation += 1

    def drain(self, snapshot: bool = False):  # type: ignore[no-untyped-def]
        changes, self.journal = self.journal, {}
        return self.generation, changes, list(self.items.values()) if snapshot else None

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def test_the_merged_view_drains_as_the_pod_watch_did() -> None:
    """What PolicySource reads of ``pods``: the generation moves with any source, the changes
    are by Pod key, the snapshot is own Pods plus slices' Pods."""
    own, by_label, everyone = FakeSource("Pod"), FakeSource("PeerSlice"), FakeSource("PeerSlice")
    merged = MergedPods(own, [by_label, everyone])  # type: ignore[list-item, arg-type]
    here = Pod("a", "mine", NODE, (), ("10.244.1.2",))
    remote = Pod("a", "web", "node-b", (), ("10.244.2.5",))
    wide = Pod("b", "client", "node-c", (), ("10.244.3.7",))
    own.put(here.key, here)
    by_label.put("s-0", (remote,))
    everyone.put("all-0", (wide,))
    gen, changes, pods = merged.drain(snapshot=True)
    assert gen == 3 and changes == {here.key: here, remote.key: remote, wide.key: wide}
    assert sorted(pods or (), key=lambda p: p.key) == [here, remote, wide]
    everyone.put("all-0", None)  # the slice deleted (or its labels no longer select it)
    assert merged.drain() == (4, {wide.key: None}, None)
    gen, pods = merged.snapshot()
    assert gen == 4 and sorted(pods, key=lambda p: p.key) == [here, remote]
    assert not merged.synced.wait(0)
    listed(own, by_label, everyone)  # type: ignore[arg-type]
    assert merged.synced.wait(0)


def test_the_node_asks_for_the_slices_of_the_groups_its_own_pods_read(
        sliced: PolicySource, monkeypatch: pytest.MonkeyPatch) -> None:
    """Delivery by subscription: the groups told from the Node's own Pods and the policies (as the
    watches' taps tell them) become a watch with those groups' selector; the first plan waits for
    it, a later one does not (a new group's peers are simply not known yet: denied); a group no
    longer read closes its watch."""
    from routesync.policy.model import policy_from
    from routesync.policy.subscription import subscribed

    monkeypatch.setattr(watch, "SYNC_TIMEOUT", 0)
    monkeypatch.setattr(sliced, "start", lambda: None)
    monkeypatch.setattr(Reflector, "start", lambda self: None)  # nothing connects: no API server here
    listed(sliced.namespaces, sliced.policies, sliced.cluster_policies, *sliced.pod_sources)
    taps = sliced.subscriptions
    assert taps is not None and isinstance(sliced.pods, MergedPods)
    pol = policy_from({"metadata": {"namespace": "a", "name": "db"},
                       "spec": {"podSelector": {"matchLabels": {"app": "db"}},
                                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}})
    db = Pod("a", "db", NODE, (("app", "db"),), ("10.244.1.5",))
    taps.policy(pol.key, pol)  # as their first lists tell them, at a start
    taps.own_pod(db.key, db)
    (group,) = subscribed(NODE, Inputs((db,), {}, (pol,)))
    with pytest.raises(SourceError, match="PeerSlices of this Node's groups not listed"):
        sliced.inputs()
    ((groups, gw),) = sliced.group_watches.values()
    assert groups == {group} and sliced.pods.extra == (gw,)
    assert partial_of(gw).keywords == {"label_selector": peerslice.group_selectors([group])[0]}
    listed(gw)
    sliced.inputs()
    taps.own_pod(db.key, None)  # the Pod gone: nothing reads the group any more
    sliced.inputs()
    assert sliced.group_watches == {} and sliced.pods.extra == ()
    taps.own_pod(db.key, db)  # back: a new watch, and the plan does not wait for it
    sliced.inputs()
    ((groups, gw2),) = sliced.group_watches.values()
    assert groups == {group} and gw2 is not gw and not gw2.synced.is_set()
