"""The chaos tests run on the hostile-input tests' Node (``fx_node``, tests.support.podnode)."""

from tests.support.podnode import fx_node  # noqa: F401 - a fixture
