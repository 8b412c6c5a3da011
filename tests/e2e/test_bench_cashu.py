"""`router bench notify|latency --dialect cashu` as a user runs them: tiny cases against the router,
checked through the JSON result file (every notification counted, none extra)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ROUTER = str(Path(sys.executable).with_name("router"))
# 4 wallets holding 8 subscriptions over 4 quotes: 2 subscriptions per quote.
LAYOUT = ["--param", "cashu.connections=4", "--param", "cashu.subscriptions=8", "--param", "cashu.objects=4"]


def bench(tmp_path: Path, scenario: str, *arguments: str) -> tuple[dict, str]:
    out = tmp_path / f"bench-{scenario}.json"
    completed = subprocess.run(
        [ROUTER, "bench", scenario, "--dialect", "cashu", "--systems", "router", "--timeout", "30",
         "--out", str(out), *arguments],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "ROUTER_RAY_DASHBOARD": "false"},
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    result = json.loads(out.read_text())
    assert result["scenario"] == scenario
    assert [row["system"] for row in result["results"]] == ["router"]
    return result["results"][0], completed.stdout


def test_notify_counts_every_state_reaching_every_subscription(tmp_path):
    row, stdout = bench(tmp_path, "notify", *LAYOUT, "--param", "cashu.rounds=5", "--param", "cashu.batch=3")
    assert row["case"] == "4 wallets x 8 subs, 4 quotes" and row["dialect"] == "cashu"
    assert row["metric"] == "notifications/s" and row["value"] > 0
    assert row["subscriptions"] == 8 and row["rounds"] == 5
    assert row["states_pushed"] == 4 * 5  # every quote, every round
    assert row["received"] == row["expected"] == 8 * 5
    assert row["gateway_frames_written"] == 8 * 5  # the gateway's own count: no frame more than the notifications
    assert row["server_cpu_pct"] >= 0 and row["shards_cpu_pct"] >= 0 and row["loadgen_cpu_pct"] >= 0
    assert row["loadgen_processes"] == 3  # two wallet processes, one pusher
    assert "notify" in stdout and "notifications/s" in stdout


def test_latency_reads_the_push_time_in_every_notification(tmp_path):
    row, stdout = bench(tmp_path, "latency", *LAYOUT, "--rate", "200", "--latency-seconds", "1",
                        "--latency-subscribers", "4")
    assert row["case"] == "200 states/s x 8 subs" and row["metric"] == "p99_ms"
    assert row["states_pushed"] == 200
    assert row["received"] == row["expected"] == 200 * 2  # each state reaches its quote's 2 subscriptions
    assert row["samples"] == 400  # every notification carried its push's send time
    assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["p99.9_ms"] <= row["max_ms"]
    assert row["value"] == row["p99_ms"]
    assert "latency" in stdout and "p99_ms" in stdout
