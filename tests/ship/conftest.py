"""Fixtures for shipping tests: the frozen bundle (built once, cached by a hash of its sources),
a CNI bin dir as a host has it, and a one-Node setup from tests/support/podnode.py.

Names this area creates start with "sp8" (namespaces, OVS dirs, labs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.ship.helpers import (
    build_bundle,
)


@pytest.fixture(scope="session")
def bundle() -> Path:
    b, took = build_bundle()
    if took:
        print(f"\nPyInstaller build: {took:.1f} s -> {b}", file=sys.stderr)
    return b
