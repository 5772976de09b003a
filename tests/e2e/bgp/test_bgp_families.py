"""``ferry-lab demo -f lab/topologies/bgp.yaml --family 4|6``: single-stack labs whose router
learns the Pod CIDRs over BGP.  IPv6-only: the Nodes peer with the router over IPv6 and take
their router IDs from the lab (a router ID is an IPv4 address and they have none)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lab.api import Lab
from tests.e2e.bgp.helpers import BGP_TOPOLOGY, all_learned, lab_name, learned
from tests.support.labs import can_run

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.mark.parametrize("family", ["4", "6"])
def test_single_stack_demo(family: str) -> None:
    reason = can_run()
    if reason:
        pytest.skip(reason)
    name = lab_name()
    ferry_lab = os.path.join(os.path.dirname(sys.executable), "ferry-lab")
    try:
        cp = subprocess.run([ferry_lab, "demo", "-f", BGP_TOPOLOGY, "--family", family, "--name", name],
                            check=False, capture_output=True, text=True, timeout=600)
        assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
        assert "15/15 probes passed" in cp.stdout, cp.stdout[-3000:]
        lab = Lab.attach(name)
        assert all_learned(lab)
        fam = int(family)
        assert {(":" in dst) for dst in learned(lab)} == {fam == 6}
        if fam == 6:
            st = lab.node("node-3").exec(["cat", os.path.join(os.path.dirname(lab.node("node-3").paths.state_file),
                                                               "bgp", "status.json")], check=True).stdout
            assert '"router_id": "10.255.0.3"' in st and '"address": "fd00:88::1"' in st, st
    finally:
        subprocess.run([ferry_lab, "down", "--name", name], check=False, capture_output=True, timeout=120)
