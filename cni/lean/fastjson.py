"""Why not ``json``: a process started once per Pod cannot afford it (-I -S, cached bytecode: import
json 8.0 ms, this module 0.7 ms, min of 25 under load); CPython's own ``_json`` C module does the work.

Equivalence test: tests/cni/lean/test_fastjson.py (byte for byte and error for error against ``json``).

JSON for the per-Pod path on the C accelerator alone, without importing ``json``.

``import json`` compiles several regular expressions (it pulls in ``re`` and ``json.decoder``),
which costs about as much as starting the interpreter, on every VERSION, ADD and DEL.  The
parsing and string escaping that matter are in CPython's ``_json`` C module, which ``json``
itself wraps; this module wraps it the same way, minus the regexes:

* ``loads`` / ``raw_decode`` use ``_json.make_scanner`` (the C scanner ``json.loads`` uses) and
  raise ``ValueError`` (``json.JSONDecodeError`` is one) on malformed input, like ``json``;
* ``dumps`` writes compact or default-separated JSON of dicts, lists, strings, numbers, booleans
  and None, escaping strings with ``_json.encode_basestring_ascii`` (ASCII output, as ``json``);
* ``field`` / ``check`` read one typed field of a decoded object (the one reader of the plugin's
  config, the node state, CNI results and route-sync's config): the value, or :class:`FieldError`
  naming the field and what it should have been, which each caller words into its own error
  (here rather than in a module of its own: the per-Pod path loads no more modules).

Long-lived code (route-sync, the lab, tests) uses ``json``."""

from __future__ import annotations

import _json

from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, TypeVar

    T = TypeVar("T")

_WS = " \t\n\r"
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Context:
    """The attributes ``_json.make_scanner`` reads (json.JSONDecoder's defaults)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__
    memo: dict[str, str] = {}  # noqa: RUF012 - the C scanner clears it after each call


_scan = _json.make_scanner(_Context())  # type: ignore[arg-type]  # duck-typed like json.JSONDecoder


def _skip(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i] in _WS:
        i += 1
    return i


def raw_decode(s: str, idx: int = 0) -> tuple[Any, int]:
    """Decode one JSON value starting at ``idx`` (after white space); returns (value, end)."""
    idx = _skip(s, idx)
    try:
        return _scan(s, idx)
    except StopIteration as e:
        raise ValueError(f"Expecting value: char {e.value}") from None
    except SystemError:
        # The C scanner reports a syntax error through json.decoder.JSONDecodeError, which it
        # looks up in sys.modules without importing it (CPython 3.11); on this rare path,
        # import it and scan again for the real error.
        import json.decoder  # noqa: F401

        try:
            return _scan(s, idx)
        except StopIteration as e:
            raise ValueError(f"Expecting value: char {e.value}") from None


def loads(data: str | bytes | bytearray) -> Any:
    if isinstance(data, (bytes, bytearray)):
        text = bytes(data).decode("utf-8")  # UnicodeDecodeError is a ValueError
    else:
        text = data
    if text.startswith("\ufeff"):
        raise ValueError("Unexpected UTF-8 BOM (decode using utf-8-sig)")
    value, end = raw_decode(text, 0)
    end = _skip(text, end)
    if end != len(text):
        raise ValueError(f"Extra data: char {end}")
    return value


def _encode(obj: Any, out: list[str], item_sep: str, key_sep: str) -> None:
    if isinstance(obj, str):
        out.append(_json.encode_basestring_ascii(obj))
    elif obj is None:
        out.append("null")
    elif obj is True:
        out.append("true")
    elif obj is False:
        out.append("false")
    elif isinstance(obj, int):
        out.append(int.__repr__(obj))
    elif isinstance(obj, float):
        if obj != obj or obj in (float("inf"), float("-inf")):  # noqa: PLR0124 - NaN test
            raise ValueError(f"out of range float value: {obj!r}")
        out.append(float.__repr__(obj))
    elif isinstance(obj, dict):
        out.append("{")
        first = True
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError(f"keys must be str, not {type(k).__name__}")
            if not first:
                out.append(item_sep)
            first = False
            out.append(_json.encode_basestring_ascii(k))
            out.append(key_sep)
            _encode(v, out, item_sep, key_sep)
        out.append("}")
    elif isinstance(obj, (list, tuple)):
        out.append("[")
        for i, v in enumerate(obj):
            if i:
                out.append(item_sep)
            _encode(v, out, item_sep, key_sep)
        out.append("]")
    else:
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def dumps(obj: Any, compact: bool = False) -> str:
    """``json.dumps(obj)`` (or with ``separators=(",", ":")`` when ``compact``)."""
    out: list[str] = []
    _encode(obj, out, "," if compact else ", ", ":" if compact else ": ")
    return "".join(out)


# ---------------------------------------------------------------- typed fields of a decoded object

REQUIRED: Any = object()  # field()'s default: the key must be there
_KINDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list",
          dict: "an object"}


class FieldError(ValueError):
    """Field ``key`` is ``missing``, or its ``value`` is not ``expected`` (``"a string"``, ``"an
    integer in [1, 65535]"``...): callers raise their own error from it, in their own words."""

    def __init__(self, key: str, expected: str, value: Any = None, missing: bool = False) -> None:
        super().__init__(f"{key}: missing" if missing else f"{key}: expected {expected}, got {value!r}")
        self.key = key
        self.expected = expected
        self.value = value
        self.missing = missing


def check(key: str, value: Any, kind: type[T], nonempty: bool = False, lo: int | None = None,
          hi: int | None = None) -> T:
    """``value`` (field ``key``'s) when it is a ``kind``: never a bool for int or float, not empty
    when ``nonempty``, within [``lo``, ``hi``] when given; :class:`FieldError` otherwise."""
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool) \
            or (nonempty and not value) \
            or (lo is not None and value < lo) or (hi is not None and value > hi):  # type: ignore[operator]
        # worded only when it fails: the plugin reads a dozen fields per call
        expected = _KINDS.get(kind, kind.__name__)
        if nonempty:
            expected = f"a non-empty {expected.removeprefix('a ').removeprefix('an ')}"
        if lo is not None and hi is not None:
            expected = f"{expected} in [{lo}, {hi}]"
        raise FieldError(key, expected, value)
    return value


def field(obj: dict[str, Any], key: str, kind: type[T], default: Any = REQUIRED, nonempty: bool = False,
          lo: int | None = None, hi: int | None = None, falsy_default: bool = False) -> T:
    """``obj[key]``, checked as :func:`check` does; ``default`` when the key is absent (and, with
    ``falsy_default``, when its value is false: null, "", 0, [], {}; otherwise a JSON ``null`` is a
    value, of no kind); :class:`FieldError` with ``missing`` when there is no default."""
    if key not in obj or (falsy_default and not obj[key]):
        if default is REQUIRED:
            raise FieldError(key, _KINDS.get(kind, kind.__name__), missing=True)
        return default  # type: ignore[no-any-return]
    return check(key, obj[key], kind, nonempty, lo, hi)
