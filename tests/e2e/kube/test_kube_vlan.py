"""A tagged underlay (issue 29) on a real Kubernetes cluster, noEncap: Ferry's DaemonSet gets
``transportVLAN: 100`` through its ConfigMap, the Nodes' switch ports turn into strict trunks of VLAN
100 once each Node tags (the lab's watcher), and then the connectivity matrix passes while tcpdump
on every Node's switch port sees only frames tagged with VID 100 (ARP and ND included), none
untagged: the kubelets' and kube-proxy's own traffic to the API server crosses the same trunks."""

from __future__ import annotations

import pytest

from lab import check
from lab.api import Lab
from tests.e2e.kube.helpers import topology
from tests.e2e.vlan.helpers import VLAN, Capture, flush_neighbours, tagged, trunk_ports, uplink_state
from tests.support.waiting import until

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_matrix_on_a_tagged_underlay(kube_lab_of) -> None:  # type: ignore[no-untyped-def]
    lab: Lab = kube_lab_of(tagged(topology({"trafficEncapMode": "noEncap"}, route_pod_cidrs=True)))
    for n in lab.nodes:  # route-sync in the DaemonSet moved the uplink onto the bridge and tags
        until(lambda n=n: (uplink_state(lab, n.name) or {}).get("vlan") == VLAN, f"{n.name} to tag")
    for node, pod in (("node-1", "a"), ("node-2", "a"), ("node-3", "a")):
        lab.add_pod(node, pod)
    with Capture(lab, trunk_ports(lab)) as cap:
        flush_neighbours(lab)
        rows = check.run(lab)
        cap.settle(lab)
        frames = cap.stop()
    failed = [r for r in rows if r.configured and not r.ok]
    assert not failed, check.table(lab, rows)
    summary = {}
    for (seg, port), f in frames.items():
        summary[port] = (f.total, dict(f.tagged))
        assert f.total > 0, f"nothing crossed {seg}/{port}"
        assert not f.untagged, f"untagged frames on {seg}/{port}: {f.untagged} {f.untagged_sample}"
        assert f.vids == {VLAN}, f"{seg}/{port} saw VLANs {f.vids}"
    print(f"\nKubernetes, noEncap, VLAN {VLAN}: {len(rows)} probes; per trunk port (frames, by (VID, type)): {summary}")
