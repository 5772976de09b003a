"""cni.lean.record behaves like a dataclass, before and after it compiles a class's __init__."""

from __future__ import annotations

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
