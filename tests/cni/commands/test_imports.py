"""Each verb loads only its own module: an ADD pays for no DEL, CHECK, STATUS or GC code (nor
``chained`` on a plain Node), and nothing outside the standard library."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import REPO

VERBS = ("cni.commands.add", "cni.commands.delete", "cni.commands.check", "cni.commands.status",
         "cni.commands.gc")
HEAVY = ("typing", "enum", "re", "dataclasses", "json", "logging", "hashlib", "subprocess", "ipaddress")


@pytest.mark.parametrize("verb", VERBS)
def test_a_verb_imports_no_other_verb(verb: str) -> None:
    code = (f"import sys; import {verb}; "
            "print(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-E", "-s", "-S", "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True)
    loaded = set(out.stdout.split())
    assert verb in loaded
    assert loaded & set(VERBS) == {verb}
    assert "cni.commands.chained" not in loaded  # networkPolicyOnly imports it when it runs
    assert loaded & set(HEAVY) == set()
