"""bench_dataplane's method, the pure parts: repetitions are interleaved across paths (each path
once per round, the order rotated), every path gets the same iperf3 parameters, the summary has
the spread, and the ratios pair the runs of one round."""

from __future__ import annotations

from bench.bench_dataplane import interleaved_order, iperf_args, ratios, summary


def test_every_round_runs_each_path_once_and_the_start_rotates() -> None:
    keys = ["vxlan", "gateway", "fast"]
    rounds = [interleaved_order(keys, r) for r in range(3)]
    assert all(sorted(r) == sorted(keys) for r in rounds)
    assert [r[0] for r in rounds] == keys  # each path leads one round
    assert interleaved_order([], 2) == []


def test_iperf_parameters_do_not_depend_on_the_path() -> None:
    args = iperf_args(10.0)
    assert args[args.index("-t") + 1] == "10"
    assert "-J" in args and "-P" not in args


def test_summary_gives_median_bounds_and_spread() -> None:
    s = summary([0.5, 0.6, 0.4])
    assert s["median"] == 0.5 and s["min"] == 0.4 and s["max"] == 0.6
    assert abs(s["spread"] - 0.4) < 1e-9


def test_ratios_pair_runs_of_the_same_round() -> None:
    fast = {"path": "fast", "gbps": [0.6, 0.9, 0.75], "median": 0.75, "cpu_s_per_gbit_median": 2.0}
    gw = {"path": "gateway", "gbps": [0.5, 0.6, 0.5], "median": 0.5, "cpu_s_per_gbit_median": 3.0}
    r = ratios([fast, gw, {"path": "vxlan", "available": False}])
    assert set(r) == {"fast/gateway"}
    assert r["fast/gateway"]["median"] == 1.5
    assert r["fast/gateway"]["per_repetition"] == [1.2, 1.5, 1.5]
    assert r["fast/gateway"]["cpu_cost"] == 1.5
