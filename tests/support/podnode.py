"""One Node (a netns with its own OVS, netdev bridge) and Pods plugged through the real cnitool or
by exec'ing the plugin as a runtime does: the ``node`` and ``fx_node`` fixtures and their helpers,
shared by the verb tests (tests/cni/commands), the hostile-input tests and the chaos run."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lab.tools import cnitool
from tests.support.ovs_instance import OvsInstance, netns

ROOT = Path(__file__).resolve().parents[2]
ECHO = str(ROOT / "lab" / "echo.py")

CNITOOL = cnitool()
NETWORK = "ferrynet"


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

    def connect(self, addr: str, port: int, timeout: float, payload: int = 3000) -> dict:
        """lab/echo.py's ``connect`` from this Pod: its JSON verdict (``ok``, ``peer``, ``server``)."""
        cp = self.exec(sys.executable, "-I", "-S", ECHO, "connect", addr, str(port), str(payload), str(timeout),
                       check=False, timeout=timeout + 10)
        return dict(json.loads(cp.stdout.strip().splitlines()[-1]))

    def serve(self, port: int) -> subprocess.Popen:
        """lab/echo.py's echo server on ``port`` in this Pod, ready when this returns (kill it)."""
        srv = subprocess.Popen(["ip", "netns", "exec", self.netns, sys.executable, "-I", "-S", ECHO, "serve",
                                str(port)], stdout=subprocess.PIPE, text=True)
        assert srv.stdout is not None and srv.stdout.readline().strip() == "ready"
        return srv

    def exec(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return run(["ip", "netns", "exec", self.netns, *argv], check=check, timeout=timeout)


@dataclass
class Node:
    name: str
    ovs: OvsInstance
    dir: Path
    cni_bin: str
    cni_version: str = "1.0.0"  # cnitool 1.1.2 (Debian) reads results up to 1.0.0
    ranges: list = field(default_factory=lambda: [[{"subnet": "10.244.1.0/24"}],
                                                  [{"subnet": "fd00:10:244:1::/64"}]])
    pods: list[Pod] = field(default_factory=list)
    bridge: str = "br-int"
    network: str = NETWORK
    cni_args: str = ""  # prefix of CNI_ARGS on add_pod, e.g. "IgnoreUnknown=1;"

    @property
    def netconf_dir(self) -> Path:
        return self.dir / "net.d"

    @property
    def ipam_dir(self) -> Path:
        return self.dir / "ipam"

    def plugin_conf(self) -> dict:
        return {
            "type": "ferry",
            "stateFile": str(self.dir / "state" / "node-state.json"),
            "bridge": self.bridge,
            "ovsdb": self.ovs.db,
            "ovsRunDir": self.ovs.run_dir,
            "datapath": "netdev",
            "logFile": str(self.dir / "cni.log"),
            "ipam": {"type": "ferry-ipam", "dataDir": str(self.ipam_dir), "ranges": self.ranges},
        }

    def write_conflist(self, **overrides) -> None:
        self.netconf_dir.mkdir(parents=True, exist_ok=True)
        conf = dict(self.plugin_conf(), **overrides)
        conflist = {"cniVersion": self.cni_version, "name": self.network, "plugins": [conf]}
        (self.netconf_dir / "10-ferry.conflist").write_text(json.dumps(conflist, indent=2))

    def cnitool(self, op: str, netns_path: str, args: str = "", check: bool = False) -> subprocess.CompletedProcess:
        env = dict(os.environ, NETCONFPATH=str(self.netconf_dir), CNI_PATH=self.cni_bin,
                   CNI_ARGS=args, CNI_CACHE_DIR=str(self.dir / "cache"))
        return run(["ip", "netns", "exec", self.name, CNITOOL, op, self.network, netns_path], check=check, env=env)

    def add_pod(self, name: str) -> Pod:
        ns = f"{self.name}-{name}"
        run(["ip", "netns", "add", ns])
        p = self.cnitool("add", f"/run/netns/{ns}",
                         args=f"{self.cni_args}K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}")
        if p.returncode != 0:
            run(["ip", "netns", "del", ns], check=False)
            raise AssertionError(f"ADD {name} failed:\n{p.stdout}\n{p.stderr}")
        pod = Pod(name, ns, json.loads(p.stdout))
        self.pods.append(pod)
        return pod

    def del_pod(self, pod: Pod) -> subprocess.CompletedProcess:
        return self.cnitool("del", pod.path)  # the Pod stays listed: teardown removes its netns

    def exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return run(["ip", "netns", "exec", self.name, *argv], check=check, env=dict(os.environ, **self.ovs_env))

    @property
    def ovs_env(self) -> dict[str, str]:
        return {"OVS_RUNDIR": self.ovs.dir, "OVS_DBDIR": self.ovs.dir, "OVS_LOGDIR": self.ovs.dir}

    def flows(self, cookie_match: str | None = None) -> list[str]:
        args = [f"cookie={cookie_match}"] if cookie_match else []
        out = self.ovs.ofctl("dump-flows", self.bridge, *args)
        return [line for line in out.splitlines() if "cookie=" in line]

    def ports(self) -> list[str]:
        out = self.ovs.vsctl("list-ports", self.bridge)
        return [p for p in out.split() if p]

    def links(self) -> list[str]:
        out = self.exec("ip", "-o", "link", "show").stdout
        return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


@pytest.fixture
def node(cni_bin: str, tmp_path: Path) -> Iterator[Node]:
    name = f"tp-{secrets.token_hex(3)}"
    with netns(name) as ns, OvsInstance(name, netns=ns) as ovs:
        n = Node(name=ns, ovs=ovs, dir=tmp_path, cni_bin=cni_bin)
        n.write_conflist()
        try:
            yield n
        finally:
            remove_pods(n)


def remove_pods(node: Node) -> None:
    """DEL every Pod the Node plugged through cnitool and delete its netns (teardown)."""
    for pod in list(node.pods):
        node.del_pod(pod)
        run(["ip", "netns", "del", pod.netns], check=False)


PREFIX = "fx-"


class FxNode(Node):
    """A Node whose Pods are created under the ``fx-`` prefix and which can exec the plugin directly."""

    def add_pod_as(self, name: str, cid: str, args: str = "", netns_name: str | None = None,
                   ifname: str = "eth0") -> Pod:
        ns = netns_name or f"{self.name}-{name}"
        if not os.path.exists(f"/run/netns/{ns}"):
            run(["ip", "netns", "add", ns])
        p = self.direct("ADD", f"/run/netns/{ns}", cid, args=args, ifname=ifname)
        if p.returncode != 0:
            raise AssertionError(f"ADD {name} failed:\n{p.stdout}\n{p.stderr}")
        pod = Pod(name, ns, json.loads(p.stdout))
        pod.cid = cid  # type: ignore[attr-defined]
        self.direct_pods.append((pod, cid, ifname))
        return pod

    def direct(self, command: str, netns_path: str, cid: str, args: str = "", ifname: str = "eth0",
               conf: dict | None = None, stdin: bytes | None = None, env: dict | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess:
        """Exec the plugin as a runtime does (env + stdin), inside the Node's netns."""
        c = conf if conf is not None else dict(self.plugin_conf(), cniVersion="1.0.0", name="ferrynet")
        e = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "CNI_COMMAND": command,
             "CNI_CONTAINERID": cid, "CNI_NETNS": netns_path, "CNI_IFNAME": ifname, "CNI_PATH": self.cni_bin,
             "CNI_ARGS": args}
        if env is not None:
            e = env
        data = stdin if stdin is not None else json.dumps(c).encode()
        return subprocess.run(["ip", "netns", "exec", self.name, os.path.join(self.cni_bin, "ferry")],
                              input=data, capture_output=True, env=e, timeout=timeout, check=False)


@pytest.fixture
def fx_node(cni_bin: str, tmp_path: Path) -> Iterator[FxNode]:
    name = f"{PREFIX}{secrets.token_hex(3)}"
    with netns(name) as ns, OvsInstance(name, netns=ns) as ovs:
        n = FxNode(name=ns, ovs=ovs, dir=tmp_path, cni_bin=cni_bin)
        n.direct_pods = []  # type: ignore[attr-defined]
        n.write_conflist()
        try:
            yield n
        finally:
            remove_pods(n)
            for pod, cid, ifname in n.direct_pods:
                n.direct("DEL", pod.path, cid, ifname=ifname)
                run(["ip", "netns", "del", pod.netns], check=False)
            for other in os.listdir("/run/netns"):  # any Pod netns a test made and did not remove
                if other.startswith(f"{ns}-"):
                    run(["ip", "netns", "del", other], check=False)
