"""The host's judge a :class:`routesync.policy.node.PolicyNode` hands on after each event is the
judge rendered afresh from that step's plan (``hostjudge.render_body(hostjudge.judge(...))``,
no memo), on random event sequences: the steps that reuse the last render because the judge's
inputs did not move (or came back as equal values, kept as the last objects) never hand on a
stale one, and the applier's shortcut for an unchanged judge writes nothing only then."""

from __future__ import annotations

import random
from typing import Any

import pytest

from cni.pipeline.tables import GATEWAY_PORT
from routesync.config import from_dict
from routesync.model import LocalFacts
from routesync.policy import hostjudge
from routesync.policy import plan as pp
from routesync.policy.node import PolicyNode
from tests.routesync.policy.test_incremental import NODE, World

SERVICES = ("10.96.0.0/12", "fd00:96::/112")
FACTS = LocalFacts(gateway_ofport=2, gateway_mac="02:00:00:00:00:01", tunnel_ofport=1, uplink_name="eth0",
                   uplink_addresses=("192.168.1.1/24",), transport_mtu=1500, node_addresses=("192.168.1.1/24",))


class WorldSource:
    """``PolicyInputs`` over a :class:`World`: its objects as a watch cache lists them (no
    journal: the node takes the difference itself, ``IncrementalPlanner.sync``)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.gen = 0

    def generation(self) -> tuple[int, int, int]:
        return (self.gen, 0, 0)

    def inputs(self) -> tuple[tuple[int, int, int], pp.Inputs]:
        return (self.gen, 0, 0), self.world.inputs()

    def service_cidrs(self, configured: tuple[str, ...]) -> tuple[str, ...]:
        return SERVICES


class NoOvs:
    """``PolicyAppliers`` without OVS: nothing pending to release, no counters to read."""

    def release_pending(self, pods: Any, full: bool) -> int:
        return 0

    def policy_flows(self) -> list[Any]:
        return []


class NoPlanner:
    """What :meth:`World.apply` feeds besides its own dicts: nothing here (the node reads them)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


@pytest.mark.parametrize("seed", range(4))
def test_each_steps_judge_is_the_judge_of_its_plan(tmp_path: Any, seed: int) -> None:
    rng = random.Random(seed)
    world = World(rng)
    source = WorldSource(world)
    cfg = from_dict({"nodeName": NODE, "podCIDRs": ["10.1.0.0/24"], "stateFile": str(tmp_path / "s.json"),
                     "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "reg")}})
    node = PolicyNode(cfg, source, NoOvs())  # type: ignore[arg-type]
    gateway = ("10.1.0.1/24",)
    sink = NoPlanner()
    reused = rendered = 0
    last = None
    for i in range(300):
        world.apply(world.event(), sink)  # type: ignore[arg-type]
        source.gen += 1
        step = node.step(gateway, FACTS, i % 97 == 0)
        want = hostjudge.render_body(hostjudge.judge(step.plan, GATEWAY_PORT, FACTS.node_addresses, SERVICES,
                                                     step.tiers))
        assert step.nft.text == want.text, f"seed {seed} event {i}: a stale judge"
        assert step.nft.fingerprint == want.fingerprint
        if last is not None and step.nft is last:
            reused += 1
        elif last is not None:
            rendered += 1
        last = step.nft
    # both ways were taken: the sequence tested the reuse, not only fresh renders
    assert reused > 10 and rendered > 10, (reused, rendered)
