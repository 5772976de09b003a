"""Fixtures for the system-layer tests: private OVS instances and namespaces, all named fs-*."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from tests.ovs_instance import OvsInstance, netns

PREFIX = "fs-"


def uniq(stem: str) -> str:
    """``fs-<stem><4 hex>``, at most 15 bytes (an interface name)."""
    name = f"{PREFIX}{stem}{secrets.token_hex(2)}"
    assert len(name) <= 15, name
    return name


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

