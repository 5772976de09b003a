"""cni.lean.fastjson agrees with the standard json module, byte for byte and error for error."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni.lean import fastjson
from tests.support.paths import REPO

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
values = st.recursive(scalars, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(values)
def test_dumps_matches_json(value):
    assert fastjson.dumps(value) == json.dumps(value)
    assert fastjson.dumps(value, compact=True) == json.dumps(value, separators=(",", ":"))


@settings(max_examples=300, deadline=None)
@given(values)
def test_loads_round_trips(value):
    text = json.dumps(value, indent=1)
    assert fastjson.loads(text) == json.loads(text)
    assert fastjson.loads(text.encode()) == json.loads(text)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_loads_fails_exactly_where_json_fails(data):
    try:
        want = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        with pytest.raises((ValueError, RecursionError)):
            fastjson.loads(data)
    else:
        got = fastjson.loads(data)
        assert got == want or (got != got and want != want)  # noqa: PLR0124 - NaN is not equal to itself


def test_raw_decode_reads_one_value_from_a_stream():
    stream = ' {"id": 1}{"id": 2}'
    first, end = fastjson.raw_decode(stream, 0)
    second, end2 = fastjson.raw_decode(stream, end)
    assert (first, second, end2) == ({"id": 1}, {"id": 2}, len(stream))


def test_fastjson_does_not_import_json_or_re():
    import subprocess
    import sys

    code = ("import sys; import cni.lean.fastjson as f; f.loads(f.dumps({'a': [1]})); "
            "print('json' in sys.modules, 're' in sys.modules)")
    out = subprocess.run([sys.executable, "-EsS", "-c", code], cwd=REPO,
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_syntax_errors_are_value_errors_in_a_fresh_interpreter():
    """CPython 3.11's C scanner looks JSONDecodeError up without importing json.decoder."""
    import subprocess
    import sys
    code = ("import cni.lean.fastjson as f\n"
            "try:\n    f.loads(b'{\"a\": 1,')\nexcept ValueError as e:\n    print('ValueError', e)")
    out = subprocess.run([sys.executable, "-EsS", "-c", code], cwd=REPO, check=False, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("ValueError"), out.stderr


KINDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list",
         dict: "an object"}


@settings(max_examples=300, deadline=None)
@given(values, st.sampled_from(list(KINDS)))
def test_a_field_is_read_when_of_its_kind_and_named_when_not(value, kind):
    """What JSON decodes to, read as each kind: the value itself when it is one (a bool is no
    number), else FieldError naming the key and the kind."""
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if ok:
        assert fastjson.field({"k": value}, "k", kind) is value
    else:
        with pytest.raises(fastjson.FieldError) as e:
            fastjson.field({"k": value}, "k", kind)
        assert (e.value.key, e.value.value, e.value.missing) == ("k", value, False)
        assert e.value.expected == KINDS[kind]


def test_absent_null_empty_and_bounds() -> None:
    with pytest.raises(fastjson.FieldError) as e:
        fastjson.field({}, "name", str)
    assert e.value.missing and e.value.key == "name" and str(e.value) == "name: missing"
    assert fastjson.field({}, "name", str, "") == ""
    with pytest.raises(fastjson.FieldError):
        fastjson.field({"name": None}, "name", str, "")  # null is a value, of no kind
    assert fastjson.field({"ips": None}, "ips", list, [], falsy_default=True) == []
    assert fastjson.field({"ips": {}}, "ips", list, [], falsy_default=True) == []
    with pytest.raises(fastjson.FieldError) as e:
        fastjson.check("nodeName", "", str, nonempty=True)
    assert e.value.expected == "a non-empty string"
    assert fastjson.check("port", 1, int, lo=1, hi=65535) == 1
    for bad in (0, 65536, True, "1"):
        with pytest.raises(fastjson.FieldError) as e:
            fastjson.check("port", bad, int, lo=1, hi=65535)
        assert str(e.value) == f"port: expected an integer in [1, 65535], got {bad!r}"
