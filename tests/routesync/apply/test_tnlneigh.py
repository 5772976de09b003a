"""route-sync speaks ovs-appctl's JSON-RPC on ovs-vswitchd's control socket itself: the same
answers as ovs-appctl, the same errors, and the binary when the socket is not usable."""

from __future__ import annotations

import subprocess

import pytest

from routesync.apply.tnlneigh import TunnelNeighborError, TunnelNeighbors, UnixctlError, parse_show, unixctl
from tests.routesync.apply.helpers import node

pytestmark = pytest.mark.root


def _appctl(ctl: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ovs-appctl", "-t", ctl, *args], capture_output=True, text=True, check=False)


def test_unixctl_answers_like_ovs_appctl() -> None:
    with node("fb-tn1") as n:
        ctl = f"{n.ovs.run_dir}/ovs-vswitchd.ctl"
        assert unixctl(ctl, "tnl/neigh/set", ["br-int", "192.168.9.1", "02:00:00:00:09:01"]) == "OK\n"
        assert unixctl(ctl, "tnl/neigh/set", ["br-int", "fd00:9::1", "02:00:00:00:09:02"]) == "OK\n"
        mine = unixctl(ctl, "tnl/neigh/show", [])
        assert mine == _appctl(ctl, "tnl/neigh/show").stdout
        assert parse_show(mine, "br-int") == {"192.168.9.1": "02:00:00:00:09:01", "fd00:9::1": "02:00:00:00:09:02"}
        with pytest.raises(UnixctlError) as refused:
            unixctl(ctl, "tnl/neigh/set", ["br-int", "not-an-ip", "02:00:00:00:09:01"])
        theirs = _appctl(ctl, "tnl/neigh/set", "br-int", "not-an-ip", "02:00:00:00:09:01")
        assert theirs.returncode != 0 and theirs.stderr.startswith(str(refused.value) + "\n")
        with pytest.raises(UnixctlError):
            unixctl(ctl, "no/such/command", [])


def test_tunnel_neighbors_fall_back_to_ovs_appctl_and_report_errors(tmp_path) -> None:
    with node("fb-tn2") as n:
        tn = TunnelNeighbors(routes=None, run_dir=n.ovs.run_dir, bridge="br-int")  # type: ignore[arg-type]
        tn._target = lambda: f"{n.ovs.run_dir}/ovs-vswitchd.ctl"  # type: ignore[method-assign]
        assert tn.installed() == {}
        tn._appctl("tnl/neigh/set", "br-int", "192.168.9.1", "02:00:00:00:09:01")
        assert tn.installed() == {"192.168.9.1": "02:00:00:00:09:01"}
        with pytest.raises(TunnelNeighborError, match="not-an-ip"):
            tn._appctl("tnl/neigh/set", "br-int", "not-an-ip", "02:00:00:00:09:01")
        # a path that is not a socket: the binary runs (and fails the same way it would)
        tn._target = lambda: str(tmp_path / "missing.ctl")  # type: ignore[method-assign]
        with pytest.raises(TunnelNeighborError, match="ovs-appctl"):
            tn.installed()
