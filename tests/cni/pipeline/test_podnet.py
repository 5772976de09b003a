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


def test_state_key_moves_with_what_decides_pods_only() -> None:
    a = state("hybrid", 1450, 1500, [peer("node-2", 2, "route")])
    assert podnet.state_key(a) == podnet.state_key(state("hybrid", 1450, 1500, [peer("node-2", 2, "route")]))
    assert podnet.state_key(a) != podnet.state_key(state("hybrid", 1450, 1500, [peer("node-2", 2, "tunnel")]))
    assert podnet.state_key(a) != podnet.state_key(state("hybrid", 8950, 9000, [peer("node-2", 2, "route")]))
