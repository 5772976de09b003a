"""Fixtures for the BGP tests: ferry-lab clusters whose router learns the Pod CIDRs over BGP
(``lab/topologies/bgp.yaml``: noEncap, FRR on the router, route-sync + ExaBGP on every Node),
one per configuration (module scope), names starting with "tg" (this area's prefix; bench_dataplane
has "tb"), torn down even when a test fails."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator

import pytest

from lab import frr
from lab.api import Lab
from tests.e2e.bgp.helpers import PODS, lab_name
from tests.support.labs import can_run


@pytest.fixture(scope="module")
def bgp_lab_of(cni_bin: str) -> Iterator[Callable[[dict], Lab]]:
    labs: list[Lab] = []

    def make(topo: dict) -> Lab:
        reason = can_run() or (None if shutil.which(frr.DAEMONS[0], path=frr.FRR_DIR) else "frr not installed")
        if reason:
            pytest.skip(reason)
        lab = Lab.up(topo, name=lab_name(), cni_bin=cni_bin)
        labs.append(lab)
        for node, pod in PODS:
            lab.add_pod(node, pod)
        return lab

    yield make
    for lab in labs:
        lab.down()
