"""The verb tests' Node: ``node`` (tests.support.podnode)."""

from tests.support.podnode import node  # noqa: F401 - a fixture
