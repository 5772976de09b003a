"""bench_dataplane's method, the pure parts: repetitions are interleaved across paths (each path
once per round, the order rotated), every path gets the same iperf3 and round-trip parameters,
the summary has the spread, the ratios pair the runs of one round; the encrypted paths are their
clear references with WireGuard on, and the path check's decision tells a run through WireGuard
from one around it (issue 30)."""

from __future__ import annotations

from bench.bench_dataplane import (
    PAIRS,
    RR_PORT,
    RR_SIZE,
    config_refuses,
    interleaved_order,
    iperf_args,
    latency_summary,
    path_problem,
    path_specs,
    ratios,
    route_sync_settings,
    rr_args,
    summary,
    topology,
)


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


# ------------------------------------------------------------------ the WireGuard paths (issue 30)

def test_each_encrypted_path_is_its_clear_reference_with_wireguard_on() -> None:
    from lab.topology import parse

    specs = path_specs()
    for path, ref in (("wg-vxlan", "vxlan"), ("wg-gateway", "gateway")):
        assert (path, ref) in PAIRS
        wg, clear = specs[path], specs[ref]
        assert wg.encrypted and not clear.encrypted and wg.route_sync == clear.route_sync
        # the lab takes the bench's document, encrypted, and the clear one stays as it was
        assert parse(topology(wg.route_sync, wg.encrypted)).encrypted
        assert "encryption" not in topology(clear.route_sync) and not parse(topology(clear.route_sync)).encrypted
        # route-sync's own parser takes the settings the bench asks for (else: "not available")
        assert route_sync_settings(wg)["trafficEncryptionMode"] == "wireguard"
        assert config_refuses(route_sync_settings(wg)) is None


def test_an_encrypted_path_passes_only_when_wireguard_carried_the_bytes_and_the_tunnel_nothing() -> None:
    wg = path_specs()["wg-vxlan"]
    payload = 50_000_000
    assert path_problem(wg, None, payload + 3_000_000, payload) is None  # no tunnel port at all
    assert path_problem(wg, 12, payload + 3_000_000, payload) is None  # a port beside it, a few strays
    went_around = path_problem(wg, None, payload // 2, payload)
    assert went_around and "went around it" in went_around
    assert "no WireGuard device" in (path_problem(wg, None, None, payload) or "")
    tunnelled = path_problem(wg, 40_000, payload * 2, payload)
    assert tunnelled and "ferry-tun0" in tunnelled and "replaces the tunnel" in tunnelled


def test_a_clear_path_is_checked_by_its_port_as_before() -> None:
    specs = path_specs()
    assert path_problem(specs["vxlan"], 250_000, None, 10**8) is None
    assert "expected a rise" in (path_problem(specs["vxlan"], 10, None, 10**8) or "")
    assert "no port ferry-tun0" in (path_problem(specs["vxlan"], None, None, 10**8) or "")
    assert path_problem(specs["fast"], 5, None, 10**8) is None
    assert "expected none" in (path_problem(specs["fast"], 5_000, None, 10**8) or "")


def test_round_trips_use_the_same_parameters_on_every_path_and_summarise_by_nearest_rank() -> None:
    assert rr_args("10.244.2.5", 300) == ["client", "10.244.2.5", str(RR_PORT), "300", str(RR_SIZE), "50", "10"]
    s = latency_summary([float(x) for x in range(1, 101)])
    assert s["n"] == 100 and s["p50"] == 50.0 and s["p99"] == 99.0 and s["mean"] == 50.5


def test_encrypted_ratios_give_throughput_cpu_and_latency_against_the_clear_path() -> None:
    def fig(path: str, gbps: list[float], cpu: float, p50: float, p99: float, per_rep: list[float]) -> dict:
        return {"path": path, "gbps": gbps, "median": sorted(gbps)[1], "cpu_s_per_gbit_median": cpu,
                "latency_us": {"p50": p50, "p99": p99, "p50_per_repetition": per_rep}}

    wg = fig("wg-vxlan", [0.06, 0.08, 0.07], 18.0, 750.0, 3000.0, [700.0, 800.0, 750.0])
    vx = fig("vxlan", [0.30, 0.25, 0.28], 3.0, 250.0, 2000.0, [250.0, 200.0, 250.0])
    r = ratios([wg, vx])
    assert set(r) == {"wg-vxlan/vxlan"}
    x = r["wg-vxlan/vxlan"]
    assert abs(x["median"] - 0.07 / 0.28) < 1e-9 and x["per_repetition"] == [0.2, 0.32, 0.25]
    assert x["cpu_per_gbit"] == 6.0 and abs(x["cpu_cost"] - 1 / 6) < 1e-9
    assert x["latency_p50"] == 3.0 and x["latency_p99"] == 1.5 and x["latency_p50_per_repetition"] == [2.8, 4.0, 3.0]
    # without round trips on one side: no latency ratio, the rest as before
    del vx["latency_us"]
    assert "latency_p50" not in ratios([wg, vx])["wg-vxlan/vxlan"]
