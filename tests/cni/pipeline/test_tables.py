"""The pipeline's tables are declared once (``cni.pipeline.tables``: each table's miss and its
priority ladder) and the planners follow the declaration: every miss flow is built from it,
every planned flow sits on a named rung of its table's ladder, and no planner writes a priority
as a number."""

from __future__ import annotations

import ast

import pytest

from cni.pipeline import tables as pl
from cni.pipeline.flows import base_flows, miss_flows
from tests.cni.pipeline.test_golden import GW, sections
from tests.support.paths import REPO

PLANNERS = ("cni/pipeline/flows.py", "cni/pipeline/services.py", "cni/pipeline/chained.py", "routesync/peerflows.py",
            "routesync/apply/uplink.py", "routesync/policy/plan.py")
TABLE_CONSTANTS = {v for k, v in vars(pl.Table).items() if k.isupper()}


def rungs(decl: type[pl.Ladder]) -> dict[str, int]:
    """A table's rungs: name -> priority, highest first (what its class declares, MISS included)."""
    out = {k: v for c in reversed(decl.__mro__) for k, v in vars(c).items()
           if k.isupper() and k not in ("TABLE", "MISS_GOTO") and type(v) is int}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def test_the_pipeline_declares_every_table_once_in_packet_order() -> None:
    tables = [decl.TABLE for decl in pl.PIPELINE]
    assert sorted(tables) == tables and set(tables) == TABLE_CONSTANTS and len(tables) == len(TABLE_CONSTANTS)
    for decl in pl.PIPELINE:
        assert pl.ladder(decl.TABLE) is decl
        # goto_table only goes forward (OpenFlow refuses the flow otherwise)
        assert decl.MISS_GOTO is None or decl.MISS_GOTO in TABLE_CONSTANTS and decl.MISS_GOTO > decl.TABLE
        ladder = rungs(decl)
        assert ladder["MISS"] == 0 and min(ladder.values()) == 0 and len(ladder) > 1
    with pytest.raises(KeyError, match="no table 99"):
        pl.ladder(pl.Table(99))


def test_the_miss_flows_are_the_declarations() -> None:
    flows = base_flows(GW)
    misses = [f for f in flows if f.priority == 0]
    declared = {f.table: f for f in miss_flows()}
    assert sorted(misses, key=lambda f: f.table) == [declared[decl.TABLE] for decl in pl.PIPELINE]
    assert declared[pl.Table.CLASSIFIER].text() == "table=0,priority=0,cookie=0x100000000000000,actions=drop"
    assert declared[pl.Table.CONNTRACK].actions_text() == "goto_table:70"


def test_no_miss_flow_is_written_by_hand() -> None:
    """Every miss comes from the declaration (``flows.miss_flows``): no planner builds a flow on a
    table's ``MISS`` rung itself."""
    writers = [path.relative_to(REPO).as_posix() for base in ("cni", "routesync")
               for path in sorted((REPO / base).rglob("*.py"))
               if any(rung in path.read_text() for rung in (".MISS,", ".MISS)"))]
    assert writers == ["cni/pipeline/flows.py"]


def test_every_planned_flow_sits_on_a_rung_of_its_tables_ladder() -> None:
    for title, flows in sections().items():
        for f in flows:
            assert f.priority in rungs(pl.ladder(f.table)).values(), (title, f.text())
            assert f.priority != 0 or (not f.match and f.cookie == pl.BASE_COOKIE), f.text()


def priority_args(source: str) -> list[ast.expr]:
    """The priority argument of every ``Flow(...)`` call in ``source``."""
    return [n.args[1] for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Flow" and len(n.args) > 1]


def numbers(arg: ast.expr) -> bool:
    return any(isinstance(n, ast.Constant | ast.BinOp) for n in ast.walk(arg))


@pytest.mark.parametrize("path", PLANNERS)
def test_no_planner_writes_a_priority_as_a_number(path: str) -> None:
    source = (REPO / path).read_text()
    args = priority_args(source)
    assert args, path
    for arg in args:
        assert not numbers(arg), \
            f"{path}:{arg.lineno}: name a rung of the table's ladder (cni/pipeline/tables.py), not a number"
    names = {t.id for n in ast.parse(source).body if isinstance(n, ast.Assign)
             for t in n.targets if isinstance(t, ast.Name)}
    assert not {n for n in names if n.startswith("PRIO") or n.endswith("PRIORITY")}, path


def test_the_check_sees_a_number() -> None:
    probe = ("Flow(Table.CLASSIFIER, PRIO + 5, (), ())\nFlow(Table.CLASSIFIER, 200, (), ())\n"
             "Flow(Table.CLASSIFIER, Classifier.POD, (), ())\n")
    assert [numbers(a) for a in priority_args(probe)] == [True, True, False]
