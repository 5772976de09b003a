"""``Frozen``: immutable plain-data classes for IPAM without importing ``dataclasses``.

``dataclasses`` (exec-generated methods, ``inspect``) costs milliseconds on every ADD; IPAM has a
handful of value types, so they declare their fields in ``__slots__`` and ``_defaults`` and share
one generic ``__init__``/``__eq__``/``__hash__``/``__repr__`` here."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar


class Frozen:
    __slots__: tuple[str, ...] = ()
    _defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = self.__slots__
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__}: too many arguments")
        values = dict(zip(names, args, strict=False))
        for k, v in kwargs.items():
            if k not in names or k in values:
                raise TypeError(f"{type(self).__name__}: unexpected or repeated argument {k!r}")
            values[k] = v
        for n in names:
            if n not in values:
                if n not in self._defaults:
                    raise TypeError(f"{type(self).__name__}: missing argument {n!r}")
                values[n] = self._defaults[n]
            object.__setattr__(self, n, values[n])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, n) for n in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._values()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"
