"""cni.pipeline.podnet: which routes a Pod holds in each mode, each with its path's MTU, and the bound on
their number (pure; no root)."""

from __future__ import annotations

import pytest

from cni.node import nodestate
from cni.pipeline import podnet
from cni.pipeline.podnet import PodNet, PodRoute

GW = {4: "10.244.1.1", 6: "fd00:10:244:1::1"}
CLUSTER = ["10.244.0.0/16", "fd00:10:244::/48"]
LOCAL = ["10.244.1.0/24", "fd00:10:244:1::/64"]


def state(mode: str, mtu: int, transport: int, peers: list[nodestate.Peer] | None = None,
          cluster: list[str] | None = None) -> nodestate.NodeState:
    return nodestate.NodeState(
        node="node-1", mode=mode, bridge="br-int", datapath="netdev", ovsdb="unix:x", ovsRunDir="/r",
        mtu=mtu, podCIDRs=LOCAL, clusterCIDRs=CLUSTER + LOCAL if cluster is None else cluster,
        gateway=nodestate.Gateway("ferry-gw0", "02:00:00:00:00:01", 2, ["10.244.1.1/24", "fd00:10:244:1::1/64"]),
        peers=peers or [], transportMTU=transport)


def peer(name: str, n: int, path: str) -> nodestate.Peer:
    return nodestate.Peer(name=name, addresses=[f"192.168.77.{n}"],
                          podCIDRs=[f"10.244.{n}.0/24", f"fd00:10:244:{n:x}::/64"], path=path)


def test_encap_cluster_at_tunnel_mtu_default_at_full_both_families() -> None:
    got = podnet.for_state(state("encap", 1450, 1500, [peer("node-2", 2, "tunnel")]), GW)
    assert got == PodNet(1500, (
        PodRoute("0.0.0.0/0", "10.244.1.1", 1500), PodRoute("10.244.0.0/16", "10.244.1.1", 1450),
        PodRoute("::/0", "fd00:10:244:1::1", 1500), PodRoute("fd00:10:244::/48", "fd00:10:244:1::1", 1450)))


def test_hybrid_routed_peers_at_full_mtu_tunnelled_through_the_cluster_route() -> None:
    st = state("hybrid", 1450, 1500, [peer("node-2", 2, "route"), peer("node-3", 3, "tunnel"),
                                      peer("node-4", 4, "fast")])
    got = podnet.for_state(st, {4: GW[4]})  # an IPv4-only Pod: IPv4 routes only
    assert got.mtu == 1500
    assert got.routes == (PodRoute("0.0.0.0/0", "10.244.1.1", 1500), PodRoute("10.244.0.0/16", "10.244.1.1", 1450),
                          PodRoute("10.244.2.0/24", "10.244.1.1", 1500), PodRoute("10.244.4.0/24", "10.244.1.1", 1500))


def test_noencap_one_route_per_family_at_full_mtu() -> None:
    got = podnet.for_state(state("noEncap", 1500, 1500, [peer("node-2", 2, "route")]), GW)
    assert got == PodNet(1500, (PodRoute("0.0.0.0/0", "10.244.1.1", 1500), PodRoute("::/0", "fd00:10:244:1::1", 1500)))


def test_single_mtu_lone_node_old_state_file_conf_mtu_and_default_mtu() -> None:
    lone = podnet.for_state(None, GW, fallback_mtu=1500)
    assert lone == PodNet(1500, (PodRoute("0.0.0.0/0", "10.244.1.1", 0), PodRoute("::/0", "fd00:10:244:1::1", 0)))
    old = podnet.for_state(state("encap", 1450, 0), {4: GW[4]})  # route-sync before per-path MTUs
    assert old == PodNet(1450, (PodRoute("0.0.0.0/0", "10.244.1.1", 0),))  # as before: no route MTU
    conf = podnet.for_state(state("encap", 1450, 1500), {4: GW[4]}, conf_mtu=1400)
    assert conf == PodNet(1400, (PodRoute("0.0.0.0/0", "10.244.1.1", 0),))
    default = podnet.for_state(state("encap", 1400, 1400), {4: GW[4]})  # defaultMTU: one MTU
    assert default == PodNet(1400, (PodRoute("0.0.0.0/0", "10.244.1.1", 1400),))


def test_bound_routed_peers_capped_the_rest_through_the_cluster_route() -> None:
    peers = [peer(f"n{n}", n, "route") for n in range(2, 2 + podnet.ROUTED_ROUTES_MAX + 20)]
    got = podnet.for_state(state("hybrid", 1450, 1500, peers), GW)
    for family in ("0.0.0.0/0", "::/0"):
        assert any(r.dst == family and r.mtu == 1500 for r in got.routes)
    full4 = [r for r in got.routes if r.mtu == 1500 and ":" not in r.dst and r.dst != "0.0.0.0/0"]
    assert len(full4) == podnet.ROUTED_ROUTES_MAX
    assert full4[0].dst == "10.244.2.0/24"  # the first ones by address
    assert PodRoute("10.244.0.0/16", "10.244.1.1", 1450) in got.routes  # the others: tunnel MTU
    assert len(got.routes) <= 2 * (1 + podnet.CLUSTER_ROUTES_MAX + podnet.ROUTED_ROUTES_MAX)


def test_bound_cluster_without_aggregate_default_takes_the_tunnel_mtu() -> None:
    """No clusterCIDRs configured: every peer's Pod CIDR listed alone.  Up to the cap they are
    routes at the tunnel MTU; beyond, none, and the default route is held to the tunnel MTU."""
    few = [peer(f"n{n}", n, "tunnel") for n in range(2, 5)]
    cluster = LOCAL + [c for p in few for c in p.podCIDRs]
    got = podnet.for_state(state("encap", 1450, 1500, few, cluster=cluster), {4: GW[4]})
    assert got.routes == (PodRoute("0.0.0.0/0", "10.244.1.1", 1500),
                          *(PodRoute(f"10.244.{n}.0/24", "10.244.1.1", 1450) for n in range(2, 5)))
    many = [peer(f"n{n}", n, "tunnel") for n in range(2, 3 + podnet.CLUSTER_ROUTES_MAX)]
    cluster = LOCAL + [c for p in many for c in p.podCIDRs]
    got = podnet.for_state(state("encap", 1450, 1500, many, cluster=cluster), {4: GW[4]})
    assert got == PodNet(1500, (PodRoute("0.0.0.0/0", "10.244.1.1", 1450),))


def test_aggregate_drops_inner_and_local_prefixes() -> None:
    assert podnet.aggregate(["10.244.0.0/16", "10.244.7.0/24", "10.244.1.0/24", "10.9.0.0/16"],
                            ["10.244.1.0/24"]) == ["10.244.0.0/16", "10.9.0.0/16"]
    assert podnet.aggregate(["10.244.1.0/24", "10.244.2.0/24"], ["10.244.1.0/24"]) == ["10.244.2.0/24"]


@pytest.mark.parametrize("mode", ["encap", "hybrid", "noEncap"])
def test_changes_converge_and_then_are_empty(mode: str) -> None:
    want = podnet.for_state(state(mode, 1450 if mode != "noEncap" else 1500, 1500,
                                  [peer("node-2", 2, "route")]), GW)
    before = [("0.0.0.0/0", "10.244.1.1", 1450), ("::/0", "fd00:10:244:1::1", 0),
              ("10.9.0.0/16", "10.244.1.1", 1450)]  # a route no mode wants any more
    todo = podnet.changes(want, 1450, before)
    assert todo.mtu == 1500 and ("10.9.0.0/16", "10.244.1.1") in todo.delete
    after = [(r.dst, r.gw, r.mtu) for r in want.routes]
    assert podnet.changes(want, 1500, after).empty


def test_state_file_round_trips_transport_mtu_and_old_files_read_as_zero() -> None:
    st = state("hybrid", 1450, 1500)
    assert nodestate.parse(st.to_json()).transportMTU == 1500
    old = st.to_json().replace(',"transportMTU":1500', "")
    assert "transportMTU" not in old and nodestate.parse(old).transportMTU == 0
    with pytest.raises(nodestate.StateError, match="transportMTU"):
        nodestate.parse(st.to_json().replace('"transportMTU":1500', '"transportMTU":12'))


def test_pod_inputs_move_with_what_decides_pods_only() -> None:
    a = state("hybrid", 1450, 1500, [peer("node-2", 2, "route")])
    assert podnet.pod_inputs(a) == podnet.pod_inputs(state("hybrid", 1450, 1500, [peer("node-2", 2, "route")]))
    assert podnet.pod_inputs(a) != podnet.pod_inputs(state("hybrid", 1450, 1500, [peer("node-2", 2, "tunnel")]))
    assert podnet.pod_inputs(a) != podnet.pod_inputs(state("hybrid", 8950, 9000, [peer("node-2", 2, "route")]))
    # a Node's Pod CIDR inside the cluster CIDR: no Pod holds anything else
    inside = state("encap", 1450, 1500, cluster=CLUSTER + LOCAL + ["10.244.9.0/24"])
    assert podnet.pod_inputs(inside) == podnet.pod_inputs(state("encap", 1450, 1500))
    outside = state("encap", 1450, 1500, cluster=CLUSTER + LOCAL + ["10.9.0.0/24"])
    assert podnet.pod_inputs(outside) != podnet.pod_inputs(state("encap", 1450, 1500))
    # routed peers decide routes in hybrid only
    assert podnet.pod_inputs(state("noEncap", 1500, 1500, [peer("node-2", 2, "route")])) == \
        podnet.pod_inputs(state("noEncap", 1500, 1500))


def _raw_plan(st: nodestate.NodeState, gateways: dict[int, str]) -> PodNet:
    """The reference: :func:`podnet.plan` on the state's lists as they are (what ``for_state``
    passed before ``PodInputs``)."""
    routed = [c for p in st.peers if p.path in ("route", "fast") for c in p.podCIDRs]
    return podnet.plan(podnet.routes_mode(st), st.mtu, st.transportMTU, gateways, list(st.clusterCIDRs),
                       list(st.podCIDRs), routed)


def test_pod_inputs_decide_what_the_raw_lists_decide_on_random_states() -> None:
    """Over random states: the Pod's routes from the reduced inputs equal plan()'s from the raw
    lists, and two states with equal inputs give every Pod the same routes (the key is sound)."""
    import random

    rng = random.Random(40)
    modes = ["encap", "hybrid", "noEncap"]
    seen: dict[podnet.PodInputs, dict[int, PodNet]] = {}
    for _ in range(600):
        peers = [peer(f"node-{n}", n, rng.choice(["route", "tunnel", "fast"])) for n in
                 rng.sample(range(2, 60), rng.randrange(0, 12))]
        extra = [f"10.{rng.choice([244, 245, 9])}.{rng.randrange(256)}.0/{rng.choice([16, 20, 24])}"
                 for _ in range(rng.randrange(0, 5))]
        cluster = (CLUSTER if rng.random() < 0.7 else []) + LOCAL + [c for p in peers for c in p.podCIDRs] + extra
        mtu, transport = rng.choice([(1450, 1500), (1500, 1500), (1450, 0), (8950, 9000)])
        st = state(rng.choice(modes), mtu, transport, peers, cluster=cluster)
        key = podnet.pod_inputs(st)
        for gws in ({4: GW[4]}, {6: GW[6]}, GW):
            want = _raw_plan(st, gws)
            assert podnet.for_state(st, gws) == want
            assert seen.setdefault(key, {}).setdefault(len(gws) * 10 + min(gws), want) == want
