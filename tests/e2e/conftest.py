"""The end-to-end suites' fixture: ``lab_of``, one ferry-lab cluster with route-sync per traffic mode,
shared by a module's tests (module scope), torn down even when a test fails."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab.api import Lab
from tests.support.labs import start_lab


@pytest.fixture(scope="module")
def lab_of(cni_bin: str) -> Iterator:
    """``lab_of(topology_dict)`` → a running lab with PODS, torn down at module end."""
    labs: list[Lab] = []

    def make(topo: dict) -> Lab:
        lab = start_lab(cni_bin, topo)
        labs.append(lab)
        return lab

    yield make
    for lab in labs:
        lab.down()
