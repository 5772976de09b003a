"""route-sync's replay of per-Pod flows after an ovs-vswitchd restart must rebuild exactly the
flows the plugin's ADD installed (pure: both planners on the same Pod)."""

from __future__ import annotations

from cni.pipeline import tables as pl
from cni.pipeline.flows import PodPort, pod_flows


def test_replayed_pod_flows_equal_the_plugins() -> None:
    from routesync.apply.ovs import pod_flow_groups

    cookie = pl.pod_cookie("fxreplay", "eth0")
    ids = {pl.EXT_CONTAINER_ID: "fxreplay", pl.EXT_IFNAME: "eth0", pl.EXT_MAC: "02:00:00:00:00:05",
           pl.EXT_IPS: "10.244.1.5/24,fd00:10:244:1::5/64", pl.EXT_OWNER: "pod"}
    gw_mac, gw_ofport = "02:00:00:00:00:01", 1
    plugin = pod_flows(PodPort(cookie, 7, "02:00:00:00:00:05", ("10.244.1.5/24", "fd00:10:244:1::5/64")),
                       gw_mac, gw_ofport)
    replay = pod_flow_groups([{"name": "fry0", "ofport": 7, "external_ids": ids}], gw_mac, gw_ofport)[cookie.value]
    assert sorted(f.text() for f in replay) == sorted(f.text() for f in plugin)


def test_replayed_chained_pod_flows_equal_the_plugins() -> None:
    """A networkPolicyOnly (chained) Pod gets its next-hop answers back too."""
    from cni.commands.chained import Attachment, chained_flows
    from routesync.apply.ovs import pod_flow_groups

    cookie = pl.pod_cookie("fxchained", "eth0")
    ids = {pl.EXT_CONTAINER_ID: "fxchained", pl.EXT_IFNAME: "eth0", pl.EXT_MAC: "02:00:00:00:00:07",
           pl.EXT_IPS: "10.244.1.7/32,fd00:10:244:1::7/128", pl.EXT_OWNER: pl.OWNER_POD, pl.EXT_CHAINED: "1",
           pl.EXT_CHAINED_GATEWAYS: "10.244.1.1,fd00:10:244:1::1"}
    gw_mac, gw_ofport = "02:00:00:00:00:01", 1
    from cni.spec.result import IPConfig

    att = Attachment(ifname="eth0", mac="02:00:00:00:00:07", host_name="veth0",
                     ips=(IPConfig(address="10.244.1.7/32", gateway="10.244.1.1"),
                          IPConfig(address="fd00:10:244:1::7/128", gateway="fd00:10:244:1::1")))
    plugin = chained_flows(cookie, 9, "02:00:00:00:00:07", att, gw_mac, gw_ofport)
    replay = pod_flow_groups([{"name": "veth0", "ofport": 9, "external_ids": ids}], gw_mac, gw_ofport)[cookie.value]
    assert sorted(f.text() for f in replay) == sorted(f.text() for f in plugin)
