"""The fast path's pure parts: which MAC, from where, and the flows a fast peer gets."""

from __future__ import annotations

import pytest

from cni.pipeline.tables import Table, peer_cookie
from routesync.config import from_dict
from routesync.model import LocalFacts, NextHop, NodeRecord
from routesync.planner import choose_mac, fast_candidates, plan, self_record

A, N = "02:00:00:00:00:0a", "02:00:00:00:00:0b"
FACTS = LocalFacts(2, "02:00:00:00:01:01", None, "eth0", ("192.168.77.11/24",), 1500,
                   uplink_mac="02:00:00:00:77:11", uplink_ofport=5)
LOCAL = NodeRecord("n1", ("192.168.77.11",), ("10.244.1.0/24",))
SAME = NodeRecord("n2", ("192.168.77.12",), ("10.244.2.0/24",), (("ferry.io/mac-address", A),))
OTHER = NodeRecord("n3", ("192.168.88.13",), ("10.244.3.0/24",), (("ferry.io/mac-address", A),))


@pytest.mark.parametrize("source, same, ann, neigh, want", [
    ("annotation", True, A, N, (A, "annotation", False)),
    ("annotation", True, None, N, (None, None, False)),
    ("neighbor", True, A, N, (N, "neighbor", False)),
    ("neighbor", True, A, None, (None, None, False)),
    ("both", True, A, N, (A, "annotation", True)),
    ("both", True, A, A, (A, "annotation", False)),
    ("both", True, None, N, (N, "neighbor", False)),
    ("annotation", False, A, N, (N, "neighbor", False)),  # a router: no annotation names it
    ("both", False, A, None, (None, None, False)),
])
def test_choose_mac(source: str, same: bool, ann: str | None, neigh: str | None, want: tuple) -> None:
    assert choose_mac(source, same, ann, neigh) == want


def cfg(**kw: object):  # type: ignore[no-untyped-def]
    return from_dict({"nodeName": "n1", "trafficEncapMode": "noEncap", "fastPath": True, **kw})


def test_fast_peer_flows_tx_and_rx_under_one_cookie() -> None:
    hops = {"192.168.77.12": NextHop("192.168.77.12", N), "192.168.88.13": NextHop("192.168.77.1", "02:00:00:00:00:01")}
    d = plan(cfg(macSource="both"), LOCAL, [SAME, OTHER], FACTS, hops)
    by_peer = {p.peer: p for p in d.peers}
    assert (by_peer["n2"].path, by_peer["n2"].next_hop_mac, by_peer["n2"].mac_source) == ("fast", A, "annotation")
    assert (by_peer["n3"].path, by_peer["n3"].next_hop_mac, by_peer["n3"].via) == ("fast", "02:00:00:00:00:01", "fast")
    assert [(x.peer, x.annotation, x.neighbor) for x in d.mac_disagreements] == [("n2", A, N)]
    n2 = [f for f in d.flows if f.cookie == peer_cookie("n2")]
    tx = [f for f in n2 if f.table == Table.L3_FORWARDING]
    rx = [f for f in n2 if f.table == Table.CLASSIFIER]
    assert [f.actions_text() for f in tx] == [f"mod_dl_src:02:00:00:00:77:11,mod_dl_dst:{A},dec_ttl,output:5"]
    assert [f.match_text() for f in rx] \
        == ["in_port=5,dl_dst=02:00:00:00:77:11,ip,nw_src=10.244.2.0/24,nw_dst=10.244.1.0/24"]
    assert rx[0].actions_text() == "mod_dl_dst:02:00:00:00:01:01,goto_table:25" and rx[0].priority > 10
    assert any(r.dst == "10.244.2.0/24" and r.gw == "192.168.77.12" for r in d.routes)  # host traffic, fallback


def test_unknown_mac_keeps_the_gateway_path_and_no_flows() -> None:
    d = plan(cfg(macSource="neighbor"), LOCAL, [SAME, OTHER], FACTS, {})
    assert sorted((p.peer, p.path, p.via) for p in d.peers) \
        == [("n2", "route", "gateway"), ("n3", "underlay", "gateway")]
    assert not [f for f in d.flows if f.cookie in (peer_cookie("n2"), peer_cookie("n3"))]


def test_candidates_and_published_annotation_per_mac_source() -> None:
    assert fast_candidates(cfg(macSource="annotation"), [SAME, OTHER], FACTS) == ("192.168.88.13",)
    assert fast_candidates(cfg(macSource="both"), [SAME, OTHER], FACTS) == ("192.168.77.12", "192.168.88.13")
    published = NodeRecord("n1", LOCAL.transport_addresses, LOCAL.pod_cidrs, (("ferry.io/mac-address", A),))
    assert self_record(cfg(macSource="neighbor"), published, FACTS).annotations == ()
    assert dict(self_record(cfg(), LOCAL, FACTS).annotations) == {"ferry.io/mac-address": "02:00:00:00:77:11"}
