"""``ferry-route-sync show`` reads the state file the daemon writes."""

from __future__ import annotations

import json

from click.testing import CliRunner

from cni.node import nodestate
from routesync.cli import main
from routesync.config import from_dict
from routesync.model import LocalFacts, NodeRecord
from routesync.planner import node_state, plan


def test_show_table_and_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = from_dict({"nodeName": "node-a", "trafficEncapMode": "hybrid", "stateFile": str(tmp_path / "s.json")})
    local = NodeRecord("node-a", ("192.168.77.11",), ("10.244.1.0/24",))
    peers = [NodeRecord("node-b", ("192.168.77.12",), ("10.244.2.0/24",)),
             NodeRecord("node-c", ("192.168.88.13",), ("10.244.3.0/24",))]
    facts = LocalFacts(2, "02:00:00:00:01:01", 3, "eth0", ("192.168.77.11/24",), 1500)
    nodestate.write(node_state(cfg, local, plan(cfg, local, peers, facts), facts), cfg.state_file)
    r = CliRunner().invoke(main, ["show", "--state-file", cfg.state_file])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert "mtu 1500 (Pods, routed, non-Pod), 1450 tunnelled" in lines[0]
    assert lines[2] == "uplink not on the bridge, untagged"
    assert lines[3].split()[:4] == ["PEER", "TRANSPORT", "POD", "CIDRS"]
    assert lines[4].split()[:5] == ["node-b", "192.168.77.12", "10.244.2.0/24", "route", "1500"]  # the path's MTU
    assert lines[5].split()[:5] == ["node-c", "192.168.88.13", "10.244.3.0/24", "tunnel", "1450"]
    r = CliRunner().invoke(main, ["show", "--json", "--state-file", cfg.state_file])
    data = json.loads(r.output)
    assert [(p["peer"], p["path"]) for p in data["peers"]] == [("node-b", "route"), ("node-c", "tunnel")]
    assert data["tunnel"]["ofport"] == 3 and data["mode"] == "hybrid"
    assert (data["mtu"], data["transportMTU"]) == (1450, 1500)
    assert [p["mtu"] for p in data["peers"]] == [1500, 1450]
    assert data["uplink"] is None
    (tmp_path / "uplink.json").write_text(json.dumps({"name": "eth0", "renamed": "eth0~", "bridge": "br-int",
                                                      "phase": "moved", "vlan": 100, "ports": {}}))
    r = CliRunner().invoke(main, ["show", "--state-file", cfg.state_file])
    assert r.output.splitlines()[2] == "uplink eth0 on br-int (physical eth0~, moved), transport VLAN 100"
    r = CliRunner().invoke(main, ["show", "--json", "--state-file", cfg.state_file])
    assert json.loads(r.output)["uplink"]["vlan"] == 100
    r = CliRunner().invoke(main, ["show", "--state-file", str(tmp_path / "none.json")])
    assert r.exit_code != 0 and "not written yet" in r.output
