"""The plugin's conf keys and how an ADD meets a state file route-sync has not written yet (no root:
files in a temporary directory)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from cni.node import config as cfg
from cni.node import nodestate
from cni.spec.errors import INVALID_CONFIG, TRY_AGAIN_LATER, CniError
from tests.support.waiting import HANG

STATE: dict[str, Any] = {
    "version": 1, "node": "node-a", "mode": "encap", "bridge": "br-int", "datapath": "netdev",
    "ovsdb": "unix:/run/openvswitch/db.sock", "ovsRunDir": "/run/openvswitch", "mtu": 1450,
    "podCIDRs": ["10.244.1.0/24"], "clusterCIDRs": ["10.244.0.0/16"],
    "gateway": {"name": "ferry-gw0", "mac": "02:00:00:00:00:01", "ofport": 2, "addresses": ["10.244.1.1/24"]},
}


def conf(tmp_path: Path, **keys: Any) -> dict[str, Any]:
    return {"type": "ferry", "name": "net", "stateFile": str(tmp_path / "state" / "node-state.json"),
            "ipam": {"type": "ferry-ipam"}, **keys}


@pytest.mark.parametrize("bad", [-1, 61, "5", True, None, [1]])
def test_startup_wait_out_of_range_names_the_field(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(CniError) as e:
        cfg.parse(conf(tmp_path, startupWaitSeconds=bad))
    assert e.value.code == INVALID_CONFIG and "startupWaitSeconds" in e.value.msg


def test_startup_wait_defaults_and_takes_fractions(tmp_path: Path) -> None:
    assert cfg.parse(conf(tmp_path)).startup_wait == cfg.DEFAULT_STARTUP_WAIT
    assert cfg.parse(conf(tmp_path, startupWaitSeconds=0.5)).startup_wait == 0.5


def test_an_add_waits_for_the_state_file_and_reads_it(tmp_path: Path) -> None:
    """The wait ends on the file's appearance: the writer starts once the reader said it waits."""
    c = cfg.parse(conf(tmp_path, startupWaitSeconds=60))
    heard: list[str] = []
    waiting = threading.Event()

    def notice(line: str) -> None:
        heard.append(line)
        waiting.set()

    def route_sync() -> None:
        assert waiting.wait(HANG)
        nodestate.write_text(json.dumps(STATE), c.state_file)

    writer = threading.Thread(target=route_sync)
    writer.start()
    node = cfg.node_context(c, need_state=True, wait=notice)
    writer.join()
    assert node.state is not None and node.pod_cidrs == ["10.244.1.0/24"] and node.mtu == 1450
    assert heard[0].startswith("waiting up to 60 s") and heard[-1].startswith("node state at")


def test_an_add_that_waits_in_vain_answers_11(tmp_path: Path) -> None:
    heard: list[str] = []
    with pytest.raises(CniError) as e:
        cfg.node_context(cfg.parse(conf(tmp_path, startupWaitSeconds=0.05)), need_state=True, wait=heard.append)
    assert e.value.code == TRY_AGAIN_LATER and "not written yet" in e.value.msg
    assert heard[-1].startswith("no node state at") and "after 0.05 s" in heard[-1]


def test_only_an_add_waits(tmp_path: Path) -> None:
    """STATUS (need_state, no wait) answers at once; a Node with explicit ranges (lone) never
    needs the file; DEL, CHECK, GC (no need_state) run lone."""
    c = cfg.parse(conf(tmp_path, startupWaitSeconds=60))
    with pytest.raises(CniError) as e:
        cfg.node_context(c, need_state=True)
    assert e.value.code == TRY_AGAIN_LATER
    assert cfg.node_context(c, need_state=False).lone
    lone = cfg.parse(conf(tmp_path, startupWaitSeconds=60,
                          ipam={"type": "ferry-ipam", "ranges": [[{"subnet": "10.244.9.0/24"}]]}))
    heard: list[str] = []
    assert cfg.node_context(lone, need_state=True, wait=heard.append).lone and heard == []


def test_a_malformed_state_file_is_not_waited_for(tmp_path: Path) -> None:
    c = cfg.parse(conf(tmp_path, startupWaitSeconds=60))
    Path(c.state_file).parent.mkdir()
    Path(c.state_file).write_text("{not json")
    heard: list[str] = []
    with pytest.raises(CniError) as e:
        cfg.node_context(c, need_state=True, wait=heard.append)
    assert e.value.code == TRY_AGAIN_LATER and heard == []
