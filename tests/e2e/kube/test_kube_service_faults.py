"""Service traffic across restarts of what carries it (issue 26): kube-proxy, ovs-vswitchd (its
flows and its userspace conntrack die with it) and route-sync on the client's Node, each while a
TCP stream runs from a Pod on node-1 through a ClusterIP to a backend on node-2.

For each event: the stream must survive on the same connection (TCP loses no bytes; a reset or
a reconnect fails the test), and a new connection through the Service must work again. Printed per
event: the stream's longest stall and how long after the event the first new connection worked
(`pytest -s`; the issue's goal is 5 s, a figure reported, not asserted: it depends on the machine)."""

from __future__ import annotations

import time

import pytest

from lab.api import ECHO_PORT, Lab
from lab.kube import services as svc
from tests.e2e.kube.helpers import restart, topology
from tests.support.liveping import LiveTcp
from tests.support.waiting import HANG

pytestmark = [pytest.mark.root, pytest.mark.slow]

STREAM_PORT = 7800
CHUNK = 1 << 20  # bytes the stream must carry before and after each event


# kube-proxy's iptables mode here: its nftables mode, run the same way, gave the same figures (the
# Service checks themselves run in both: test_kube_services, test_kube_modes); one cluster less for CI.
@pytest.mark.parametrize("proxy", ("iptables",))
def test_service_connections_across_restarts(kube_lab_of, proxy: str) -> None:  # type: ignore[no-untyped-def]
    topo = topology({"trafficEncapMode": "encap", "tunnelType": "vxlan"})
    topo["kubernetes"]["kubeProxy"] = proxy
    lab: Lab = kube_lab_of(topo)
    cluster = lab.kube()
    client = lab.add_pod("node-1", "client")
    server = lab.add_pod("node-2", "srv")
    svc.backend(lab, server, "faults")
    echo_ip = svc.create(cluster, svc.service("faults", ECHO_PORT), 1).cluster_ips[0]
    stream_ip = svc.create(cluster, svc.service("stream", STREAM_PORT, selects="faults"), 1).cluster_ips[0]
    assert svc.until(lambda: lab.connect(client, echo_ip, 80)).ok
    server_ip = next(a.split("/")[0] for a in server.ips if ":" not in a)
    report = []
    for event in ("kube-proxy", "ovs-vswitchd", "route-sync"):
        with LiveTcp(server.netns, server_ip, client.netns, STREAM_PORT, via=(stream_ip, 80)) as stream:
            stream.more_bytes(CHUNK, f"before the {event} restart")
            t0 = time.monotonic()
            restart(lab, event, "node-1")
            first = svc.until(lambda: lab.connect(client, echo_ip, 80, timeout=1.0), timeout=HANG)
            new_after = time.monotonic() - t0
            assert first.ok, f"after the {event} restart, no new connection through the Service: {first.detail}"
            stream.more_bytes(CHUNK, f"after the {event} restart")
            stall = stream.longest_stall(since=t0 - 1.0)
            carried = stream.stop()  # fails unless the one connection carried it all
        report.append(f"{proxy} {event}: stream survived ({carried} bytes), longest stall {stall:.2f} s; "
                      f"new connection {new_after:.2f} s after the restart began")
    print("\n" + "\n".join(report))
