"""cni.lean.spawn runs argv without a shell, feeds stdin, separates stdout/stderr, enforces a timeout."""

from __future__ import annotations

import pytest

from cni.lean import spawn
from tests.support.paths import REPO


def test_stdin_stdout_stderr_and_exit_code():
    code, out, err = spawn.run(["sh", "-c", "cat; echo oops >&2; exit 3"], b"hello\n" * 20000)
    assert (code, out, err) == (3, b"hello\n" * 20000, b"oops\n")


def test_no_shell_interprets_arguments():
    code, out, _ = spawn.run(["echo", "$(id)", ";", "rm -rf /"])
    assert code == 0 and out == b"$(id) ; rm -rf /\n"


def test_missing_program_is_an_oserror():
    with pytest.raises(OSError):
        spawn.run(["/nonexistent/ferry-test-binary"])


def test_timeout_kills_the_child():
    with pytest.raises(spawn.SpawnError, match="did not finish"):
        spawn.run(["sleep", "5"], timeout=0.2)


def test_signal_death_is_a_negative_code():
    code, _, _ = spawn.run(["sh", "-c", "kill -9 $$"])
    assert code == -9


EQUIVALENCE_CASES = [
    (["sh", "-c", "cat; echo oops >&2; exit 3"], b"hello\n" * 20000),  # more than a pipe buffer each way
    (["echo", "$(id)", ";", "rm -rf /"], b""),  # no shell between argv and the program
    (["sh", "-c", "printf 'a\\0b'; exit 0"], b""),  # binary output
    (["sh", "-c", "head -c 3; exit 7"], b"abcdef"),  # the child stops reading early
    (["sh", "-c", "kill -9 $$"], b""),  # killed by a signal: a negative code
    (["true"], b""),
]


@pytest.mark.parametrize(("argv", "stdin"), EQUIVALENCE_CASES, ids=lambda v: repr(v)[:30])
def test_outcome_equals_subprocess_run(argv, stdin):
    """The equivalence test named in cni.lean.spawn's docstring: (exit code, stdout, stderr) as
    ``subprocess.run`` gives them, and OSError for a program that cannot start, as it raises."""
    import subprocess

    want = subprocess.run(argv, input=stdin, capture_output=True, check=False, timeout=10)
    assert spawn.run(argv, stdin, timeout=10) == (want.returncode, want.stdout, want.stderr)


def test_a_missing_program_raises_like_subprocess():
    import subprocess

    with pytest.raises(OSError) as theirs:
        subprocess.run(["/nonexistent/ferry-test-binary"], check=False)
    with pytest.raises(OSError) as ours:
        spawn.run(["/nonexistent/ferry-test-binary"])
    assert ours.value.errno == theirs.value.errno


def test_plugin_path_imports_stay_lean():
    """The per-Pod modules must not drag in subprocess, socket.py, re, contextlib, json or enum."""
    import subprocess
    import sys

    from cni.launcher import PER_POD_MODULES

    code = (f"import sys; import {', '.join(PER_POD_MODULES)}; "
            "print(' '.join(sorted(m for m in ('re','subprocess','socket','enum','contextlib','threading',"
            "'signal','json','typing','dataclasses','logging','hashlib','ipaddress','collections','array',"
            "'ctypes') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-EsS", "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
