"""Whatever arrives on stdin and in the environment, the answer is one valid CNI document (or nothing
for a successful non-ADD command) and the exit code agrees with it."""

from __future__ import annotations

import io
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni.spec import protocol
from cni.spec.protocol import SUPPORTED_VERSIONS
from tests.cni.spec.helpers import recording_handlers

COMMANDS = ["ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC"]

GOOD = {"CNI_CONTAINERID": "fp-c0ffee", "CNI_NETNS": "/var/run/netns/fp-x", "CNI_IFNAME": "eth0",
        "CNI_ARGS": "K8S_POD_NAME=a;IgnoreUnknown=1", "CNI_PATH": "/opt/cni/bin"}
ABSENT = object()

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=10))
json_any = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                           st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                        max_leaves=10)


def mostly(good: Any, bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The good value 9 times in 10 (so runs get past validation), else absent or ``bad``."""
    return st.integers(0, 19).flatmap(lambda n: st.just(good) if n < 18 else st.just(ABSENT) if n == 18 else bad)


@st.composite
def environ(draw: Any) -> dict[str, str]:
    env = {"CNI_COMMAND": draw(mostly(draw(st.sampled_from(COMMANDS)), st.text(max_size=8)))}
    env.update({k: draw(mostly(v, st.text(max_size=20))) for k, v in GOOD.items()})
    return {k: v for k, v in env.items() if v is not ABSENT}


@st.composite
def config(draw: Any) -> dict[str, Any]:
    conf = {
        "cniVersion": draw(mostly(draw(st.sampled_from(SUPPORTED_VERSIONS)),
                                  st.one_of(st.sampled_from(["0.2.0", "2.0.0", "1.0", ""]), json_any))),
        "name": draw(mostly("fp-net", json_any)),
        "type": draw(mostly("ferry", json_any)),
        "cni.dev/valid-attachments": draw(mostly([{"containerID": "fp-a", "ifname": "eth0"}], json_any)),
        "prevResult": draw(st.sampled_from([ABSENT, ABSENT, ABSENT, {"ips": [{"address": "10.0.0.2/24"}]}])
                           | json_any),
        "extra": draw(st.one_of(st.just(ABSENT), json_any)),
    }
    return {k: v for k, v in conf.items() if v is not ABSENT}


stdin = st.one_of(config().map(lambda c: json.dumps(c).encode()), st.binary(max_size=64),
                  json_any.map(lambda c: json.dumps(c).encode()))


def looks_like_version(v: Any) -> bool:
    return isinstance(v, str) and protocol.version_tuple(v) is not None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(env=environ(), data=stdin)
def test_every_run_is_one_valid_answer(env: dict[str, str], data: bytes, tmp_path: Any) -> None:
    out, err = io.BytesIO(), io.StringIO()
    rc = protocol.run(recording_handlers([]), env, data, out, err, log_file=str(tmp_path / "cni.log"))
    text = out.getvalue().decode("ascii")  # the core writes ASCII JSON only
    if text == "":
        assert rc == 0
        assert env.get("CNI_COMMAND") in ("DEL", "CHECK", "STATUS", "GC")
        return
    assert text.endswith("\n") and text.count("\n") == 1, text
    doc = json.loads(text)
    assert isinstance(doc, dict)
    assert looks_like_version(doc.get("cniVersion")), doc
    if "code" in doc:
        assert rc == 1
        assert set(doc) == {"cniVersion", "code", "msg", "details"}
        assert isinstance(doc["code"], int) and doc["code"] > 0
        assert isinstance(doc["msg"], str) and doc["msg"] and "\n" not in doc["msg"]
        assert isinstance(doc["details"], str)
    else:
        assert rc == 0
        if env.get("CNI_COMMAND") == "VERSION":
            assert doc["supportedVersions"] == list(SUPPORTED_VERSIONS)
        else:
            assert env.get("CNI_COMMAND") == "ADD"
            assert doc["cniVersion"] in SUPPORTED_VERSIONS and "ips" in doc
