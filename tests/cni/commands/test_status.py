"""STATUS in-process: ready when OVS answers and IPAM has ranges; NOT_READY saying why otherwise."""

from __future__ import annotations

import os
import signal

import pytest

from cni.commands.status import status
from cni.spec.errors import NOT_READY, CniError
from tests.cni.commands.inprocess import LoneNode

pytestmark = pytest.mark.root


def test_a_lone_node_with_ovs_up_is_ready(lone_node: LoneNode) -> None:
    assert lone_node.call(status, lone_node.request("STATUS")) is None  # no bridge yet: the first ADD makes it


def test_without_ipam_ranges_or_node_state_it_is_not_ready(lone_node: LoneNode) -> None:
    conf = lone_node.conf()
    conf["ipam"] = {"type": "ferry-ipam", "dataDir": str(lone_node.ipam_dir)}  # ranges come from route-sync's state
    with pytest.raises(CniError) as e:
        lone_node.call(status, lone_node.request("STATUS", conf=conf))
    assert e.value.code == NOT_READY, e.value


def test_with_ovsdb_down_it_is_not_ready(lone_node: LoneNode) -> None:
    with open(f"{lone_node.ovs.dir}/ovsdb-server.pid") as f:
        os.kill(int(f.read()), signal.SIGKILL)
    with pytest.raises(CniError) as e:
        lone_node.call(status, lone_node.request("STATUS"))
    assert e.value.code == NOT_READY and "not reachable" in e.value.msg, e.value.msg
