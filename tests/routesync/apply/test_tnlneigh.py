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


def test_a_delta_whose_next_hops_are_known_does_not_read_the_cache_and_a_full_sync_repairs_it() -> None:
    """Two endpoints behind one router: the first sync reads OVS's cache and writes the router's
    entry; a delta's new endpoint behind the same router (same MAC) is trusted to the entry known,
    so an entry flushed behind route-sync's back stays gone (proof the cache was not read), until
    a sync that does not trust (a full pass) writes it again.  A next hop with another MAC than
    the one known is read and written at once, trusted or not."""
    from routesync.apply.routes import RouteApplier
    from tests.routesync.apply.helpers import ns_sh

    with node("fb-tn3") as n, RouteApplier(netns=n.ns) as routes:
        ns_sh(n.ns, "ip", "link", "add", "up0", "type", "veth", "peer", "name", "up1")
        ns_sh(n.ns, "ip", "addr", "add", "192.168.9.2/24", "dev", "up0")
        ns_sh(n.ns, "ip", "link", "set", "up0", "up")
        ns_sh(n.ns, "ip", "link", "set", "up1", "up")
        ns_sh(n.ns, "ip", "route", "add", "172.16.0.0/12", "via", "192.168.9.1")
        ns_sh(n.ns, "ip", "neigh", "replace", "192.168.9.1", "lladdr", "02:00:00:00:09:01", "dev", "up0",
              "nud", "permanent")
        ctl = f"{n.ovs.run_dir}/ovs-vswitchd.ctl"
        tn = TunnelNeighbors(routes, run_dir=n.ovs.run_dir, bridge="br-int")
        tn._target = lambda pid=None: ctl  # type: ignore[method-assign]  # OvsInstance's socket name

        def cache() -> dict[str, str]:
            return parse_show(_appctl(ctl, "tnl/neigh/show").stdout, "br-int")

        assert tn.sync(["172.16.0.5"], trust_known=True) == [("192.168.9.1", "02:00:00:00:09:01")]
        assert cache() == {"192.168.9.1": "02:00:00:00:09:01"}
        assert _appctl(ctl, "tnl/neigh/flush").returncode == 0
        assert tn.sync(["172.16.0.6"], trust_known=True) == []
        assert cache() == {}  # not read, so not repaired
        assert tn.sync(["172.16.0.5", "172.16.0.6"]) == [("192.168.9.1", "02:00:00:00:09:01")]
        assert cache() == {"192.168.9.1": "02:00:00:00:09:01"}
        ns_sh(n.ns, "ip", "neigh", "replace", "192.168.9.1", "lladdr", "02:00:00:00:09:09", "dev", "up0",
              "nud", "permanent")
        assert tn.sync(["172.16.0.7"], trust_known=True) == [("192.168.9.1", "02:00:00:00:09:09")]
        assert cache() == {"192.168.9.1": "02:00:00:00:09:09"}
