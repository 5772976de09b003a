"""Fixtures for the plugin's layer tests (kernel, OVS clients, ...): private OVS instances and
namespaces, all named fs-* (tests.support.names)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from tests.support.names import uniq
from tests.support.ovs_instance import OvsInstance, netns


@pytest.fixture
def make_netns() -> Iterator[Callable[[str], str]]:
    """Factory: ``make_netns("pod")`` → name of a fresh namespace, deleted after the test."""
    with ExitStack() as stack:
        yield lambda stem: stack.enter_context(netns(uniq(stem)))


@pytest.fixture
def ns(make_netns: Callable[[str], str]) -> str:
    return make_netns("ns")


@pytest.fixture
def ovs(make_netns: Callable[[str], str]) -> Iterator[OvsInstance]:
    """A private OVS whose vswitchd runs in its own namespace (``ovs.netns``): ports it opens
    (veths, taps of internal ports) live there."""
    with OvsInstance(uniq("ovs"), netns=make_netns("node")) as instance:
        yield instance
