"""CHECK in-process: passes on what ADD made, names what diverged once something is taken away."""

from __future__ import annotations

import threading

import pytest

from cni.commands.add import add
from cni.commands.check import check
from cni.node.locks import attachment_lock
from cni.pipeline import tables as pl
from cni.spec.errors import CHECK_FAILED, INVALID_CONFIG, CniError
from tests.cni.commands.inprocess import LoneNode, MakePod, run
from tests.support.waiting import HANG, flock_waiters, until

pytestmark = pytest.mark.root


@pytest.mark.parametrize("damage", ["address", "route", "port", "flows"])
def test_check_passes_then_names_what_was_taken_away(lone_node: LoneNode, make_pod: MakePod, damage: str) -> None:
    pod = make_pod("a")
    result = lone_node.call(add, lone_node.request("ADD", pod))
    assert lone_node.call(check, lone_node.request("CHECK", pod, prev_result=result)) is None

    v4 = next(i.address for i in result.ips if "." in i.address)
    host = result.interfaces[0].name
    if damage == "address":
        run(["ip", "-n", pod.netns, "addr", "del", v4, "dev", "eth0"])
        expect = f"address {v4} is missing"
    elif damage == "route":
        run(["ip", "-n", pod.netns, "route", "del", "default"])
        expect = "route 0.0.0.0/0"
    elif damage == "port":
        lone_node.ovs.vsctl("del-port", lone_node.bridge, host)
        expect = "OVS port"
    else:
        lone_node.ovs.ofctl("del-flows", lone_node.bridge, f"cookie={pl.pod_cookie(pod.container_id, 'eth0').match()}")
        expect = "per-Pod flows missing"
    with pytest.raises(CniError) as e:
        lone_node.call(check, lone_node.request("CHECK", pod, prev_result=result))
    assert e.value.code == CHECK_FAILED and expect in e.value.msg, e.value.msg


def test_check_without_prev_result_is_a_config_error(lone_node: LoneNode, make_pod: MakePod) -> None:
    pod = make_pod("a")
    lone_node.call(add, lone_node.request("ADD", pod))
    with pytest.raises(CniError) as e:
        lone_node.call(check, lone_node.request("CHECK", pod))
    assert e.value.code == INVALID_CONFIG and "prevResult" in e.value.msg


def test_check_waits_for_the_attachment_lock(lone_node: LoneNode, make_pod: MakePod) -> None:
    """CHECK holds the attachment's lock, as cni.node.locks says: held elsewhere (an ADD, a DEL, GC,
    route-sync's Pod MTU sync), CHECK waits, and passes once the holder is done."""
    pod = make_pod("a")
    result = lone_node.call(add, lone_node.request("ADD", pod))
    outcome: list[object] = []

    def run_check() -> None:
        try:
            outcome.append(lone_node.call(check, lone_node.request("CHECK", pod, prev_result=result)))
        except CniError as e:
            outcome.append(e)

    with attachment_lock(str(lone_node.dir / "state" / "locks"), pod.container_id, "eth0") as lock:
        t = threading.Thread(target=run_check)
        t.start()
        until(lambda: flock_waiters(lock.path) == 1, "CHECK waiting on the attachment lock")
        assert outcome == []
    t.join(HANG)
    assert outcome == [None]
