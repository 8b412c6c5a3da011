"""Baqend's curve in ``router bench``: its points measured in rounds, forward and backward in
turn, and judged on each point's median (``router.bench.dialects.baqend.curve``)."""

from __future__ import annotations

import pytest

from router.bench import plan_cases
from router.bench.dialects.baqend import FLAT_MAX, curve, curve_order
from router.bench.report import format_summaries, markdown_summaries
from router.bench.scenarios import Options


def test_the_curve_runs_forward_then_backward_in_turn():
    assert curve_order([1000, 10_000], 3) == [(1, 0, 1000), (1, 1, 10_000), (2, 1, 10_000), (2, 0, 1000),
                                             (3, 0, 1000), (3, 1, 10_000)]
    assert curve_order([20, 40, 80], 1) == [(1, 0, 20), (1, 1, 40), (1, 2, 80)]


def test_each_round_of_a_point_is_a_case_of_its_own_and_one_round_keeps_the_plain_names():
    rounds = plan_cases("queries", ["baqend"], Options(params={"baqend.queries": "1000,10000"}))
    assert [case.case for case in rounds] == [
        "1,000 queries x 10 conns, 20,000 writes, round 1", "10,000 queries x 10 conns, 20,000 writes, round 1",
        "10,000 queries x 10 conns, 20,000 writes, round 2", "1,000 queries x 10 conns, 20,000 writes, round 2",
        "1,000 queries x 10 conns, 20,000 writes, round 3", "10,000 queries x 10 conns, 20,000 writes, round 3"]
    once = plan_cases("queries", ["baqend"], Options(params={"baqend.queries": "1000,10000", "baqend.rounds": "1"}))
    assert [case.case for case in once] == ["1,000 queries x 10 conns, 20,000 writes",
                                            "10,000 queries x 10 conns, 20,000 writes"]


def row(queries: int, query_us: float, writes_per_s: int | None, gateway_us: float = 100.0, **extra) -> dict:
    return {"scenario": "queries", "case": f"{queries} queries", "dialect": "baqend", "system": "router",
            "queries": queries, "value": writes_per_s,
            "cpu_us_per_write": {"gateway": gateway_us, "query": query_us, "document": 30.0}, **extra}


def test_each_point_is_the_median_of_its_runs_and_flat_within_ten_percent():
    # One round at 10,000 queries is high (+30 %): the median is not, and the curve is flat. The
    # rows come as the rounds ran (backward in the second).
    rows = [row(1000, 50.0, 8000, 90.0), row(10_000, 65.0, 6000, 120.0), row(10_000, 54.0, 7600, 95.0),
            row(1000, 48.0, 8200, 80.0), row(1000, 52.0, 7900, 100.0), row(10_000, 53.0, 7800, 99.0)]
    [summary] = curve(rows[1:3] + rows[:1] + rows[3:])  # the fewest queries first whatever came first
    assert [point["queries"] for point in summary["points"]] == [1000, 10_000]
    first, last = summary["points"]
    assert (first["query_us_per_write"], first["runs_query_us_per_write"], first["runs"]) == (50.0, [50.0, 48.0, 52.0], 3)
    assert (first["gateway_us_per_write"], first["matched_writes_per_s"]) == (90.0, 8000)
    assert (last["query_us_per_write"], last["matched_writes_per_s"], last["gateway_us_per_write"]) == (54.0, 7600, 99.0)
    assert summary["growth"] == pytest.approx(1.08) and summary["met"] is True
    assert summary["throughput"] == pytest.approx(7600 / 8000) and summary["system"] == "router"
    assert summary["name"] == ("Baqend matching cost flat from 1,000 to 10,000 queries "
                               "(query shards' µs a write within +10 %)")
    assert summary["figure"] == ("50 / 54 µs a write at 1,000 / 10,000 queries (+8.0 %), matched writes/s at "
                                 "10,000 95 % of those at 1,000 (medians of 3 runs)")
    assert format_summaries([summary]) == summary["name"] + ": " + summary["figure"] + ": met"
    assert markdown_summaries([summary]).splitlines() == [
        "| target | measured | |", "|---|---|---|", f"| {summary['name']} | {summary['figure']} | met |"]


def test_the_bound_is_flat_and_a_rise_past_it_is_not():
    assert curve([row(1000, 50.0, 9000), row(10_000, 55.0, 8000)])[0]["met"] is True  # +10 % exactly
    rows = [row(1000, 40.0, 9000), row(2000, 42.0, 8800), row(10_000, 44.5, 8000)]
    [summary] = curve(rows)
    assert summary["met"] is False and summary["growth"] == pytest.approx(44.5 / 40.0)
    assert summary["figure"] == ("40 / 42 / 44.5 µs a write at 1,000 / 2,000 / 10,000 queries (+11.3 %), matched "
                                 "writes/s at 10,000 89 % of those at 1,000 (one run each)")
    assert format_summaries([summary]).endswith(": not met")
    [uneven] = curve([row(1000, 40.0, 9000), row(1000, 41.0, 9000), row(10_000, 40.0, 9000)])
    assert uneven["figure"].endswith("(medians of 1 to 2 runs)")


def test_a_curve_for_each_router_system_and_none_without_two_points():
    scaled = [{**each, "system": "router g2/s2"} for each in (row(1000, 50.0, 8000), row(10_000, 60.0, 8000))]
    summaries = curve([row(1000, 50.0, 8000), row(10_000, 50.0, 8000), *scaled])
    assert [(each["system"], each["met"]) for each in summaries] == [("router", True), ("router g2/s2", False)]
    assert summaries[1]["name"].startswith("Baqend matching cost flat from 1,000 to 10,000 queries (router g2/s2) ")
    assert curve([row(1000, 50.0, 8000), row(1000, 52.0, 8000)]) == []
    # Runs that failed or measured nothing are left out: no value, a value of 0, no CPU read.
    assert curve([row(1000, 50.0, 8000), row(10_000, 50.0, None)]) == []
    assert curve([row(1000, 50.0, 8000), row(10_000, 50.0, 0)]) == []
    assert curve([row(1000, 50.0, 8000), {**row(10_000, 50.0, 8000), "cpu_us_per_write": {"gateway": 9.0}}]) == []
    assert curve([row(1000, 50.0, 8000), {**row(10_000, 50.0, 8000), "cpu_us_per_write": {}}]) == []
    assert curve([row(1000, 0.0, 8000), row(10_000, 50.0, 8000)]) == []
    # Other systems, dialects and scenarios are not the curve.
    assert curve([row(1000, 50.0, 8000), {**row(10_000, 50.0, 8000), "system": "redis"}]) == []
    assert curve([row(1000, 50.0, 8000), {**row(10_000, 50.0, 8000), "dialect": "signal"}]) == []
    assert curve([row(1000, 50.0, 8000), {**row(10_000, 50.0, 8000), "scenario": "latency"}]) == []


def test_the_rounds_are_one_number_of_at_least_one():
    for bad in ("0", "2,3"):
        with pytest.raises(SystemExit, match="baqend.rounds"):
            plan_cases("queries", ["baqend"], Options(params={"baqend.rounds": bad}))
