"""ADD in-process: the Pod's interface, addresses and routes, its OVS port and flows; a failed ADD
undoes what it made."""

from __future__ import annotations

import pytest

from cni.commands.add import add
from cni.pipeline import tables as pl
from cni.spec.errors import INVALID_CONFIG, CniError
from tests.cni.commands.inprocess import LoneNode, MakePod, Pod, packets, run

pytestmark = pytest.mark.root


def test_add_plugs_the_pod_into_the_bridge(lone_node: LoneNode, make_pod: MakePod) -> None:
    pod = make_pod("a")
    result = lone_node.call(add, lone_node.request("ADD", pod, container_id=pod.container_id))

    host, sandbox = result.interfaces
    assert sandbox.sandbox == pod.path and sandbox.name == "eth0" and not host.sandbox
    addresses = {ip.address for ip in result.ips}
    assert {a.split(".")[0] for a in addresses if "." in a} == {"10"} and any(":" in a for a in addresses)

    eth0 = pod.links()["eth0"]  # in the Pod's netns: up, with the MAC and addresses the result gives
    assert eth0["address"] == sandbox.mac and "UP" in eth0["flags"]
    assert pod.addresses() == addresses
    routes = run(["ip", "-n", pod.netns, "route", "show", "default"]).stdout
    assert "via 10.244.1.1 dev eth0" in routes

    assert lone_node.host_veths() == [host.name]  # the host end, in the LoneNode's netns, is an OVS port
    assert lone_node.pod_ports() == [host.name]
    ids = lone_node.port_external_ids(host.name)
    assert ids[pl.EXT_CONTAINER_ID] == pod.container_id and ids[pl.EXT_IFNAME] == "eth0"
    assert ids[pl.EXT_OWNER] == "pod" and ids[pl.EXT_MAC] == sandbox.mac
    assert set(ids[pl.EXT_IPS].split(",")) == addresses
    assert len(lone_node.ipam_files()) == 3  # two claims, one record

    cookie = pl.pod_cookie(pod.container_id, "eth0")
    assert len(lone_node.flows(cookie)) >= 5
    before = packets(lone_node.flows(cookie))
    # The flows carry the Pod's traffic: it reaches the gateway through OVS (ARP answered by
    # OVS's responder, SpoofGuard passing the Pod's own addresses), counted on its cookie.
    assert run(["ip", "netns", "exec", pod.netns, "ping", "-n", "-c", "1", "-W", "10", "10.244.1.1"],
               check=False).returncode == 0
    assert packets(lone_node.flows(cookie)) > before


def test_a_second_pod_gets_other_addresses_and_its_own_port(lone_node: LoneNode, make_pod: MakePod) -> None:
    a, b = make_pod("a"), make_pod("b")
    ra = lone_node.call(add, lone_node.request("ADD", a))
    rb = lone_node.call(add, lone_node.request("ADD", b))
    assert {i.address for i in ra.ips}.isdisjoint(i.address for i in rb.ips)
    assert sorted(lone_node.pod_ports()) == sorted([ra.interfaces[0].name, rb.interfaces[0].name])
    assert lone_node.flows(pl.pod_cookie(a.container_id, "eth0")) \
        and lone_node.flows(pl.pod_cookie(b.container_id, "eth0"))
    b_ip = next(i.address for i in rb.ips if "." in i.address).split("/")[0]
    assert run(["ip", "netns", "exec", a.netns, "ping", "-n", "-c", "1", "-W", "10", b_ip], check=False).returncode == 0


def _nothing_of(lone_node: LoneNode, pod: Pod, container_id: str) -> None:
    assert lone_node.host_veths() == [], "host veth left"
    assert lone_node.pod_ports() == [], "OVS port left"
    assert lone_node.flows(pl.pod_cookie(container_id, "eth0")) == [], "per-Pod flows left"
    assert lone_node.ipam_files() == [], "IPAM claims or records left"
    assert set(pod.links()) == {"lo"}, "an interface left in the Pod's netns"


def test_a_bad_config_field_fails_before_anything_is_made(lone_node: LoneNode, make_pod: MakePod) -> None:
    pod = make_pod("a")
    with pytest.raises(CniError) as e:
        lone_node.call(add, lone_node.request("ADD", pod, conf=lone_node.conf(mtu="jumbo")))
    assert e.value.code == INVALID_CONFIG and "mtu" in e.value.msg
    _nothing_of(lone_node, pod, pod.container_id)
    assert not lone_node.bridge_exists()


def test_a_failure_after_the_port_and_flows_rolls_everything_back(lone_node: LoneNode, make_pod: MakePod) -> None:
    """An MTU the parser accepts but the kernel cannot give IPv6 (below 1280: the interface gets no
    IPv6 at all) fails ADD while configuring the Pod's side, after the veth, the IPAM addresses, the
    OVS port and the per-Pod flows exist: the rollback removes each of them."""
    pod = make_pod("a")
    with pytest.raises(CniError) as e:
        lone_node.call(add, lone_node.request("ADD", pod, conf=lone_node.conf(mtu=1200)))
    assert f"configure eth0 in {pod.path}" in e.value.msg, e.value.msg  # the step it failed at
    _nothing_of(lone_node, pod, pod.container_id)
    assert lone_node.bridge_exists()  # the lone LoneNode's bridge and gateway stay: they are the LoneNode's
    rolled_back = (lone_node.dir / "cni.log").read_text()
    for what in ("IPAM addresses", "veth", "OVS port", "per-Pod flows"):
        assert f"rollback: removed {what}" in rolled_back

    # The same Pod then plugs in with a usable MTU: nothing of the failed attempt is in the way.
    result = lone_node.call(add, lone_node.request("ADD", pod))
    assert lone_node.pod_ports() == [result.interfaces[0].name]


def test_add_refuses_an_ifname_already_in_the_pod(lone_node: LoneNode, make_pod: MakePod) -> None:
    pod = make_pod("a")
    run(["ip", "-n", pod.netns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0peer"])
    with pytest.raises(CniError) as e:
        lone_node.call(add, lone_node.request("ADD", pod))
    assert e.value.code == 120  # INTERFACE_EXISTS
    assert lone_node.host_veths() == [] and lone_node.pod_ports() == [] and lone_node.ipam_files() == []


def test_an_ipv4_network_below_the_ipv6_minimum_mtu_plugs_in(lone_node: LoneNode, make_pod: MakePod) -> None:
    """Below 1280 bytes a link has no IPv6 at all, so the host end has no IPv6 to turn off (netdev):
    ADD goes on (it failed with 'No such file ... disable_ipv6' before)."""
    pod = make_pod("a")
    conf = lone_node.conf(mtu=1200)
    conf["ipam"] = dict(conf["ipam"], ranges=[[{"subnet": "10.244.1.0/24"}]])
    result = lone_node.call(add, lone_node.request("ADD", pod, conf=conf))
    assert pod.links()["eth0"]["mtu"] == 1200 and pod.addresses() == {i.address for i in result.ips}
    assert run(["ip", "netns", "exec", pod.netns, "ping", "-n", "-c", "1", "-W", "10", "10.244.1.1"],
               check=False).returncode == 0
