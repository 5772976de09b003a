"""The flow planners: pure, so checked without root; ovs-ofctl itself parses what they produce."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess

import pytest

from cni.pipeline import tables as pl
from cni.pipeline.actions import actions_text
from cni.pipeline.flows import (
    GatewayPort,
    PodPort,
    arp_responder_actions,
    base_flows,
    link_local,
    mac,
    pod_flows,
)

GW = GatewayPort(ofport=2, mac="02:00:00:00:00:01", addresses=("10.244.1.1/24", "fd00:10:244:1::1/64"))
POD = PodPort(cookie=pl.pod_cookie("c1", "eth0"), ofport=7, mac="02:11:22:33:44:55",
              addresses=("10.244.1.5/24", "fd00:10:244:1::5/64"))


def test_link_local_is_the_kernels_eui64():
    # The kernel derives fe80::11:22ff:fe33:4455 from 02:11:22:33:44:55 (flip the U/L bit).
    assert link_local("02:11:22:33:44:55") == "fe80::11:22ff:fe33:4455"
    assert link_local("00:16:3e:aa:bb:cc") == "fe80::216:3eff:feaa:bbcc"


@pytest.mark.parametrize("bad", ["", "02:11:22:33:44", "02:11:22:33:44:55,actions=drop", "zz:11:22:33:44:55"])
def test_mac_rejects_anything_but_a_mac(bad):
    with pytest.raises(ValueError):
        mac(bad)


def test_flow_text_cannot_be_extended_by_an_address():
    with pytest.raises(ValueError):
        pod_flows(PodPort(POD.cookie, 7, POD.mac, ("10.0.0.1,actions=output:1",)), GW.mac)


def test_pod_flows_all_carry_the_pods_cookie_and_only_it():
    flows = pod_flows(POD, GW.mac)
    assert {f.cookie for f in flows} == {POD.cookie}
    assert pl.pod_cookie("c2", "eth0") != POD.cookie  # a stale sandbox never matches


def test_pod_flows_guard_every_source_the_pod_owns():
    flows = pod_flows(POD, GW.mac)
    guard = [f.match_text() for f in flows if f.table == pl.Table.SPOOF_GUARD]
    assert any("nw_src=10.244.1.5" in m and "dl_src=02:11:22:33:44:55" in m for m in guard)
    assert any("arp_spa=10.244.1.5" in m and "arp_sha=02:11:22:33:44:55" in m for m in guard)
    assert any("ipv6_src=fd00:10:244:1::5" in m for m in guard)
    # Router advertisements from a Pod are dropped before anything else.
    ra = [f for f in flows if f.table == pl.Table.SPOOF_GUARD and "icmp_type=134" in f.match_text()]
    assert ra and all(f.actions_text() == "drop" for f in ra)
    # Nothing in SpoofGuard admits a packet without pinning in_port.
    assert all("in_port=7" in m for m in guard)


def test_routed_delivery_rewrites_macs_and_decrements_ttl():
    flows = pod_flows(POD, GW.mac)
    l3 = [f for f in flows if f.table == pl.Table.L3_FORWARDING]
    assert len(l3) == 2
    for f in l3:
        assert "dl_dst=02:00:00:00:00:01" in f.match_text()
        assert "mod_dl_src:02:00:00:00:00:01" in f.actions_text() and "mod_dl_dst:02:11:22:33:44:55" in f.actions_text()
        assert "dec_ttl" in f.actions_text()


def test_arp_responder_answers_with_the_given_pair():
    a = actions_text(arp_responder_actions("02:00:00:00:00:01", "10.244.1.1"))
    assert "load:0x020000000001->NXM_NX_ARP_SHA[]" in a
    assert f"load:0x{int(ipaddress.IPv4Address('10.244.1.1')):08x}->NXM_OF_ARP_SPA[]" in a
    assert a.endswith("IN_PORT")


def test_flow_keys_are_unique():
    flows = base_flows(GW) + pod_flows(POD, GW.mac)
    keys = [f.key() for f in flows]
    assert len(keys) == len(set(keys))


@pytest.mark.skipif(shutil.which("ovs-ofctl") is None, reason="ovs-ofctl not installed")
def test_ovs_ofctl_parses_every_planned_flow(tmp_path):
    flows = base_flows(GW) + pod_flows(POD, GW.mac)
    path = tmp_path / "flows.txt"
    path.write_text("\n".join(f.text() for f in flows) + "\n")
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "parse-flows", str(path)],
                         check=False, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("OFPT_FLOW_MOD") == len(flows)
