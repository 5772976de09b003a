"""cni.ovs.ovsdb against a private ovsdb-server + ovs-vswitchd, cross-checked with ovsdbapp / ovs-vsctl."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from cni.kernel.netlink import Netlink
from cni.kernel.netns import open_netns
from cni.ovs.ovsdb import Ovsdb, OvsdbError, OvsdbUnreachable, PortExistsError
from tests.support.names import uniq
from tests.support.ovs_instance import OvsInstance
from tests.support.waiting import HANG

pytestmark = pytest.mark.root
BR = "fs-br"


@pytest.fixture
def db(ovs: OvsInstance) -> Iterator[Ovsdb]:
    with Ovsdb(ovs.db) as client:
        client.ensure_bridge(BR, "netdev")
        yield client


def veth_in(ovs: OvsInstance) -> str:
    """A veth inside vswitchd's namespace (peer ``<name>p`` too); returns the OVS-side name."""
    name = uniq("v")
    with Netlink.in_netns(f"/run/netns/{ovs.netns}") as nl:
        fd = open_netns(f"/run/netns/{ovs.netns}")
        try:
            nl.create_veth(name, name[:-1] + "p", fd, mtu=1500)
        finally:
            os.close(fd)
        nl.link_set(name, up=True)
    return name


def ovsdbapp_api(remote: str):  # type: ignore[no-untyped-def]
    from ovsdbapp.backend.ovs_idl import connection
    from ovsdbapp.schema.open_vswitch import impl_idl

    idl = connection.OvsdbIdl.from_server(remote, "Open_vSwitch")
    conn = connection.Connection(idl=idl, timeout=10)
    return impl_idl.OvsdbIdl(conn), conn


def test_ensure_bridge_creates_secure_bridge_once(ovs: OvsInstance, db: Ovsdb) -> None:
    info = db.bridge(BR)
    assert info is not None and info.datapath_type == "netdev"
    db.ensure_bridge(BR, "system")  # exists: no-op, nothing changes
    assert db.bridge(BR) == info
    assert ovs.vsctl("list-br").split() == [BR]
    assert ovs.vsctl("get", "bridge", BR, "fail_mode").strip() == "secure"
    assert ovs.vsctl("get", "bridge", BR, "datapath_type").strip() == "netdev"
    assert ovs.vsctl("get", "bridge", BR, "_uuid").strip() == info.uuid
    # fail_mode=secure: vswitchd installed no NORMAL flow.
    assert "NORMAL" not in ovs.ofctl("dump-flows", BR)
    assert db.bridge("fs-none") is None


def test_add_find_del_port_seen_by_ovsdbapp(ovs: OvsInstance, db: Ovsdb) -> None:
    name = veth_in(ovs)
    ext = {"ferry-owner": "pod", "ferry-container-id": "c0ffee", "ferry-ifname": "eth0"}
    ofport = db.add_port(BR, name, ext)
    assert ofport == int(ovs.vsctl("get", "interface", name, "ofport"))
    assert ofport > 0
    api, conn = ovsdbapp_api(ovs.db)
    try:
        assert api.db_get("Port", name, "external_ids").execute(check_error=True) == ext
        assert api.db_get("Interface", name, "external_ids").execute(check_error=True) == ext
        assert name in api.list_ports(BR).execute(check_error=True)
    finally:
        conn.stop()
    info = db.port(name)
    assert info is not None
    assert (info.name, info.ofport, info.external_ids, info.iface_type, info.error) == (name, ofport, ext, "", None)
    assert info.mac_in_use == ovs.vsctl("get", "interface", name, "mac_in_use").strip().strip('"')
    other = veth_in(ovs)
    db.add_port(BR, other, {"ferry-owner": "pod", "ferry-container-id": "other"})
    assert [p.name for p in db.find_ports({"ferry-container-id": "c0ffee"})] == [name]
    assert [p.name for p in db.find_ports({"ferry-owner": "pod"})] == sorted([name, other])
    assert db.find_ports({"ferry-container-id": "c0ffee", "ferry-ifname": "eth1"}) == []
    assert {p.name for p in db.ports(BR)} == {BR, name, other}
    assert db.del_port(BR, name) is True
    assert db.del_port(BR, name) is False
    assert db.port(name) is None
    assert sorted(ovs.vsctl("list-ports", BR).split()) == [other]
    # OVSDB garbage-collected the Interface row too.
    assert name not in ovs.vsctl("--columns=name", "list", "interface")


def test_internal_port_with_mac(ovs: OvsInstance, db: Ovsdb) -> None:
    ofport = db.add_port(BR, "fs-gw0", {"ferry-owner": "node"}, iface_type="internal", mac="02:aa:00:00:00:01")
    assert ofport == int(ovs.vsctl("get", "interface", "fs-gw0", "ofport"))
    info = db.port("fs-gw0")
    assert info is not None and info.iface_type == "internal" and info.mac_in_use == "02:aa:00:00:00:01"
    with Netlink.in_netns(f"/run/netns/{ovs.netns}") as nl:  # the tap device exists with that MAC
        link = nl.link_get("fs-gw0")
        assert link is not None and link.mac == "02:aa:00:00:00:01"


def test_add_port_errors(ovs: OvsInstance, db: Ovsdb) -> None:
    with pytest.raises(OvsdbError, match="No such device"):
        db.add_port(BR, "fs-nodev", {"x": "y"})
    assert db.port("fs-nodev") is None  # the failed port was removed again
    name = veth_in(ovs)
    with pytest.raises(OvsdbError, match="does not exist"):
        db.add_port("fs-nobr", name, {})
    db.add_port(BR, name, {})
    with pytest.raises(PortExistsError):
        db.add_port(BR, name, {})
    assert db.port(name) is not None and db.port(name).ofport > 0  # type: ignore[union-attr]


def test_missing_socket_names_the_path(tmp_path: object) -> None:
    sock = f"{tmp_path}/db.sock"
    with pytest.raises(OvsdbError) as e:
        Ovsdb(f"unix:{sock}").bridge("x")
    assert sock in str(e.value) and "ovsdb-server is not running" in str(e.value)


def test_connect_waits_for_an_ovsdb_server_that_starts_meanwhile(tmp_path: object) -> None:
    """A DEL on a Node that has just started: the connection waits (``wait``) for ovsdb-server,
    which starts once the caller said it waits; without a server it fails after the wait, naming
    the socket."""
    heard: list[str] = []
    with pytest.raises(OvsdbUnreachable) as e:
        Ovsdb(f"unix:{tmp_path}/db.sock").connect(wait=0.05, notice=heard.append)
    assert f"{tmp_path}/db.sock" in str(e.value) and heard and "waiting up to 0.05 s" in heard[0]
    late = OvsInstance(uniq("late"), start=False)
    waiting = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        db = Ovsdb(late.db)
        done = pool.submit(db.connect, 60.0, lambda _line: waiting.set())
        assert waiting.wait(HANG) and not done.done()
        try:
            late.start()
            done.result(timeout=HANG)
            assert db.bridge("none-such") is None  # connected: a query answers
        finally:
            db.close()
            late.stop()


def test_requested_ofport_is_known_before_vswitchd_and_collisions_move_on(ovs: OvsInstance, db: Ovsdb) -> None:
    """add_port_start with candidate ofports: the first free one is requested and then assigned;
    one requested or held by another interface is skipped inside the same transaction."""
    first = veth_in(ovs)
    pending = db.add_port_start(BR, first, {"ferry-owner": "pod"}, ofports=(4000, 4001))
    assert pending.ofport_request == 4000
    assert pending.finish() == 4000 == int(ovs.vsctl("get", "interface", first, "ofport"))
    # 4000 is held now, and 4001 is requested by an interface vswitchd cannot open.
    ovs.vsctl("add-port", BR, "fs-ghost", "--", "set", "interface", "fs-ghost", "ofport_request=4001")
    second = veth_in(ovs)
    pending = db.add_port_start(BR, second, {"ferry-owner": "pod"}, ofports=(4000, 4001, 4002))
    assert pending.ofport_request == 4002 and pending.finish() == 4002
    third = veth_in(ovs)
    with pytest.raises(OvsdbError, match="4000, 4001 are all taken"):
        db.add_port_start(BR, third, {}, ofports=(4000, 4001))
    assert db.port(third) is None  # nothing was inserted
    assert db.add_port(BR, third, {}) not in (4000, 4001, 4002)  # the connection is still usable


def test_find_ports_joins_interfaces_without_external_ids(ovs: OvsInstance, db: Ovsdb) -> None:
    """A port whose external_ids are on the Port only (written by someone else, not add_port) still
    comes back with its Interface's ofport."""
    name = veth_in(ovs)
    ovs.vsctl("add-port", BR, name, "--", "set", "port", name, "external_ids:ferry-container-id=elsewhere")
    found = db.find_ports({"ferry-container-id": "elsewhere"})
    assert [p.name for p in found] == [name]
    assert found[0].ofport == int(ovs.vsctl("get", "interface", name, "ofport")) > 0
