"""noEncap across subnets with the router learning every Pod CIDR over BGP (issue 16), end to end.

The lab is ``lab/topologies/bgp.yaml``: FRR's bgpd on the router (dynamic neighbours per segment),
route-sync + ExaBGP on every Node, a 3 s hold time, nothing static on the router.  What is
observed: the router's kernel table (routes zebra installed, ``proto bgp``), pings and TCP
across the router, route-sync's status file, log and metrics.  Times are printed (the numbers of
the issue's note), never asserted: they depend on the machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from lab import build, check, ovs
from lab.api import Lab, Node, Pod
from lab.topology import node_addresses
from routesync.bgp import status as bgp_status
from tests.e2e.bgp.helpers import all_learned, bgp_topology, learned
from tests.support.waiting import elapsed_until, until

pytestmark = [pytest.mark.root, pytest.mark.slow]
FAMILIES = (4, 6)


@pytest.fixture(scope="module")
def bgp_lab(bgp_lab_of) -> Lab:  # type: ignore[no-untyped-def]
    lab = bgp_lab_of(bgp_topology())
    until(lambda: all_learned(lab), "the router to learn every Node's Pod CIDRs over BGP")
    return lab


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0")]
    except OSError:
        return []


def status_of(node: Node) -> bgp_status.BgpStatus | None:
    return bgp_status.read(os.path.join(os.path.dirname(node.paths.state_file), "bgp"))


def established(node: Node) -> bool:
    st = status_of(node)
    return st is not None and all(p.state == "established" and p.advertised for p in st.peers)


def has_routes(lab: Lab, node: str) -> bool:
    have = learned(lab)
    return all(c in have for c in lab.node(node).spec.pod_cidrs)


def has_none(lab: Lab, node: str) -> bool:
    have = learned(lab)
    return not any(c in have for c in lab.node(node).spec.pod_cidrs)


def reaches(lab: Lab, src: Pod, dst: Pod) -> bool:
    return all(lab.ping(src, dst.address(f) or "", count=1, timeout=1) for f in FAMILIES)


def unreachable(lab: Lab, src: Pod, dst: Pod) -> bool:
    return not any(lab.ping(src, dst.address(f) or "", count=1, timeout=1) for f in FAMILIES)


def test_matrix_passes_with_only_bgp_routes_on_the_router(bgp_lab: Lab) -> None:
    lab = bgp_lab
    rows = check.run(lab)
    failed = [r for r in rows if r.configured and not r.ok]
    print(check.table(lab, rows))
    assert not failed, check.table(lab, rows)
    assert {"other-subnet", "same-subnet", "pod-to-external"} <= {r.spec.category for r in rows if r.configured}
    assert {r.spec.family for r in rows if r.spec.category == "other-subnet"} == {4, 6}
    # the router's kernel table: each Node's Pod CIDRs, via that Node, installed by zebra from BGP
    have = learned(lab)
    for n in lab.nodes:
        v4, v6 = node_addresses(lab.topology, n.spec)
        for cidr in n.spec.pod_cidrs:
            r = have[cidr]
            assert r["protocol"] == "bgp" and r["via"] == (v6 if ":" in cidr else v4), r
    # and nothing else leads to a Pod CIDR: no static ("boot") route on the router
    for fam in ("-4", "-6"):
        routes = json.loads(lab.router.exec(["ip", "-j", fam, "route", "show"], check=True).stdout)
        assert not [r for r in routes if r.get("protocol") not in ("kernel", "bgp")], routes


def test_show_reports_sessions(bgp_lab: Lab) -> None:
    lab = bgp_lab
    n1 = lab.node("node-1")
    cmd = str(build.route_sync_command())
    cp = n1.exec([cmd, "show", "--config", n1.paths.route_sync_config], check=True)
    row = next(line.split() for line in cp.stdout.splitlines() if line.startswith("192.168.77.1 "))
    assert row[:4] == ["192.168.77.1", "65000", "192.168.77.11", "established"], cp.stdout
    assert row[5] == "10.244.1.0/24,fd00:10:244:1::/64", cp.stdout
    cp = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ferry-lab"), "show", "--name", lab.name],
                        capture_output=True, text=True, check=True)
    assert "bgp neighbour 192.168.88.13 AS 64512: Established, received IPv4 1, IPv6 1" in cp.stdout, cp.stdout
    assert "bgp peer 192.168.88.1 AS 65000: established, advertised 10.244.3.0/24, fd00:10:244:3::/64" in cp.stdout


def test_sigkill_withdraws_and_restart_restores(bgp_lab: Lab) -> None:
    """route-sync SIGKILLed: ExaBGP dies with it (PR_SET_PDEATHSIG), the kernel closes the TCP
    session, FRR withdraws at once (before the 3 s hold time); traffic from the other subnet stops.
    Restarted: the routes and the traffic come back."""
    lab = bgp_lab
    a, c = lab.pod("node-1", "a"), lab.pod("node-3", "a")
    assert reaches(lab, a, c)
    t0 = time.monotonic()
    lab.kill_route_sync("node-3", signal.SIGKILL)
    until(lambda: has_none(lab, "node-3"), "node-3's Pod CIDRs to leave the router", step=0.005)
    gone = time.monotonic() - t0
    assert unreachable(lab, a, c)
    assert not [p for p in build.pids_in([lab.node("node-3").netns]) if "exabgp" in " ".join(cmdline(p))]
    t1 = time.monotonic()
    lab.start_route_sync("node-3")
    until(lambda: has_routes(lab, "node-3"), "node-3's Pod CIDRs back on the router", step=0.005)
    back = time.monotonic() - t1
    until(lambda: reaches(lab, a, c), "node-1's Pod to reach node-3's again")
    print(f"SIGKILL -> withdrawn on the router {gone * 1e3:.0f} ms; restart -> routes back {back * 1e3:.0f} ms, "
          f"-> cross-subnet ping (both families) {(time.monotonic() - t1) * 1e3:.0f} ms")


def test_silent_node_withdrawn_by_the_hold_timer(bgp_lab: Lab) -> None:
    """A Node that stops answering without closing its session (ExaBGP frozen: SIGSTOP) is
    withdrawn when the router's hold timer (3 s) expires; thawed, it comes back by itself."""
    lab = bgp_lab
    n2 = lab.node("node-2")
    until(lambda: established(n2), "node-2's session up")
    st = status_of(n2)
    assert st is not None and st.speaker_pid
    ups = st.peers[0].established_count
    os.kill(st.speaker_pid, signal.SIGSTOP)
    try:
        gone = elapsed_until(lambda: has_none(lab, "node-2"), "node-2's Pod CIDRs to leave the router")
    finally:
        os.kill(st.speaker_pid, signal.SIGCONT)
    back = elapsed_until(lambda: has_routes(lab, "node-2"), "node-2's Pod CIDRs back")
    after = until(lambda: (s := status_of(n2)) and s.peers[0].established_count > ups and s, "node-2 up again")
    print(f"silent Node (ExaBGP stopped) -> withdrawn after {gone:.2f} s (hold time 3 s); "
          f"thawed -> back in {back:.2f} s; last error: {after.peers[0].last_error}")
    assert after.peers[0].last_error


def test_node_leaves_the_registry_and_rejoins(bgp_lab: Lab) -> None:
    """node-3 leaves (route-sync stopped, its registry record removed): its prefixes leave the
    router and the other Nodes forget it.  It joins again: its Pods are reachable from the
    other subnet."""
    lab = bgp_lab
    n1, n3 = lab.node("node-1"), lab.node("node-3")
    a, c = lab.pod("node-1", "a"), lab.pod("node-3", "a")
    record = os.path.join(lab.dir, "registry", "node-3.yaml")
    t0 = time.monotonic()
    lab.kill_route_sync("node-3", signal.SIGTERM)  # graceful: withdraw, then Cease
    stopped = time.monotonic() - t0
    os.unlink(record)
    until(lambda: has_none(lab, "node-3"), "node-3's Pod CIDRs to leave the router", step=0.005)
    total = time.monotonic() - t0
    until(lambda: not any(p["name"] == "node-3" for p in (n1.state() or {}).get("peers", [])),
          "node-1 to forget node-3")
    assert unreachable(lab, a, c)
    t1 = time.monotonic()
    lab.start_route_sync("node-3")  # publishes its record again, advertises its Pod CIDRs
    until(lambda: os.path.exists(record), "node-3's record back")
    until(lambda: has_routes(lab, "node-3"), "node-3's Pod CIDRs on the router", step=0.005)
    routed = time.monotonic() - t1
    until(lambda: reaches(lab, a, c), "node-1's Pod to reach node-3's (both families)")
    join = time.monotonic() - t1
    print(f"leave (SIGTERM, record removed) -> prefixes off the router within {total * 1e3:.0f} ms (route-sync "
          f"exited after {stopped * 1e3:.0f} ms); join (route-sync started) -> its Pod CIDRs on the router "
          f"{routed * 1e3:.0f} ms -> first cross-subnet ping, both families {join * 1e3:.0f} ms")
    assert established(n3) or until(lambda: established(n3), "node-3's session up")


def test_exabgp_killed_is_restarted(bgp_lab: Lab) -> None:
    """ExaBGP dies under a live route-sync: route-sync logs it, starts it again (after its
    backoff) and announces everything again; the router learns node-1's Pod CIDRs back."""
    lab = bgp_lab
    n1 = lab.node("node-1")
    until(lambda: established(n1), "node-1's session up")
    st = status_of(n1)
    assert st is not None and st.speaker_pid
    t0 = time.monotonic()
    os.kill(st.speaker_pid, signal.SIGKILL)
    until(lambda: has_none(lab, "node-1"), "node-1's Pod CIDRs withdrawn (its session closed)")
    after = until(lambda: (s := status_of(n1)) and s.speaker_restarts > st.speaker_restarts
                  and s.speaker_pid not in (None, st.speaker_pid) and s, "a new ExaBGP")
    until(lambda: has_routes(lab, "node-1"), "node-1's Pod CIDRs back on the router")
    print(f"ExaBGP SIGKILLed -> routes back in {(time.monotonic() - t0) * 1e3:.0f} ms (restart backoff 1 s)")
    assert lab.route_sync_pid("node-1") is not None
    with open(n1.paths.route_sync_log) as f:
        assert any("ExaBGP exited" in line for line in f)
    assert after.speaker == "running"


def test_pod_cidr_change_is_advertised(bgp_lab: Lab) -> None:
    """node-2's record gets another IPv4 Pod CIDR (what a controller assigning CIDRs does): its
    route-sync withdraws the old prefix and announces the new one; restored, the old one is back
    and node-3's Pod reaches node-2's again."""
    from routesync.model import NodeRecord
    from routesync.sources.registry import render_record, write_atomic
    from tests.e2e.fastpath.helpers import read_record, registry_path

    lab = bgp_lab
    old = read_record(lab, "node-2")
    v4 = next(c for c in old.pod_cidrs if ":" not in c)
    moved = "10.244.102.0/24"
    cidrs = tuple(moved if c == v4 else c for c in old.pod_cidrs)
    t0 = time.monotonic()
    write_atomic(registry_path(lab, "node-2"), render_record(NodeRecord(old.name, old.transport_addresses, cidrs,
                                                                        old.annotations)))
    until(lambda: moved in learned(lab) and v4 not in learned(lab), f"the router to learn {moved} instead of {v4}")
    took = time.monotonic() - t0
    assert learned(lab)[moved]["via"] == lab.node("node-2").ipv4
    write_atomic(registry_path(lab, "node-2"), render_record(old))
    until(lambda: v4 in learned(lab) and moved not in learned(lab), f"{v4} back on the router")
    until(lambda: reaches(lab, lab.pod("node-3", "a"), lab.pod("node-2", "a")), "node-3's Pod to reach node-2's")
    print(f"Pod CIDR changed in the record -> the router routes the new one in {took * 1e3:.0f} ms")


def _metrics(node: Node, port: int) -> str:
    code = (f"import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics', timeout=5)"
            ".read().decode())")
    cp = node.exec([sys.executable, "-c", code])
    return cp.stdout if cp.returncode == 0 else ""


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.split()[-1])
    return 0.0


def test_faults_are_log_lines_and_metrics(bgp_lab: Lab) -> None:
    """route-sync on node-3 with three bad peers: the router with the wrong local AS (FRR refuses
    the session: NOTIFICATION bad peer AS), the external host (nothing listens: the connection is
    refused) and an address nobody holds (no answer at all).  Each is a log line naming the peer
    and a metric; route-sync keeps running and retrying, its health stays fine, nothing of node-3
    reaches the router."""
    lab = bgp_lab
    n3 = lab.node("node-3")
    lab.kill_route_sync("node-3", signal.SIGTERM)
    until(lambda: has_none(lab, "node-3"), "node-3's Pod CIDRs to leave the router")
    with open(n3.paths.route_sync_config) as f:
        doc = yaml.safe_load(f)
    refusing, silent = lab.external.address(4), "192.168.88.200"
    doc["bgp"]["localASN"] = 64999
    doc["bgp"]["peers"] += [{"address": refusing, "asn": 65099, "holdTime": 3},
                            {"address": silent, "asn": 65098, "holdTime": 3}]
    doc["logFile"] = os.path.join(n3.paths.log, "route-sync-faults.log")
    path = os.path.join(n3.paths.root, "route-sync-faults.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(doc, f)
    port = 19469
    proc = subprocess.Popen(["ip", "netns", "exec", n3.netns, str(build.route_sync_command()), "run", "--config", path,
                             "--metrics-port", str(port), "--metrics-host", "127.0.0.1"],
                            env=ovs.env(n3.paths), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    lab.manifest.record("pid", pid=proc.pid, netns=n3.netns, what="route-sync node-3 faults")
    try:
        def logged(peer: str, words: str) -> str | None:
            try:
                with open(doc["logFile"]) as f:
                    return next((line for line in f if f"BGP peer {peer} " in line and words in line), None)
            except OSError:
                return None

        lines = [until(lambda: logged("192.168.88.1", "bad peer AS"), "the log line about the bad peer AS"),
                 until(lambda: logged(refusing, "no session"), "the log line about the refusing peer"),
                 until(lambda: logged(silent, "no session"), "the log line about the silent peer")]
        print("".join(line.split(": ", 1)[1] for line in lines).rstrip())
        assert "bgp.localASN" in lines[0]

        def counted() -> str | None:
            t = _metrics(n3, port)
            errors = "ferry_route_sync_bgp_session_errors_total"
            ok = (_metric(t, errors, peer="192.168.88.1", reason="bad-peer-as") >= 1
                  and _metric(t, errors, peer=refusing, reason="connect-failed") >= 1
                  and _metric(t, errors, peer=silent, reason="connect-failed") >= 1)
            return t if ok else None

        text = until(counted, "the bad-peer-as and connect-failed metrics")
        for peer in ("192.168.88.1", refusing, silent):
            assert _metric(text, "ferry_route_sync_bgp_session_established", peer=peer) == 0
        st = status_of(n3)
        assert st is not None and all(p.state != "established" and p.last_error for p in st.peers), st
        assert "bad peer AS" in (st.peers[0].last_error or "")
        assert proc.poll() is None  # still running, still retrying
        code = f"import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:{port}/healthz').status)"
        health = n3.exec([sys.executable, "-c", code])
        assert health.stdout.strip() == "200", health.stdout + health.stderr
        assert has_none(lab, "node-3")
    finally:
        proc.terminate()
        proc.wait(30)
    lab.start_route_sync("node-3")
    until(lambda: has_routes(lab, "node-3"), "node-3 back with the right AS")


# ------------------------------------------------------------------ the fast path over BGP's routes
@pytest.fixture(scope="module")
def fast_bgp_lab(bgp_lab_of) -> Lab:  # type: ignore[no-untyped-def]
    from tests.e2e.fastpath.helpers import settled

    lab = bgp_lab_of(bgp_topology(fastPath=True, macSource="annotation"))
    until(lambda: all_learned(lab), "the router to learn every Node's Pod CIDRs over BGP")
    until(lambda: all(settled(n, [m.name for m in lab.nodes if m.name != n.name]) for n in lab.nodes),
          "every Node off the gateway fallback to every peer")
    return lab


@pytest.mark.parametrize("family", FAMILIES)
def test_fast_path_across_subnets(fast_bgp_lab: Lab, family: int) -> None:
    """Cross-subnet Pod traffic leaves OVS straight to the router's MAC (the fast path), never
    crossing ferry-gw0 or the Node's stack, and the router forwards it by its BGP routes."""
    from tests.e2e.fastpath.helpers import state_peers, traffic

    lab = fast_bgp_lab
    router_mac = json.loads(lab.router.exec(["ip", "-j", "link", "show", "eth-a"], check=True).stdout)[0]["address"]
    peer = state_peers(lab.node("node-1"))[("node-3", family)]
    assert peer["path"] == "fast" and peer["mac"] == router_mac, peer
    assert learned(lab)[lab.node("node-3").spec.pod_cidrs[family == 6]]["protocol"] == "bgp"
    a, c = lab.pod("node-1", "a"), lab.pod("node-3", "a")
    nodes = (lab.node("node-1"), lab.node("node-3"))
    for s, d in ((a, c), (c, a)):
        counts = traffic(lab, s, d, family, nodes)
        for n in nodes:
            assert counts[n.name].gw_ovs <= 10 and counts[n.name].host_uplink <= 10, counts
            assert counts[n.name].uplink_ovs >= 40, counts


# ------------------------------------------------------------------ graceful restart
def stale(lab: Lab, prefix: str) -> bool | None:
    """Whether the router holds ``prefix`` as a stale path (None: it holds no path)."""
    from lab import frr

    out = json.loads(frr.vtysh(lab.dir, lab.router.netns, f"show bgp {'ipv6' if ':' in prefix else 'ipv4'} "
                                                          f"unicast {prefix} json") or "{}")
    paths = out.get("paths") or []
    return None if not paths else any(p.get("stale") for p in paths)


def test_graceful_restart_keeps_forwarding(bgp_lab_of) -> None:  # type: ignore[no-untyped-def]
    """bgp.gracefulRestart: route-sync SIGKILLed, the router keeps node-3's routes as stale
    (ExaBGP died without a NOTIFICATION) and Pods in the other subnet keep reaching node-3's
    Pods; restarted, the routes are refreshed (no longer stale)."""
    from tests.support.liveping import LivePing

    lab = bgp_lab_of(bgp_topology({"gracefulRestart": 60}))
    until(lambda: all_learned(lab), "the router to learn every Node's Pod CIDRs over BGP")
    a, c = lab.pod("node-1", "a"), lab.pod("node-3", "a")
    v4 = lab.node("node-3").spec.pod_cidrs[0]
    with LivePing(a.netns, c.ipv4 or "") as ping:
        ping.more_replies(5, "before the kill")
        lab.kill_route_sync("node-3", signal.SIGKILL)
        killed = time.time()
        until(lambda: stale(lab, v4), "the router to mark node-3's route stale")
        assert ping.reply_after(time.time()), "no reply while node-3's route-sync was down"
        assert has_routes(lab, "node-3")
        lab.start_route_sync("node-3")
        until(lambda: stale(lab, v4) is False, "node-3's route refreshed after the restart")
        ping.more_replies(5, "after the restart")
        result = ping.stop()
    print(f"graceful restart: SIGKILL at {killed:.2f}, restart; longest gap between replies {result.gap * 1e3:.0f} ms "
          f"(20 ms interval), {result.lost} of {result.transmitted} lost")
    assert has_routes(lab, "node-3")

