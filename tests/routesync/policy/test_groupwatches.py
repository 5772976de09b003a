"""The group watches' planner (routesync/policy/groupwatches.py) on random histories: the groups a
Node subscribes to grow and shrink, watches list at random moments, and after each plan is carried
out no subscribed group that a listed watch delivered is left without one (the safety rule: a
closed watch never takes a group away), every subscribed group is asked for, no watch asks for
more than a selector holds, and the count of watches stays bounded; when the subscriptions stop
changing and every watch lists, the plans reach a fixpoint with every group delivered, no watch
kept for nothing, and no more watches than ``max_watches`` or the set needs."""

from __future__ import annotations

import math
import random

import pytest

from routesync.policy.groupwatches import Plan, Watch, chunks, plan

UNIVERSE = tuple(f"g{i:02d}" for i in range(40))
PER = 3
MAX = 3


class Node:
    def __init__(self) -> None:
        self.watches: list[Watch] = []
        self.next = 0

    def carry_out(self, p: Plan) -> None:
        closing = set(p.close)
        assert closing <= {w.ident for w in self.watches}, "closes a watch that is not open"
        self.watches = [w for w in self.watches if w.ident not in closing]
        for groups in p.open:
            assert 1 <= len(groups) <= PER
            self.watches.append(Watch(self.next, groups))
            self.next += 1

    def delivered(self) -> frozenset[str]:
        return frozenset().union(*(w.groups for w in self.watches if w.listed))

    def asked(self) -> frozenset[str]:
        return frozenset().union(*(w.groups for w in self.watches))


def settle(node: Node, subscribed: frozenset[str]) -> int:
    """Every watch lists, plans carried out until one is empty; how many rounds it took."""
    for rounds in range(1, 10):
        node.watches = [Watch(w.ident, w.groups, True) for w in node.watches]
        p = plan(node.watches, subscribed, MAX, PER)
        if p == Plan():
            return rounds
        node.carry_out(p)
    raise AssertionError(f"no fixpoint: {node.watches}")


@pytest.mark.parametrize("seed", range(20))
def test_watches_follow_the_subscriptions_without_a_gap(seed: int) -> None:
    rng = random.Random(seed)
    node = Node()
    subscribed: frozenset[str] = frozenset()
    opened = closed = consolidated = 0
    bound = MAX + 2 * math.ceil(len(UNIVERSE) / PER)
    for step in range(400):
        change = set(subscribed)
        for _ in range(rng.choice((0, 1, 1, 2, 5))):
            change ^= {rng.choice(UNIVERSE)}
        subscribed = frozenset(change)
        node.watches = [Watch(w.ident, w.groups, w.listed or rng.random() < 0.4) for w in node.watches]
        before = node.delivered() & subscribed
        p = plan(node.watches, subscribed, MAX, PER)
        if len(p.open) and not (subscribed - node.asked()):
            consolidated += 1
        node.carry_out(p)
        opened += len(p.open)
        closed += len(p.close)
        where = f"seed {seed} step {step}"
        assert before <= node.delivered(), f"{where}: closing took {sorted(before - node.delivered())} away"
        assert subscribed <= node.asked(), f"{where}: {sorted(subscribed - node.asked())} asked for by no watch"
        assert len(node.watches) <= bound, f"{where}: {len(node.watches)} watches"
    rounds = settle(node, subscribed)
    assert subscribed <= node.delivered()
    assert all(w.groups & subscribed for w in node.watches), "a watch kept for nothing"
    assert len(node.watches) <= max(MAX, len(chunks(subscribed, PER))), node.watches
    assert opened and closed and consolidated and rounds >= 1, (opened, closed, consolidated)


def test_a_new_group_gets_a_watch_and_the_old_one_stays_until_a_replacement_listed() -> None:
    w0 = Watch(0, frozenset({"a", "b"}), listed=True)
    p = plan([w0], frozenset({"a", "b", "c"}), MAX, PER)
    assert p == Plan(open=(frozenset({"c"}),))
    w1 = Watch(1, frozenset({"c"}))
    assert plan([w0, w1], frozenset({"b", "c"}), MAX, PER) == Plan()  # b still needs w0
    assert plan([w0, w1], frozenset({"c"}), MAX, PER) == Plan(close=(0,))  # w0 for nothing now


def test_too_many_watches_are_asked_again_in_one_go_then_the_old_ones_close() -> None:
    olds = [Watch(i, frozenset({f"g{i}"}), listed=True) for i in range(MAX + 1)]
    everything = frozenset(f"g{i}" for i in range(MAX + 1))
    p = plan(olds, everything, MAX, per_selector=10)
    assert p == Plan(open=(everything,))
    new = Watch(MAX + 1, everything)
    assert plan([*olds, new], everything, MAX, 10) == Plan()  # not listed yet: nothing closes
    listed = Watch(MAX + 1, everything, listed=True)
    assert plan([*olds, listed], everything, MAX, 10) == Plan(close=tuple(range(MAX + 1)))


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_watches and per_selector"):
        plan([], frozenset(), 0, 1)
