"""The in-process API against a real store on disk: idempotency, requested addresses, exhaustion
without leftovers, release/check/gc/status, config errors, and the store's file hygiene."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from cni.ipam import api
from cni.ipam.store import Store
from cni.spec.errors import (
    INVALID_CONFIG,
    IO_FAILURE,
    IPAM_EXHAUSTED,
    IPAM_FAILURE,
    NOT_READY,
    TRY_AGAIN_LATER,
    CniError,
)


def netconf(tmp_path: Path, ranges: Any = None, **ipam: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"type": "ferry-ipam", "dataDir": str(tmp_path / "data"), **ipam}
    if ranges is not None:
        d["ranges"] = ranges
    return {"cniVersion": "1.1.0", "name": "fi-net", "type": "ferry", "ipam": d}


DUAL = [[{"subnet": "10.7.0.0/29"}], [{"subnet": "fd07::/125"}]]


def store_problems(conf: api.IpamConfig) -> list[str]:
    with Store(conf.store_dir).locked() as txn:
        return txn.verify()


def claims(conf: api.IpamConfig) -> set[str]:
    return set(os.listdir(os.path.join(conf.store_dir, "ips")))


def test_parse_config_from_node_cidrs_and_store_dir(tmp_path: Path) -> None:
    conf = api.parse_config(netconf(tmp_path), ["10.244.1.0/24", "fd00:10:244:1::/64"])
    assert conf.store_dir == str(tmp_path / "data" / "fi-net")
    assert [rs[0].subnet for rs in conf.range_sets] == ["10.244.1.0/24", "fd00:10:244:1::/64"]
    ips = api.allocate(conf, "c1", "eth0")
    assert [(i.address, i.gateway) for i in ips] == [("10.244.1.2/24", "10.244.1.1"),
                                                     ("fd00:10:244:1::2/64", "fd00:10:244:1::1")]
    # Explicit ranges win over the Node's CIDRs.
    conf2 = api.parse_config(netconf(tmp_path, [[{"subnet": "10.9.0.0/24"}]]), ["10.244.1.0/24"])
    assert [rs[0].subnet for rs in conf2.range_sets] == ["10.9.0.0/24"]
    assert api.parse_config({"name": "n", "ipam": {}}, ["10.1.0.0/24"]).data_dir == "/var/lib/ferry/ipam"


def test_parse_config_errors(tmp_path: Path) -> None:
    with pytest.raises(CniError) as e:
        api.parse_config(netconf(tmp_path), [])
    assert e.value.code == TRY_AGAIN_LATER
    with pytest.raises(CniError) as e:
        api.parse_config(netconf(tmp_path, [[{"subnet": "10.7.0.0/24"}, {"subnet": "10.8.0.0/24",
                                                                          "gateway": "10.7.0.1"}]]), [])
    assert e.value.code == INVALID_CONFIG and e.value.msg.startswith("ipam.ranges[0][1].gateway")
    with pytest.raises(CniError) as e:
        api.parse_config(netconf(tmp_path), ["10.244.1.0/24", "10.244.0.0/16"])
    assert e.value.code == INVALID_CONFIG and "overlaps" in e.value.msg
    for bad, field in (({"name": "../x", "ipam": {}}, "name"),
                       ({"name": "n", "ipam": {"dataDir": "rel/dir"}}, "ipam.dataDir"),
                       ({"name": "n", "ipam": {"routes": [{"gw": "10.0.0.1"}]}}, "ipam.routes[0].dst"),
                       ({"name": "n", "ipam": {"routes": [{"dst": "x"}]}}, "ipam.routes[0]")):
        with pytest.raises(CniError) as e:
            api.parse_config(bad, ["10.1.0.0/24"])
        assert e.value.code == INVALID_CONFIG and e.value.msg.startswith(field), e.value.msg


def test_idempotent_and_distinct(tmp_path: Path) -> None:
    conf = api.parse_config(netconf(tmp_path, DUAL), [])
    a = api.allocate(conf, "c1", "eth0")
    assert api.allocate(conf, "c1", "eth0") == a
    b = api.allocate(conf, "c1", "net1")  # another interface of the same container
    assert {i.address for i in a}.isdisjoint({i.address for i in b})
    assert store_problems(conf) == []


def test_never_gateway_network_broadcast_and_exhaustion_names_range(tmp_path: Path) -> None:
    conf = api.parse_config(netconf(tmp_path, [[{"subnet": "10.7.0.0/29", "gateway": "10.7.0.4"}]]), [])
    got = [api.allocate(conf, f"c{i}", "eth0")[0].address for i in range(5)]
    assert sorted(got) == ["10.7.0.1/29", "10.7.0.2/29", "10.7.0.3/29", "10.7.0.5/29", "10.7.0.6/29"]
    with pytest.raises(CniError) as e:
        api.allocate(conf, "c9", "eth0")
    assert e.value.code == IPAM_EXHAUSTED and "10.7.0.0/29" in e.value.msg
    with pytest.raises(CniError) as e:
        api.status(conf)
    assert e.value.code == NOT_READY and "10.7.0.0/29" in e.value.msg
    api.release(conf, "c2", "eth0")
    api.status(conf)
    assert api.allocate(conf, "c9", "eth0")[0].address == got[2]


def test_dual_stack_failure_leaves_nothing_reserved(tmp_path: Path) -> None:
    conf = api.parse_config(netconf(tmp_path, [[{"subnet": "10.7.0.0/24"}],
                                               [{"subnet": "fd07::/120", "rangeStart": "fd07::10",
                                                 "rangeEnd": "fd07::11"}]]), [])
    api.allocate(conf, "c1", "eth0")
    api.allocate(conf, "c2", "eth0")
    before = claims(conf)
    with pytest.raises(CniError) as e:
        api.allocate(conf, "c3", "eth0")
    assert e.value.code == IPAM_EXHAUSTED and "range set 1" in e.value.msg and "fd07::/120" in e.value.msg
    assert claims(conf) == before  # the IPv4 address it would have had is not held
    with Store(conf.store_dir).locked() as txn:
        assert txn.get(("c3", "eth0")) is None


def test_requested_addresses(tmp_path: Path) -> None:
    conf = api.parse_config(netconf(tmp_path, DUAL), [])
    ips = api.allocate(conf, "c1", "eth0", ["10.7.0.5", "fd07::6/125"])
    assert [i.address for i in ips] == ["10.7.0.5/29", "fd07::6/125"]
    with pytest.raises(CniError) as e:
        api.allocate(conf, "c2", "eth0", ["10.7.0.5"])
    assert e.value.code == IPAM_FAILURE and "10.7.0.5" in e.value.msg and "c1/eth0" in e.value.msg
    with pytest.raises(CniError) as e:
        api.allocate(conf, "c2", "eth0", ["10.8.0.5"])
    assert e.value.code == INVALID_CONFIG and "10.8.0.5" in e.value.msg
    with pytest.raises(CniError) as e:
        api.allocate(conf, "c1", "eth0", ["10.7.0.3"])  # it already holds another
    assert e.value.code == IPAM_FAILURE and "10.7.0.5/29" in e.value.msg
    # Pinned addresses do not move the cursor: the pool continues from its own last pick.
    assert api.allocate(conf, "c3", "eth0")[0].address == "10.7.0.2/29"
    assert store_problems(conf) == []


def test_release_check_gc(tmp_path: Path) -> None:
    conf = api.parse_config(netconf(tmp_path, DUAL), [])
    a = api.allocate(conf, "c1", "eth0")
    api.allocate(conf, "c2", "eth0")
    api.allocate(conf, "c3", "eth0")
    api.check(conf, "c1", "eth0", [i.address for i in a])
    with pytest.raises(CniError) as e:
        api.check(conf, "c1", "eth0", ["10.7.0.6/29"])
    assert e.value.code == IPAM_FAILURE and "10.7.0.6/29" in e.value.msg
    api.release(conf, "c1", "eth0")
    api.release(conf, "c1", "eth0")  # unknown now: still success
    api.release(conf, "nobody", "eth0")
    with pytest.raises(CniError) as e:
        api.check(conf, "c1", "eth0", [a[0].address])
    assert a[0].address in e.value.msg
    assert api.gc(conf, {("c2", "eth0")}) == [("c3", "eth0")]
    with Store(conf.store_dir).locked() as txn:
        assert txn.keys() == [("c2", "eth0")]
    assert len(claims(conf)) == 2 and store_problems(conf) == []


def test_status_no_range_and_unwritable_store(tmp_path: Path) -> None:
    conf = api.parse_config(netconf(tmp_path, DUAL), [])
    with pytest.raises(CniError) as e:
        api.status(api.IpamConfig(network="x", data_dir=str(tmp_path), range_sets=()))
    assert e.value.code == NOT_READY
    (tmp_path / "data").write_text("a file where the data dir should be")
    with pytest.raises(CniError) as e:
        api.status(conf)
    assert e.value.code == NOT_READY and "store" in e.value.msg
    with pytest.raises(CniError) as e:
        api.allocate(conf, "c1", "eth0")
    assert e.value.code == IO_FAILURE


def test_store_refuses_symlinks_and_files_are_not_world_writable(tmp_path: Path) -> None:
    conf = api.parse_config(netconf(tmp_path, DUAL), [])
    api.allocate(conf, "c1", "eth0")
    for root, dirs, files in os.walk(conf.store_dir):
        for n in dirs + files:
            st = os.lstat(os.path.join(root, n))
            assert st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH), n
    # A symlink planted where the next claim goes is replaced, never followed.
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, os.path.join(conf.store_dir, "ips", ".10.7.0.3.tmp"))
    os.symlink(victim, os.path.join(conf.store_dir, "ips", "10.7.0.4"))  # looks taken: skipped
    got = api.allocate(conf, "c2", "eth0")
    assert got[0].address == "10.7.0.3/29" and victim.read_text() == "precious"
    # A store directory that is a symlink is refused.
    real = tmp_path / "elsewhere"
    real.mkdir()
    os.symlink(real, tmp_path / "data" / "fi-link")
    linked = api.IpamConfig(network="fi-link", data_dir=str(tmp_path / "data"), range_sets=conf.range_sets)
    with pytest.raises(CniError) as e:
        api.allocate(linked, "c1", "eth0")
    assert "symlink" in e.value.msg and os.listdir(real) == []
    # A group-writable store is refused.
    loose = tmp_path / "data" / "fi-loose"
    loose.mkdir()
    loose.chmod(0o775)
    with pytest.raises(CniError) as e:
        api.allocate(api.IpamConfig("fi-loose", str(tmp_path / "data"), conf.range_sets), "c1", "eth0")
    assert "writable by group" in e.value.msg


def test_odd_container_ids_round_trip(tmp_path: Path) -> None:
    conf = api.parse_config(netconf(tmp_path, DUAL), [])
    key = ("weird:id/with%chars", "eth0@x")
    api.allocate(conf, *key)
    with Store(conf.store_dir).locked() as txn:
        assert txn.keys() == [key]
    assert api.gc(conf, set()) == [key]


def test_add_and_del_never_scan_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The normal path costs O(1) whatever the fill: no directory listing on ADD, DEL or CHECK."""
    conf = api.parse_config(netconf(tmp_path, [[{"subnet": "10.7.0.0/16"}]]), [])
    for i in range(50):
        api.allocate(conf, f"fill{i}", "eth0")
    import cni.ipam.store

    def no_scan(*a: object) -> list[str]:
        raise AssertionError("directory scanned on the per-Pod path")

    monkeypatch.setattr(cni.ipam.store.os, "listdir", no_scan)
    ips = api.allocate(conf, "c1", "eth0")
    api.check(conf, "c1", "eth0", [ips[0].address])
    api.release(conf, "c1", "eth0")
    monkeypatch.undo()
    assert store_problems(conf) == []
