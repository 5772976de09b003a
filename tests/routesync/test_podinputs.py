"""routesync.podinputs: the Pods' inputs kept across passes equal ``podnet.pod_inputs`` (the full
reduction) after every step of random sequences of cluster sets, and the reduction is skipped
when the changes stay inside what it kept (pure; no root)."""

from __future__ import annotations

import random

import pytest

from cni.node import nodestate
from cni.pipeline import podnet
from routesync.model import ClusterChanges
from routesync.podinputs import PodInputsTracker

CONFIGURED = ("10.244.0.0/16", "fd00:10:244::/48")


def state(cluster: tuple[str, ...], local: tuple[str, ...], mode: str = "encap") -> nodestate.NodeState:
    return nodestate.NodeState(
        node="node-1", mode=mode, bridge="br-int", datapath="netdev", ovsdb="unix:x", ovsRunDir="/r",
        mtu=1450, podCIDRs=list(local), clusterCIDRs=list(cluster), transportMTU=1500,
        gateway=nodestate.Gateway("ferry-gw0", "02:00:00:00:00:01", 2, ["10.244.1.1/24"]))


def random_cidr(rng: random.Random) -> str:
    """Mostly a Node's /24 inside the configured cluster CIDR, sometimes outside it or wider."""
    roll = rng.random()
    if roll < 0.75:
        return f"10.244.{rng.randrange(256)}.0/24"
    if roll < 0.85:
        return f"10.{rng.choice([9, 245])}.{rng.randrange(4)}.0/24"
    if roll < 0.92:
        return f"10.244.{rng.randrange(0, 256, 16)}.0/20"
    return f"fd00:10:244:{rng.randrange(64):x}::/64"


@pytest.mark.parametrize("seed", range(6))
def test_tracker_equals_the_full_reduction_after_every_step(seed: int) -> None:
    rng = random.Random(seed)
    tracker = PodInputsTracker()
    local = ("10.244.1.0/24",)
    configured = CONFIGURED if seed % 3 else ()  # no cluster CIDR configured: every CIDR counts
    held = set(configured) | set(local) | {random_cidr(rng) for _ in range(20)}
    cluster = tuple(sorted(held))
    changes: ClusterChanges | None = None
    for step in range(1, 500):
        st = state(cluster, local, rng.choice(["encap", "encap", "hybrid", "noEncap"]))
        assert tracker.inputs(st, cluster, changes) == podnet.pod_inputs(st), f"step {step}"
        roll = rng.random()
        if roll < 0.03:  # the Node's own Pod CIDRs change
            local = (random_cidr(rng),)
        came = {random_cidr(rng) for _ in range(rng.choice([0, 1, 1, 2]))} - held
        pool = sorted(held - set(configured) - set(local))
        left = set(rng.sample(pool, min(len(pool), rng.choice([0, 1, 1, 2]))))
        held = (held | came | set(local)) - left
        before, cluster = cluster, tuple(sorted(held))
        if roll < 0.05:
            changes = None  # a full pass: nothing known
        elif cluster == before and rng.random() < 0.5:
            cluster, changes = before, ClusterChanges(before, (), ())  # the planner hands the same tuple
        else:
            changes = ClusterChanges(before, tuple(sorted(came)), tuple(sorted(left)))
    if configured:  # inside the configured CIDR most changes keep the reduction
        assert tracker.reductions < 250


def test_a_change_outside_what_was_kept_reduces_again() -> None:
    tracker = PodInputsTracker()
    local = ("10.244.1.0/24",)
    first = (*CONFIGURED, *local, "10.244.2.0/24")
    tracker.inputs(state(first, local), first, None)
    inside = (*first, "10.244.3.0/24")
    got = tracker.inputs(state(inside, local), inside, ClusterChanges(first, ("10.244.3.0/24",), ()))
    assert tracker.reductions == 1 and got.cluster == CONFIGURED
    outside = (*inside, "10.9.0.0/24")
    got = tracker.inputs(state(outside, local), outside, ClusterChanges(inside, ("10.9.0.0/24",), ()))
    assert tracker.reductions == 2 and "10.9.0.0/24" in got.cluster
    # changes from another tuple than the one reduced: not trusted
    again = (*outside, "10.244.4.0/24")
    tracker.inputs(state(again, local), again, ClusterChanges(first, ("10.244.4.0/24",), ()))
    assert tracker.reductions == 3
