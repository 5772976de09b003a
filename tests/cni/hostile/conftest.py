"""The hostile-input tests' Node: ``fx_node`` (tests.support.podnode), Pods under the ``fx-`` prefix
that the plugin is exec'd for directly."""

from tests.support.podnode import fx_node  # noqa: F401 - a fixture
