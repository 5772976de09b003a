"""Fixtures of the pipeline tests that run on a real bridge."""

from tests.support.podnode import node  # noqa: F401 - a fixture
