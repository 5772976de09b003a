"""What a well-formed call produces: VERSION, results per version, handler errors, request contents."""

from __future__ import annotations

import io
import json
from typing import Any

from cni.spec import errors, protocol
from cni.spec.errors import CniError
from cni.spec.protocol import NEWEST, SUPPORTED_VERSIONS
from cni.spec.result import SUPPORTED_VERSIONS as RESULT_VERSIONS
from cni.spec.result import decode
from tests.cni.spec.helpers import sample_result

ENV = {"CNI_CONTAINERID": "fp-c0ffee", "CNI_NETNS": "/var/run/netns/fp-none", "CNI_IFNAME": "eth0",
       "CNI_PATH": "/opt/cni/bin:/usr/lib/cni::"}


def conf(version: str = "1.0.0", **extra: Any) -> bytes:
    return json.dumps({"cniVersion": version, "name": "fp-net", "type": "ferry", **extra}).encode()


def test_supported_versions_declared_once_in_effect() -> None:
    assert SUPPORTED_VERSIONS == RESULT_VERSIONS


def test_version_without_config(run_inproc: Any, run_ferry: Any) -> None:
    for outcome in (run_inproc({"CNI_COMMAND": "VERSION"}, b""), run_ferry({"CNI_COMMAND": "VERSION"}, b"")):
        assert outcome.rc == 0
        assert outcome.doc() == {"cniVersion": "1.1.0",
                                 "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}


def test_version_answers_in_the_config_version(run_inproc: Any, run_ferry: Any) -> None:
    for v in SUPPORTED_VERSIONS:
        assert run_inproc({"CNI_COMMAND": "VERSION"}, conf(v)).doc()["cniVersion"] == v
    assert run_ferry({"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"0.4.0"}').doc()["cniVersion"] == "0.4.0"
    # a version we do not speak, or no usable config at all: the newest
    for stdin in (conf("0.2.0"), b"garbage", b"[]", b'{"cniVersion": 4}'):
        outcome = run_inproc({"CNI_COMMAND": "VERSION"}, stdin)
        assert outcome.rc == 0 and outcome.doc()["cniVersion"] == NEWEST


def test_add_prints_the_result_in_the_config_version(run_inproc: Any) -> None:
    for v in SUPPORTED_VERSIONS:
        outcome = run_inproc(dict(ENV, CNI_COMMAND="ADD"), conf(v))
        assert outcome.rc == 0
        doc = outcome.doc()
        assert doc == sample_result().encode(v)
        assert doc["cniVersion"] == v
        tagged = all("version" in ip for ip in doc["ips"])
        assert tagged == (v < "1.0.0"), doc
        assert ("mtu" in doc["interfaces"][0]) == (v == "1.1.0"), doc


def test_request_carries_env_and_config(run_inproc: Any) -> None:
    env = dict(ENV, CNI_COMMAND="ADD", CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAME=web-0;K8S_POD_UID=a=b;")
    outcome = run_inproc(env, conf("1.1.0", bridge="br-fp"))
    assert outcome.rc == 0
    (req,) = outcome.calls
    assert (req.command, req.cni_version, req.container_id, req.netns, req.ifname) == \
        ("ADD", "1.1.0", "fp-c0ffee", "/var/run/netns/fp-none", "eth0")
    assert req.args == {"IgnoreUnknown": "1", "K8S_POD_NAME": "web-0", "K8S_POD_UID": "a=b"}
    assert req.path == ["/opt/cni/bin", "/usr/lib/cni"]
    assert req.config["bridge"] == "br-fp" and req.prev_result is None


def test_prev_result_round_trips_from_add_to_check(run_inproc: Any) -> None:
    """What ADD printed, handed back as prevResult (as libcni does), reaches CHECK/DEL decoded."""
    for v in ("0.4.0", "1.0.0", "1.1.0"):
        printed = run_inproc(dict(ENV, CNI_COMMAND="ADD"), conf(v)).doc()
        for cmd in ("CHECK", "DEL"):
            outcome = run_inproc(dict(ENV, CNI_COMMAND=cmd), conf(v, prevResult=printed))
            assert outcome.rc == 0 and outcome.stdout == b""
            (req,) = outcome.calls
            expected = sample_result()
            if v != "1.1.0":
                expected.interfaces[0].mtu = 0  # older versions have no interface mtu
            assert req.prev_result == expected


def test_del_check_status_gc_print_nothing(run_inproc: Any) -> None:
    gc = conf("1.1.0", **{"cni.dev/valid-attachments": [{"containerID": "fp-a", "ifname": "eth0"}]})
    for cmd, env, stdin in (("DEL", dict(ENV), conf()), ("CHECK", dict(ENV), conf()),
                            ("STATUS", {}, conf("1.1.0")), ("GC", {"CNI_PATH": "/opt/cni/bin"}, gc)):
        outcome = run_inproc(dict(env, CNI_COMMAND=cmd), stdin)
        assert (outcome.rc, outcome.stdout) == (0, b""), cmd
        assert [r.command for r in outcome.calls] == [cmd]


def test_del_without_netns_is_fine(run_inproc: Any) -> None:
    env = {k: v for k, v in ENV.items() if k != "CNI_NETNS"}
    outcome = run_inproc(dict(env, CNI_COMMAND="DEL"), conf())
    assert outcome.rc == 0 and outcome.calls[0].netns == ""


def test_gc_attachments_normalised(run_inproc: Any) -> None:
    keep = [{"containerID": "fp-a", "ifname": "eth0", "extra": 1}]
    for key in ("cni.dev/valid-attachments", "cni.dev/attachments"):  # libcni sends both spellings
        outcome = run_inproc({"CNI_COMMAND": "GC", "CNI_PATH": "/x"}, conf("1.1.0", **{key: keep}))
        assert outcome.rc == 0
        assert outcome.calls[0].config["cni.dev/valid-attachments"] == [{"containerID": "fp-a", "ifname": "eth0"}]
    outcome = run_inproc({"CNI_COMMAND": "GC", "CNI_PATH": "/x"},
                         conf("1.1.0", **{"cni.dev/valid-attachments": None}))
    assert outcome.rc == 0 and outcome.calls[0].config["cni.dev/valid-attachments"] == []


def test_handler_cni_error_is_printed_as_is(run_inproc: Any) -> None:
    outcome = run_inproc(dict(ENV, CNI_COMMAND="ADD"), conf("0.4.0"),
                         fail=CniError(errors.TRY_AGAIN_LATER, "node state not written yet", "later"))
    assert outcome.rc == 1
    assert outcome.doc() == {"cniVersion": "0.4.0", "code": 11, "msg": "node state not written yet",
                             "details": "later"}


def test_handler_crash_is_code_100_one_line_and_traceback_only_in_log(run_inproc: Any, log_file: str) -> None:
    outcome = run_inproc(dict(ENV, CNI_COMMAND="CHECK"), conf("1.1.0"),
                         fail=KeyError("missing\nsecond line"))
    assert outcome.rc == 1
    doc = outcome.doc()
    assert doc["code"] == errors.INTERNAL and doc["cniVersion"] == "1.1.0"
    assert doc["msg"].startswith("KeyError:") and "\n" not in doc["msg"]
    assert b"Traceback" not in outcome.stdout
    with open(log_file) as f:
        lines = f.read().splitlines()
    crash = [line for line in lines if "Traceback" in line]
    assert len(crash) == 1 and "CHECK fp-c0ffee" in crash[0] and "helpers.py" in crash[0]


def test_add_without_result_is_an_error(run_inproc: Any) -> None:
    handlers = {"ADD": lambda req: None}
    outcome = run_inproc(dict(ENV, CNI_COMMAND="ADD"), conf(), handlers=handlers)
    assert outcome.rc == 1 and outcome.doc()["code"] == errors.INTERNAL


def test_unimplemented_command_is_an_error(run_inproc: Any) -> None:
    outcome = run_inproc({"CNI_COMMAND": "STATUS"}, conf("1.1.0"), handlers={})
    assert outcome.rc == 1 and "STATUS" in outcome.doc()["msg"]


def test_unwritable_stdout_is_a_failure_not_a_crash(log_file: str) -> None:
    class Closed(io.BytesIO):
        def write(self, b: Any) -> int:
            raise BrokenPipeError("stdout closed")

    err = io.StringIO()
    rc = protocol.run({}, {"CNI_COMMAND": "VERSION"}, b"", Closed(), err, log_file=log_file)
    assert rc == 1 and "cannot write the answer" in err.getvalue()


def test_parse_request_is_usable_alone() -> None:
    req = protocol.parse_request(dict(ENV, CNI_COMMAND="CHECK"), conf("0.4.0"))
    assert (req.command, req.cni_version, req.ifname) == ("CHECK", "0.4.0", "eth0")
    assert protocol.parse_request({"CNI_COMMAND": "VERSION"}, b"").cni_version == NEWEST


def test_prev_result_decoding_uses_the_shared_decoder() -> None:
    doc = sample_result().encode("0.3.1")
    req = protocol.parse_request(dict(ENV, CNI_COMMAND="DEL"), conf("0.3.1", prevResult=doc))
    assert req.prev_result == decode(doc)
