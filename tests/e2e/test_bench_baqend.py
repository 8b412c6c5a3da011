"""`router bench --dialect baqend` as a user runs it: its own scenarios (``queries``, ``latency``),
tiny, checked through the JSON result file: every expected event arrives, exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ROUTER = str(Path(sys.executable).with_name("router"))


def bench(scenario: str, out: Path, *params: str) -> tuple[dict[str, Any], str]:
    arguments = [ROUTER, "bench", scenario, "--dialect", "baqend", "--systems", "router", "--timeout", "30",
                 "--out", str(out)]
    for param in params:
        arguments += ["--param", param]
    completed = subprocess.run(arguments, cwd=ROOT, capture_output=True, text=True, timeout=120,
                               env={**os.environ, "ROUTER_RAY_DASHBOARD": "false"})
    assert completed.returncode == 0, completed.stdout + completed.stderr
    result = json.loads(out.read_text())
    assert result["scenario"] == scenario
    assert [system["system"] for system in result["systems"]] == ["router"]
    return result, completed.stdout


def test_queries_counts_every_match_of_every_write_and_what_a_write_costs(tmp_path):
    result, stdout = bench("queries", tmp_path / "queries.json",
                           "baqend.queries=20,40", "baqend.connections=4", "baqend.writes=300", "baqend.inflight=8",
                           "baqend.rest_connections=4", "baqend.rounds=2")
    rows = result["results"]
    assert [(row["case"], row["queries"]) for row in rows] == [
        ("20 queries x 4 conns, 300 writes, round 1", 20), ("40 queries x 4 conns, 300 writes, round 1", 40),
        ("40 queries x 4 conns, 300 writes, round 2", 40), ("20 queries x 4 conns, 300 writes, round 2", 20)]
    for row in rows:
        groups = row["queries"] // 10
        # Each write matches 10 queries; the sorted one of its group (limit 10) also sends a
        # remove for every write past the tenth to that group.
        removes = groups * (300 // groups - 10)
        assert row["received"] == row["expected"] == 300 * 10 + removes, row
        assert row["gateway_frames_written"] == row["expected"], row
        assert (row["dialect"], row["system"], row["metric"]) == ("baqend", "router", "matched writes/s")
        assert (row["writes"], row["connections"], row["matches_per_write"]) == (300, 4, 10)
        assert row["value"] > 0 and row["events_per_s"] > row["value"], row
        assert set(row["cpu_us_per_write"]) == {"gateway", "session", "topic", "document", "query"}, row
        assert row["shards_cpu_us_per_write"] > 0 and "not received" not in row["notes"], row
    assert "matched writes/s" in stdout
    # The curve after the table: each point the median of its two rounds.
    [summary] = result["summaries"]
    assert summary["name"].startswith("Baqend matching cost flat from 20 to 40 queries")
    assert [(point["queries"], point["runs"]) for point in summary["points"]] == [(20, 2), (40, 2)]
    for point in summary["points"]:
        measured = [row["cpu_us_per_write"]["query"] for row in rows if row["queries"] == point["queries"]]
        assert point["runs_query_us_per_write"] == measured
        assert point["query_us_per_write"] == sum(measured) / 2
    assert f"{summary['name']}: {summary['figure']}: {'met' if summary['met'] else 'not met'}" in stdout


def test_latency_times_each_write_to_each_of_its_events(tmp_path):
    result, _ = bench("latency", tmp_path / "latency.json",
                      "baqend.rate=200", "baqend.seconds=1", "baqend.latency_queries=30", "baqend.connections=3")
    [row] = result["results"]
    assert "summaries" not in result  # no curve without the queries scenario
    assert (row["case"], row["metric"], row["compare"]) == ("200 writes/s x 30 queries", "p99_ms",
                                                          "1,000 msg/s x 100 subs")
    # Only the add/insert events are timed: each of the 200 writes reaches its 10 queries once.
    assert row["received"] == row["expected"] == row["samples"] == 2000, row
    assert row["writes"] == 200 and row["queries"] == 30
    assert 0 < row["p50_ms"] <= row["p99_ms"] == row["value"] <= row["p99.9_ms"] <= row["max_ms"], row
    assert row["notes"].startswith(f"p50 {row['p50_ms']:.2f} ms"), row
