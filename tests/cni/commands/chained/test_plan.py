"""The pure half of cni.commands.chained: what it reads from prevResult and what it plans."""

from __future__ import annotations

import pytest

from cni.commands import chained
from cni.pipeline import tables as pl
from cni.spec.errors import CniError
from cni.spec.result import decode

PTP = decode({
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "veth4df04900", "mac": "6e:02:f4:4b:e8:43"},
                   {"name": "eth0", "mac": "A2:04:FE:68:64:60", "sandbox": "/run/netns/p"}],
    "ips": [{"interface": 1, "address": "10.244.1.2/24", "gateway": "10.244.1.1"},
            {"interface": 1, "address": "fd00:10:244:1::2/64", "gateway": "fd00:10:244:1::1"}],
    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]})


def test_attachment_from_ptp_result() -> None:
    att = chained.attachment(PTP, "eth0")
    assert att.host_name == "veth4df04900" and att.mac == "a2:04:fe:68:64:60"
    assert att.addresses == ("10.244.1.2/24", "fd00:10:244:1::2/64")
    assert att.gateways == ("10.244.1.1", "fd00:10:244:1::1")
    assert [chained.host_route_dst(a) for a in att.addresses] == ["10.244.1.2/32", "fd00:10:244:1::2/128"]


def test_no_prev_result_or_no_address_is_a_config_error() -> None:
    with pytest.raises(CniError) as e:
        chained.attachment(None, "eth0")
    assert e.value.code == 7 and "prevResult" in e.value.msg
    with pytest.raises(CniError):
        chained.attachment(PTP, "net1")  # ptp's addresses belong to eth0


def test_next_hop_flows_are_per_pod_and_deleted_with_its_cookie() -> None:
    cookie = pl.pod_cookie("c1", "eth0")
    att = chained.attachment(PTP, "eth0")
    flows = chained.next_hop_flows(cookie, 7, att.gateways, "02:fe:00:00:00:01")
    assert all(f.cookie == cookie and "in_port=7" in f.match_text() for f in flows)
    arp, ns, na = flows
    assert "arp_tpa=10.244.1.1" in arp.match_text() and "load:0x02fe00000001->NXM_NX_ARP_SHA[]" in arp.actions_text()
    assert "nd_target=fd00:10:244:1::1" in ns.match_text() and "set_field:136->icmpv6_type" in ns.actions_text()
    assert ns.actions_text().endswith(f"resubmit(,{int(pl.Table.NEIGHBOR_RESPONDER)})")
    assert "icmp_type=136" in na.match_text() and na.actions_text() == "set_field:02:fe:00:00:00:01->nd_tll,IN_PORT"
    every = chained.chained_flows(cookie, 7, att.mac, att, "02:fe:00:00:00:01", 1)
    assert len({f.key() for f in every}) == len(every)  # none overwrites another


def test_records_round_trip_and_ignore_garbage() -> None:
    moved = [chained.MovedRoute("10.244.1.2/32", 3, None), chained.MovedRoute("fd00::2/128", 3, 1024)]
    assert chained.decode_routes(chained.encode_routes(moved)) == moved
    assert chained.decode_routes("x|1|;10.0.0.1/32|z|") == []
    pairs = {"arp_ignore": "0", "rp_filter": "2", "disable_ipv6": "0"}
    assert chained.decode_pairs(chained.encode_pairs(pairs)) == pairs
