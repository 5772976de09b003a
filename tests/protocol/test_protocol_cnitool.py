"""The real plugin driven the way runtimes drive it: cnitool (libcni 1.1.2) for ADD, and direct exec
with libcni's environment and stdin for STATUS and GC (cnitool 1.1.2 has only add/check/del verbs).

Conflists at 0.4.0 and 1.1.0.  cnitool prints a plugin's error as
``plugin type="ferry" failed (add): <msg>`` on stderr and exits non-zero."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cni import errors
from lab.tools import cnitool
from tests.ovs_instance import OvsInstance, netns, netns_path

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
    rc, out = exec_plugin(cni_bin, command, "0.4.0", {"logFile": str(tmp_path / "l"),
                                                       "cni.dev/valid-attachments": []})
    assert rc == 1 and json.loads(out)["code"] == errors.INCOMPATIBLE_VERSION
    assert command in json.loads(out)["msg"]


@pytest.fixture
def private_ovs() -> Iterator[OvsInstance]:
    needs_root()
    with netns(f"fp-ovs-{uuid.uuid4().hex[:6]}") as ns, OvsInstance("fp-proto", netns=ns) as ovs:
        ovs.vsctl("add-br", "fp-br0", "--", "set", "bridge", "fp-br0", "datapath_type=netdev")
        yield ovs


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


def test_status_ready_with_ovs(cni_bin: str, private_ovs: OvsInstance, tmp_path: Any) -> None:
    rc, out = exec_plugin(cni_bin, "STATUS", "1.1.0", lone_node_entry(private_ovs, tmp_path))
    assert (rc, out) == (0, b""), out


def test_status_not_ready_without_ovs(cni_bin: str, tmp_path: Any) -> None:
    rc, out = exec_plugin(cni_bin, "STATUS", "1.1.0", lone_node_entry(None, tmp_path))
    doc = json.loads(out)
    assert rc == 1 and doc["code"] == errors.NOT_READY and doc["cniVersion"] == "1.1.0", doc


def test_gc_with_nothing_stale(cni_bin: str, private_ovs: OvsInstance, tmp_path: Any) -> None:
    entry = dict(lone_node_entry(private_ovs, tmp_path),
                 **{"cni.dev/valid-attachments": [{"containerID": "fp-keep", "ifname": "eth0"}]})
    rc, out = exec_plugin(cni_bin, "GC", "1.1.0", entry)
    assert (rc, out) == (0, b""), out
    assert "GC released 0" in (tmp_path / "cni.log").read_text()


def test_gc_without_ovs_is_a_cni_error(cni_bin: str, tmp_path: Any) -> None:
    entry = dict(lone_node_entry(None, tmp_path), **{"cni.dev/valid-attachments": []})
    rc, out = exec_plugin(cni_bin, "GC", "1.1.0", entry)
    doc = json.loads(out)
    assert rc == 1 and set(doc) == {"cniVersion", "code", "msg", "details"} and doc["code"] > 0, doc
