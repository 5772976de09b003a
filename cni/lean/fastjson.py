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
  and None, escaping strings with ``_json.encode_basestring_ascii`` (ASCII output, as ``json``).

Long-lived code (route-sync, the lab, tests) uses ``json``."""

from __future__ import annotations

import _json

from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

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
