"""Where a lab keeps its files, and the files' contents (conflist, registry record,
route-sync config) as plain data.  Pure: paths and dicts, no I/O except ``write_atomic``."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from cni.node.atomicfile import write_atomic as write_bytes
from cni.pipeline.modes import ENCRYPTION_WIREGUARD
from lab import frr, tools
from lab.topology import NodeSpec, Topology, gateway_address, node_addresses
from routesync.config import WG_SECTION

DEFAULT_ROOT = "/run/ferry-lab"
NETWORK_NAME = "ferry"
CNI_VERSION = "1.0.0"


def lab_root() -> str:
    return os.environ.get("FERRY_LAB_ROOT", DEFAULT_ROOT)


def lab_dir(name: str, root: str | None = None) -> str:
    return os.path.join(root or lab_root(), name)


@dataclass(frozen=True)
class NodePaths:
    """Everything one simulated Node keeps on disk, under ``<lab>/nodes/<node>/``."""

    root: str

    @property
    def ovs(self) -> str:  # OVS_RUNDIR = OVS_DBDIR = OVS_LOGDIR
        return os.path.join(self.root, "ovs")

    @property
    def db_sock(self) -> str:
        return os.path.join(self.ovs, "db.sock")

    @property
    def netconf(self) -> str:  # NETCONFPATH
        return os.path.join(self.root, "net.d")

    @property
    def conflist(self) -> str:
        return os.path.join(self.netconf, "10-ferry.conflist")

    @property
    def state_file(self) -> str:
        return os.path.join(self.root, "state", "node-state.json")

    @property
    def ipam(self) -> str:
        return os.path.join(self.root, "ipam")

    @property
    def log(self) -> str:
        return os.path.join(self.root, "log")

    @property
    def cni_log(self) -> str:
        return os.path.join(self.log, "cni.log")

    @property
    def route_sync_config(self) -> str:
        return os.path.join(self.root, "route-sync.yaml")

    @property
    def route_sync_log(self) -> str:
        return os.path.join(self.log, "route-sync.log")

    @property
    def pods(self) -> str:
        return os.path.join(self.root, "pods")

    @property
    def wireguard(self) -> str:
        """The Node's WireGuard files (an encrypted lab): ``run`` and ``keys`` below it."""
        return os.path.join(self.root, ENCRYPTION_WIREGUARD)

    @property
    def wireguard_run(self) -> str:  # wireguard.runDir: the userspace device's UAPI socket
        return os.path.join(self.wireguard, "run")

    @property
    def wireguard_keys(self) -> str:  # wireguard.keyDir: the Node's private key (route-sync makes it, 0700)
        return os.path.join(self.wireguard, "keys")

    def pod_result(self, pod: str) -> str:
        return os.path.join(self.pods, f"{pod}.json")

    def dirs(self) -> list[str]:
        return [self.root, self.ovs, self.netconf, os.path.dirname(self.state_file), self.ipam,
                self.log, self.pods]

    def ovs_env(self) -> dict[str, str]:
        return {"OVS_RUNDIR": self.ovs, "OVS_DBDIR": self.ovs, "OVS_LOGDIR": self.ovs}


def node_paths(lab_directory: str, node: str) -> NodePaths:
    return NodePaths(os.path.join(lab_directory, "nodes", node))


def registry_dir(lab_directory: str) -> str:
    return os.path.join(lab_directory, "registry")


def conflist(topo: Topology, node: NodeSpec, paths: NodePaths, lone: bool) -> dict:
    """The Node's ``10-ferry.conflist``.  ``lone``: no route-sync, so the plugin needs the MTU and
    explicit IPAM ranges (the Node's Pod CIDRs) and builds the bridge itself.  With route-sync
    the conflist names no ranges and no MTU: the plugin takes the Pod CIDRs, the MTU and the
    gateway from the state file route-sync writes (until then ADD answers "try again later")."""
    ipam: dict = {"type": "ferry-ipam", "dataDir": paths.ipam}
    if lone:
        ipam["ranges"] = [[{"subnet": c}] for c in node.pod_cidrs]
    plugin = {
        "type": "ferry",
        "stateFile": paths.state_file,
        "bridge": topo.bridge,
        "ovsdb": f"unix:{paths.db_sock}",
        "ovsRunDir": paths.ovs,
        "datapath": node.datapath,
        "mtu": topo.segment(node.segment).mtu if lone else 0,
        "logFile": paths.cni_log,
        "ipam": ipam,
    }
    if topo.chained and not lone:
        return chained_conflist(node, paths, plugin)
    return {"cniVersion": CNI_VERSION, "name": NETWORK_NAME, "plugins": [plugin]}


def chained_conflist(node: NodeSpec, paths: NodePaths, ferry: dict) -> dict:
    """networkPolicyOnly: Debian's ``ptp`` with ``host-local`` (the Node's Pod CIDRs) owns the
    Pod's veth, addresses and routes; ``ferry`` follows with no IPAM of its own (the state file
    route-sync writes says networkPolicyOnly)."""
    ptp = {"type": "ptp", "ipam": {
        "type": "host-local", "dataDir": os.path.join(paths.ipam, "host-local"),
        "ranges": [[{"subnet": c}] for c in node.pod_cidrs],
        "routes": [{"dst": "::/0" if ":" in c else "0.0.0.0/0"} for c in node.pod_cidrs]}}
    ferry = {k: v for k, v in ferry.items() if k not in ("ipam", "mtu")}
    return {"cniVersion": CNI_VERSION, "name": NETWORK_NAME, "plugins": [ptp, ferry]}


def registry_record(topo: Topology, node: NodeSpec) -> dict:
    return {"name": node.name, "transportAddresses": [a for a in node_addresses(topo, node) if a],
            "podCIDRs": list(node.pod_cidrs), "annotations": {}}


def route_sync_config(topo: Topology, node: NodeSpec, paths: NodePaths, lab_directory: str) -> dict:
    rs = topo.route_sync
    assert rs is not None
    return {
        "nodeName": node.name,
        "trafficEncapMode": rs.trafficEncapMode,
        "tunnelType": rs.tunnelType,
        **({"tunnelPort": rs.tunnelPort} if rs.tunnelPort is not None else {}),
        "transportInterface": "eth0",
        "noSNAT": rs.noSNAT,
        # no defaultMTU: route-sync derives the Pod MTU from the uplink's MTU (the segment's)
        # minus the tunnel overhead; a defaultMTU would override that deduction
        "bridge": topo.bridge,
        "datapathType": node.datapath,
        "ovsdb": f"unix:{paths.db_sock}",
        "ovsRunDir": paths.ovs,
        "stateFile": paths.state_file,
        "podCIDRs": list(node.pod_cidrs),
        "clusterCIDRs": list(topo.cluster_cidrs),
        "nodeSource": {"type": "registry", "registryDir": registry_dir(lab_directory)},
        "logFile": paths.route_sync_log,
        "fastPath": rs.fastPath,
        "macSource": rs.macSource,
        "resyncSeconds": rs.resyncSeconds,
        **({"transportVLAN": node.vlan} if node.vlan is not None else {}),
        **({"bgp": frr.node_bgp_config(topo, node)} if topo.router_bgp is not None else {}),
        **(wireguard_config(paths) if topo.encrypted else {}),
    }


def wireguard_config(paths: NodePaths) -> dict:
    """An encrypted lab's keys of route-sync's config: every Node's own run and key directories
    under the lab's, and the userspace WireGuard (this kernel has no WireGuard module)."""
    return {"trafficEncryptionMode": ENCRYPTION_WIREGUARD,
            WG_SECTION: {"runDir": paths.wireguard_run, "keyDir": paths.wireguard_keys,
                         "userspaceCommand": tools.wireguard_go()}}


def gateway_addresses(node: NodeSpec) -> list[str]:
    return [gateway_address(c) for c in node.pod_cidrs]


def write_atomic(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_bytes(path, text.encode())


def write_json(path: str, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=2) + "\n")
