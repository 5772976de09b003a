"""``ferry-ipam`` exec'd as a CNI IPAM plugin (through the lean launcher), and ``ferry-ipam ls``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cni.launcher import write_launchers


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("fi-bin")
    write_launchers(str(d), sys.executable)
    return str(d / "ferry-ipam")


def run(plugin: str, command: str, conf: dict[str, Any], cid: str = "fi-c1", args: str = "",
        ifname: str = "eth0") -> tuple[int, Any]:
    env = {"PATH": os.environ.get("PATH", ""), "CNI_COMMAND": command, "CNI_CONTAINERID": cid,
           "CNI_IFNAME": ifname, "CNI_NETNS": "/var/run/netns/fi-none", "CNI_PATH": os.path.dirname(plugin),
           "CNI_ARGS": args}
    p = subprocess.run([plugin], input=json.dumps(conf).encode(), env=env, capture_output=True, timeout=30,
                       check=False)
    out = p.stdout.decode()
    return p.returncode, json.loads(out) if out.strip() else None


def conf_for(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    ipam = {"type": "ferry-ipam", "dataDir": str(tmp_path / "data"),
            "ranges": [[{"subnet": "10.79.0.0/24"}], [{"subnet": "fd79::/64"}]],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0", "gw": "fd79::1"}]}
    ipam.update(extra)
    return {"cniVersion": "1.1.0", "name": "fi-plug", "type": "ferry", "ipam": ipam,
            "stateFile": str(tmp_path / "absent-state.json")}


def test_add_check_gc_del_status(plugin: str, tmp_path: Path) -> None:
    conf = conf_for(tmp_path)
    rc, res = run(plugin, "ADD", conf, args="IgnoreUnknown=1;IP=10.79.0.50")
    assert rc == 0, res
    assert "interfaces" not in res
    assert res["ips"] == [{"address": "10.79.0.50/24", "gateway": "10.79.0.1"},
                          {"address": "fd79::2/64", "gateway": "fd79::1"}]
    assert res["routes"] == [{"dst": "0.0.0.0/0"}, {"dst": "::/0", "gw": "fd79::1"}]
    rc, again = run(plugin, "ADD", conf)
    assert rc == 0 and again["ips"] == res["ips"]
    rc, other = run(plugin, "ADD", {**conf, "runtimeConfig": {"ips": ["10.79.0.50"]}}, cid="fi-c2")
    assert rc == 1 and other["code"] == 111 and "10.79.0.50" in other["msg"]
    rc, other = run(plugin, "ADD", {**conf, "runtimeConfig": {"ips": ["fd79::77"]}}, cid="fi-c2")
    assert rc == 0 and other["ips"][1]["address"] == "fd79::77/64"

    rc, out = run(plugin, "CHECK", {**conf, "prevResult": res})
    assert rc == 0 and out is None
    wrong = {**res, "ips": [{"address": "10.79.0.51/24"}]}
    rc, out = run(plugin, "CHECK", {**conf, "prevResult": wrong})
    assert rc == 1 and "10.79.0.51/24" in out["msg"]

    rc, _ = run(plugin, "GC", {**conf, "cni.dev/valid-attachments": [{"containerID": "fi-c1", "ifname": "eth0"}]})
    assert rc == 0
    ls = subprocess.run([plugin, "ls", "--json", "--data-dir", str(tmp_path / "data")], capture_output=True,
                        check=True)
    assert {r["containerID"] for r in json.loads(ls.stdout)} == {"fi-c1"}
    table = subprocess.run([plugin, "ls", "--data-dir", str(tmp_path / "data")], capture_output=True,
                           check=True).stdout.decode().splitlines()
    assert table[0].split() == ["NETWORK", "CONTAINER", "IFNAME", "ADDRESS", "GATEWAY"]
    assert table[1].split() == ["fi-plug", "fi-c1", "eth0", "10.79.0.50/24", "10.79.0.1"]

    rc, out = run(plugin, "STATUS", conf)
    assert rc == 0 and out is None
    rc, out = run(plugin, "DEL", conf)
    assert rc == 0 and out is None
    rc, out = run(plugin, "DEL", conf)  # again: still success
    assert rc == 0
    assert json.loads(subprocess.run([plugin, "ls", "--json", "--data-dir", str(tmp_path / "data")],
                                     capture_output=True, check=True).stdout) == []


def test_errors_as_cni_json(plugin: str, tmp_path: Path) -> None:
    bad = conf_for(tmp_path, ranges=[[{"subnet": "10.79.0.0/24", "gateway": "10.80.0.1"}]])
    rc, out = run(plugin, "ADD", bad)
    assert rc == 1 and out["code"] == 7 and out["msg"].startswith("ipam.ranges[0][0].gateway")
    no_ranges = conf_for(tmp_path)
    del no_ranges["ipam"]["ranges"]
    rc, out = run(plugin, "ADD", no_ranges)
    assert rc == 1 and out["code"] == 11
    rc, out = run(plugin, "STATUS", no_ranges)
    assert rc == 1 and out["code"] == 50
    rc, out = run(plugin, "DEL", no_ranges)  # nothing can have been allocated: success
    assert rc == 0
    rc, out = run(plugin, "ADD", conf_for(tmp_path), args="IP=10.99.0.1")
    assert rc == 1 and out["code"] == 7 and "10.99.0.1" in out["msg"]


def test_ranges_from_node_state(plugin: str, tmp_path: Path) -> None:
    from cni.node import nodestate

    state = nodestate.NodeState(node="fi-n", mode="encap", bridge="br-int", datapath="netdev", ovsdb="unix:x",
                                ovsRunDir="/x", mtu=1450, podCIDRs=["10.81.3.0/24"],
                                gateway=nodestate.Gateway("ferry-gw0", "02:00:00:00:00:01", 2, ["10.81.3.1/24"]))
    path = tmp_path / "state.json"
    nodestate.write(state, str(path))
    conf = conf_for(tmp_path)
    del conf["ipam"]["ranges"]
    conf["stateFile"] = str(path)
    rc, res = run(plugin, "ADD", conf)
    assert rc == 0 and res["ips"] == [{"address": "10.81.3.2/24", "gateway": "10.81.3.1"}]
