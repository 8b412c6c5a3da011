"""router/bench/targets.py: the ratio targets in alternating rounds — what a round runs and in
which order, each round's ratio and the median, and the settings of the one router that serves
Signal Hub and NoLag in a round."""

from __future__ import annotations

import argparse

import pytest

from router.bench import _with_targets, add_arguments
from router.bench.scenarios import Options
from router.bench.systems import RouterSystem, merged_settings
from router.bench.targets import markdown_targets, plan, round_order, summarise, targets

OPTIONS = Options(pairs=20)


def test_a_round_runs_every_case_a_target_names_once_each_on_its_side():
    raw, router = plan(OPTIONS)
    assert [(case.scenario, case.case, case.dialect) for case in raw] == [
        ("fanout", "S=1", None), ("p2p", "20 pairs", None)]
    assert [(case.scenario, case.case, case.dialect) for case in router] == [
        ("fanout", "S=1", "signal"), ("p2p", "20 pairs", "signal"), ("fanout", "S=100", "signal"),
        ("fanout", "S=100", "nolag"), ("fanout", "S=100 QoS 1", "nolag")]
    named = {side for target in targets(OPTIONS) for side in (target.numerator, target.denominator)}
    ran = {(case.scenario, case.case, case.dialect or "raw") for case in [*raw, *router]}
    assert named == ran


def test_the_qos1_case_is_the_one_of_100_subscribers_whatever_else_the_run_asks_for():
    options = Options(params={"nolag.qos1_subscribers": "1,100,1000"})
    _, router = plan(options)
    assert [case.case for case in router if case.dialect == "nolag"] == ["S=100", "S=100 QoS 1"]


def test_rounds_alternate_which_side_goes_first_and_reverse_the_cases():
    raw, router = ["r1", "r2"], ["a", "b", "c"]
    assert round_order(1, raw, router) == [("raw", ["r1", "r2"]), ("router", ["a", "b", "c"])]
    assert round_order(2, raw, router) == [("router", ["c", "b", "a"]), ("raw", ["r2", "r1"])]
    assert round_order(3, raw, router) == round_order(1, raw, router)


def _row(scenario, case, system, dialect, number, value):
    return {"scenario": scenario, "base_case": case, "case": f"{case}, round {number}", "system": system,
            "dialect": dialect, "round": number, "value": value}


def test_each_round_gives_its_ratio_and_the_target_takes_their_median():
    rows = []
    for number, (raw, signal, s100, qos0, qos1) in enumerate(
            [(100, 110, 7_000, 6_000, 3_400), (100, 90, 8_000, 7_000, 3_900), (200, 250, 6_000, 5_000, 3_300)], 1):
        rows += [_row("fanout", "S=1", "raw", "-", number, raw), _row("fanout", "S=1", "router", "signal", number, signal),
                 _row("p2p", "20 pairs", "raw", "-", number, raw), _row("p2p", "20 pairs", "router", "signal", number, signal),
                 _row("fanout", "S=100", "router", "signal", number, s100),
                 _row("fanout", "S=100", "router", "nolag", number, qos0),
                 _row("fanout", "S=100 QoS 1", "router", "nolag", number, qos1)]
    summary = {item["target"]: item for item in summarise(rows, targets(OPTIONS), 3)}
    s1 = summary["Signal Hub fanout S=1 ≥ 1.0 × raw"]
    assert s1["ratios"] == [1.1, 0.9, 1.25] and s1["median"] == 1.1 and s1["rounds_met"] == 2 and s1["met"]
    qos1 = summary["NoLag QoS 1 fanout S=100 ≥ 0.5 × Signal Hub"]
    assert qos1["ratios"] == [0.485714, 0.4875, 0.55] and qos1["median"] == 0.4875
    assert qos1["rounds_met"] == 1 and not qos1["met"]
    assert summary["NoLag QoS 0 fanout S=100 ≥ 0.7 × Signal Hub"]["ratios"] == [0.857143, 0.875, 0.833333]
    assert "| NoLag QoS 1 fanout S=100 ≥ 0.5 × Signal Hub | 0.50 | 0.49 | 0.49 | 0.55 | 0.49 | no (1 of 3 rounds) |" \
        in markdown_targets(list(summary.values()))


def test_a_round_without_a_figure_has_no_ratio_and_the_target_is_not_met_without_every_round():
    rows = [_row("fanout", "S=1", "raw", "-", 1, 100), _row("fanout", "S=1", "router", "signal", 1, None),
            _row("fanout", "S=1", "raw", "-", 2, 100), _row("fanout", "S=1", "router", "signal", 2, 120)]
    (s1, p2p, *_) = summarise(rows, targets(OPTIONS), 2)
    assert s1["ratios"] == [None, 1.2] and s1["median"] == 1.2 and s1["rounds_met"] == 1 and not s1["met"]
    assert p2p["ratios"] == [None, None] and p2p["median"] is None and not p2p["met"]
    assert "| 1.00 | - | 1.20 | 1.20 | no (1 of 2 rounds, 1 without a figure) |" in markdown_targets([s1])


def test_a_round_that_delivered_nothing_is_a_ratio_of_zero_not_a_missing_one():
    rows = [_row("fanout", "S=1", "raw", "-", n, 100) for n in (1, 2, 3)]
    rows += [_row("fanout", "S=1", "router", "signal", n, value) for n, value in ((1, 0), (2, 130), (3, 120))]
    (s1, *_) = summarise(rows, targets(OPTIONS), 3)
    assert s1["ratios"] == [0.0, 1.3, 1.2] and s1["median"] == 1.2 and s1["rounds_met"] == 2 and s1["met"]


def test_signal_hubs_and_nolags_settings_merge_and_a_conflict_is_refused():
    from router.bench.dialects import profile

    merged = merged_settings(profile("signal").settings(), profile("nolag").settings())
    assert merged["signal"] == profile("signal").settings()["signal"]
    assert merged["nolag"] == profile("nolag").settings()["nolag"]
    assert merged_settings({"a": {"b": 1}}, {"a": {"c": 2}}) == {"a": {"b": 1, "c": 2}}
    with pytest.raises(ValueError, match="'b'"):
        merged_settings({"a": {"b": 1}}, {"a": {"b": 2}})


def test_a_router_is_measured_only_through_a_dialect_it_was_set_up_for():
    router = RouterSystem(dialect="signal", also=("nolag", "signal"))
    assert router.dialects == ("signal", "nolag")
    router._serving = {"signal": (["ws://s"], {"k": 1}), "nolag": (["ws://n"], {"tokens": ["t"]})}
    view = router.serving("nolag")
    assert (view.dialect, view.urls(), view.client_config()) == ("nolag", ["ws://n"], {"tokens": ["t"]})
    assert router.dialect == "signal" and view.accepts(type("C", (), {"dialect": "nolag"})())
    with pytest.raises(ValueError):
        router.serving("mx")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("argv, skipped, runs", [
    (("all", "--dialect", "all"), {}, True),
    (("all", "--dialect", "signal,nolag", "--systems", "raw, router"), {}, True),
    (("all", "--dialect", "all", "--target-rounds", "0"), {}, False),
    (("all", "--dialect", "signal"), {}, False),
    (("all", "--dialect", "all", "--systems", "router"), {}, False),
    (("all", "--dialect", "all"), {"raw": "not here"}, False),
    (("all", "--dialect", "all", "--gateways", "2"), {}, False),
    (("all", "--dialect", "all", "--eventlog", "compare"), {}, False),
    (("all", "--dialect", "all", "--pin-gateway"), {}, True),
    (("fanout", "--dialect", "all"), {}, False),
])
def test_all_ends_with_the_rounds_only_when_it_measures_what_they_compare(argv, skipped, runs):
    assert _with_targets(_args(*argv), skipped) is runs
