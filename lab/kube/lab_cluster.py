"""The seam between the lab (``lab.build``) and the cluster: from a Topology to a running cluster."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lab import tools
from lab.kube import cluster, plan
from lab.manifest import Manifest
from lab.topology import Topology, router_netns
from routesync.config import DEFAULT_GATEWAY, WG_SECTION


def route_sync_keys(topo: Topology) -> dict[str, Any]:
    """The topology's ``routeSync`` block as route-sync config keys (the ConfigMap's)."""
    rs = topo.route_sync
    assert rs is not None
    keys: dict[str, Any] = {"trafficEncapMode": rs.trafficEncapMode, "tunnelType": rs.tunnelType,
                            "noSNAT": rs.noSNAT, "fastPath": rs.fastPath, "macSource": rs.macSource,
                            "resyncSeconds": rs.resyncSeconds, "bridge": topo.bridge}
    if topo.kubernetes is not None:  # always said: the shipped manifest's default is ferry
        keys["ovsDaemons"] = topo.kubernetes.ovs_daemons
        # the Nodes' one datapath (lab.topology holds them to one here): netdev where the kernel
        # has no openvswitch module, as on the machine the lab was written on
        keys["datapathType"] = topo.nodes[0].datapath
    if rs.tunnelPort is not None:
        keys["tunnelPort"] = rs.tunnelPort
    if rs.policyPeers != "cluster":  # the shipped default otherwise; peerSlices brings ferry-controller
        keys["policyPeers"] = rs.policyPeers
    if topo.vlan is not None:  # one ConfigMap: a Node's own VLAN is its ferry.io/transport-vlan annotation
        keys["transportVLAN"] = topo.vlan
    if topo.encrypted:
        # the image's wireguard-go (the kernel's WireGuard where the Node has it): on Kubernetes
        # Ferry's openvswitch container runs it, whoever runs Open vSwitch, so it outlives
        # route-sync's container; without Kubernetes route-sync starts it itself
        keys["trafficEncryptionMode"] = topo.encryption
        keys[WG_SECTION] = {"startUserspace": topo.kubernetes is None}
    if topo.router_bgp is not None:
        keys["bgp"] = bgp_keys(topo)
    if topo.kubernetes is not None and topo.kubernetes.services:
        keys["serviceCIDRs"] = list(plan.service_cidrs(topo, topo.kubernetes))
    return keys


def bgp_keys(topo: Topology) -> dict[str, Any]:
    """route-sync's ``bgp`` section for every Node at once (``routePodCIDRs: bgp``): each Node
    peers with its IPv4 default gateway, its segment's router (FRR listens on every segment's
    range, ``lab.frr``), as ``lab.frr.node_bgp_config`` names it per Node without Kubernetes."""
    rb = topo.router_bgp
    assert rb is not None
    out: dict[str, Any] = {"localASN": rb.node_asn, "peers": [
        {"address": DEFAULT_GATEWAY, "addressFamily": "ipv4", "asn": rb.asn, "holdTime": rb.hold_time}]}
    if rb.graceful_restart:
        out["gracefulRestart"] = rb.graceful_restart
    return out


def cluster_plan(topo: Topology, name: str, directory: str) -> plan.ClusterPlan:
    assert topo.kubernetes is not None
    return plan.plan(name, directory, topo, topo.kubernetes, tools.TOOLS_DIR)


def up(topo: Topology, name: str, directory: str, manifest: Manifest, log: Callable[[str], None]) -> None:
    assert topo.kubernetes is not None
    p = cluster_plan(topo, name, directory)
    manifest.set(kubeconfig=p.admin_kubeconfig)
    cluster.up(p, plan.server_names(topo, topo.kubernetes), route_sync_keys(topo), topo.kubernetes.image_tag,
               topo.kubernetes.join_later, topo.route_pod_cidrs, router_netns(name), manifest, log,
               topo.kubernetes.cni, bgp=topo.router_bgp is not None, chained=topo.chained,
               installer=topo.kubernetes.installer, release_tag=topo.kubernetes.release,
               controller_delivery=topo.kubernetes.controller_delivery)
