"""cni.kernel.podroutes, the planner part (pure, no root): which of a Pod interface's routes are the
plugin's, and that carrying out the plan converges (planning again finds nothing) without ever
touching the kernel's routes.  The netlink part runs in the root tests of ADD and CHECK
(tests/cni/commands) and of route-sync's Pod sync (tests/routesync_apply)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cni.kernel.netlink import RT_TABLE_LOCAL, RT_TABLE_MAIN, RTPROT_KERNEL, RTPROT_STATIC, RouteEntry
from cni.kernel.podroutes import held, plan
from cni.lean import addr
from cni.pipeline.podnet import PodNet, PodRoute

GW4, GW6 = "10.244.1.1", "fd00:10:244:1::1"
DSTS = ["0.0.0.0/0", "10.244.0.0/16", "10.244.2.0/24", "10.244.1.0/24", "::/0", "fd00:10:244::/48",
        "fd00:10:244:2::/64", "fe80::/64"]


def route(dst: str, gw: str | None, mtu: int = 0, proto: int = RTPROT_STATIC, table: int = RT_TABLE_MAIN) -> RouteEntry:
    return RouteEntry(dst=dst, gw=gw, index=7, proto=proto, table=table, mtu=mtu)


def test_held_are_the_main_tables_gateway_routes_not_the_kernels() -> None:
    routes = [route("0.0.0.0/0", GW4, 1500), route("10.244.1.0/24", None, proto=RTPROT_KERNEL),
              route("fe80::/64", None, proto=RTPROT_KERNEL), route("10.9.0.0/16", GW4, proto=RTPROT_KERNEL),
              route("10.8.0.0/16", GW4, table=RT_TABLE_LOCAL), route("::/0", GW6, 1450, proto=3)]
    assert held(routes) == [("0.0.0.0/0", GW4, 1500), ("::/0", GW6, 1450)]


def gw_of(dst: str) -> str:
    return GW4 if addr.family(dst) == 4 else GW6


def apply(routes: list[RouteEntry], want: PodNet) -> list[RouteEntry]:
    """What the kernel holds after :func:`cni.kernel.podroutes.apply` (a replace keys on dst and gw)."""
    todo = plan(want, want.mtu, routes)
    gone = {(addr.canonical_network(d), addr.host(g)) for d, g in todo.delete}
    put = {(addr.canonical_network(r.dst), addr.host(r.gw)): r for r in todo.put}
    out = []
    for r in routes:
        k = (addr.canonical_network(r.dst), addr.host(r.gw)) if r.gw else None
        if k in gone:
            continue
        if k in put and r.proto != RTPROT_KERNEL:
            continue  # replaced
        out.append(r)
    return out + [route(r.dst, r.gw, r.mtu) for r in put.values()]


wanted = st.lists(st.tuples(st.sampled_from(DSTS[:3] + DSTS[4:7]), st.sampled_from([0, 1430, 1450, 1500])),
                  unique_by=lambda t: t[0], max_size=6)
# what an interface holds: one route per destination (the kernel refuses a second of the same metric); the
# kernel's own are its connected and link-local routes, without a gateway
present = st.lists(st.tuples(st.sampled_from(DSTS), st.sampled_from([0, 1400, 1500]), st.booleans(),
                             st.sampled_from([RTPROT_STATIC, RTPROT_KERNEL, 3])), unique_by=lambda t: t[0], max_size=8)


@given(wanted, present, st.sampled_from([1400, 1450, 1500]))
def test_plan_converges_and_never_touches_the_kernels_routes(want_routes, have, mtu) -> None:  # type: ignore[no-untyped-def]
    want = PodNet(mtu, tuple(sorted((PodRoute(d, gw_of(d), m) for d, m in want_routes), key=lambda r: r.dst)))
    routes = [route(d, gw_of(d) if via and proto != RTPROT_KERNEL else None, m, proto) for d, m, via, proto in have]
    kernel = [r for r in routes if r.proto == RTPROT_KERNEL]
    todo = plan(want, 9000, routes)
    assert todo.mtu == mtu  # the interface first
    assert not {(d, g) for d, g in todo.delete} & {(r.dst, r.gw) for r in kernel}
    after = apply(routes, want)
    assert plan(want, mtu, after).empty  # converged: a second pass has nothing to do
    assert [r for r in after if r.proto == RTPROT_KERNEL] == kernel
    assert sorted((addr.canonical_network(d), g, m) for d, g, m in held(after)) == \
        sorted((addr.canonical_network(r.dst), r.gw, r.mtu) for r in want.routes)
