"""cni.lean.record behaves like a dataclass, before and after it compiles a class's __init__."""

from __future__ import annotations

import dataclasses

import pytest

from cni.lean.record import Factory, as_dict, record, replace


@record(frozen=True)
class Point:
    x: int
    y: int = 0
    tags: list[str] = Factory(list)


@record(frozen=True)
class Pair:
    a: int
    b: int


@record
class Counter:
    n: int

    def __post_init__(self) -> None:
        self.n += 1


@pytest.mark.parametrize("rounds", [1, 200])  # 200 crosses the compile threshold
def test_construction_defaults_factories_and_errors(rounds):
    for _ in range(rounds):
        p = Point(1, y=2)
        q = Point(x=1)
    assert (p.x, p.y, q.y) == (1, 2, 0)
    assert p.tags == [] and p.tags is not q.tags
    assert Point(1, 2) == Point(1, 2) and Point(1, 2) != Point(2, 1)
    assert hash(Pair(1, 2)) == hash(Pair(1, 2)) and len({Pair(1, 2), Pair(1, 2), Pair(2, 1)}) == 2
    with pytest.raises(TypeError):
        Point()
    with pytest.raises(TypeError):
        Point(1, 2, [], 4)
    with pytest.raises(TypeError):
        Point(1, z=3)
    with pytest.raises(AttributeError):
        p.x = 5  # type: ignore[misc]
    assert as_dict(p) == {"x": 1, "y": 2, "tags": []} and replace(p, y=9) == Point(1, 9)
    assert repr(Point(1)) == "Point(x=1, y=0, tags=[])"


def test_post_init_runs_compiled_or_not():
    assert [Counter(i).n for i in range(150)] == list(range(1, 151))


# Side by side with dataclasses: each twin pair is declared alike, each case is run on both, and
# both must give the same value or raise the same kind of exception. Includes what ipam's former
# ``Frozen`` base offered its value types: positional and keyword construction, class-level
# defaults (immutable ones such as ``()``), properties, methods and static constructors on a frozen
# class, equality only within one class, hashing (set members, dict keys), repr, immutability.


def _twins(make_class):  # type: ignore[no-untyped-def]
    """The same class body decorated by ``record`` and by ``dataclass``.  A dataclass's repr names
    the class by ``__qualname__``, a record's by ``__name__``: the same for a module's classes, so
    these local ones are given their plain name."""
    twins = make_class(record), make_class(dataclasses.dataclass)
    for cls in twins:
        cls.__qualname__ = cls.__name__
    return twins


def _stored_ip(deco):  # type: ignore[no-untyped-def]
    @deco(frozen=True)
    class StoredIP:
        address: str
        gateway: str = ""

        @property
        def ip(self) -> str:
            return self.address.split("/", 1)[0]

        @staticmethod
        def parse(text: str) -> StoredIP:
            address, _, gateway = text.partition(" via ")
            return StoredIP(address, gateway)

    return StoredIP


def _config(deco):  # type: ignore[no-untyped-def]
    @deco(frozen=True)
    class Config:
        network: str
        ranges: tuple[int, ...]
        routes: tuple[str, ...] = ()
        durable: bool = False

        def describe(self) -> str:
            return f"{self.network}: {len(self.ranges)} ranges" + (", durable" if self.durable else "")

    return Config


def _outcome(fn):  # type: ignore[no-untyped-def]
    try:
        return ("value", fn())
    except Exception as e:  # noqa: BLE001 - the kind of exception is what is compared
        return ("raises", AttributeError if isinstance(e, AttributeError) else type(e))


CASES = {
    "positional": lambda C, I: (I("10.0.0.5/24", "10.0.0.1"),),
    "keyword": lambda C, I: (I(gateway="g", address="a"),),
    "default": lambda C, I: (I("a").gateway, C("n", (1,)).routes, C("n", (1,)).durable),
    "repr": lambda C, I: (repr(I("a", "g")), repr(C("n", (1, 2), durable=True))),
    "equal": lambda C, I: (I("a") == I("a", ""), I("a") == I("b"), C("n", ()) == C("n", (), ())),
    "not equal to another class with the same values": lambda C, I: (I("n", "") == C("n", ""),),
    "not equal to a tuple": lambda C, I: (I("a", "g") == ("a", "g"),),
    "hash of equal values": lambda C, I: (hash(I("a", "g")) == hash(I("a", "g")),),
    "set and dict members": lambda C, I: (len({I("a"), I("a", ""), I("b")}), {C("n", (1,)): 1}[C("n", (1,))]),
    "property": lambda C, I: (I("10.0.0.5/24").ip,),
    "method": lambda C, I: (C("n", (1, 2), durable=True).describe(),),
    "static constructor": lambda C, I: (I.parse("10.0.0.5/24 via 10.0.0.1"),),
    "too many arguments": lambda C, I: I("a", "g", "x"),
    "missing argument": lambda C, I: I(),
    "unknown keyword": lambda C, I: I("a", via="g"),
    "repeated argument": lambda C, I: I("a", address="b"),
    "set a field": lambda C, I: setattr(I("a"), "address", "b"),
    "set a new attribute": lambda C, I: setattr(I("a"), "other", 1),
    "delete a field": lambda C, I: delattr(I("a"), "address"),
}


@pytest.mark.parametrize("rounds", [1, 100])  # 100: the record classes' __init__ gets compiled on the way
@pytest.mark.parametrize("case", sorted(CASES))
def test_frozen_records_behave_like_frozen_dataclasses(case, rounds):  # type: ignore[no-untyped-def]
    (rec_ip, dc_ip), (rec_conf, dc_conf) = _twins(_stored_ip), _twins(_config)
    for _ in range(rounds):
        got = _outcome(lambda: CASES[case](rec_conf, rec_ip))
    want = _outcome(lambda: CASES[case](dc_conf, dc_ip))
    if got[0] == "value" and want[0] == "value":  # instances of twin classes: compare what they show
        got, want = repr(got), repr(want)
    assert got == want


def test_as_dict_and_replace_agree_with_dataclasses():
    (rec_ip, dc_ip), (rec_conf, dc_conf) = _twins(_stored_ip), _twins(_config)
    assert as_dict(rec_conf("n", (1,), ("r",))) == dataclasses.asdict(dc_conf("n", (1,), ("r",))) | {
        "ranges": [1], "routes": ["r"]}  # as_dict gives JSON-able lists where asdict keeps tuples
    assert repr(replace(rec_ip("a", "g"), gateway="h")) == repr(dataclasses.replace(dc_ip("a", "g"), gateway="h"))
