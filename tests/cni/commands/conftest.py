"""The verb tests' Node: ``node`` (tests.support.podnode)."""

from tests.cni.commands.inprocess import lone_node, make_pod  # noqa: F401 - fixtures of the in-process verb tests
from tests.support.podnode import node  # noqa: F401 - a fixture
