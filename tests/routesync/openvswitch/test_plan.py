"""What Ferry's openvswitch container runs, planned without root: the database steps, the daemons'
command lines, the restart budget, and the config keys that choose it."""

from __future__ import annotations

import pytest

from routesync import config
from routesync.openvswitch.plan import (
    DAEMONS,
    OVS_VSWITCHD,
    OVSDB_SERVER,
    Layout,
    RestartBudget,
    daemon_argv,
    database_steps,
    plan,
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
