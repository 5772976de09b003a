"""cni.lean.typecheck's flag is typing's at run time (False), and taking it imports no typing."""

from __future__ import annotations

import subprocess
import sys
import typing

from cni.lean import typecheck
from tests.support.paths import REPO


def test_the_flag_is_typings_at_run_time() -> None:
    assert typecheck.TYPE_CHECKING is typing.TYPE_CHECKING is False


def test_taking_it_imports_no_typing() -> None:
    code = ("import sys; from cni.lean.typecheck import TYPE_CHECKING; "
            "print(TYPE_CHECKING, 'typing' in sys.modules)")
    out = subprocess.run([sys.executable, "-E", "-s", "-S", "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["False", "False"]
