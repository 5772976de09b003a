"""The pure parts route-sync gained for the lab: tunnel neighbour planning and the per-Pod flow
replay plan (no root needed)."""

from __future__ import annotations

from cni.pipeline.flows import PodPort, pod_flows
from cni.pipeline.tables import EXT_CONTAINER_ID, EXT_IFNAME, EXT_IPS, EXT_MAC, EXT_OWNER, pod_cookie
from routesync.apply.ovs import pod_flow_groups
from routesync.apply.tnlneigh import parse_show, plan_set, tunnel_endpoints
from routesync.model import PeerPlan

SHOW = """IP                                            MAC                 Bridge
==========================================================================
192.168.77.12                                 8e:bf:1e:6a:00:f0   br-int
fd00:77::1                                    1E:1F:C5:81:48:0E   br-int
10.0.0.1                                      00:00:00:00:00:01   br-other
"""


def test_parse_show_keeps_one_bridge_and_lowercases() -> None:
    assert parse_show(SHOW, "br-int") == {"192.168.77.12": "8e:bf:1e:6a:00:f0", "fd00:77::1": "1e:1f:c5:81:48:0e"}


def test_plan_set_writes_missing_and_changed_only() -> None:
    have = {"192.168.77.12": "8e:bf:1e:6a:00:f0", "192.168.77.1": "aa:aa:aa:aa:aa:aa", "9.9.9.9": "x"}
    want = {"192.168.77.12": "8E:BF:1E:6A:00:F0", "192.168.77.1": "bb:bb:bb:bb:bb:bb",
            "fd00:77::1": "cc:cc:cc:cc:cc:cc"}
    assert plan_set(want, have) == [("192.168.77.1", "bb:bb:bb:bb:bb:bb"), ("fd00:77::1", "cc:cc:cc:cc:cc:cc")]


def test_tunnel_endpoints_only_tunnelled_peers() -> None:
    peers = [PeerPlan("n2", 4, "tunnel", "192.168.77.12", ("10.244.2.0/24",)),
             PeerPlan("n2", 6, "tunnel", "fd00:77::c", ("fd00:10:244:2::/64",)),
             PeerPlan("n3", 4, "route", "192.168.77.13", ("10.244.3.0/24",)),
             PeerPlan("n4", 4, "tunnel", None, ("10.244.4.0/24",)),
             PeerPlan("n5", 4, "tunnel", "192.168.77.12", ("10.244.5.0/24",))]
    assert tunnel_endpoints(peers) == ("192.168.77.12", "fd00:77::c")


def _port(cid: str, ofport: int, **extra: str) -> dict:
    ids = {EXT_OWNER: "pod", EXT_CONTAINER_ID: cid, EXT_IFNAME: "eth0", EXT_MAC: "02:00:00:00:00:05",
           EXT_IPS: "10.244.1.5/24,fd00:10:244:1::5/64", **extra}
    return {"name": f"fry{cid}", "ofport": ofport, "external_ids": ids}


def test_pod_flow_groups_equal_the_plugins_flows() -> None:
    gw = "02:11:22:33:44:55"
    groups = pod_flow_groups([_port("c1", 7)], gw)
    cookie = pod_cookie("c1", "eth0")
    assert list(groups) == [cookie.value]
    assert groups[cookie.value] == pod_flows(
        PodPort(cookie, 7, "02:00:00:00:00:05", ("10.244.1.5/24", "fd00:10:244:1::5/64")), gw)  # type: ignore[call-arg]


def test_pod_flow_groups_skip_ports_without_ofport_or_ids() -> None:
    bad = _port("c2", 8)
    del bad["external_ids"][EXT_MAC]
    assert pod_flow_groups([_port("c1", -1), bad, {"name": "x", "ofport": 3}], "02:11:22:33:44:55") == {}


def test_a_replayed_pod_of_a_namespace_with_policies_is_pending_again() -> None:
    """After an ovs-vswitchd restart the replay gives a Pod of a namespace with policies the
    pending block its ADD gave it (route-sync lifts it once the Pod's policy is planned)."""
    from cni.pipeline.flows import pending_flows
    from cni.pipeline.tables import EXT_POD_NAMESPACE

    gw = "02:11:22:33:44:55"
    cookie = pod_cookie("c1", "eth0")
    ports = [_port("c1", 7, **{EXT_POD_NAMESPACE: "prod"})]
    plain = pod_flow_groups(ports, gw)[cookie.value]
    assert pod_flow_groups(ports, gw, pending_namespaces=frozenset({"dev"}))[cookie.value] == plain
    assert pod_flow_groups(ports, gw, pending_namespaces=frozenset({"prod"}))[cookie.value] == \
        plain + pending_flows(cookie, ("10.244.1.5/24", "fd00:10:244:1::5/64"))
