"""cni.lean.typecheck's flag is typing's at run time (False), and taking it imports no typing."""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path

from cni.lean import typecheck

ROOT = str(Path(__file__).resolve().parents[3])


def test_the_flag_is_typings_at_run_time() -> None:
    assert typecheck.TYPE_CHECKING is typing.TYPE_CHECKING is False


def test_taking_it_imports_no_typing() -> None:
    code = (f"import sys; sys.path.insert(0, {ROOT!r}); from cni.lean.typecheck import TYPE_CHECKING; "
            "print(TYPE_CHECKING, 'typing' in sys.modules)")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
