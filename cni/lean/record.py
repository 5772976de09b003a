"""Why not ``dataclasses``: a process started once per Pod cannot afford it (-I -S, cached bytecode:
import dataclasses 14.1 ms, this module 0.6 ms, min of 25 under load), nor its exec per method.

Equivalence test: tests/cni/lean/test_record.py (each behaviour side by side with a dataclass twin).

``@record``: plain-data classes for the per-Pod path and IPAM, without the cost of ``dataclasses``.

``dataclasses`` generates each method with ``exec`` and imports ``inspect``: on the plugin's path
(some 30 classes, once per Pod) that was ~25 ms of a ~60 ms ADD.  ``record`` reads the class's
annotations and defaults once and installs shared, generic ``__init__``, ``__repr__``, ``__eq__``
(and ``__hash__`` plus immutability when ``frozen``).  Same spelling as a dataclass::

    @record(frozen=True)
    class Flow:
        table: int
        priority: int
        cookie: Cookie = BASE_COOKIE
        tags: list[str] = Factory(list)     # instead of field(default_factory=list)

Long-lived processes (route-sync, the lab) keep using ``dataclasses``; ``as_dict`` works on both.
"""

from __future__ import annotations

from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    T = TypeVar("T")

_MISSING = object()


class _Factory:
    """A default made fresh for each instance (``Factory(list)``)."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def _fields(cls: type) -> tuple[tuple[str, Any], ...]:
    inherited: dict[str, Any] = {}
    for base in reversed(cls.__mro__[1:]):
        for name, default in getattr(base, "__record_fields__", ()):
            inherited[name] = default
    for name, kind in cls.__dict__.get("__annotations__", {}).items():  # noqa: RUF063 - no inspect import
        if str(kind).startswith(("ClassVar", "typing.ClassVar")):
            continue
        inherited[name] = cls.__dict__.get(name, _MISSING)
    return tuple(inherited.items())


# A class instantiated this often gets a compiled ``__init__`` (one ``exec``, ~0.1 ms): the generic
# one costs ~30 us per instance, which adds up in route-sync (thousands of peers), while the
# plugin, creating a handful of each, never pays for the compile.
_COMPILE_AFTER = 64


def _compiled_init(cls: Any) -> Any:
    fields = cls.__record_fields__
    params, body, env = [], [], {"_MISSING": _MISSING, "_set": object.__setattr__}
    for i, (name, default) in enumerate(fields):
        if default is _MISSING:
            params.append(name)
            body.append(f" _set(self, {name!r}, {name})")
        elif isinstance(default, _Factory):
            env[f"_make{i}"] = default.make
            params.append(f"{name}=_MISSING")
            body.append(f" _set(self, {name!r}, _make{i}() if {name} is _MISSING else {name})")
        else:
            env[f"_d{i}"] = default
            params.append(f"{name}=_d{i}")
            body.append(f" _set(self, {name!r}, {name})")
    if hasattr(cls, "__post_init__"):
        body.append(" self.__post_init__()")
    src = f"def __init__(self, {', '.join(params)}):\n" + ("\n".join(body) or " pass") + "\n"
    exec(src, env)  # noqa: S102 - built only from the class's own field names
    return env["__init__"]


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    count = cls.__dict__.get("__record_inits__", 0) + 1
    if count > _COMPILE_AFTER and cls.__init__ is _init:
        cls.__init__ = _compiled_init(cls)
        cls.__init__(self, *args, **kwargs)
        return
    type.__setattr__(cls, "__record_inits__", count)
    fields = cls.__record_fields__
    if len(args) > len(fields):
        raise TypeError(f"{type(self).__name__}() takes {len(fields)} arguments, got {len(args)}")
    set_ = object.__setattr__
    for i, (name, default) in enumerate(fields):
        if i < len(args):
            if name in kwargs:
                raise TypeError(f"{type(self).__name__}() got two values for {name!r}")
            value = args[i]
        elif name in kwargs:
            value = kwargs.pop(name)
        elif default is _MISSING:
            raise TypeError(f"{type(self).__name__}() missing argument {name!r}")
        elif isinstance(default, _Factory):
            value = default.make()
        else:
            value = default
        set_(self, name, value)
    if kwargs and len(kwargs) > sum(1 for n, _ in fields[:len(args)] if n in kwargs):
        unknown = [k for k in kwargs if k not in dict(fields)]
        if unknown:
            raise TypeError(f"{type(self).__name__}() got unexpected arguments {unknown}")
    post = getattr(self, "__post_init__", None)
    if post is not None:
        post()


def _values(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, name) for name, _ in type(self).__record_fields__)


def _repr(self: Any) -> str:
    inner = ", ".join(f"{name}={getattr(self, name)!r}" for name, _ in type(self).__record_fields__)
    return f"{type(self).__name__}({inner})"


def _eq(self: Any, other: Any) -> Any:
    if type(other) is not type(self):
        return NotImplemented
    return _values(self) == _values(other)


def _hash(self: Any) -> int:
    return hash(_values(self))


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise AttributeError(f"{type(self).__name__} is frozen: cannot delete {name!r}")


def _record(cls: type | None = None, *, frozen: bool = False) -> Any:
    def wrap(c: Any) -> Any:  # Any: methods are installed on the class object itself
        c.__record_fields__ = _fields(c)
        for name, default in c.__record_fields__:
            if isinstance(default, _Factory):
                delattr(c, name)
        if "__init__" not in c.__dict__:
            c.__init__ = _init
        if "__repr__" not in c.__dict__:
            c.__repr__ = _repr
        if "__eq__" not in c.__dict__:
            c.__eq__ = _eq
        if frozen:
            c.__setattr__ = _frozen_setattr
            c.__delattr__ = _frozen_delattr
            c.__hash__ = _hash
        else:
            c.__hash__ = None
        return c

    return wrap if cls is None else wrap(cls)


if TYPE_CHECKING:  # type checkers see what @record and Factory are to them: dataclass and field
    from dataclasses import dataclass as record
    from dataclasses import field as _field

    def Factory(make: Callable[[], T]) -> T:
        return _field(default_factory=make)
else:
    record = _record
    Factory = _Factory


_LEAVES = frozenset((str, int, float, bool, type(None)))


def as_dict(obj: Any) -> Any:
    """Records (and dataclasses), lists, tuples and dicts of them, as plain JSON-able data.

    Leaves are tested first and by exact type: route-sync's state file is mostly strings
    (1,000 peers: 19 -> 8 ms)."""
    kind = type(obj)
    if kind in _LEAVES:
        return obj
    fields = getattr(kind, "__record_fields__", None)
    if fields is not None:
        return {name: as_dict(getattr(obj, name)) for name, _ in fields}
    if kind is list or kind is tuple:
        return [x if type(x) in _LEAVES else as_dict(x) for x in obj]
    if hasattr(kind, "__dataclass_fields__"):
        return {name: as_dict(getattr(obj, name)) for name in type(obj).__dataclass_fields__}
    if isinstance(obj, (list, tuple)):
        return [as_dict(x) for x in obj]
    if isinstance(obj, dict):
        return {k: as_dict(v) for k, v in obj.items()}
    return obj


def replace(obj: T, **changes: Any) -> T:
    values = {name: getattr(obj, name) for name, _ in type(obj).__record_fields__}  # type: ignore[attr-defined]
    values.update(changes)
    return type(obj)(**values)
