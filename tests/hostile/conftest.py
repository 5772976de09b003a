"""One Node (its own netns + private OVS, netdev bridge) driven by the real plugin, for the
hostile-input, spoofing, file-safety and stale-DEL tests.  Names carry this area's prefix ``fx-``.

Builds on tests/pod/conftest.py's Node/Pod helpers (cnitool, flows, ports) with our own prefix."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

from tests.ovs_instance import OvsInstance, netns
from tests.pod.conftest import Node, Pod, run

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
            for pod in n.pods:
                n.del_pod(pod)
                run(["ip", "netns", "del", pod.netns], check=False)
            for pod, cid, ifname in n.direct_pods:
                n.direct("DEL", pod.path, cid, ifname=ifname)
                run(["ip", "netns", "del", pod.netns], check=False)
            for other in os.listdir("/run/netns"):  # any Pod netns a test made and did not remove
                if other.startswith(f"{ns}-"):
                    run(["ip", "netns", "del", other], check=False)
