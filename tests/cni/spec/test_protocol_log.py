"""The plugin log: where lines go, what they carry, and that a broken log never breaks a call."""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
from typing import Any

from cni.spec import protocol
from cni.spec.log import open_log
from tests.cni.spec.helpers import recording_handlers
from tests.support.paths import REPO

ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "fp-log1", "CNI_NETNS": "/var/run/netns/fp-none",
       "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin"}


def conf(**extra: Any) -> bytes:
    return json.dumps({"cniVersion": "1.0.0", "name": "fp-net", "type": "ferry", **extra}).encode()


def test_one_line_per_event_with_command_and_container(tmp_path: Any) -> None:
    path = tmp_path / "sub" / "cni.log"  # the directory is created
    out, err = io.BytesIO(), io.StringIO()
    assert protocol.run(recording_handlers([]), ENV, conf(logFile=str(path)), out, err) == 0
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and all(" ADD fp-log1 " in line for line in lines), lines
    assert "INFO" in lines[0] and "done" in lines[1] and "10.244.1.5/24" in lines[1]
    assert err.getvalue() == ""  # info stays out of the runtime's stderr
    assert json.loads(out.getvalue())["cniVersion"] == "1.0.0"  # and stdout holds only the result


def test_errors_reach_stderr_too(tmp_path: Any) -> None:
    path = tmp_path / "cni.log"
    err = io.StringIO()
    rc = protocol.run(recording_handlers([]), dict(ENV, CNI_IFNAME="a:b"), conf(logFile=str(path)),
                      io.BytesIO(), err)
    assert rc == 1
    assert "ERROR ADD fp-log1" in err.getvalue() and "CNI_IFNAME" in err.getvalue()
    assert "CNI_IFNAME" in path.read_text()


def test_log_level_debug_and_bad_values(tmp_path: Any) -> None:
    path = tmp_path / "cni.log"
    out = io.BytesIO()
    protocol.run({}, {"CNI_COMMAND": "VERSION"}, conf(logFile=str(path), logLevel="DEBUG"), out, io.StringIO())
    assert "DEBUG VERSION" in path.read_text()
    err = io.StringIO()
    log = open_log({"logFile": str(path), "logLevel": "loud"}, err)
    assert log.level == 20 and "logLevel" in err.getvalue()


def test_unopenable_log_file_falls_back_to_stderr(tmp_path: Any) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad = str(blocker / "cni.log")  # a path under a regular file cannot be created
    out, err = io.BytesIO(), io.StringIO()
    rc = protocol.run(recording_handlers([]), dict(ENV, CNI_ARGS="x"), conf(logFile=bad), out, err)
    assert rc == 1 and json.loads(out.getvalue())["code"] == 4  # the call itself is unaffected
    assert "cannot write log file" in err.getvalue() and "CNI_ARGS" in err.getvalue()


def test_handlers_log_through_the_request_into_the_plugin_log(tmp_path: Any) -> None:
    path = tmp_path / "cni.log"

    def add(req: Any) -> Any:
        req.logger().warning("veth fp1234 created")
        from tests.cni.spec.helpers import sample_result

        return sample_result()

    err = io.StringIO()
    protocol.run({"ADD": add}, ENV, conf(logFile=str(path)), io.BytesIO(), err)
    assert "WARNING ADD fp-log1 veth fp1234 created" in path.read_text()
    assert err.getvalue().count("veth fp1234 created") == 1


def test_gc_stdlib_logging_lands_in_the_plugin_log(tmp_path: Any) -> None:
    """IPAM's GC reports through stdlib logging (a rare path): forwarded once, nothing left behind."""
    import logging

    path = tmp_path / "cni.log"

    def gc(req: Any) -> None:
        logging.getLogger("ferry").warning("released %s", "fp1234")

    err = io.StringIO()
    gc_conf = json.loads(conf(logFile=str(path)))
    gc_conf.update(cniVersion="1.1.0", **{"cni.dev/valid-attachments": []})
    env = dict(ENV, CNI_COMMAND="GC")
    protocol.run({"GC": gc}, env, json.dumps(gc_conf).encode(), io.BytesIO(), err)
    assert "WARNING GC" in path.read_text() and "released fp1234" in path.read_text()
    assert err.getvalue().count("released fp1234") == 1  # once, not again via logging's lastResort
    assert logging.getLogger("ferry").handlers == []


def test_plugin_stdout_is_only_the_answer_even_when_logging_to_stderr(cni_bin: str, tmp_path: Any) -> None:
    env = {"PATH": "/usr/bin:/bin", **ENV, "CNI_IFNAME": "bad/name"}
    p = subprocess.run([os.path.join(cni_bin, "ferry")], input=conf(logFile=str(tmp_path / "l")),
                       capture_output=True, env=env, timeout=30, check=False)
    assert p.returncode == 1
    assert json.loads(p.stdout)["code"] == 4 and p.stdout.count(b"\n") == 1
    assert b"CNI_IFNAME" in p.stderr


VERB_MODULES = ("cni.commands.add", "cni.commands.delete", "cni.commands.check", "cni.commands.status",
                "cni.commands.gc", "cni.commands.steps")


def test_version_and_input_errors_import_little(cni_bin: str) -> None:
    """VERSION needs the C JSON scanner and the log only (not even ``json``/``re``); input errors add
    the shared contracts, never a verb's module."""
    probe = ("import sys; import io, os; from cni import plugin; "
             "sys.stdin = io.TextIOWrapper(io.BytesIO({stdin!r})); "
             "code = plugin.main(); print(sorted(m for m in sys.modules), file=sys.stderr)")

    def modules(env: dict[str, str], stdin: bytes) -> set[str]:
        p = subprocess.run([sys.executable, "-E", "-s", "-S", "-c", probe.format(stdin=stdin)],
                           cwd=REPO, capture_output=True, env={"PATH": "/usr/bin:/bin", **env}, timeout=30, check=False)
        return set(ast.literal_eval(p.stderr.decode().strip().splitlines()[-1]))

    version = modules({"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"1.0.0"}')
    assert "cni.lean.fastjson" in version
    for heavy in ("json", "re", *VERB_MODULES, "cni.spec.result", "cni.spec.request", "dataclasses", "ipaddress",
                  "logging", "typing"):
        assert heavy not in version, heavy
    error = modules(dict(ENV, CNI_IFNAME="a/b"), conf(logFile="/dev/null"))
    assert "cni.spec.errors" in error
    for heavy in (*VERB_MODULES, "cni.spec.request", "cni.spec.result", "ipaddress", "logging", "typing"):
        assert heavy not in error, heavy
