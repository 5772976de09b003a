"""With route-sync down and its state file gone: DEL still succeeds and frees everything; ADD answers
11 (try again later) and leaves nothing, until the state file is back."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from cni.node import nodestate
from cni.pipeline import tables as pl
from tests.support.podnode import Pod, run
from tests.support.waiting import until

pytestmark = pytest.mark.root


def _ipam(node) -> list:
    return json.loads(run([f"{node.cni_bin}/ferry-ipam", "ls", "--json", "--data-dir", str(node.ipam_dir)]).stdout)


def _state_for(node) -> nodestate.NodeState:
    """What route-sync would write for this Node (bridge, gateway and base flows exist already)."""
    gw_mac = node.exec("cat", "/sys/class/net/ferry-gw0/address").stdout.strip()
    gw_ofport = int(node.ovs.vsctl("get", "interface", pl.GATEWAY_PORT, "ofport"))
    return nodestate.NodeState(
        node="fx", mode="encap", bridge="br-int", datapath="netdev", ovsdb=node.ovs.db, ovsRunDir=node.ovs.run_dir,
        mtu=1450, podCIDRs=["10.244.1.0/24", "fd00:10:244:1::/64"],
        gateway=nodestate.Gateway("ferry-gw0", gw_mac, gw_ofport, ["10.244.1.1/24", "fd00:10:244:1::1/64"]))


def test_del_while_route_sync_is_down_frees_everything(fx_node):
    warm = fx_node.add_pod_as("warm", "fxwarm01")  # lone mode builds bridge, gateway, base flows
    state_file = fx_node.dir / "state" / "node-state.json"
    nodestate.write(_state_for(fx_node), str(state_file))
    conf = dict(fx_node.plugin_conf(), cniVersion="1.0.0", name="ferrynet")
    conf["ipam"] = {"type": "ferry-ipam", "dataDir": str(fx_node.ipam_dir)}  # as with route-sync: no ranges
    ns = f"{fx_node.name}-a"
    run(["ip", "netns", "add", ns])
    added = fx_node.direct("ADD", f"/run/netns/{ns}", "fxrsdown1", conf=conf)
    assert added.returncode == 0, added.stdout
    pod = Pod("a", ns, json.loads(added.stdout))
    fx_node.direct_pods.append((pod, "fxrsdown1", "eth0"))
    assert any(r["containerID"] == "fxrsdown1" for r in _ipam(fx_node))
    state_file.unlink()  # route-sync down, and its state file gone (e.g. a Node reboot, /run cleared)
    p = fx_node.direct("DEL", pod.path, "fxrsdown1", conf=conf)
    assert p.returncode == 0, p.stdout
    fx_node.direct_pods = [x for x in fx_node.direct_pods if x[1] != "fxrsdown1"]
    run(["ip", "netns", "del", ns], check=False)
    assert pod.host_veth not in fx_node.links() and pod.host_veth not in fx_node.ports()
    assert fx_node.flows(pl.pod_cookie("fxrsdown1", "eth0").match()) == []
    assert not any(r["containerID"] == "fxrsdown1" for r in _ipam(fx_node)), "IPAM record left"
    del warm


def test_add_answers_11_until_the_state_file_is_back(fx_node):
    fx_node.add_pod_as("warm", "fxwarm02")
    state_file = fx_node.dir / "state" / "node-state.json"
    conf = dict(fx_node.plugin_conf(), cniVersion="1.0.0", name="ferrynet", startupWaitSeconds=0)
    conf["ipam"] = {"type": "ferry-ipam", "dataDir": str(fx_node.ipam_dir)}
    ns = f"{fx_node.name}-wait"
    run(["ip", "netns", "add", ns])
    try:
        before = (sorted(fx_node.links()), sorted(fx_node.ports()), len(_ipam(fx_node)))
        for _ in range(2):
            p = fx_node.direct("ADD", f"/run/netns/{ns}", "fxwait01", conf=conf)
            assert p.returncode != 0 and json.loads(p.stdout)["code"] == 11, p.stdout
        assert (sorted(fx_node.links()), sorted(fx_node.ports()), len(_ipam(fx_node))) == before
        assert "eth0" not in run(["ip", "-n", ns, "-o", "link"]).stdout
        nodestate.write(_state_for(fx_node), str(state_file))  # route-sync is back
        p = fx_node.direct("ADD", f"/run/netns/{ns}", "fxwait01", conf=conf)
        assert p.returncode == 0, p.stdout
        assert fx_node.direct("DEL", f"/run/netns/{ns}", "fxwait01", conf=conf).returncode == 0
    finally:
        run(["ip", "netns", "del", ns], check=False)


def test_add_waits_for_the_state_file_route_sync_writes(fx_node):
    """A Node just started: the kubelet's ADDs run while route-sync's Pod starts. An ADD that finds
    no state file waits (startupWaitSeconds) and succeeds once route-sync writes it, instead of code
    11 and the kubelet's retry ~10 s later."""
    fx_node.add_pod_as("warm", "fxwarm03")
    state_file = fx_node.dir / "state" / "node-state.json"
    log = fx_node.dir / "cni.log"
    conf = dict(fx_node.plugin_conf(), cniVersion="1.0.0", name="ferrynet", startupWaitSeconds=60)
    conf["ipam"] = {"type": "ferry-ipam", "dataDir": str(fx_node.ipam_dir)}
    ns = f"{fx_node.name}-late"
    run(["ip", "netns", "add", ns])
    try:
        with ThreadPoolExecutor(1) as pool:
            add = pool.submit(fx_node.direct, "ADD", f"/run/netns/{ns}", "fxlate01", conf=conf, timeout=120)
            until(lambda: add.done() or (log.exists() and "waiting up to 60 s for route-sync's node state"
                                         in log.read_text()), "the ADD to wait for the state file")
            assert not add.done(), add.result().stdout
            nodestate.write(_state_for(fx_node), str(state_file))  # route-sync's first write
            p = add.result()
        assert p.returncode == 0, p.stdout
        assert json.loads(p.stdout)["ips"], p.stdout
        assert "node state at" in log.read_text()
        assert fx_node.direct("DEL", f"/run/netns/{ns}", "fxlate01", conf=conf).returncode == 0
    finally:
        run(["ip", "netns", "del", ns], check=False)
