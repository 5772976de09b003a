"""The traffic modes end to end, in a three-Node lab with route-sync on every Node.

For each mode: Pod↔Pod on one Node, across Nodes of one segment, across the router; Pod → a
remote Node; Pod → the external host behind the router — IPv4 and IPv6, ping and TCP.  The
path is asserted, not only reachability: a tunnelled pair moves the source Node's flow counters
of the peer's cookie (PEER flows: set tun_dst, output to the tunnel) and the destination Node's
tunnel-in classifier flow; a routed or underlay pair moves neither and the source Node has a
proto-102 route via the peer's transport address (routed) or none (underlay).  (The tunnel
port's OVSDB statistics stay 0 with the netdev datapath, hence the OpenFlow counters.)"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from lab.api import Lab
from tests.e2e.modes.helpers import ferry_routes, measure
from tests.support.labs import start_lab, topology

pytestmark = [pytest.mark.root, pytest.mark.slow]


@dataclass(frozen=True)
class Mode:
    name: str
    route_sync: dict
    route_pod_cidrs: bool
    same_subnet: str  # expected path node-1 → node-2: tunnel | route
    other_subnet: str  # node-1 → node-3: tunnel | underlay
    snat: bool = True


MODES = [
    Mode("encap-vxlan", {"trafficEncapMode": "encap", "tunnelType": "vxlan"}, False, "tunnel", "tunnel"),
    Mode("encap-geneve", {"trafficEncapMode": "encap", "tunnelType": "geneve"}, False, "tunnel", "tunnel"),
    Mode("encap-gre", {"trafficEncapMode": "encap", "tunnelType": "gre"}, False, "tunnel", "tunnel"),
    Mode("noEncap", {"trafficEncapMode": "noEncap"}, True, "route", "underlay"),
    Mode("noEncap-noSNAT", {"trafficEncapMode": "noEncap", "noSNAT": True}, True, "route", "underlay",
         snat=False),
    Mode("hybrid", {"trafficEncapMode": "hybrid", "tunnelType": "vxlan"}, False, "route", "tunnel"),
]

FAMILIES = (4, 6)


@pytest.fixture(scope="module", params=MODES, ids=[m.name for m in MODES])
def mode_lab(request: pytest.FixtureRequest, cni_bin: str):  # type: ignore[no-untyped-def]
    mode: Mode = request.param
    lab = start_lab(cni_bin, topology(mode.route_sync, mode.route_pod_cidrs))
    yield mode, lab
    lab.down()


def _reach(lab: Lab, src, addr: str) -> None:  # type: ignore[no-untyped-def]
    ping = lab.ping(src, addr, count=3, timeout=2, interval=0.05)
    assert ping, f"ping {src.node}/{src.name} -> {addr}: {ping.detail}"
    tcp = lab.tcp(src, addr)
    assert tcp, f"tcp {src.node}/{src.name} -> {addr}: {tcp.detail}"
    return tcp


def _assert_path(lab: Lab, src, dst_node: str, addr: str, path: str) -> None:  # type: ignore[no-untyped-def]
    sample = measure(lab, src, dst_node, lambda: _reach(lab, src, addr))
    if path == "tunnel":
        # 3 echo requests + the TCP exchange leave through the peer's tunnel flows
        assert sample.out_delta >= 3, f"{src.node}->{dst_node} {addr}: peer flows moved {sample.out_delta}"
        assert sample.in_delta >= 3, f"{dst_node} tunnel-in moved {sample.in_delta}"
    else:
        assert sample.out_delta == 0 and sample.in_delta == 0, \
            f"{path} pair {src.node}->{dst_node} went through the tunnel: {sample}"


def _assert_routes(lab: Lab, src_node: str, dst_node: str, path: str) -> None:
    """Host routes on the source Node agree with the path: routed via the peer's transport
    address, tunnelled via the peer's gateway on ferry-gw0, underlay none of ours."""
    routes = ferry_routes(lab.node(src_node))
    dst = lab.node(dst_node)
    cidrs = dst.spec.pod_cidrs
    for cidr in cidrs:
        mine = [r for r in routes if r.startswith(f"{cidr} ")]
        fam = 6 if ":" in cidr else 4
        if path == "route":
            assert mine and f"via {dst.address(fam)}" in mine[0], routes
        elif path == "tunnel":
            assert mine and "dev ferry-gw0" in mine[0], routes
        else:
            assert not mine, routes


@pytest.mark.parametrize("family", FAMILIES)
def test_same_node(mode_lab, family: int) -> None:  # type: ignore[no-untyped-def]
    _mode, lab = mode_lab
    a, b = lab.pod("node-1", "a"), lab.pod("node-1", "b")
    sample = measure(lab, a, "node-2", lambda: _reach(lab, a, b.address(family)))
    assert sample.out_delta == 0  # nothing for another Node left this one
    tcp = lab.tcp(a, b.address(family))
    assert tcp.peer == a.address(family)  # no NAT between Pods


@pytest.mark.parametrize("family", FAMILIES)
def test_same_subnet(mode_lab, family: int) -> None:  # type: ignore[no-untyped-def]
    mode, lab = mode_lab
    a, b = lab.pod("node-1", "a"), lab.pod("node-2", "a")
    _assert_routes(lab, "node-1", "node-2", mode.same_subnet)
    _assert_path(lab, a, "node-2", b.address(family), mode.same_subnet)
    assert lab.tcp(a, b.address(family)).peer == a.address(family)


@pytest.mark.parametrize("family", FAMILIES)
def test_other_subnet(mode_lab, family: int) -> None:  # type: ignore[no-untyped-def]
    mode, lab = mode_lab
    a, c = lab.pod("node-1", "a"), lab.pod("node-3", "a")
    _assert_routes(lab, "node-1", "node-3", mode.other_subnet)
    _assert_path(lab, a, "node-3", c.address(family), mode.other_subnet)
    # and back: node-3 reaches node-1's Pod the same way
    _assert_path(lab, c, "node-1", a.address(family), mode.other_subnet)
    assert lab.tcp(a, c.address(family)).peer == a.address(family)


@pytest.mark.parametrize("family", FAMILIES)
def test_pod_to_remote_node(mode_lab, family: int) -> None:  # type: ignore[no-untyped-def]
    _mode, lab = mode_lab
    for src_node, dst_node in (("node-1", "node-2"), ("node-2", "node-3"), ("node-3", "node-1")):
        _reach(lab, lab.pod(src_node, "a"), lab.node(dst_node).address(family))


@pytest.mark.parametrize("family", FAMILIES)
def test_pod_to_external(mode_lab, family: int) -> None:  # type: ignore[no-untyped-def]
    mode, lab = mode_lab
    ext = lab.external.addresses[0 if family == 4 else 1]
    for node in ("node-1", "node-2", "node-3"):
        pod = lab.pod(node, "a")
        tcp = _reach(lab, pod, ext)
        expected = lab.node(node).address(family) if mode.snat else pod.address(family)
        assert tcp.peer == expected, f"{node}: external host saw {tcp.peer}, expected {expected}"
