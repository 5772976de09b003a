"""route-sync's bgp section, pure: validation naming the key, what is advertised and with which
next hop, ExaBGP's configuration, the API lines between two sets of routes, ExaBGP's events
read back, the status table and ``show`` with BGP."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cni.node import nodestate
from routesync.bgp import plan, status
from routesync.cli import main
from routesync.config import BgpPeer, ConfigError, from_dict
from routesync.model import LocalFacts, NodeRecord
from routesync.planner import node_state
from routesync.planner import plan as rs_plan

PEER = {"address": "192.168.77.1", "asn": 65000}
UPLINK = ("192.168.77.11/24", "fd00:77::b/64", "fe80::1/64")


def bgp_cfg(**bgp: object):  # type: ignore[no-untyped-def]
    return from_dict({"nodeName": "n1", "trafficEncapMode": "noEncap",
                      "bgp": {"localASN": 64512, "peers": [PEER], **bgp}}).bgp


def test_defaults() -> None:
    b = bgp_cfg()
    assert b is not None
    assert (b.local_asn, b.router_id, b.prefixes, b.graceful_restart) == (64512, None, None, 0)
    assert b.peers == (BgpPeer("192.168.77.1", 65000, None, 90),)
    c = from_dict({"nodeName": "n", "stateFile": "/x/state/s.json", "bgp": {"localASN": 1, "peers": [PEER]}})
    assert c.bgp_run_dir == "/x/state/bgp"
    assert from_dict({"nodeName": "n"}).bgp is None


@pytest.mark.parametrize("bgp,key", [
    ("yes", "bgp"),
    ({"peers": [PEER]}, "bgp.localASN"),
    ({"localASN": 0, "peers": [PEER]}, "bgp.localASN"),
    ({"localASN": 4294967296, "peers": [PEER]}, "bgp.localASN"),
    ({"localASN": "64512", "peers": [PEER]}, "bgp.localASN"),
    ({"localASN": 64512}, "bgp.peers"),
    ({"localASN": 64512, "peers": []}, "bgp.peers"),
    ({"localASN": 64512, "peers": ["192.168.77.1"]}, "bgp.peers[0]"),
    ({"localASN": 64512, "peers": [{"asn": 65000}]}, "bgp.peers[0].address"),
    ({"localASN": 64512, "peers": [{"address": "192.168.77.1"}]}, "bgp.peers[0].asn"),
    ({"localASN": 64512, "peers": [{"address": "router", "asn": 65000}]}, "bgp.peers[0].address"),
    ({"localASN": 64512, "peers": [PEER, {"address": "192.168.77.300", "asn": 1}]}, "bgp.peers[1].address"),
    ({"localASN": 64512, "peers": [PEER, PEER]}, "bgp.peers[1].address"),
    ({"localASN": 64512, "peers": [{**PEER, "holdTime": 2}]}, "bgp.peers[0].holdTime"),
    ({"localASN": 64512, "peers": [{**PEER, "holdTime": 70000}]}, "bgp.peers[0].holdTime"),
    ({"localASN": 64512, "peers": [{**PEER, "password": "x" * 81}]}, "bgp.peers[0].password"),
    ({"localASN": 64512, "peers": [{**PEER, "password": 'a"b'}]}, "bgp.peers[0].password"),
    ({"localASN": 64512, "peers": [{**PEER, "port": 1179}]}, "bgp.peers[0].port"),
    ({"localASN": 64512, "peers": [PEER], "routerID": "fd00::1"}, "bgp.routerID"),
    ({"localASN": 64512, "peers": [PEER], "prefixes": ["10.244.1.1/24"]}, "bgp.prefixes"),
    ({"localASN": 64512, "peers": [PEER], "gracefulRestart": 5000}, "bgp.gracefulRestart"),
    ({"localASN": 64512, "peers": [PEER], "communities": []}, "bgp.communities"),
])
def test_bad_values_name_the_key(bgp: object, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        from_dict({"nodeName": "n1", "bgp": bgp})
    assert e.value.key == key, str(e.value)
    assert repr(key) in str(e.value)


def test_bad_key_through_the_cli(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "rs.yaml"
    p.write_text("nodeName: n1\nbgp: {localASN: 64512, peers: [{address: 192.168.77.1, asn: -1}]}\n")
    r = CliRunner().invoke(main, ["run", "--config", str(p)])
    assert r.exit_code != 0 and "'bgp.peers[0].asn'" in r.output


def test_routes_default_to_pod_cidrs_with_the_family_next_hop() -> None:
    b = bgp_cfg()
    routes, problems = plan.routes(b, ("10.244.1.0/24", "fd00:10:244:1::/64"), UPLINK)
    assert routes == {plan.Route("10.244.1.0/24", "192.168.77.11"), plan.Route("fd00:10:244:1::/64", "fd00:77::b")}
    assert problems == []
    only4, problems = plan.routes(b, ("10.244.1.0/24", "fd00:10:244:1::/64"), ("192.168.77.11/24",))
    assert only4 == {plan.Route("10.244.1.0/24", "192.168.77.11")}
    assert "fd00:10:244:1::/64 not advertised" in problems[0]
    explicit, _ = plan.routes(bgp_cfg(prefixes=["10.96.0.0/12"]), ("10.244.1.0/24",), UPLINK)
    assert explicit == {plan.Route("10.96.0.0/12", "192.168.77.11")}


def test_router_id_and_sessions() -> None:
    b = bgp_cfg()
    assert plan.router_id(b, UPLINK) == "192.168.77.11"
    assert plan.router_id(bgp_cfg(routerID="10.255.0.1"), ("fd00:77::b/64",)) == "10.255.0.1"
    with pytest.raises(plan.PlanError, match="'bgp.routerID'"):
        plan.router_id(b, ("fd00:77::b/64",))
    v6peer = bgp_cfg(peers=[PEER, {"address": "fd00:77::1", "asn": 65001}])
    sess, problems = plan.sessions(v6peer, ("192.168.77.11/24",))
    assert [s.peer.address for s in sess] == ["192.168.77.1"] and sess[0].local_address == "192.168.77.11"
    assert "'bgp.peers[1].address'" in problems[0]


def test_commands_withdraw_first_then_announce() -> None:
    old = frozenset({plan.Route("10.244.1.0/24", "192.168.77.11"), plan.Route("fd00:1::/64", "fd00:77::b")})
    new = frozenset({plan.Route("10.244.1.0/24", "192.168.77.99"), plan.Route("fd00:1::/64", "fd00:77::b")})
    assert plan.commands(old, new) == ["withdraw route 10.244.1.0/24 next-hop 192.168.77.11",
                                       "announce route 10.244.1.0/24 next-hop 192.168.77.99"]
    assert plan.commands(new, new) == []
    assert plan.commands(new, frozenset()) == ["withdraw route 10.244.1.0/24 next-hop 192.168.77.99",
                                               "withdraw route fd00:1::/64 next-hop fd00:77::b"]


def test_render_exabgp() -> None:
    b = bgp_cfg(peers=[{**PEER, "password": "s3cret", "holdTime": 3}], gracefulRestart=120)
    sess, _ = plan.sessions(b, UPLINK)
    text = plan.render_exabgp(b, sess, ["/usr/bin/python3", "/x/relay.py"])
    assert "run /usr/bin/python3 /x/relay.py;" in text and "encoder json;" in text
    for line in ("neighbor 192.168.77.1 {", "router-id 192.168.77.11;", "local-address 192.168.77.11;",
                 "local-as 64512;", "peer-as 65000;", "hold-time 3;", 'md5-password "s3cret";',
                 "ipv4 unicast;", "ipv6 unicast;", "graceful-restart 120;", "processes [ ferry ];",
                 "neighbor-changes;"):
        assert line in text, line
    plain = plan.render_exabgp(bgp_cfg(), plan.sessions(bgp_cfg(), UPLINK)[0], ["r"])
    assert "md5-password" not in plain and "graceful-restart" not in plain
    env = plan.exabgp_env()
    assert env["exabgp.daemon.user"] == "root" and env["exabgp.tcp.bind"] == ""
    assert env["exabgp.api.cli"] == "false" and env["exabgp.api.terminate"] == "true"


def _state(peer: str, state: str, reason: str = "") -> str:
    n: dict = {"address": {"local": "192.168.77.11", "peer": peer}, "asn": {"local": 64512, "peer": 65000},
               "state": state}
    if reason:
        n["reason"] = reason
    return json.dumps({"exabgp": "5.0.0", "type": "state", "neighbor": n})


def test_parse_events_and_classify() -> None:
    assert plan.parse_event(_state("192.168.77.1", "up")) == plan.PeerEvent("192.168.77.1", "up")
    down = plan.parse_event(_state("192.168.77.1", "down", "notification received (2,2)"))
    assert down == plan.PeerEvent("192.168.77.1", "down", "notification received (2,2)")
    assert plan.parse_event("done") == plan.Answer(True, "done")
    assert plan.parse_event("error") == plan.Answer(False, "error")
    assert plan.parse_event('{"type": "update"}') is None and plan.parse_event("{broken") is None
    assert plan.parse_event("") is None
    label, text = plan.classify("notification received (2,2)", False)
    assert label == "bad-peer-as" and "bgp.localASN" in text and "from the peer" in text
    assert plan.classify("notification received (4,0)", True)[0] == "hold-timer-expired"
    assert plan.classify("notification sent (3,9)", True)[0] == "notification-3-9"
    assert plan.classify("closing connection", False)[0] == plan.REASON_CONNECT
    assert plan.classify("closing connection", True)[0] == plan.REASON_CLOSED


def test_status_round_trip_and_show(tmp_path) -> None:  # type: ignore[no-untyped-def]
    st = status.BgpStatus(64512, "192.168.77.11", "running", 42, routes=["10.244.1.0/24 via 192.168.77.11"],
                          peers=[status.PeerStatus("192.168.77.1", 65000, "192.168.77.11", "established", 100.0,
                                                   ["10.244.1.0/24"], None, None, 0, 1),
                                 status.PeerStatus("192.168.88.1", 65001, None, "connect", 100.0, [],
                                                   "OPEN message error: bad peer AS", 99.0, 3, 0)])
    status.write(st, str(tmp_path / "bgp"))
    assert status.read(str(tmp_path / "bgp")) == st
    assert status.read(str(tmp_path / "none")) is None
    table = status.as_table(st, 130.0)
    rows = [line.split(None, 6) for line in table.splitlines() if line.startswith("192.168.")]
    assert rows[0][:6] == ["192.168.77.1", "65000", "192.168.77.11", "established", "30s", "10.244.1.0/24"]
    assert rows[1][3] == "connect" and "bad peer AS" in rows[1][6]
    # through the CLI: the config names the bgp section, show prints the status beside the peers
    cfg_file = tmp_path / "rs.yaml"
    state_file = tmp_path / "state.json"
    cfg_file.write_text(f"nodeName: node-a\ntrafficEncapMode: noEncap\nstateFile: {state_file}\n"
                        f"bgp: {{localASN: 64512, runDir: {tmp_path / 'bgp'}, "
                        f"peers: [{{address: 192.168.77.1, asn: 65000}}]}}\n")
    cfg = from_dict({"nodeName": "node-a", "trafficEncapMode": "noEncap", "stateFile": str(state_file)})
    local = NodeRecord("node-a", ("192.168.77.11",), ("10.244.1.0/24",))
    facts = LocalFacts(2, "02:00:00:00:01:01", None, "eth0", ("192.168.77.11/24",), 1500)
    nodestate.write(node_state(cfg, local, rs_plan(cfg, local, [], facts), facts), str(state_file))
    r = CliRunner().invoke(main, ["show", "--config", str(cfg_file)])
    assert r.exit_code == 0, r.output
    assert "BGP PEER" in r.output and "established" in r.output and "bad peer AS" in r.output
    r = CliRunner().invoke(main, ["show", "--json", "--config", str(cfg_file)])
    data = json.loads(r.output)
    assert data["bgp"]["peers"][0]["advertised"] == ["10.244.1.0/24"]


def test_metrics() -> None:
    from routesync.metrics import Observer, RouteSyncMetrics

    m = RouteSyncMetrics()
    obs = Observer(m)
    obs.bgp_peer("192.168.77.1", True, {4: 1, 6: 1})
    obs.bgp_error("192.168.88.1", "bad-peer-as")
    obs.bgp_error("192.168.88.1", "bad-peer-as")
    obs.bgp_speaker_restart()
    text = m.exposition()[0].decode()
    assert 'ferry_route_sync_bgp_session_established{peer="192.168.77.1"} 1.0' in text
    assert 'ferry_route_sync_bgp_prefixes_advertised{family="6",peer="192.168.77.1"} 1.0' in text
    assert 'ferry_route_sync_bgp_session_errors_total{peer="192.168.88.1",reason="bad-peer-as"} 2.0' in text
    assert "ferry_route_sync_bgp_speaker_restarts_total 1.0" in text
