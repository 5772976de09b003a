"""What a Node's reboot loses and keeps (``lab.kube.reboot.plan``), without root: a pure function of
the topology and the Node's plan."""

from __future__ import annotations

import os

from lab import layout
from lab import topology as topo_mod
from lab.kube import plan, reboot
from routesync.config import OVS_FERRY, OVS_HOST
from tests.e2e.kube.helpers import topology


def reboot_plan(ovs_daemons: str, lab_dir: str = "/run/ferry-lab/t") -> tuple[reboot.RebootPlan, plan.NodePlan]:
    topo = topo_mod.parse(topology({"trafficEncapMode": "encap"}, ovs_daemons=ovs_daemons))
    node = plan.plan("t", lab_dir, topo, topo.kubernetes, "/tools").node("node-1")  # type: ignore[arg-type]
    pods = ("t-node-1-a",)
    return reboot.plan("t", topo, node, layout.node_paths(lab_dir, "node-1"), pods), node


def test_a_reboot_empties_what_is_tmpfs_and_keeps_var_lib() -> None:
    p, node = reboot_plan(OVS_FERRY)
    emptied = {src for src, _keep in p.tmpfs_dirs}
    by_target = {dst: src for src, dst in node.binds}
    for target in ("/run/netns", "/run/openvswitch", "/run/ferry", "/run/containerd", "/run/wireguard"):
        assert by_target[target] in emptied, target
    for target in ("/var/lib/ferry", "/var/lib/kubelet", "/var/lib/containerd", "/var/lib/cni", "/etc/cni/net.d",
                   "/opt/cni/bin", "/var/log/ferry"):
        assert by_target[target] not in emptied, target
    assert all(keep == () for _src, keep in p.tmpfs_dirs)  # Ferry's conf.db is under /var/lib/ferry
    assert not p.host_ovs and p.netns == "t-node-1" and p.pod_netns == ("t-node-1-a",)


def test_the_nic_comes_back_with_the_machines_own_configuration() -> None:
    p, _node = reboot_plan(OVS_FERRY)
    assert p.nic_config[0] == "link set eth0 up"
    assert any(line.startswith("addr add 192.168.77.") and line.endswith("dev eth0") for line in p.nic_config)
    assert any(line.startswith("route add default via") for line in p.nic_config)
    assert "net.ipv4.ip_forward=1" in p.sysctls


def test_the_hosts_open_vswitch_keeps_its_database_and_starts_first() -> None:
    p, node = reboot_plan(OVS_HOST)
    ovs_run = os.path.normpath({dst: src for src, dst in node.binds}["/run/openvswitch"])
    assert p.host_ovs
    assert {os.path.normpath(s): k for s, k in p.tmpfs_dirs}[ovs_run] == ("conf.db",)
