"""`router bench` as a user runs it: a tiny fanout against the router and the baselines, checked
through its JSON result file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROUTER = str(Path(sys.executable).with_name("router"))


def test_router_bench_fanout_measures_the_router_and_the_baselines(tmp_path):
    out, picture = tmp_path / "bench-fanout.json", tmp_path / "bench.png"
    systems = ["raw", "router"] + (["redis"] if shutil.which("redis-server") else [])
    completed = subprocess.run(
        [ROUTER, "bench", "fanout", "--subscribers", "10", "--deliveries", "40000", "--router-deliveries", "60000",
         "--systems", ",".join(systems),
         "--timeout", "40", "--pin-gateway", "--out", str(out), "--plot", str(picture)],
        cwd=ROOT, capture_output=True, text=True, timeout=150,
        env={**os.environ, "ROUTER_RAY_DASHBOARD": "false"},
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    result = json.loads(out.read_text())
    assert result["scenario"] == "fanout" and result["machine"]["cpus"] >= 1
    rows = {row["system"]: row for row in result["results"]}
    assert set(rows) == set(systems)
    for system, row in rows.items():
        assert row["case"] == "S=10" and row["metric"] == "deliveries/s"
        # a router's fan-out carries --router-deliveries (long enough for its steady state), a baseline's --deliveries
        assert row["received"] == row["expected"] == (60_000 if system == "router" else 40_000), row
        assert row["value"] > 0, row
        # CPU is sampled every 50 ms: over a run this short a figure may round to 0, never be missing.
        assert row["server_cpu_pct"] >= 0 and row["loadgen_cpu_pct"] >= 0, row
    assert rows["raw"]["ratio_to_raw"] == 1.0 and rows["router"]["ratio_to_raw"] > 0
    # --pin 0 (the default) and --pin-gateway: each server's busy process (raw's, Redis's, the
    # router's one gateway; every thread) on CPU 0, the load generators and the router's other
    # processes on the others.
    cpus = result["machine"]["cpus"]
    rest = list(range(1, cpus)) or [0]
    for system, row in rows.items():
        assert row["cpus"]["server"] == [0] and row["cpus"]["loadgen"] == rest, row
    assert rows["router"]["cpus"]["shards"] == rest
    assert {d["system"]: d["pinned_cpu"] for d in result["systems"]} == {system: 0 for system in systems}
    assert "shards_cpu_pct" in rows["router"]
    assert picture.stat().st_size > 0
    assert "fanout" in completed.stdout and "x raw" in completed.stdout


def test_router_bench_lanes_measures_both_kinds_of_lane(tmp_path):
    out = tmp_path / "bench-lanes.json"
    completed = subprocess.run([ROUTER, "bench", "lanes", "--lane-seconds", "0.3", "--out", str(out)],
                               cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    rows = json.loads(out.read_text())["results"]
    assert [row["lane"] for row in rows] == ["unix", "tcp"]
    for row in rows:
        assert row["commands_per_s"] > 0 and 0 < row["rtt_p50_us"] <= row["rtt_p99_us"] and row["connect_ms"] > 0, row
    assert "unix: open + 1 call" in completed.stdout and "tcp: open + 1 call" in completed.stdout


def test_router_bench_targets_alternates_raw_and_one_router_of_signal_hub_and_nolag(tmp_path):
    out, table = tmp_path / "bench-targets.json", tmp_path / "targets.md"
    completed = subprocess.run(
        [ROUTER, "bench", "targets", "--target-rounds", "2", "--messages-s1", "2000", "--p2p-messages", "2000",
         "--router-deliveries", "20000", "--pairs", "4", "--timeout", "40", "--out", str(out),
         "--markdown", str(table)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={**os.environ, "ROUTER_RAY_DASHBOARD": "false"},
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    result = json.loads(out.read_text())
    rows = result["target_rounds"]
    # round 1: raw's cases, then the router's; round 2: the router's reversed, then raw's reversed
    order = [(row["round"], row["system"], row["dialect"], row["scenario"], row["base_case"]) for row in rows]
    first = [(1, "raw", "-", "fanout", "S=1"), (1, "raw", "-", "p2p", "4 pairs"),
             (1, "router", "signal", "fanout", "S=1"), (1, "router", "signal", "p2p", "4 pairs"),
             (1, "router", "signal", "fanout", "S=100"), (1, "router", "nolag", "fanout", "S=100"),
             (1, "router", "nolag", "fanout", "S=100 QoS 1")]
    second = [(2, *item[1:]) for item in first[2:][::-1] + first[:2][::-1]]
    assert order == first + second
    expected = {"S=1": 2_000, "4 pairs": 2_000, "S=100": 20_000, "S=100 QoS 1": 20_000}
    for row in rows:
        assert row["case"] == f"{row['base_case']}, round {row['round']}"
        assert row["received"] == row["expected"] == expected[row["base_case"]], row
        assert row["value"] > 0 and "notes" not in row, row
    # NoLag's cases ran on the router Signal Hub's did (the same gateway process in a round), a
    # fresh one each round
    routers = [{tuple(row["gateway_pids"]) for row in rows if row["round"] == number and row["system"] == "router"}
               for number in (1, 2)]
    assert all(len(pids) == 1 for pids in routers) and routers[0] != routers[1]
    value = {(row["round"], row["dialect"], row["scenario"], row["base_case"]): row["value"] for row in rows}
    summary = {item["target"]: item for item in result["targets"]}
    assert list(summary) == ["Signal Hub fanout S=1 ≥ 1.0 × raw", "Signal Hub p2p ≥ 1.0 × raw",
                             "NoLag QoS 0 fanout S=100 ≥ 0.7 × Signal Hub", "NoLag QoS 1 fanout S=100 ≥ 0.5 × Signal Hub"]
    qos1 = summary["NoLag QoS 1 fanout S=100 ≥ 0.5 × Signal Hub"]
    ratios = [round(value[n, "nolag", "fanout", "S=100 QoS 1"] / value[n, "signal", "fanout", "S=100"], 6) for n in (1, 2)]
    assert qos1["ratios"] == ratios and qos1["median"] == round((ratios[0] + ratios[1]) / 2, 6)
    s1 = summary["Signal Hub fanout S=1 ≥ 1.0 × raw"]
    assert s1["ratios"] == [round(value[n, "signal", "fanout", "S=1"] / value[n, "-", "fanout", "S=1"], 6) for n in (1, 2)]
    assert "| target | goal | round 1 | round 2 | median | met |" in table.read_text()
    assert "median" in completed.stdout
