"""Two Nodes claiming one Pod CIDR (routesync.planclaims, and the planner using it): one owner,
the other claim planned nowhere (no flows, no host routes, no cluster set entry, no BGP), v4 and
v6, equal or nested, this Node's own first.  Pure, no root."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from routesync.config import from_dict
from routesync.model import CidrConflict, LocalFacts, NodeRecord
from routesync.planclaims import ClaimIndex, advertised, conflicts
from routesync.planner import PeerMemo, plan

FACTS = LocalFacts(gateway_ofport=2, gateway_mac="02:00:00:00:01:01", tunnel_ofport=3, uplink_name="eth0",
                   uplink_addresses=("192.168.77.11/24",), transport_mtu=1500, uplink_mac="02:00:00:00:00:11")
LOCAL = NodeRecord("node-a", ("192.168.77.11",), ("10.244.1.0/24", "fd00:10:244:1::/64"))


def cfg(mode: str = "hybrid"):  # type: ignore[no-untyped-def]
    return from_dict({"nodeName": "node-a", "trafficEncapMode": mode})


def peer(name: str, n: int, *cidrs: str) -> NodeRecord:
    return NodeRecord(name, (f"192.168.77.{n}",), cidrs)


def planned(desired, cidr: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Who the plan sends ``cidr`` to: the peers whose plan lists it, the host routes' next hops."""
    return {"peers": sorted(p.peer for p in desired.peers if cidr in p.pod_cidrs),
            "routes": sorted(r.gw for r in desired.routes if r.dst == cidr),
            "cluster": cidr in desired.nft.cluster_pod_cidrs}


def test_no_overlap_no_conflict() -> None:
    assert conflicts("node-a", {"node-a": ["10.244.1.0/24"], "node-b": ["10.244.2.0/24", "fd00:10:244:2::/64"],
                                "node-c": ["10.244.3.0/24"]}) == ()


def test_equal_claims_the_name_that_sorts_first_owns_and_the_other_is_not_planned() -> None:
    peers = [peer("node-c", 13, "10.244.2.0/24"), peer("node-b", 12, "10.244.2.0/24", "fd00:10:244:2::/64")]
    d = plan(cfg(), LOCAL, peers, FACTS)
    assert d.cidr_conflicts == (CidrConflict("node-c", "10.244.2.0/24", "node-b", "10.244.2.0/24"),)
    assert planned(d, "10.244.2.0/24") == {"peers": ["node-b"], "routes": ["192.168.77.12"], "cluster": True}
    assert [p.peer for p in d.peers] == ["node-b", "node-b"]  # node-c had only that CIDR: nothing of it
    assert not any("192.168.77.13" in f.text() for f in d.flows)  # no flow towards node-c either


def test_a_cidr_inside_another_nodes_is_an_overlap_in_both_families() -> None:
    peers = [peer("node-b", 12, "10.245.0.0/16", "fd00:10:245::/48"),
             peer("node-c", 13, "10.245.7.0/24", "fd00:10:245:7::/64")]
    d = plan(cfg(), LOCAL, peers, FACTS)
    assert d.cidr_conflicts == (CidrConflict("node-c", "10.245.7.0/24", "node-b", "10.245.0.0/16"),
                                CidrConflict("node-c", "fd00:10:245:7::/64", "node-b", "fd00:10:245::/48"))
    assert planned(d, "10.245.7.0/24") == {"peers": [], "routes": [], "cluster": False}
    assert planned(d, "fd00:10:245:7::/64")["peers"] == []
    assert planned(d, "10.245.0.0/16")["routes"] == ["192.168.77.12"]


def test_this_nodes_own_cidr_stands_here_and_is_not_advertised_when_another_owns_it() -> None:
    # node-0 sorts first, so the other Nodes set node-a's claim aside; here node-a's own stands
    # (its Pods hold addresses from it), node-0's overlapping claim is not planned, and BGP does not
    # advertise node-a's: the underlay routers, as the other Nodes, send the range to node-0
    peers = [peer("node-0", 10, "10.244.1.128/25")]
    d = plan(cfg(), LOCAL, peers, FACTS)
    assert set(d.cidr_conflicts) == {CidrConflict("node-0", "10.244.1.128/25", "node-a", "10.244.1.0/24"),
                                     CidrConflict("node-a", "10.244.1.0/24", "node-0", "10.244.1.128/25")}
    assert planned(d, "10.244.1.128/25") == {"peers": [], "routes": [], "cluster": False}
    assert advertised(LOCAL.pod_cidrs, d.cidr_conflicts, "node-a") == ("fd00:10:244:1::/64",)
    # a peer that sorts after this Node: its claim is set aside everywhere, this Node's advertised
    d = plan(cfg(), LOCAL, [peer("node-z", 26, "10.244.0.0/16")], FACTS)
    assert d.cidr_conflicts == (CidrConflict("node-z", "10.244.0.0/16", "node-a", "10.244.1.0/24"),)
    assert advertised(LOCAL.pod_cidrs, d.cidr_conflicts, "node-a") == LOCAL.pod_cidrs


def test_a_set_aside_claim_takes_nothing_from_the_nodes_after_it() -> None:
    # node-c's /16 loses to node-b's /24 inside it; node-d's other /24 inside the /16 stands
    got = conflicts("node-a", {"node-a": ["10.244.1.0/24"], "node-b": ["10.9.1.0/24"], "node-c": ["10.9.0.0/16"],
                               "node-d": ["10.9.2.0/24"]})
    assert got == (CidrConflict("node-c", "10.9.0.0/16", "node-b", "10.9.1.0/24"),)


def test_a_nodes_own_overlapping_cidrs_are_no_conflict() -> None:
    assert conflicts("node-a", {"node-a": ["10.244.1.0/24"], "node-b": ["10.9.0.0/16", "10.9.1.0/24"]}) == ()


def test_the_memo_keeps_the_claims_across_passes_and_follows_a_fix() -> None:
    memo = PeerMemo()
    clash = [peer("node-b", 12, "10.244.2.0/24"), peer("node-c", 13, "10.244.2.0/24")]
    assert len(plan(cfg(), LOCAL, clash, FACTS, memo=memo).cidr_conflicts) == 1
    fixed = [clash[0], peer("node-c", 13, "10.244.3.0/24")]
    d = plan(cfg(), LOCAL, fixed, FACTS, memo=memo)
    assert d.cidr_conflicts == () and planned(d, "10.244.3.0/24")["peers"] == ["node-c"]
    assert plan(cfg(), LOCAL, fixed, FACTS).peers == d.peers  # with or without the memo, the same


cidr = st.one_of(
    st.builds(lambda a, p: str(ipaddress.ip_network(f"10.{a >> 8 & 3}.{a & 255}.0/{p}", strict=False)),
              st.integers(0, 1023), st.integers(14, 26)),
    st.builds(lambda a, p: str(ipaddress.ip_network(f"fd00:{a & 3:x}:{a >> 2 & 7:x}::/{p}", strict=False)),
              st.integers(0, 31), st.integers(30, 50)))
records = st.dictionaries(st.sampled_from(["node-a", "node-b", "node-c", "node-d", "node-e"]),
                          st.lists(cidr, min_size=1, max_size=3), max_size=5)


def brute_pairs(recs: dict[str, list[str]]) -> set[frozenset[tuple[str, str]]]:
    claims = [(n, str(ipaddress.ip_network(c))) for n, cs in recs.items() for c in cs]
    return {frozenset((a, b)) for a in claims for b in claims if a[0] != b[0]
            and ipaddress.ip_network(a[1]).version == ipaddress.ip_network(b[1]).version
            and ipaddress.ip_network(a[1]).overlaps(ipaddress.ip_network(b[1]))}  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)  # no timing: the machine is shared
@given(st.lists(records, min_size=1, max_size=5))
def test_index_updated_node_by_node_equals_one_built_afresh_and_finds_every_overlap(steps) -> None:  # type: ignore[no-untyped-def]
    index = ClaimIndex()
    for recs in steps:
        index.sync(recs)
        assert {frozenset((a, b)) for a, bs in index.pairs.items() for b in bs} == brute_pairs(recs)
        got = index.conflicts("node-c")
        assert got == conflicts("node-c", recs)
        aside = {(c.node, c.cidr) for c in got}
        standing = [(n, str(ipaddress.ip_network(c))) for n, cs in recs.items() for c in cs if (n, c) not in aside]
        assert brute_pairs({n: [c for m, c in standing if m == n] for n in recs}) == set()  # what stands is disjoint
        assert all(c.node != c.owner for c in got)
