"""Fixtures shared with tests/hostile: one fx- Node with a private OVS, driven by the real plugin."""

from tests.hostile.conftest import fx_node  # noqa: F401 - fixtures
