"""One Node in networkPolicyOnly: a netns with a private OVS (netdev bridge ``br-int``), the gateway
port and base flows as route-sync plants them in that mode (a ``ferry-gw0`` without addresses),
the node state file, and Pods plugged through the real cnitool with the conflist
[Debian's ``ptp`` + ``host-local``, ``ferry``]."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cni.node import nodestate
from cni.pipeline import tables as pl
from cni.pipeline.flows import GatewayPort, base_flows
from tests.support.ovs_instance import OvsInstance, netns
from tests.support.podnode import Node, run

NETWORK = "chained"
POD_CIDRS = ("10.244.1.0/24", "fd00:10:244:1::/64")
GW_MAC = "02:fe:00:00:00:01"


@dataclass
class ChainedNode(Node):
    """A Node whose conflist is [Debian's ``ptp`` + ``host-local``, ``ferry``] with the state file
    route-sync writes in networkPolicyOnly."""

    network: str = NETWORK
    cni_args: str = "IgnoreUnknown=1;"
    gw_ofport: int = 0

    @property
    def state_file(self) -> Path:
        return self.dir / "state" / "node-state.json"

    def conflist(self) -> dict:
        ptp = {"type": "ptp", "ipam": {
            "type": "host-local", "dataDir": str(self.dir / "host-local"),
            "ranges": [[{"subnet": c}] for c in POD_CIDRS],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}}
        ferry = {"type": "ferry", "stateFile": str(self.state_file), "logFile": str(self.dir / "cni.log")}
        return {"cniVersion": "1.0.0", "name": NETWORK, "plugins": [ptp, ferry]}


def plant_policy_only(ovs: OvsInstance, ns: str, state_file: Path, bridge: str = "br-int") -> int:
    """What route-sync sets up in networkPolicyOnly: bridge, ``ferry-gw0`` (no addresses), base
    flows, forwarding, and the state file.  Returns the gateway's ofport."""
    ovs.vsctl("add-br", bridge, "--", "set", "bridge", bridge, "datapath_type=netdev")
    ovs.vsctl("add-port", bridge, pl.GATEWAY_PORT, "--", "set", "interface", pl.GATEWAY_PORT,
              "type=internal", f"mac=\"{GW_MAC}\"", "--", "set", "port", pl.GATEWAY_PORT,
              f"external_ids:{pl.EXT_OWNER}=node")
    ofport = int(ovs.vsctl("get", "interface", pl.GATEWAY_PORT, "ofport").strip())
    run(["ip", "netns", "exec", ns, "ip", "link", "set", pl.GATEWAY_PORT, "address", GW_MAC, "up"])
    run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"])
    text = "".join(f.text() + "\n" for f in base_flows(GatewayPort(ofport, GW_MAC, ())))
    run(["ovs-ofctl", "add-flows", f"unix:{ovs.run_dir}/{bridge}.mgmt", "-"], input=text, env=ovs.env)
    nodestate.write(nodestate.NodeState(
        node="node-1", mode="networkPolicyOnly", bridge=bridge, datapath="netdev", ovsdb=ovs.db,
        ovsRunDir=ovs.run_dir, mtu=1500, podCIDRs=list(POD_CIDRS),
        gateway=nodestate.Gateway(name=pl.GATEWAY_PORT, mac=GW_MAC, ofport=ofport, addresses=[])),
        str(state_file))
    return ofport


@pytest.fixture
def node(cni_bin: str, tmp_path: Path) -> Iterator[ChainedNode]:
    name = f"fc-{secrets.token_hex(3)}"
    with netns(name) as ns, OvsInstance(name, netns=ns) as ovs:
        n = ChainedNode(name=ns, ovs=ovs, dir=tmp_path, cni_bin=cni_bin)
        n.netconf_dir.mkdir(parents=True)
        (n.netconf_dir / "10-chained.conflist").write_text(json.dumps(n.conflist(), indent=2))
        n.gw_ofport = plant_policy_only(ovs, ns, n.state_file)
        try:
            yield n
        finally:
            for pod in list(n.pods):
                n.del_pod(pod)
            for line in run(["ip", "netns", "list"], check=False).stdout.splitlines():
                if line and line.split()[0].startswith(f"{ns}-"):
                    run(["ip", "netns", "del", line.split()[0]], check=False)
