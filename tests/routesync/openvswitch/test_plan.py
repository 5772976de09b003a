"""What Ferry's openvswitch container runs, planned without root: the database steps, the daemons'
command lines, the restart budget, and the config keys that choose it."""

from __future__ import annotations

import json

import pytest

from routesync import config
from routesync.openvswitch.plan import (
    DAEMONS,
    FLOW_RESTORE_WAIT,
    OVS_VSWITCHD,
    OVSDB_SERVER,
    SAVE_PROTOCOLS,
    Layout,
    RestartBudget,
    SavedBridge,
    bridges_in,
    daemon_argv,
    database_steps,
    dump_argv,
    flow_lines,
    group_lines,
    meter_specs,
    plan,
    restore_plan,
    saved_path,
)

LAYOUT = Layout(run_dir="/var/run/openvswitch", database="/var/lib/ferry/openvswitch/conf.db",
                log_dir="/var/log/ferry")


def test_a_new_node_creates_the_database_from_the_schema() -> None:
    assert database_steps(LAYOUT, exists=False, needs_conversion=False) == (
        ("ovsdb-tool", "create", LAYOUT.database, LAYOUT.schema),)


def test_a_newer_schema_converts_in_place_and_keeps_the_old_file() -> None:
    steps = database_steps(LAYOUT, exists=True, needs_conversion=True)
    assert steps[0] == ("cp", "-p", LAYOUT.database, LAYOUT.database + ".before-convert")
    assert steps[-1] == ("ovsdb-tool", "convert", LAYOUT.database, LAYOUT.schema)


def test_an_up_to_date_database_is_left_alone() -> None:
    assert database_steps(LAYOUT, exists=True, needs_conversion=False) == ()


def test_the_daemons_run_in_the_foreground_on_the_layouts_paths() -> None:
    p = plan(LAYOUT, exists=True, needs_conversion=False)
    assert [name for name, _ in p.daemons] == list(DAEMONS) == [OVSDB_SERVER, OVS_VSWITCHD]
    server, switch = (argv for _, argv in p.daemons)
    for argv, name in ((server, OVSDB_SERVER), (switch, OVS_VSWITCHD)):
        assert argv[0] == name
        assert "--detach" not in argv  # the supervisor must be their parent to see them exit
        assert f"--pidfile=/var/run/openvswitch/{name}.pid" in argv  # route-sync's restart detection
        assert f"--log-file=/var/log/ferry/{name}.log" in argv
    assert server[1] == LAYOUT.database and "--remote=punix:/var/run/openvswitch/db.sock" in server
    assert switch[1] == "unix:/var/run/openvswitch/db.sock"
    with pytest.raises(ValueError, match="ovs-monitor"):
        daemon_argv(LAYOUT, "ovs-monitor")


def test_env_points_ovs_tools_at_the_layout() -> None:
    assert LAYOUT.env() == {"OVS_RUNDIR": "/var/run/openvswitch", "OVS_DBDIR": "/var/lib/ferry/openvswitch",
                            "OVS_LOGDIR": "/var/log/ferry"}


def test_restart_budget_counts_only_the_window() -> None:
    b = RestartBudget(limit=3, window=60.0)
    assert b.allows((), 0.0)
    assert b.allows((1.0, 2.0), 3.0)
    assert not b.allows((1.0, 2.0, 3.0), 4.0)  # a crash loop: hand over to the kubelet
    assert b.allows((1.0, 2.0, 3.0), 62.0)  # the oldest restart left the window


def test_ovs_daemons_config_keys() -> None:
    c = config.from_dict({"nodeName": "n1"})
    assert c.ovs_daemons == config.OVS_HOST  # route-sync alone never starts Open vSwitch
    c = config.from_dict({"nodeName": "n1", "ovsDaemons": "ferry", "ovsDatabase": "/srv/ovs/conf.db",
                          "ovsLogDir": "/srv/log"})
    assert (c.ovs_daemons, c.ovs_database, c.ovs_log_dir) == (config.OVS_FERRY, "/srv/ovs/conf.db", "/srv/log")
    with pytest.raises(config.ConfigError, match="ovsDaemons"):
        config.from_dict({"nodeName": "n1", "ovsDaemons": "container"})
    with pytest.raises(config.ConfigError, match="ovsDatabase"):
        config.from_dict({"nodeName": "n1", "ovsDatabase": "conf.db"})
    with pytest.raises(config.ConfigError, match="ovsLogDir"):
        config.from_dict({"nodeName": "n1", "ovsLogDir": ""})


# -- the flows across ovs-vswitchd's restarts (issue 42)
DUMP = """ cookie=0x5, priority=0 actions=drop
 cookie=0x1234, table=10, idle_age=3, priority=200,ip,nw_dst=10.0.0.0/8 actions=meter:7,dec_ttl,goto_table:20
 cookie=0x9, table=20, priority=10,igmp actions=drop
"""
METERS = """OFPST_METER_CONFIG reply (OF1.3) (xid=0x2):
meter=7 pktps burst bands=
type=drop rate=100 burst_size=1000
meter=8 kbps stats bands=
type=drop rate=10
type=dscp_remark rate=20 prec_level=1
"""


def test_a_dump_becomes_add_flows_lines_as_ovs_save_makes_them() -> None:
    assert flow_lines("OFPST_FLOW reply (OF1.3) (xid=0x2):\n" + DUMP) == (
        "cookie=0x5, priority=0 actions=drop",
        "cookie=0x1234, table=10, priority=200,ip,nw_dst=10.0.0.0/8 actions=meter:7,dec_ttl,goto_table:20",
        "cookie=0x9, table=20, priority=10,ip,nw_proto=2 actions=drop")
    assert group_lines("OFPST_GROUP_DESC reply (OF1.3) (xid=0x2):\n group_id=1,type=all,bucket=actions=drop\n") == (
        "group_id=1,type=all,bucket=actions=drop",)
    assert meter_specs(METERS) == ("meter=7,pktps,burst,bands=type=drop,rate=100,burst_size=1000",
                                   "meter=8,kbps,stats,bands=type=drop,rate=10,type=dscp_remark,rate=20,prec_level=1")
    assert meter_specs("OFPST_METER_CONFIG reply (OF1.3) (xid=0x2):\n") == ()


def test_the_bridges_are_read_off_the_run_directory() -> None:
    assert bridges_in(["db.sock", "br-int.mgmt", "ovs-vswitchd.pid", "br-phy.mgmt", ".mgmt"]) == ("br-int", "br-phy")


def test_a_saved_bridge_round_trips_and_another_version_is_ignored() -> None:
    s = SavedBridge("br-int", ("a",), ("g",), ("m",))
    assert SavedBridge.from_json(json.loads(json.dumps(s.to_json()))) == s
    assert SavedBridge.from_json({**s.to_json(), "version": 99}) is None
    assert SavedBridge.from_json({"version": 1, "bridge": "b", "flows": [1]}) is None
    assert SavedBridge.from_json([]) is None
    assert saved_path(LAYOUT, "br-int") == "/var/run/openvswitch/ferry-saved-flows/br-int.flows.json"


def test_a_restore_waits_meters_then_groups_then_flows_in_bundles_then_clears_the_wait() -> None:
    s = SavedBridge("br-int", ("cookie=0x5, priority=0 actions=drop",), ("group_id=1,type=all",), ("meter=7,pktps",))
    gone = SavedBridge("br-old", ("priority=0 actions=drop",))
    r = restore_plan(LAYOUT, [s, gone], existing=("br-int",))
    assert r.before[0].argv[-4:] == ("set", "Open_vSwitch", ".", "other_config:flow-restore-wait=true")
    assert [b for b, _ in r.bridges] == ["br-int"]  # a bridge no longer in the database is not waited for
    steps = r.bridges[0][1]
    target = "unix:/var/run/openvswitch/br-int.mgmt"
    assert [st.argv[3:] for st in steps] == [("add-meter", target, "meter=7,pktps"),
                                             ("--bundle", "add-groups", target, "-"),
                                             ("--bundle", "add-flows", target, "-")]
    assert steps[-1].stdin == "cookie=0x5, priority=0 actions=drop\n"
    assert all(st.argv[1:3] == ("-O", SAVE_PROTOCOLS) for st in steps)
    assert r.after[0].argv[-6:] == ("--if-exists", "remove", "Open_vSwitch", ".", "other_config", FLOW_RESTORE_WAIT)


def test_nothing_to_restore_clears_a_stale_wait_before_the_start() -> None:
    """A supervisor killed between setting flow-restore-wait and clearing it must not leave the
    next ovs-vswitchd waiting for ever."""
    r = restore_plan(LAYOUT, [], existing=("br-int",))
    assert r.bridges == () and r.after == ()
    assert r.before[0].argv[-2:] == ("other_config", FLOW_RESTORE_WAIT)


def test_the_dumps_are_without_counters_under_the_same_negotiation() -> None:
    argv = dump_argv(LAYOUT, "br-int")
    assert argv["flows"] == ("ovs-ofctl", "-O", SAVE_PROTOCOLS, "dump-flows", "--no-names", "--no-stats",
                             "unix:/var/run/openvswitch/br-int.mgmt")
    assert set(argv) == {"flows", "groups", "meters"}
