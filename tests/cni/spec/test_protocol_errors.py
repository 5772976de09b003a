"""Every error reachable from bad input: code, message naming the culprit, one JSON document.

Each case runs in-process (fast) and, unless it needs something a real environment cannot carry
(a NUL byte), through the real ``ferry`` launcher as a subprocess."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from cni.spec import errors
from cni.spec.protocol import NEWEST

ATTACH_ENV = {"CNI_CONTAINERID": "fp-c0ffee", "CNI_NETNS": "/var/run/netns/fp-none",
              "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin"}
BASE_CONF = {"cniVersion": "1.0.0", "name": "fp-net", "type": "ferry"}
GC_CONF = {"cniVersion": "1.1.0", "name": "fp-net", "type": "ferry",
           "cni.dev/valid-attachments": [{"containerID": "fp-keep", "ifname": "eth0"}]}
DROP = object()  # marks a key to remove


@dataclass
class Case:
    id: str
    command: str | None
    code: int
    names: str  # must appear in msg (or details)
    env: dict[str, Any] = field(default_factory=dict)
    conf: dict[str, Any] | None = None  # overrides on the base conf; None = base conf
    stdin: bytes | None = None  # raw stdin instead of a conf
    base: dict[str, Any] | None = None
    subprocess: bool = True
    error_version: str | None = None  # expected cniVersion of the error (default: the conf's)


def build(case: Case, log_file: str) -> tuple[dict[str, str], bytes, str]:
    env: dict[str, str] = {}
    if case.command is not None:
        env["CNI_COMMAND"] = case.command
    base = case.base if case.base is not None else (GC_CONF if case.command == "GC" else BASE_CONF)
    if case.command in ("ADD", "CHECK", "DEL"):
        env.update(ATTACH_ENV)
        if case.command == "DEL":
            env.pop("CNI_NETNS")
    elif case.command in ("GC",):
        env["CNI_PATH"] = "/opt/cni/bin"
    for k, v in case.env.items():
        if v is DROP:
            env.pop(k, None)
        else:
            env[k] = v
    if case.stdin is not None:
        return env, case.stdin, case.error_version or NEWEST
    conf = dict(base, logFile=log_file)
    for k, v in (case.conf or {}).items():
        if v is DROP:
            conf.pop(k, None)
        else:
            conf[k] = v
    version = conf.get("cniVersion")
    expected = case.error_version or (version if isinstance(version, str) and version.count(".") == 2
                                      and all(p.isdigit() for p in version.split(".")) else NEWEST)
    return env, json.dumps(conf).encode(), expected


CASES: list[Case] = []
# Each variable the spec requires, per command, missing (and empty, which the spec treats alike).
for cmd, required in {"ADD": ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"],
                      "CHECK": ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"],
                      "DEL": ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
                      "GC": ["CNI_PATH"]}.items():
    for var in required:
        CASES.append(Case(f"{cmd}-missing-{var}", cmd, errors.INVALID_ENV, var, env={var: DROP}))
    CASES.append(Case(f"{cmd}-empty-{required[-1]}", cmd, errors.INVALID_ENV, required[-1],
                      env={required[-1]: ""}, subprocess=False))
CASES += [
    Case("no-command", None, errors.INVALID_ENV, "CNI_COMMAND"),
    Case("unknown-command", "FROB", errors.INVALID_ENV, "CNI_COMMAND"),
    Case("lowercase-command", "add", errors.INVALID_ENV, "CNI_COMMAND", env=ATTACH_ENV),
    # stdin that is not a config
    Case("empty-stdin", "ADD", errors.DECODE_FAILURE, "configuration", stdin=b""),
    Case("malformed-json", "ADD", errors.DECODE_FAILURE, "malformed", stdin=b'{"cniVersion": "1.0.0",'),
    Case("json-array", "ADD", errors.DECODE_FAILURE, "JSON object", stdin=b'[{"cniVersion": "1.0.0"}]'),
    Case("json-string", "DEL", errors.DECODE_FAILURE, "JSON object", stdin=b'"ferry"'),
    Case("not-utf8", "ADD", errors.DECODE_FAILURE, "malformed", stdin=b'{"name": "\xff\xfe"}'),
    Case("too-deep", "CHECK", errors.DECODE_FAILURE, "malformed", stdin=b"[" * 100_000),
    # the three fields every config has
    Case("missing-cniVersion", "ADD", errors.INVALID_CONFIG, "cniVersion", conf={"cniVersion": DROP}),
    Case("missing-name", "ADD", errors.INVALID_CONFIG, "name", conf={"name": DROP}),
    Case("missing-type", "DEL", errors.INVALID_CONFIG, "type", conf={"type": DROP}),
    Case("cniVersion-number", "ADD", errors.INVALID_CONFIG, "cniVersion", conf={"cniVersion": 1.0}),
    Case("name-list", "ADD", errors.INVALID_CONFIG, "name", conf={"name": ["fp-net"]}),
    Case("name-empty", "CHECK", errors.INVALID_CONFIG, "name", conf={"name": ""}),
    Case("name-bad-chars", "ADD", errors.INVALID_CONFIG, "name", conf={"name": "fp net!"}),
    Case("type-null", "ADD", errors.INVALID_CONFIG, "type", conf={"type": None}),
    # versions
    Case("version-0.2.0", "ADD", errors.INCOMPATIBLE_VERSION, "cniVersion", conf={"cniVersion": "0.2.0"}),
    Case("version-9.9.9", "DEL", errors.INCOMPATIBLE_VERSION, "cniVersion", conf={"cniVersion": "9.9.9"}),
    Case("version-not-semver", "ADD", errors.INCOMPATIBLE_VERSION, "cniVersion", conf={"cniVersion": "1.0"}),
    Case("check-before-0.4.0", "CHECK", errors.INCOMPATIBLE_VERSION, "CHECK", conf={"cniVersion": "0.3.1"}),
    Case("status-before-1.1.0", "STATUS", errors.INCOMPATIBLE_VERSION, "STATUS", conf={"cniVersion": "1.0.0"}),
    Case("gc-before-1.1.0", "GC", errors.INCOMPATIBLE_VERSION, "GC", conf={"cniVersion": "0.4.0"}),
    # container ID, interface name, netns path
    Case("cid-leading-dash", "ADD", errors.INVALID_ENV, "CNI_CONTAINERID", env={"CNI_CONTAINERID": "-abc"}),
    Case("cid-space", "DEL", errors.INVALID_ENV, "CNI_CONTAINERID", env={"CNI_CONTAINERID": "a b"}),
    Case("cid-slash", "CHECK", errors.INVALID_ENV, "CNI_CONTAINERID", env={"CNI_CONTAINERID": "../etc"}),
    Case("cid-non-ascii", "ADD", errors.INVALID_ENV, "CNI_CONTAINERID", env={"CNI_CONTAINERID": "c\u00e4fe"}),
    Case("ifname-colon", "ADD", errors.INVALID_ENV, "CNI_IFNAME", env={"CNI_IFNAME": "eth0:1"}),
    Case("ifname-slash", "DEL", errors.INVALID_ENV, "CNI_IFNAME", env={"CNI_IFNAME": "a/b"}),
    Case("ifname-dot", "ADD", errors.INVALID_ENV, "CNI_IFNAME", env={"CNI_IFNAME": "."}),
    Case("ifname-dotdot", "CHECK", errors.INVALID_ENV, "CNI_IFNAME", env={"CNI_IFNAME": ".."}),
    Case("ifname-16-bytes", "ADD", errors.INVALID_ENV, "CNI_IFNAME", env={"CNI_IFNAME": "x" * 16}),
    Case("ifname-16-utf8-bytes", "ADD", errors.INVALID_ENV, "CNI_IFNAME", env={"CNI_IFNAME": "\u00e9" * 8}),
    Case("ifname-space", "ADD", errors.INVALID_ENV, "CNI_IFNAME", env={"CNI_IFNAME": "eth 0"}),
    Case("ifname-tab", "DEL", errors.INVALID_ENV, "CNI_IFNAME", env={"CNI_IFNAME": "eth\t0"}),
    Case("netns-relative", "ADD", errors.INVALID_ENV, "CNI_NETNS", env={"CNI_NETNS": "var/run/netns/x"}),
    Case("netns-relative-del", "DEL", errors.INVALID_ENV, "CNI_NETNS", env={"CNI_NETNS": "netns"}),
    Case("netns-nul", "ADD", errors.INVALID_ENV, "CNI_NETNS", env={"CNI_NETNS": "/var/run/netns/a\0b"},
         subprocess=False),
    # CNI_ARGS
    Case("args-no-equals", "ADD", errors.INVALID_ENV, "CNI_ARGS", env={"CNI_ARGS": "FOO"}),
    Case("args-empty-key", "DEL", errors.INVALID_ENV, "CNI_ARGS", env={"CNI_ARGS": "=bar"}),
    Case("args-second-bad", "ADD", errors.INVALID_ENV, "CNI_ARGS",
         env={"CNI_ARGS": "K8S_POD_NAME=p;K8S_POD_NAMESPACE"}),
    # prevResult
    Case("prevresult-bad-ip", "CHECK", errors.DECODE_FAILURE, "prevResult",
         conf={"prevResult": {"ips": [{"address": "not-an-ip"}]}}),
    Case("prevresult-not-object", "DEL", errors.DECODE_FAILURE, "prevResult", conf={"prevResult": [1]}),
    Case("prevresult-chained-add", "ADD", errors.DECODE_FAILURE, "prevResult",
         conf={"prevResult": {"interfaces": [{"mac": "x"}]}}),
    # GC's list of attachments to keep
    Case("gc-no-attachments", "GC", errors.INVALID_CONFIG, "cni.dev/valid-attachments",
         conf={"cni.dev/valid-attachments": DROP}),
    Case("gc-attachments-not-list", "GC", errors.INVALID_CONFIG, "cni.dev/valid-attachments",
         conf={"cni.dev/valid-attachments": {"containerID": "a", "ifname": "eth0"}}),
    Case("gc-attachment-not-object", "GC", errors.INVALID_CONFIG, "cni.dev/valid-attachments[0]",
         conf={"cni.dev/valid-attachments": ["a/eth0"]}),
    Case("gc-attachment-bad-cid", "GC", errors.INVALID_CONFIG, "containerID",
         conf={"cni.dev/valid-attachments": [{"containerID": "-x", "ifname": "eth0"}]}),
    Case("gc-attachment-no-ifname", "GC", errors.INVALID_CONFIG, "ifname",
         conf={"cni.dev/valid-attachments": [{"containerID": "fp-a"}]}),
]


def check_error(outcome: Any, case: Case, expected_version: str) -> None:
    assert outcome.rc == 1, (outcome.rc, outcome.stdout)
    doc = outcome.doc()
    assert set(doc) == {"cniVersion", "code", "msg", "details"}, doc
    assert doc["code"] == case.code, doc
    assert case.names in doc["msg"] + " " + doc["details"], doc
    assert doc["cniVersion"] == expected_version, doc
    assert "Traceback" not in outcome.stdout.decode()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_error_in_process(case: Case, run_inproc: Any, log_file: str) -> None:
    env, stdin, version = build(case, log_file)
    outcome = run_inproc(env, stdin)
    check_error(outcome, case, version)
    assert outcome.calls == [], "a handler ran despite bad input"


SUBPROCESS_CASES = [c for c in CASES if c.subprocess]


@pytest.mark.parametrize("case", SUBPROCESS_CASES, ids=[c.id for c in SUBPROCESS_CASES])
def test_error_through_real_plugin(case: Case, run_ferry: Any, log_file: str) -> None:
    env, stdin, version = build(case, log_file)
    check_error(run_ferry(env, stdin), case, version)


def test_every_code_path_is_covered() -> None:
    """The table reaches every input-error code the core can give."""
    assert {c.code for c in CASES} == {errors.INVALID_ENV, errors.DECODE_FAILURE, errors.INVALID_CONFIG,
                                       errors.INCOMPATIBLE_VERSION}
    for cmd in ("ADD", "CHECK", "DEL", "GC"):
        assert any(c.command == cmd and "missing" in c.id for c in CASES)
