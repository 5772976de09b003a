"""Where the repository is, for tests that exec its files or read its tree (one definition, so a
test that moves between folders cannot point at the wrong directory)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUPPORT = Path(__file__).resolve().parent
