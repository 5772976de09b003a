"""Fixtures that call the verbs in-process (``lone_node``, ``make_pod``): ``cni.commands.add.add(req)``
and its siblings as functions, where tests.support.podnode's ``node`` drives the executable (cnitool).

A Node is a network namespace with its own Open vSwitch (netdev datapath) and no route-sync: the
first ADD creates the bridge and gateway port as on a lone Node.  Each call parses its request with
the protocol core from the environment and stdin a runtime would give the executable, logs to the
Node's log file, and runs in the Node's namespace (``setns`` for this thread, then back), so the
verb sees what it sees under ``ip netns exec``.  Nothing is replaced: the veths, addresses, OVS
ports, flows and IPAM files the tests look at are the real ones."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cni.kernel.netns import entered
from cni.pipeline import tables as pl
from cni.spec import protocol
from cni.spec.log import open_log
from cni.spec.request import Request
from cni.spec.result import Result
from tests.support.ovs_instance import OvsInstance, netns, netns_path
from tests.support.podnode import run

PREFIX = "fv-"  # this test area's namespaces and OVS directories (tests/cni/commands/chained uses fc-)
NETWORK = "ferrynet"
CNI_VERSION = "1.1.0"  # STATUS and GC need it
T = TypeVar("T")


@dataclass
class Pod:
    """A Pod sandbox: its netns and the container ID the runtime would give it."""

    netns: str
    container_id: str

    @property
    def path(self) -> str:
        return netns_path(self.netns)

    def links(self) -> dict[str, dict[str, Any]]:
        """``ip -j addr`` of the Pod's netns by interface name."""
        return {i["ifname"]: i for i in json.loads(run(["ip", "-n", self.netns, "-j", "addr", "show"]).stdout)}

    def addresses(self, ifname: str = "eth0") -> set[str]:
        link = self.links().get(ifname)
        if link is None:
            return set()
        return {f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a.get("scope") == "global"}


@dataclass
class LoneNode:
    netns: str
    ovs: OvsInstance
    dir: Path
    bridge: str = "br-int"

    def conf(self, **overrides: Any) -> dict[str, Any]:
        """The network config (one plugin, as libcni hands it to the plugin), with overrides."""
        conf = {
            "cniVersion": CNI_VERSION, "name": NETWORK, "type": "ferry",
            "stateFile": str(self.dir / "state" / "node-state.json"),  # absent: a lone Node
            "bridge": self.bridge, "ovsdb": self.ovs.db, "ovsRunDir": self.ovs.run_dir,
            "datapath": "netdev", "logFile": str(self.dir / "cni.log"), "logLevel": "debug",
            "ipam": {"type": "ferry-ipam", "dataDir": str(self.ipam_dir),
                     "ranges": [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:244:1::/64"}]]},
        }
        conf.update(overrides)
        return conf

    @property
    def ipam_dir(self) -> Path:
        return self.dir / "ipam"

    def request(self, command: str, pod: Pod | None = None, *, container_id: str = "", ifname: str = "eth0",
                conf: dict[str, Any] | None = None, prev_result: Result | None = None,
                valid: list[Pod] | None = None) -> Request:
        """The request the protocol core would hand the verb for this environment and stdin."""
        config = dict(conf if conf is not None else self.conf())
        if prev_result is not None:
            config["prevResult"] = prev_result.encode(config["cniVersion"])
        if valid is not None:
            config["cni.dev/valid-attachments"] = [{"containerID": p.container_id, "ifname": ifname} for p in valid]
        environ = {"CNI_COMMAND": command, "CNI_PATH": "/nonexistent"}  # IPAM runs in-process: nothing exec'd
        if pod is not None:
            environ.update(CNI_CONTAINERID=container_id or pod.container_id, CNI_NETNS=pod.path, CNI_IFNAME=ifname)
        return protocol.parse_request(environ, json.dumps(config).encode())

    def call(self, verb: Callable[[Request], T], req: Request) -> T:
        """Run ``verb(req)`` in the Node's namespace, logging to the Node's log file."""
        log = open_log(req.config, None, req.command, req.container_id)
        req.log = log
        try:
            with entered(netns_path(self.netns)):
                return verb(req)
        finally:
            log.close()

    # What the tests look at, read with the system's own tools.
    def links(self) -> list[str]:
        return [i["ifname"] for i in json.loads(run(["ip", "-n", self.netns, "-j", "link", "show"]).stdout)]

    def host_veths(self) -> list[str]:
        return [name for name in self.links() if name.startswith(pl.HOST_VETH_PREFIX)]

    def bridge_exists(self) -> bool:
        return self.bridge in self.ovs.vsctl("list-br").split()

    def pod_ports(self) -> list[str]:
        if not self.bridge_exists():
            return []
        return [p for p in self.ovs.vsctl("list-ports", self.bridge).split() if p.startswith(pl.HOST_VETH_PREFIX)]

    def port_external_ids(self, port: str) -> dict[str, str]:
        out = self.ovs.vsctl("--format=json", "--columns=external_ids", "list", "Port", port)
        pairs = json.loads(out)["data"][0][0][1]  # ["map", [[k, v], ...]]
        return dict(pairs)

    def flows(self, cookie: pl.Cookie | None = None) -> list[str]:
        """Flows of one cookie (every per-Pod flow without one), as ovs-ofctl dumps them."""
        if not self.bridge_exists():
            return []
        match = cookie.match() if cookie is not None else pl.Cookie.owner_match(pl.Owner.POD)
        out = self.ovs.ofctl("dump-flows", self.bridge, f"cookie={match}")
        return [line for line in out.splitlines() if "cookie=" in line]

    def ipam_files(self) -> list[str]:
        """Every claim and attachment record in the IPAM store (lock and cursors are not state)."""
        found = []
        for root, _dirs, files in os.walk(self.ipam_dir):
            if os.path.basename(root) in ("ips", "attachments"):
                found += [os.path.join(os.path.basename(root), f) for f in files]
        return sorted(found)


def packets(flow_lines: list[str]) -> int:
    return sum(int(line.split("n_packets=", 1)[1].split(",", 1)[0]) for line in flow_lines)


@pytest.fixture
def lone_node(tmp_path: Path) -> Iterator[LoneNode]:
    name = f"{PREFIX}n{secrets.token_hex(3)}"
    with netns(name) as ns, OvsInstance(name, netns=ns) as ovs:
        yield LoneNode(ns, ovs, tmp_path)
    _reap_announcers()


MakePod = Callable[[str], Pod]


@pytest.fixture
def make_pod() -> Iterator[MakePod]:
    """Factory: ``make_pod("a")`` -> a fresh Pod netns (deleted after the test)."""
    with ExitStack() as stack:
        def make(stem: str) -> Pod:
            ns = stack.enter_context(netns(f"{PREFIX}{stem}{secrets.token_hex(3)}"))
            return Pod(ns, f"cid-{stem}-{secrets.token_hex(8)}")

        yield make


def _reap_announcers() -> None:
    """ADD forks a child that sends the Pod's gratuitous ARP/NA and exits; the plugin never waits
    for it (its process ends first), so in-process callers collect it here."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
