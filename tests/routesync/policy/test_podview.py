"""The merged Pod view (own Pods + PeerSlices) held to its definition recomputed from scratch,
after every change of a random sequence: the changes it reports rebuild exactly the view, and
the view is the own Pods plus, for every other key, the record of the smallest slice holding it."""

from __future__ import annotations

import random
import threading

import pytest

from routesync.policy.model import Pod
from routesync.policy.podview import MergedPods, PodMerge

KEYS = [f"a/p{i}" for i in range(6)]
SLICES = ("s1", "s2", "s3")


def record(rng: random.Random, key: str) -> Pod:
    ns, name = key.split("/")
    return Pod(ns, name, rng.choice(("n1", "n2")), (("app", rng.choice("xy")),), (f"10.0.0.{rng.randrange(1, 4)}",))


def reference(own: dict[str, Pod], slices: dict[str, dict[str, Pod]]) -> dict[str, Pod]:
    out = dict(own)
    for name in sorted(slices, reverse=True):  # the smallest name written last wins
        for key, pod in slices[name].items():
            if key not in own:
                out[key] = pod
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_merged_view_equals_its_definition_after_every_change(seed: int) -> None:
    rng = random.Random(seed)
    merge = PodMerge()
    own: dict[str, Pod] = {}
    slices: dict[str, dict[str, Pod]] = {}
    seen: dict[str, Pod] = {}  # the view rebuilt from the reported changes only
    reported = 0
    for step in range(400):
        own_changes: dict[str, Pod | None] = {}
        slice_changes: dict[str, tuple[Pod, ...] | None] = {}
        for _ in range(rng.choice((1, 1, 2, 3))):
            if rng.random() < 0.3:
                key = rng.choice(KEYS)
                pod = record(rng, key) if rng.random() < 0.6 else None
                own_changes[key] = pod
                if pod is None:
                    own.pop(key, None)
                else:
                    own[key] = pod
            else:
                name = rng.choice(SLICES)
                if rng.random() < 0.15:
                    slices.pop(name, None)
                    slice_changes[name] = None
                else:
                    pods = {k: record(rng, k) for k in rng.sample(KEYS, rng.randrange(1, 4))}
                    if rng.random() < 0.3 and name in slices:  # one Pod's record changes, the rest stay
                        pods = dict(slices[name])
                        k = rng.choice(sorted(pods))
                        pods[k] = record(rng, k)
                    slices[name] = pods
                    slice_changes[name] = tuple(pods.values())
        changes = merge.apply(own_changes, slice_changes)
        for key, pod in changes.items():
            assert seen.get(key) != pod, f"step {step}: {key} reported without a change"
            if pod is None:
                del seen[key]
            else:
                seen[key] = pod
        reported += len(changes)
        want = reference(own, slices)
        assert merge.view == want, f"step {step}"
        assert seen == want, f"step {step}: the reported changes do not rebuild the view"
    assert reported > 200


def test_a_pod_moving_between_slices_is_never_gone_when_the_new_one_comes_first() -> None:
    merge = PodMerge()
    pod = Pod("a", "web", "n2", (), ("10.0.0.1",))
    assert merge.apply({}, {"old": (pod,)}) == {"a/web": pod}
    assert merge.apply({}, {"new": (pod,)}) == {}  # in both for a moment: nothing moved
    assert merge.apply({}, {"old": None}) == {}
    assert merge.view == {"a/web": pod}
    assert merge.apply({}, {"new": ()}) == {"a/web": None}


def test_the_own_watch_wins_over_a_stale_slice() -> None:
    merge = PodMerge()
    remote = Pod("a", "web", "n2", (), ("10.0.0.1",))
    local = Pod("a", "web", "n1", (), ("10.0.0.9",))
    merge.apply({}, {"s": (remote,)})
    assert merge.apply({"a/web": local}, {}) == {"a/web": local}
    assert merge.apply({}, {"s": (remote,)}) == {}  # the slice again: the own record stays
    assert merge.apply({"a/web": None}, {}) == {"a/web": remote}


class FakeSlices:
    """A slice watch as MergedPods reads it: a journal by slice name, a generation, start/stop
    (stands in for a Reflector: the watch itself is tested against the API server elsewhere)."""

    kind = "PeerSlice"

    def __init__(self) -> None:
        self.generation = 0
        self.synced = threading.Event()
        self.slices: dict[str, tuple[Pod, ...]] = {}
        self.journal: dict[str, tuple[Pod, ...] | None] = {}
        self.running = False

    def start(self) -> None:
        self.running = True

    def stop(self) -> None:
        self.running = False

    def put(self, name: str, pods: tuple[Pod, ...] | None) -> None:
        if pods is None:
            self.slices.pop(name, None)
        else:
            self.slices[name] = pods
        self.journal[name] = pods
        self.generation += 1

    def drain(self, snapshot: bool = False) -> tuple[int, dict[str, tuple[Pod, ...] | None], None]:
        out, self.journal = self.journal, {}
        return self.generation, out, None


class FakeOwn(FakeSlices):
    kind = "Pod"


@pytest.mark.parametrize("seed", range(6))
def test_slice_sources_that_come_and_go_take_their_slices_with_them(seed: int) -> None:
    rng = random.Random(seed)
    own = FakeOwn()
    first = FakeSlices()
    merged = MergedPods(own, [first])  # type: ignore[arg-type]
    numbers = {id(first): 0}
    extra: list[FakeSlices] = []
    seen: dict[str, Pod] = {}
    generation, removed = -1, 0
    for step in range(300):
        r = rng.random()
        if r < 0.1:  # a watch opened for new groups
            s = FakeSlices()
            extra.append(s)
            merged.set_extra(extra)  # type: ignore[arg-type]
            numbers[id(s)] = max(numbers.values()) + 1
            assert s.running
        elif r < 0.17 and extra:  # a watch closed
            s = extra.pop(rng.randrange(len(extra)))
            merged.set_extra(extra)  # type: ignore[arg-type]
            assert not s.running
            removed += 1
        else:
            source = rng.choice([first, *extra])
            name = rng.choice(SLICES)
            pods = None if rng.random() < 0.2 else \
                tuple({k: record(rng, k) for k in rng.sample(KEYS, rng.randrange(1, 4))}.values())
            source.put(name, pods)
        gen, changes, view = merged.drain(snapshot=True)
        assert gen >= generation and (gen > generation or not changes), f"step {step}: generation went back"
        generation = gen
        for key, pod in changes.items():
            if pod is None:
                seen.pop(key, None)
            else:
                seen[key] = pod
        want = reference({}, {f"{name}#{numbers[id(s)]}": {p.key: p for p in pods}
                              for s in [first, *extra] for name, pods in s.slices.items()})
        assert {p.key: p for p in view or ()} == want, f"step {step}"
        assert seen == want, f"step {step}: the reported changes do not rebuild the view"
    assert removed > 5
