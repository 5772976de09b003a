"""A DEL for an older sandbox of a Pod (same Pod name, other container ID) leaves the live Pod
untouched: its flows, OVS port, veth, address, and its traffic."""

from __future__ import annotations

import pytest

from cni.pipeline import tables as pl
from tests.support.netcheck import ping
from tests.support.podnode import run

pytestmark = pytest.mark.root

ARGS = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web"


def _strip(dump: list[str]) -> list[str]:
    import re

    return sorted(re.sub(r"(duration|n_packets|n_bytes|idle_age|hard_age)=[^,]*, ?", "", f).strip() for f in dump)


def _live_state(node, pod, cid: str) -> dict:
    flows = node.flows(pl.pod_cookie(cid, "eth0").match())
    port_cid = node.ovs.vsctl("get", "port", pod.host_veth, f"external_ids:{pl.EXT_CONTAINER_ID}").strip().strip('"')
    allocs = run([f"{node.cni_bin}/ferry-ipam", "ls", "--json", "--data-dir", str(node.ipam_dir)]).stdout
    return {"flows": _strip(flows), "port_cid": port_cid, "in_bridge": pod.host_veth in node.ports(),
            "veth": pod.host_veth in node.links(),
            "addr": pod.ip(4) in pod.exec("ip", "-o", "addr", "show", "eth0").stdout,
            "ipam": pod.ip(4) in allocs and cid in allocs}


@pytest.mark.parametrize("netns", ["same-netns-path", "other-netns-path", "gone-netns"])
def test_stale_del_leaves_the_live_pod_untouched(fx_node, netns):
    old_cid, new_cid = "fx0ldsandbox0001", "fx1ivesandbox002"
    if netns == "other-netns-path":  # the old sandbox really existed and is still plugged
        old = fx_node.add_pod_as("web-old", old_cid, ARGS)
    live = fx_node.add_pod_as("web", new_cid, ARGS)
    gw_ip = next(i["gateway"] for i in live.result["ips"] if "." in i["address"])
    assert ping(live.netns, gw_ip)
    before = _live_state(fx_node, live, new_cid)
    assert before["flows"] and all(v for v in before.values()), before

    stale_path = {"same-netns-path": live.path, "other-netns-path": f"/run/netns/{fx_node.name}-web-old",
                  "gone-netns": f"/run/netns/{fx_node.name}-web-gone"}[netns]
    for _ in range(2):  # the kubelet may repeat it
        p = fx_node.direct("DEL", stale_path, old_cid, args=ARGS)
        assert p.returncode == 0, p.stdout + p.stderr

    assert _live_state(fx_node, live, new_cid) == before
    assert ping(live.netns, gw_ip)
    if netns == "other-netns-path":  # the stale DEL did remove what was really the old sandbox's
        assert fx_node.flows(pl.pod_cookie(old_cid, "eth0").match()) == []
        assert old.host_veth not in fx_node.ports() and old.host_veth not in fx_node.links()
        fx_node.direct_pods = [x for x in fx_node.direct_pods if x[1] != old_cid]
        run(["ip", "netns", "del", old.netns], check=False)
