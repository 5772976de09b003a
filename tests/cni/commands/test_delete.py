"""DEL in-process: everything ADD made goes, and a second DEL (or one without the netns) succeeds."""

from __future__ import annotations

import pytest

from cni.commands.add import add
from cni.commands.delete import delete
from cni.pipeline import tables as pl
from tests.cni.commands.inprocess import LoneNode, MakePod, run

pytestmark = pytest.mark.root


def _gone(lone_node: LoneNode, container_id: str) -> None:
    assert lone_node.host_veths() == [], "host veth left"
    assert lone_node.pod_ports() == [], "OVS port left"
    assert lone_node.flows(pl.pod_cookie(container_id, "eth0")) == [], "per-Pod flows left"
    assert lone_node.ipam_files() == [], "IPAM claims or records left"


def test_del_removes_all_and_is_idempotent(lone_node: LoneNode, make_pod: MakePod) -> None:
    pod = make_pod("a")
    result = lone_node.call(add, lone_node.request("ADD", pod))
    assert lone_node.pod_ports() == [result.interfaces[0].name]

    assert lone_node.call(delete, lone_node.request("DEL", pod, prev_result=result)) is None
    _gone(lone_node, pod.container_id)
    assert set(pod.links()) == {"lo"}  # the Pod's end went with its peer
    assert lone_node.bridge_exists()  # the LoneNode's bridge and gateway stay for the next Pod

    lone_node.call(delete, lone_node.request("DEL", pod, prev_result=result))  # again: nothing to do, no error
    _gone(lone_node, pod.container_id)


def test_del_after_the_netns_is_gone(lone_node: LoneNode, make_pod: MakePod) -> None:
    """The runtime may delete the sandbox first: DEL finds the port by its external_ids and the
    addresses by the attachment, not through the netns."""
    pod = make_pod("a")
    lone_node.call(add, lone_node.request("ADD", pod))
    run(["ip", "netns", "del", pod.netns])
    lone_node.call(delete, lone_node.request("DEL", pod))
    _gone(lone_node, pod.container_id)


def test_del_leaves_the_other_pods_alone(lone_node: LoneNode, make_pod: MakePod) -> None:
    a, b = make_pod("a"), make_pod("b")
    lone_node.call(add, lone_node.request("ADD", a))
    rb = lone_node.call(add, lone_node.request("ADD", b))
    lone_node.call(delete, lone_node.request("DEL", a))
    assert lone_node.pod_ports() == [rb.interfaces[0].name] and lone_node.host_veths() == [rb.interfaces[0].name]
    assert lone_node.flows(pl.pod_cookie(a.container_id, "eth0")) == []
    assert lone_node.flows(pl.pod_cookie(b.container_id, "eth0")) != []
    assert len(lone_node.ipam_files()) == 3 and b.addresses() == {i.address for i in rb.ips}
