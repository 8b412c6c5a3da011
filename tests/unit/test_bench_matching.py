"""router bench matching (router/bench/dialects/baqend.py): the in-process curve of what Baqend's query shards pay per write."""

from __future__ import annotations

import json

import pytest

from router.bench import run
from router.bench.dialects import baqend
from router.cli import build_parser


def test_a_run_matches_each_write_against_its_group_and_counts_the_window_removes():
    result = baqend.matching_measure(100, per_group=20, matches=10)
    # 10 groups of 10 queries, 20 writes each: every write is an add for the 10 queries of its
    # group, and the sorted one's window of 10 pushes a document out for each of the last 10
    assert (result["queries"], result["writes"]) == (100, 200)
    assert result["events_per_write"] == (200 * 10 + 10 * 10) / 200
    with pytest.raises(SystemExit, match="not a multiple"):
        baqend.matching_measure(105, per_group=1, matches=10)


def test_router_bench_matching_writes_one_row_per_query_count(tmp_path, capsys):
    out = tmp_path / "matching.json"
    args = build_parser().parse_args(["bench", "matching", "--param", "baqend.queries=20,40",
                                      "--param", "baqend.per_group=3", "--out", str(out)])
    assert run(args) == 0
    written = json.loads(out.read_text())
    assert (written["scenario"], written["per_group"], written["matches"]) == ("matching", 3, 10)
    assert [(row["queries"], row["writes"], len(row["runs_us_per_write"])) for row in written["results"]] == [
        (20, 6, 3), (40, 12, 3)]
    assert "20 queries" in capsys.readouterr().out


def test_the_grouped_order_sends_the_same_writes_with_a_groups_in_a_row():
    """Each order makes the same events (a group's writes keep their order), so the two curves
    differ only in where the state was when a write came."""
    rows = [baqend.matching_measure(100, per_group=20, matches=10, order=order) for order in ("round", "grouped")]
    assert [(row["order"], row["writes"], row["events_per_write"]) for row in rows] == [
        ("round", 200, (200 * 10 + 10 * 10) / 200), ("grouped", 200, (200 * 10 + 10 * 10) / 200)]
    with pytest.raises(SystemExit, match="not one of"):
        baqend.matching_measure(100, per_group=1, matches=10, order="random")


def test_router_bench_matching_takes_both_orders(tmp_path):
    out = tmp_path / "matching.json"
    args = build_parser().parse_args(["bench", "matching", "--param", "baqend.queries=20",
                                      "--param", "baqend.per_group=3", "--param", "baqend.order=round,grouped",
                                      "--out", str(out)])
    assert run(args) == 0
    assert [(row["queries"], row["order"]) for row in json.loads(out.read_text())["results"]] == [
        (20, "round"), (20, "grouped")]


def test_the_same_writes_at_every_query_count_spread_over_the_groups(tmp_path):
    """``baqend.writes``: the database the same at every Q (the ``queries`` scenario's way), each
    group's share of the writes smaller as the groups grow; a share that does not divide evenly
    puts one more write in the first groups, in both orders."""
    # 100 queries: 10 groups; 25 writes: groups 0-4 get 3, groups 5-9 get 2; each write is an add
    # for its group's 10 queries and no sorted window (limit 10) fills.
    rows = [baqend.matching_measure(100, per_group=999, matches=10, order=order, writes=25)
            for order in ("round", "grouped")]
    assert [(row["writes"], row["events_per_write"]) for row in rows] == [(25, 10.0), (25, 10.0)]
    out = tmp_path / "matching.json"
    args = build_parser().parse_args(["bench", "matching", "--param", "baqend.queries=20,40",
                                      "--param", "baqend.writes=60", "--out", str(out)])
    assert run(args) == 0
    written = json.loads(out.read_text())
    assert (written["per_group"], written["writes"]) == (None, 60)
    # 2 groups of 30 writes: each sorted window of 10 pushes one out for the last 20; 4 groups of 15: the last 5
    assert [(row["queries"], row["writes"], row["events_per_write"]) for row in written["results"]] == [
        (20, 60, round((60 * 10 + 2 * 20) / 60, 3)), (40, 60, round((60 * 10 + 4 * 5) / 60, 3))]
    with pytest.raises(SystemExit, match="baqend.writes"):
        run(build_parser().parse_args(["bench", "matching", "--param", "baqend.writes=0", "--out", str(out)]))
