"""ipam.durable chooses the crash contract: fsync everything (power loss) or nothing (process crash)."""

from __future__ import annotations

import os

import pytest

from cni.ipam import api
from cni.spec.errors import CniError


def _conf(tmp_path, durable=None):
    ipam = {"type": "ferry-ipam", "dataDir": str(tmp_path), "ranges": [[{"subnet": "10.9.0.0/24"}]]}
    if durable is not None:
        ipam["durable"] = durable
    return api.parse_config({"name": "fi-dur", "ipam": ipam}, [])


@pytest.mark.parametrize("durable, expect_syncs", [(None, False), (False, False), (True, True)])
def test_fsyncs_follow_the_setting(tmp_path, monkeypatch, durable, expect_syncs):
    conf = _conf(tmp_path, durable)
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    api.allocate(conf, "c1", "eth0")
    api.release(conf, "c1", "eth0")
    assert (len(calls) >= 5) if expect_syncs else (calls == [])


def test_durable_must_be_a_boolean(tmp_path):
    with pytest.raises(CniError) as e:
        _conf(tmp_path, "yes")
    assert e.value.code == 7 and "ipam.durable" in e.value.msg
