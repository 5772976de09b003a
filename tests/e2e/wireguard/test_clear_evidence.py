"""The wire evidence's control (issue 30): with encryption off, the same capture that must see no
Pod address on an encrypted lab sees them, in every mode, where the mode puts them (outer on a
routed or underlay path, inside VXLAN, Geneve or GRE on a tunnelled one), and tcpdump's own
decoding of the same files sees the same Pod addresses: the evidence can fail, and its reader of
the wire is not the only witness.  So does the DF probe: a Pod whose route promises more than
the tunnel carries black-holes 1500-byte packets, and the probe says so."""

from __future__ import annotations

import os

import pytest

from cni.pipeline.modes import ENCRYPTION_NONE
from lab import check, layout, wireevidence
from lab.wirecapture import WireCapture
from tests.e2e.wireguard.helpers import MODES, Mode, df_ping, route_mtu, settle_clear, start, tcpdump_addresses

pytestmark = pytest.mark.root


@pytest.fixture(scope="module", params=MODES, ids=[m.name for m in MODES])
def clear_lab(request: pytest.FixtureRequest, cni_bin: str):  # type: ignore[no-untyped-def]
    m: Mode = request.param
    lab = start(cni_bin, m, ENCRYPTION_NONE)
    yield m, lab
    lab.down()


def test_clear_pod_traffic_shows_pod_addresses_on_the_wire(clear_lab, tmp_path) -> None:  # type: ignore[no-untyped-def]
    m, lab = clear_lab
    settle_clear(lab, m)
    keep = str(tmp_path / "pcap")
    with WireCapture(lab, keep=keep) as cap:
        rows = check.run(lab)
        ev = cap.evidence()
    failed = [r for r in rows if not r.ok]
    assert rows and not failed, check.table(lab, failed)
    assert not any(ev.dropped.values()), ev.dropped
    pods = {n.spec.name: n.pods() for n in lab.nodes}
    pod_ips = {a for ps in pods.values() for p in ps for a in (p.ipv4, p.ipv6) if a}
    # every Pod that sent across Nodes (the first of each Node) is seen, both families
    senders = {a for ps in pods.values() for a in (ps[0].ipv4, ps[0].ipv6) if a}
    assert senders <= ev.pod_addresses <= pod_ips, ev.report()
    assert ev.inside() == m.clear_inside, ev.report()
    # tcpdump reads the same files alike
    nets = wireevidence.pod_networks(lab.topology)
    for pt in cap.points:
        mine = {s.address for s in ev.sightings if s.point == pt.name}
        theirs = tcpdump_addresses(os.path.join(keep, os.path.basename(cap.file(pt))),
                                   lambda a: any(a.version == n.version and a in n for n in nets))
        assert mine == theirs, f"{m.name} {pt.name}: lab.pcap {sorted(mine)}, tcpdump {sorted(theirs)}"
    print(f"\n{m.name} (clear): {len(rows)} probes ok; {ev.total} frames, Pod addresses "
          f"{len(ev.pod_addresses)} seen ({', '.join(str(i) for i in sorted(ev.inside(), key=str))})")

    if m.name.startswith("encap"):
        _black_hole_control(lab)


def _black_hole_control(lab) -> None:  # type: ignore[no-untyped-def]
    """The DF probe tells a refusal from a black hole: a Pod's route to the cluster at the tunnel
    MTU refuses a 1500-byte DF packet (and one of its size crosses); raised to 1500 the tunnel
    drops it without a word."""
    src, dst = lab.pod("node-1", "a"), lab.pod("node-3", "a")
    assert dst.ipv4 is not None
    mtu = route_mtu(src.netns, dst.ipv4)
    assert mtu is not None and mtu < 1500
    refused = df_ping(src.netns, dst.ipv4, 1500)
    assert (refused.outcome, refused.mtu) == ("refused", mtu), refused
    assert df_ping(src.netns, dst.ipv4, mtu).outcome == "crossed"
    cidr = lab.topology.cluster_cidrs[0]
    gw = layout.gateway_addresses(lab.node("node-1").spec)[0]
    route = ["ip", "route", "change", cidr, "via", gw, "dev", "eth0", "proto", "static", "mtu"]
    src.exec([*route, "1500"], check=True)
    try:
        lost = df_ping(src.netns, dst.ipv4, 1500)
    finally:
        src.exec([*route, str(mtu)], check=True)
    assert lost.black_hole, lost
