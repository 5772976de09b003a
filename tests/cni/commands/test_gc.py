"""GC in-process: an attachment not in the runtime's valid list goes entirely; listed ones stay."""

from __future__ import annotations

import pytest

from cni.commands.add import add
from cni.commands.check import check
from cni.commands.gc import gc
from cni.pipeline import tables as pl
from tests.cni.commands.inprocess import LoneNode, MakePod

pytestmark = pytest.mark.root


def test_gc_removes_what_the_runtime_no_longer_lists(lone_node: LoneNode, make_pod: MakePod) -> None:
    keep, stale = make_pod("keep"), make_pod("stale")
    kept = lone_node.call(add, lone_node.request("ADD", keep))
    gone = lone_node.call(add, lone_node.request("ADD", stale))
    assert len(lone_node.pod_ports()) == 2 and len(lone_node.ipam_files()) == 6

    assert lone_node.call(gc, lone_node.request("GC", valid=[keep])) is None

    assert lone_node.pod_ports() == [kept.interfaces[0].name]
    assert lone_node.host_veths() == [kept.interfaces[0].name]
    assert lone_node.flows(pl.pod_cookie(stale.container_id, "eth0")) == []
    assert set(stale.links()) == {"lo"}  # its veth went, Pod end included
    claims = {f.split("/", 1)[1] for f in lone_node.ipam_files() if f.startswith("ips/")}
    assert claims == {i.address.split("/")[0] for i in kept.ips}
    assert not claims & {i.address.split("/")[0] for i in gone.ips}
    # The listed Pod is untouched: CHECK still passes, its flows are all there.
    assert lone_node.call(check, lone_node.request("CHECK", keep, prev_result=kept)) is None


def test_gc_with_every_attachment_listed_changes_nothing(lone_node: LoneNode, make_pod: MakePod) -> None:
    a, b = make_pod("a"), make_pod("b")
    lone_node.call(add, lone_node.request("ADD", a))
    lone_node.call(add, lone_node.request("ADD", b))
    ports, files, flows = sorted(lone_node.pod_ports()), lone_node.ipam_files(), len(lone_node.flows())
    lone_node.call(gc, lone_node.request("GC", valid=[a, b]))
    assert (sorted(lone_node.pod_ports()), lone_node.ipam_files(), len(lone_node.flows())) == (ports, files, flows)
