"""The real plugin driven the way runtimes drive it: the pinned cnitool (libcni 1.3.0) for ADD, DEL,
STATUS and GC against 1.1.0 conflists; direct exec with libcni's environment and stdin only for
the STATUS/GC version gate, which libcni never crosses (it skips both below 1.1.0).

Conflists at 0.4.0 and 1.1.0.  cnitool prints a plugin's error as
``plugin type="ferry" failed (add): <msg>`` on stderr and exits non-zero."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from cni.pipeline import tables as pl
from cni.spec import errors
from lab.api import CNI_CACHE, cnitool_container_id
from lab.tools import cnitool
from tests.support.ovs_instance import OvsInstance, netns, netns_path

pytestmark = pytest.mark.root

CNITOOL = cnitool()


def needs_root() -> None:
    if os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists(CNITOOL):
        pytest.skip("needs root, iproute2 and cnitool")


@pytest.fixture
def pod_ns() -> Iterator[str]:
    needs_root()
    with netns(f"fp-ct-{uuid.uuid4().hex[:6]}") as name:
        yield netns_path(name)


def write_conflist(d: Any, name: str, version: str, entry: dict[str, Any]) -> None:
    (d / f"{name}.conflist").write_text(json.dumps(
        {"cniVersion": version, "name": name, "plugins": [dict({"type": "ferry"}, **entry)]}))


def cnitool(cni_bin: str, netconf: Any, verb: str, net: str, ns: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NETCONFPATH": str(netconf), "CNI_PATH": cni_bin}
    return subprocess.run([CNITOOL, verb, net, ns], capture_output=True, text=True, env=env, timeout=60,
                          check=False)


@pytest.mark.parametrize("version", ["0.4.0", "1.1.0"])
@pytest.mark.parametrize("entry,expect", [
    ({"prevResult": {"ips": [{"address": "not-an-ip"}]}}, "prevResult.ips[0]"),
    ({"mtu": "big"}, "'mtu'"),
])
def test_cnitool_add_with_broken_entry(version: str, entry: dict[str, Any], expect: str, cni_bin: str,
                                       pod_ns: str, tmp_path: Any) -> None:
    log = tmp_path / "cni.log"
    write_conflist(tmp_path, "fp-net", version, dict(entry, logFile=str(log)))
    p = cnitool(cni_bin, tmp_path, "add", "fp-net", pod_ns)
    assert p.returncode != 0
    assert 'plugin type="ferry" failed (add):' in p.stderr and expect in p.stderr, p.stderr
    assert p.stdout == ""
    assert expect in log.read_text()
    # nothing was created in the Pod's namespace
    links = subprocess.run(["ip", "-n", os.path.basename(pod_ns), "-o", "link"], capture_output=True,
                           text=True, check=True).stdout
    assert links.count("\n") == 1 and "lo:" in links


def test_cnitool_unsupported_version(cni_bin: str, pod_ns: str, tmp_path: Any) -> None:
    write_conflist(tmp_path, "fp-net", "9.9.9", {"logFile": str(tmp_path / "cni.log")})
    p = cnitool(cni_bin, tmp_path, "add", "fp-net", pod_ns)
    assert p.returncode != 0 and "cniVersion '9.9.9' is not supported" in p.stderr, p.stderr


def exec_plugin(cni_bin: str, command: str, version: str, entry: dict[str, Any]) -> tuple[int, bytes]:
    """What libcni does for STATUS/GC: the list's name and cniVersion injected into the entry."""
    conf = dict({"type": "ferry"}, **entry, name="fp-net", cniVersion=version)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND": command, "CNI_PATH": cni_bin}
    p = subprocess.run([os.path.join(cni_bin, "ferry")], input=json.dumps(conf).encode(), env=env,
                       capture_output=True, timeout=60, check=False)
    return p.returncode, p.stdout


@pytest.mark.parametrize("command", ["STATUS", "GC"])
def test_status_gc_need_1_1_0(command: str, cni_bin: str, tmp_path: Any) -> None:
    """Exec'd by hand: libcni never sends STATUS or GC for a list below 1.1.0 (cnitool answers
    0 without running the plugin), so only a runtime that ignores the version reaches this gate."""
    rc, out = exec_plugin(cni_bin, command, "0.4.0", {"logFile": str(tmp_path / "l"),
                                                       "cni.dev/valid-attachments": []})
    assert rc == 1 and json.loads(out)["code"] == errors.INCOMPATIBLE_VERSION
    assert command in json.loads(out)["msg"]


# ------------------------------------------------------------------ STATUS and GC through cnitool


class CniNode:
    """A Node for cnitool: its own netns and OVS, a 1.1.0 conflist with a network name of its own
    (libcni's cache, /var/lib/cni, is the machine's), cnitool run inside the Node's netns."""

    def __init__(self, cni_bin: str, ovs: OvsInstance, ns: str, tmp_path: Any) -> None:
        self.cni_bin, self.ovs, self.ns, self.dir = cni_bin, ovs, ns, tmp_path
        self.net = f"fp-gc-{uuid.uuid4().hex[:8]}"
        self.netconf = tmp_path / "net.d"
        self.netconf.mkdir()
        self.log = tmp_path / "cni.log"
        self.pod_ns: list[str] = []
        self.write_conflist()

    def entry(self) -> dict[str, Any]:
        return lone_node_entry(self.ovs, self.dir)

    def write_conflist(self, **extra: Any) -> None:
        write_conflist(self.netconf, self.net, "1.1.0", dict(self.entry(), **extra))

    def cnitool(self, verb: str, netns_path: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NETCONFPATH": str(self.netconf), "CNI_PATH": self.cni_bin}
        return subprocess.run(["ip", "netns", "exec", self.ns, CNITOOL, verb, self.net, netns_path],
                              capture_output=True, text=True, env=env, timeout=60, check=False)

    def add(self, name: str) -> Attachment:
        ns = f"{self.ns}-{name}"
        subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
        self.pod_ns.append(ns)
        p = self.cnitool("add", netns_path(ns))
        assert p.returncode == 0, p.stderr
        result = json.loads(p.stdout)
        host = next(i["name"] for i in result["interfaces"] if not i.get("sandbox"))
        return Attachment(netns_path(ns), cnitool_container_id(netns_path(ns)), host,
                          [ip["address"].split("/")[0] for ip in result["ips"]])

    def cache_file(self, a: Attachment) -> str:
        return os.path.join(CNI_CACHE, f"{self.net}-{a.cid}-eth0")

    def ports(self) -> set[str]:
        return set(self.ovs.vsctl("list-ports", "fp-br0").split())

    def links(self) -> set[str]:
        out = subprocess.run(["ip", "-n", self.ns, "-o", "link", "show"], capture_output=True, text=True,
                             check=True).stdout
        return {ln.split(":")[1].strip().split("@")[0] for ln in out.splitlines()}

    def ipam_holders(self) -> dict[str, str]:
        """Address -> container ID, from Ferry IPAM's store."""
        p = subprocess.run([os.path.join(self.cni_bin, "ferry-ipam"), "ls", "--json", "--data-dir",
                            str(self.dir / "ipam")], capture_output=True, text=True, check=True, timeout=60)
        return {r["address"].split("/")[0]: r["containerID"] for r in json.loads(p.stdout)}

    def attached(self, a: Attachment) -> bool:
        """Its veth, its OVS port and its IPAM record all there (False: all gone; else the test fails)."""
        parts = [a.host_veth in self.ports(), a.host_veth in self.links(),
                 all(self.ipam_holders().get(ip) == a.cid for ip in a.ips)]
        assert len(set(parts)) == 1, f"{a.cid} half there (port, veth, IPAM): {parts}"
        return parts[0]

    def cleanup(self) -> None:
        self.write_conflist()
        for ns in self.pod_ns:
            self.cnitool("del", netns_path(ns))
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        for f in os.listdir(CNI_CACHE) if os.path.isdir(CNI_CACHE) else []:
            if f.startswith(f"{self.net}-"):
                os.unlink(os.path.join(CNI_CACHE, f))


@dataclass
class Attachment:
    netns: str
    cid: str
    host_veth: str
    ips: list[str]


@pytest.fixture
def private_ovs() -> Iterator[tuple[str, OvsInstance]]:
    needs_root()
    with netns(f"fp-ovs-{uuid.uuid4().hex[:6]}") as ns, OvsInstance("fp-proto", netns=ns) as ovs:
        ovs.vsctl("add-br", "fp-br0", "--", "set", "bridge", "fp-br0", "datapath_type=netdev")
        yield ns, ovs


@pytest.fixture
def cni_node(cni_bin: str, private_ovs: tuple[str, OvsInstance], tmp_path: Any) -> Iterator[CniNode]:
    ns, ovs = private_ovs
    n = CniNode(cni_bin, ovs, ns, tmp_path)
    try:
        yield n
    finally:
        n.cleanup()


def lone_node_entry(ovs: OvsInstance | None, tmp_path: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"stateFile": str(tmp_path / "no-state.json"), "bridge": "fp-br0",
                             "datapath": "netdev", "logFile": str(tmp_path / "cni.log"),
                             "ipam": {"type": "ferry-ipam", "dataDir": str(tmp_path / "ipam"),
                                      "ranges": [[{"subnet": "10.250.1.0/24"}]]}}
    if ovs is not None:
        entry.update(ovsdb=ovs.db, ovsRunDir=ovs.run_dir)
    else:
        entry.update(ovsdb=f"unix:{tmp_path}/nothing.sock", ovsRunDir=str(tmp_path))
    return entry


def test_cnitool_status_ready_then_not_when_ovs_stops(cni_node: CniNode) -> None:
    ready = cni_node.cnitool("status", netns_path(cni_node.ns))
    assert (ready.returncode, ready.stdout, ready.stderr) == (0, "", ""), ready.stderr
    cni_node.ovs.stop()  # ovsdb-server and ovs-vswitchd gone
    down = cni_node.cnitool("status", netns_path(cni_node.ns))
    assert down.returncode == 1 and "Open vSwitch is not reachable" in down.stderr, down.stderr
    assert f"STATUS - error {errors.NOT_READY}: Open vSwitch is not reachable" in cni_node.log.read_text()


def test_cnitool_gc_releases_what_no_one_holds(cni_node: CniNode) -> None:
    """cnitool gc: libcni DELs every attachment its cache holds for the network (cnitool passes
    no valid list), then sends GC; the runtime's valid list reaches the plugin in the list's
    entry.  ``cached`` goes by libcni's DEL; ``stale`` (no cache entry, not valid) by Ferry's GC,
    its veth, OVS port, flows and IPAM address; ``valid`` (no cache entry, valid) stays."""
    cached, stale, valid = cni_node.add("a"), cni_node.add("b"), cni_node.add("c")
    assert all(cni_node.attached(x) for x in (cached, stale, valid))
    for forgotten in (stale, valid):  # the runtime lost its record of these
        os.unlink(cni_node.cache_file(forgotten))
    cni_node.write_conflist(**{"cni.dev/valid-attachments": [{"containerID": valid.cid, "ifname": "eth0"}]})
    p = cni_node.cnitool("gc", netns_path(cni_node.ns))
    assert (p.returncode, p.stderr) == (0, ""), p.stderr
    assert not cni_node.attached(cached) and not os.path.exists(cni_node.cache_file(cached))
    assert not cni_node.attached(stale)
    assert cni_node.attached(valid)
    assert cni_node.ovs.ofctl("dump-flows", "fp-br0", f"cookie={pl.pod_cookie(stale.cid, 'eth0').match()}") \
        .count("cookie=") == 0
    assert f"GC released 2 attachments: {stale.cid}/eth0, {stale.cid}/eth0 (IPAM)" in cni_node.log.read_text()
    ips_left = set(cni_node.ipam_holders())
    assert ips_left == set(valid.ips)  # the two released addresses are free again


def test_cnitool_gc_without_a_valid_list_tears_down_nothing_more(cni_node: CniNode) -> None:
    """A list without ``cni.dev/valid-attachments`` (as cnitool sends GC): libcni's own DELs of
    its cached attachments happen, the plugin's GC refuses (reading "no list" as "keep nothing"
    would tear down every Pod on the Node) and cnitool fails."""
    cached, stale = cni_node.add("a"), cni_node.add("b")
    os.unlink(cni_node.cache_file(stale))
    p = cni_node.cnitool("gc", netns_path(cni_node.ns))
    assert p.returncode == 1 and "failed to GC plugin ferry" in p.stderr, p.stderr
    assert "cni.dev/valid-attachments" in p.stderr and "missing" in p.stderr, p.stderr
    assert not cni_node.attached(cached)
    assert cni_node.attached(stale)


def test_cnitool_gc_without_ovs_fails(cni_node: CniNode) -> None:
    cni_node.write_conflist(**{"cni.dev/valid-attachments": []})
    cni_node.ovs.stop()
    p = cni_node.cnitool("gc", netns_path(cni_node.ns))
    assert p.returncode == 1 and "failed to GC plugin ferry" in p.stderr, p.stderr
