"""One Node in networkPolicyOnly: a netns with a private OVS (netdev bridge ``br-int``), the gateway
port and base flows as route-sync plants them in that mode (a ``ferry-gw0`` without addresses),
the node state file, and Pods plugged through the real cnitool with the conflist
[Debian's ``ptp`` + ``host-local``, ``ferry``]."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cni.node import nodestate
from cni.pipeline import tables as pl
from cni.pipeline.flows import GatewayPort, base_flows
from lab.tools import cnitool
from tests.support.ovs_instance import OvsInstance, netns

CNITOOL = cnitool()
NETWORK = "chained"
POD_CIDRS = ("10.244.1.0/24", "fd00:10:244:1::/64")
GW_MAC = "02:fe:00:00:00:01"


def run(argv: list[str], check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{argv} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


@dataclass
class Pod:
    name: str
    netns: str
    result: dict

    @property
    def path(self) -> str:
        return f"/run/netns/{self.netns}"

    def ip(self, family: int) -> str:
        for i in self.result.get("ips", []):
            a = i["address"].split("/")[0]
            if (":" in a) == (family == 6):
                return a
        raise KeyError(family)

    def gateway(self, family: int) -> str:
        return next(i["gateway"] for i in self.result["ips"] if (":" in i["address"]) == (family == 6))

    @property
    def mac(self) -> str:
        return next(i["mac"] for i in self.result["interfaces"] if i.get("sandbox"))

    @property
    def host_veth(self) -> str:
        return next(i["name"] for i in self.result["interfaces"] if not i.get("sandbox"))

    def exec(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return run(["ip", "netns", "exec", self.netns, *argv], check=check, timeout=timeout)


@dataclass
class Node:
    name: str  # its netns
    ovs: OvsInstance
    dir: Path
    cni_bin: str
    pods: list[Pod] = field(default_factory=list)
    bridge: str = "br-int"
    gw_ofport: int = 0

    @property
    def netconf_dir(self) -> Path:
        return self.dir / "net.d"

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

    def cnitool(self, op: str, netns_path: str, args: str = "") -> subprocess.CompletedProcess:
        env = dict(os.environ, NETCONFPATH=str(self.netconf_dir), CNI_PATH=self.cni_bin,
                   CNI_ARGS=args, CNI_CACHE_DIR=str(self.dir / "cache"))
        return run(["ip", "netns", "exec", self.name, CNITOOL, op, NETWORK, netns_path], check=False, env=env)

    def add_pod(self, name: str) -> Pod:
        ns = f"{self.name}-{name}"
        run(["ip", "netns", "add", ns])
        p = self.cnitool("add", f"/run/netns/{ns}", args=f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}")
        if p.returncode != 0:
            run(["ip", "netns", "del", ns], check=False)
            raise AssertionError(f"ADD {name} failed:\n{p.stdout}\n{p.stderr}")
        pod = Pod(name, ns, json.loads(p.stdout))
        self.pods.append(pod)
        return pod

    def del_pod(self, pod: Pod) -> subprocess.CompletedProcess:
        p = self.cnitool("del", pod.path)
        if p.returncode == 0 and pod in self.pods:
            self.pods.remove(pod)
        return p

    def exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return run(["ip", "netns", "exec", self.name, *argv], check=check)

    def flows(self, cookie_match: str | None = None) -> list[str]:
        args = [f"cookie={cookie_match}"] if cookie_match else []
        out = self.ovs.ofctl("dump-flows", self.bridge, *args)
        return [line for line in out.splitlines() if "cookie=" in line]

    def ports(self) -> list[str]:
        return [p for p in self.ovs.vsctl("list-ports", self.bridge).split() if p]


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
def node(cni_bin: str, tmp_path: Path) -> Iterator[Node]:
    name = f"fc-{secrets.token_hex(3)}"
    with netns(name) as ns, OvsInstance(name, netns=ns) as ovs:
        n = Node(name=ns, ovs=ovs, dir=tmp_path, cni_bin=cni_bin)
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
