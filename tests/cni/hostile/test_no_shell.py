"""No code path of Ferry can hand a string to a shell: no shell=True, os.system, os.popen, or
subprocess.getoutput/getstatusoutput anywhere in the code base (tests included)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO

ROOT = REPO
AREAS = ("cni", "routesync", "lab", "bench", "tests", "deploy")
SHELL_CALLS = {("os", "system"), ("os", "popen"), ("subprocess", "getoutput"), ("subprocess", "getstatusoutput"),
               ("os", "execl"), ("os", "spawnl")}


def _sources() -> list[Path]:
    return [p for a in AREAS if (ROOT / a).is_dir() for p in (ROOT / a).rglob("*.py")
            if ".venv" not in p.parts and "build" not in p.parts]


def shell_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for each call that would start a shell."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                found.append((node.lineno, "shell=" + ast.unparse(kw.value)))
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (f.value.id, f.attr) in SHELL_CALLS:
            found.append((node.lineno, f"{f.value.id}.{f.attr}"))
    return found


def test_the_checker_finds_each_form() -> None:
    src = ("import os, subprocess\nsubprocess.run('x', shell=True)\nos.system('x')\nos.popen('x')\n"
           "subprocess.getoutput('x')\nsubprocess.call('x', shell=flag)\nsubprocess.run(['x'], shell=False)\n")
    assert [w for _, w in shell_uses(src)] == ["shell=True", "os.system", "os.popen", "subprocess.getoutput",
                                                "shell=flag"]


def test_no_shell_anywhere() -> None:
    files = _sources()
    assert len(files) > 50
    bad = [f"{p.relative_to(ROOT)}:{line}: {what}" for p in files for line, what in shell_uses(p.read_text())]
    assert bad == []


def test_no_shell_text_either() -> None:
    """The same by plain text, for code the AST walk might miss (e.g. strings handed to exec)."""
    me = Path(__file__).resolve()
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in _sources() if p.resolve() != me
           for i, line in enumerate(p.read_text().splitlines(), 1)
           if any(t in line for t in ("shell=True", "os.system(", "os.popen("))]
    assert bad == []
