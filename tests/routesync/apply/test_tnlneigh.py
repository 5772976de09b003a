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


def test_a_change_trusts_the_entries_it_set_for_a_bounded_time_and_never_reads_the_cache() -> None:
    """Endpoints behind one router: a full sync reads OVS's cache and sets the router's entry; a
    change's new endpoint behind the same router (same MAC) trusts that set, so an entry flushed
    behind route-sync's back stays gone (proof nothing read the cache), until the trust runs out
    (the clock moved past ``trust_for``: set again without a read) or a full sync repairs it.  A
    next hop with another MAC than the one set is set at once; another ovs-vswitchd trusts
    nothing."""
    from routesync.apply.routes import RouteApplier
    from routesync.apply.tnlneigh import OVS_DEFAULT_AGING, TRUST_MOST
    from tests.routesync.apply.helpers import ns_sh

    now = [1000.0]
    with node("fb-tn3") as n, RouteApplier(netns=n.ns) as routes:
        ns_sh(n.ns, "ip", "link", "add", "up0", "type", "veth", "peer", "name", "up1")
        ns_sh(n.ns, "ip", "addr", "add", "192.168.9.2/24", "dev", "up0")
        ns_sh(n.ns, "ip", "link", "set", "up0", "up")
        ns_sh(n.ns, "ip", "link", "set", "up1", "up")
        ns_sh(n.ns, "ip", "route", "add", "172.16.0.0/12", "via", "192.168.9.1")
        ns_sh(n.ns, "ip", "neigh", "replace", "192.168.9.1", "lladdr", "02:00:00:00:09:01", "dev", "up0",
              "nud", "permanent")
        ctl = f"{n.ovs.run_dir}/ovs-vswitchd.ctl"
        tn = TunnelNeighbors(routes, run_dir=n.ovs.run_dir, bridge="br-int", clock=lambda: now[0])
        tn._target = lambda: ctl  # type: ignore[method-assign]  # OvsInstance's socket name
        pid = tn._pid()
        router = ("192.168.9.1", "02:00:00:00:09:01")

        def cache() -> dict[str, str]:
            return parse_show(_appctl(ctl, "tnl/neigh/show").stdout, "br-int")

        def flush() -> None:
            assert _appctl(ctl, "tnl/neigh/flush").returncode == 0
            assert cache() == {}

        assert tn.trust_for(pid) == min(TRUST_MOST, OVS_DEFAULT_AGING / 3)  # OVS 3.1: no tnl/neigh/aging
        assert tn.sync(["172.16.0.5"]) == [router]
        assert cache() == dict([router])
        flush()
        assert tn.sync(["172.16.0.6"], trust_written=True) == []
        assert cache() == {}  # trusted: not read, so not repaired
        now[0] += tn.trust_for(pid)
        assert tn.sync(["172.16.0.7"], trust_written=True) == [router]  # the trust ran out: set again
        assert cache() == dict([router])
        flush()
        assert tn.sync(["172.16.0.5", "172.16.0.6"]) == [router]  # a full sync reads and repairs
        assert cache() == dict([router])
        ns_sh(n.ns, "ip", "neigh", "replace", "192.168.9.1", "lladdr", "02:00:00:00:09:09", "dev", "up0",
              "nud", "permanent")
        assert tn.sync(["172.16.0.8"], trust_written=True) == [("192.168.9.1", "02:00:00:00:09:09")]
        assert cache() == {"192.168.9.1": "02:00:00:00:09:09"}
        flush()
        tn._pid = lambda: pid + 1  # type: ignore[method-assign]  # ovs-vswitchd restarted
        assert tn.sync(["172.16.0.9"], trust_written=True) == [("192.168.9.1", "02:00:00:00:09:09")]
        assert cache() == {"192.168.9.1": "02:00:00:00:09:09"}
