"""ovs-vswitchd SIGKILLed under Ferry's supervisor (issue 42): the datapath forwards again with the
flows it had, without waiting for route-sync, and route-sync's pass after the restart changes
nothing that was restored right.

One Node: a network namespace running the real ``ferry-route-sync ovs`` (the supervisor, its
stderr read line by line), route-sync's daemon with its real appliers (in this process, on a
thread, so the test reads what it sent), a registry with this Node's record, and two Pods made by
the real plugin (exec'd as a runtime does).  A 10 ms ping runs from one Pod to the other and a TCP
stream beside it while ovs-vswitchd is SIGKILLed.

Synchronised on events only: the supervisor's log lines (ovs-vswitchd exited, started, flows
restored), replies of the ping, bytes of the stream, route-sync's passes (its reconcile count).
What the restart costs in lost pings depends on how fast a new ovs-vswitchd opens its ports (the
userspace datapath dies with the process); that is printed, not asserted.  What is asserted does
not depend on speed: the ping comes back with route-sync held off (so by the restore alone), the
bridge holds after the restart exactly the flows it held before, ofports included, and route-sync's
pass for the new instance sends no flow-mod and replays no Pod."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from routesync.apply import make_appliers
from routesync.config import load
from routesync.daemon import Daemon
from routesync.sources import make_source
from tests.routesync.openvswitch.test_supervise import Supervised
from tests.support.liveping import LivePing, LiveTcp
from tests.support.names import uniq
from tests.support.ovs_instance import netns
from tests.support.podnode import FxNode
from tests.support.waiting import until

pytestmark = pytest.mark.root


@dataclass
class SupervisedOvs:
    """What tests.support.podnode's Node needs of an OVS instance, for the supervisor's."""

    dir: str

    @property
    def db(self) -> str:
        return f"unix:{self.dir}/db.sock"

    @property
    def run_dir(self) -> str:
        return self.dir

    def ofctl(self, command: str, bridge: str, *args: str) -> str:
        return subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", command, f"unix:{self.dir}/{bridge}.mgmt", *args],
                              capture_output=True, text=True, check=True).stdout


def sh(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True).stdout


@dataclass
class Node:
    ns: str
    supervisor: Supervised
    daemon: Daemon
    thread: threading.Thread
    plugin: FxNode

    def flows(self) -> list[str]:
        """The bridge's flows without counters, sorted (what a restart must give back)."""
        out = self.plugin.ovs.ofctl("dump-flows", "br-int", "--no-names", "--no-stats")  # type: ignore[attr-defined]
        return sorted(line.strip() for line in out.splitlines() if "cookie=" in line)

    def ofports(self) -> dict[str, str]:
        names = self.supervisor.vsctl("list-ports", "br-int").split()
        return {n: self.supervisor.vsctl("get", "interface", n, "ofport").strip() for n in names}


@pytest.fixture
def ovs_node(cni_bin: str, tmp_path: Path) -> Iterator[Node]:
    with ExitStack() as stack:
        ns = stack.enter_context(netns(uniq("ovg")))
        peer = stack.enter_context(netns(uniq("ovq")))
        sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", "up0", "netns", peer)
        for where, dev, address in ((ns, "eth0", "192.168.62.1/24"), (peer, "up0", "192.168.62.2/24")):
            sh("ip", "-n", where, "addr", "add", address, "dev", dev)
            sh("ip", "-n", where, "link", "set", dev, "up")
            sh("ip", "netns", "exec", where, "ethtool", "-K", dev, "tx", "off")
        s = Supervised(ns, tmp_path)
        stack.callback(s.stop)
        s.expect(r"openvswitch: running")

        cfg_path = tmp_path / "route-sync.yaml"
        cfg = yaml.safe_load(cfg_path.read_text())
        cfg.update({"podCIDRs": ["10.244.1.0/24"], "clusterCIDRs": ["10.244.0.0/16"], "datapathType": "netdev",
                    "trafficEncapMode": "encap", "tunnelType": "vxlan", "resyncSeconds": 3600,
                    "nodeSource": {"type": "registry", "registryDir": str(tmp_path / "registry")}})
        cfg_path.write_text(yaml.safe_dump(cfg))
        config = load(str(cfg_path))
        appliers = make_appliers(config, netns=ns)
        daemon = Daemon(config, make_source(config), appliers)
        thread = threading.Thread(target=daemon.run, name="route-sync", daemon=True)
        thread.start()

        def stop_daemon() -> None:
            daemon.stop.set()
            thread.join(60)
            appliers.close()

        stack.callback(stop_daemon)
        until(lambda: os.path.exists(config.state_file) and daemon.reconciles >= 1, "route-sync's first pass")

        plugin = FxNode(name=ns, ovs=SupervisedOvs(str(s.run_dir)), dir=tmp_path / "cni",  # type: ignore[arg-type]
                        cni_bin=cni_bin)
        plugin.direct_pods = []  # type: ignore[attr-defined]
        conf = plugin.plugin_conf()
        conf["stateFile"] = config.state_file
        conf["ipam"] = {"type": "ferry-ipam", "dataDir": str(plugin.ipam_dir)}  # ranges from the state file
        plugin.plugin_conf = lambda: conf  # type: ignore[method-assign]

        def remove_pods() -> None:
            for pod, cid, ifname in plugin.direct_pods:  # type: ignore[attr-defined]
                plugin.direct("DEL", pod.path, cid, ifname=ifname)
                subprocess.run(["ip", "netns", "del", pod.netns], check=False)

        stack.callback(remove_pods)
        yield Node(ns, s, daemon, thread, plugin)


def saved_flows(node: Node) -> list[str]:
    try:
        return list(json.loads((node.supervisor.run_dir / "ferry-saved-flows" / "br-int.flows.json")
                               .read_text())["flows"])
    except (OSError, ValueError, KeyError):
        return []


def test_a_killed_vswitchd_forwards_again_with_its_flows_before_route_sync_acts(ovs_node: Node) -> None:
    n = ovs_node
    a = n.plugin.add_pod_as("a", "c0ffee0a")  # type: ignore[attr-defined]
    b = n.plugin.add_pod_as("b", "c0ffee0b")  # type: ignore[attr-defined]
    with LivePing(a.netns, b.ip(4)) as warm:  # the Pods reach each other: neighbours resolved
        warm.more_replies(3, "before the restart")
        warm.stop()
    before = n.flows()
    ofports = n.ofports()
    # the supervisor's copy holds every flow the switch holds (Pods' included)
    until(lambda: sorted(saved_flows(n)) == before, "the supervisor to save the bridge's flows")

    # route-sync is held: whatever brings the ping back is the supervisor's restore alone
    reconciles = n.daemon.reconciles
    sent = n.daemon.appliers.ovs.flow_mods  # type: ignore[attr-defined]
    hold = threading.Lock()
    hold.acquire()
    inner = n.daemon.appliers.ovs_restoring

    def held() -> bool:
        with hold:
            return bool(inner())

    n.daemon.appliers.ovs_restoring = held  # type: ignore[method-assign]
    try:
        with LivePing(a.netns, b.ip(4), interval=0.01) as ping, LiveTcp(b.netns, b.ip(4), a.netns, 5201) as tcp:
            ping.more_replies(20, "before the kill")
            tcp.more_bytes(1 << 20, "before the kill")
            killed_at, t_kill = time.time(), time.monotonic()
            old = n.supervisor.pid("ovs-vswitchd")
            assert old is not None
            os.kill(old, signal.SIGKILL)
            n.supervisor.expect(r"ovs-vswitchd exited \(-9\)")
            n.supervisor.expect(r"ovs-vswitchd started")
            restored = n.supervisor.expect(r"flows restored on br-int \((\d+) flows.*")
            assert int(restored.group(1)) == len(before)
            assert ping.reply_after(killed_at), "no reply after the restart with route-sync held off"
            ping.more_replies(50, "after the restore")
            tcp.more_bytes(1 << 20, "after the restore")
            assert n.daemon.reconciles == reconciles  # nobody but the supervisor touched the flows
            assert n.flows() == before and n.ofports() == ofports

            hold.release()  # route-sync sees the new instance now
            until(lambda: n.daemon.reconciles > reconciles, "route-sync's pass for the new ovs-vswitchd")
            assert n.daemon.appliers.ovs.flow_mods == sent, "route-sync re-sent restored flows"  # type: ignore[attr-defined]
            assert n.flows() == before
            ping.more_replies(20, "after route-sync's pass")
            result = ping.stop()
            stall = tcp.longest_stall(since=t_kill - 1.0)
            assert tcp.stop() > 0
    finally:
        if hold.locked():
            hold.release()
    print(f"\nvswitchd SIGKILL, 10 ms ping: {result.lost} lost of {result.transmitted}, longest gap "
          f"{result.gap * 1e3:.0f} ms; TCP longest stall {stall * 1e3:.0f} ms; restore: {restored.group(0)}")


def test_the_gap_end_to_end_with_route_sync_running(ovs_node: Node) -> None:
    """As in production: route-sync free to act.  The ping comes back, the bridge holds the flows
    it held, and route-sync's pass for the new instance (after flow-restore-wait is cleared) sends
    no flow-mod.  Prints the figures of docs/design/openvswitch.md ("The gap of an ovs-vswitchd SIGKILL")."""
    n = ovs_node
    a = n.plugin.add_pod_as("a", "c0ffee1a")  # type: ignore[attr-defined]
    b = n.plugin.add_pod_as("b", "c0ffee1b")  # type: ignore[attr-defined]
    with LivePing(a.netns, b.ip(4)) as warm:
        warm.more_replies(3, "before the restart")
        warm.stop()
    before = n.flows()
    until(lambda: sorted(saved_flows(n)) == before, "the supervisor to save the bridge's flows")
    sent = getattr(n.daemon.appliers.ovs, "flow_mods", 0)  # type: ignore[attr-defined]
    instance = n.daemon.appliers.ovs_generation()
    with LivePing(a.netns, b.ip(4), interval=0.01) as ping, LiveTcp(b.netns, b.ip(4), a.netns, 5202) as tcp:
        ping.more_replies(20, "before the kill")
        tcp.more_bytes(1 << 20, "before the kill")
        killed_at, t_kill = time.time(), time.monotonic()
        old = n.supervisor.pid("ovs-vswitchd")
        assert old is not None
        os.kill(old, signal.SIGKILL)
        n.supervisor.expect(r"ovs-vswitchd exited \(-9\)")
        n.supervisor.expect(r"ovs-vswitchd started")
        reconciles = n.daemon.reconciles
        # route-sync's pass for the new instance (it ran once the restore was done)
        until(lambda: n.daemon.appliers.ovs_generation() != instance and n.daemon.reconciles > reconciles,
              "route-sync's pass for the new ovs-vswitchd")
        assert ping.reply_after(killed_at), "no reply after the restart"
        ping.more_replies(50, "after the restart")
        tcp.more_bytes(1 << 20, "after the restart")
        result = ping.stop()
        stall = tcp.longest_stall(since=t_kill - 1.0)
        assert tcp.stop() > 0
    assert n.flows() == before
    assert getattr(n.daemon.appliers.ovs, "flow_mods", 0) == sent, "route-sync re-sent restored flows"  # type: ignore[attr-defined]
    print(f"\nend to end, vswitchd SIGKILL, 10 ms ping: {result.lost} lost of {result.transmitted}, longest gap "
          f"{result.gap * 1e3:.0f} ms; TCP longest stall {stall * 1e3:.0f} ms")
