"""`router bench` through NoLag as a user runs it: every scenario of the dialect in one run (the
shared ones, fan-out at QoS 1 with acknowledgements, load-balance groups), tiny, checked through
its JSON result file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROUTER = str(Path(sys.executable).with_name("router"))


def test_router_bench_runs_every_nolag_scenario_with_exact_counts(tmp_path):
    out = tmp_path / "bench-all-nolag.json"
    completed = subprocess.run(
        [ROUTER, "bench", "all", "--dialect", "nolag", "--systems", "router", "--subscribers", "100",
         "--deliveries", "20000", "--router-deliveries", "20000", "--connections", "200", "--latency-seconds", "1", "--rate", "200",
         "--latency-subscribers", "5", "--churn-seconds", "1", "--param", "nolag.members=50",
         "--timeout", "30", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=150,
        env={**os.environ, "ROUTER_RAY_DASHBOARD": "false"},
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    rows = {(row["scenario"], row["case"]): row for row in json.loads(out.read_text())["results"]}
    assert set(rows) == {
        ("fanout", "S=100"), ("topics", "100 topics x 10 subs, 10 pubs"), ("latency", "200 msg/s x 5 subs"),
        ("connections", "200 idle"), ("churn", "50 concurrent"), ("fanout", "S=100 QoS 1"),
        ("groups", "50 subs in 10 groups"),
    }
    assert all(row["dialect"] == "nolag" and row["system"] == "router" for row in rows.values())
    # without --pin-gateway the router's processes and its load generators are where the system puts them
    everywhere = sorted(os.sched_getaffinity(0))
    for row in rows.values():
        if "cpus" in row:
            assert row["cpus"] == {"server": everywhere, "shards": everywhere, "loadgen": everywhere}, row

    fanout, qos1 = rows["fanout", "S=100"], rows["fanout", "S=100 QoS 1"]
    groups = rows["groups", "50 subs in 10 groups"]
    for row in (fanout, qos1, groups, rows["topics", "100 topics x 10 subs, 10 pubs"]):
        assert row["metric"] == "deliveries/s" and row["value"] > 0, row
        assert row["received"] == row["expected"] == 20_000, row
        # the gateway's own count: nothing written to anyone but the receivers, nothing twice
        assert row["gateway_frames_written"] == 20_000, row
        assert "notes" not in row, row
    # the event log kept every message and delivery of each case, written before the next began:
    # a publish's row and its deliveries' (at QoS 1 the receivers' batchAcks too), none dropped
    publishes = {"topics": 2_000, "groups": 2_000}
    for key, row in rows.items():
        assert row["eventlog_dropped"] == 0, row
    assert fanout["eventlog_rows"] == 20_000 + 200, fanout
    assert rows["topics", "100 topics x 10 subs, 10 pubs"]["eventlog_rows"] == 20_000 + publishes["topics"]
    assert groups["eventlog_rows"] == 20_000 + publishes["groups"], groups
    # a receiver's last batchAck may still be on its way when the case's count is taken (it then
    # counts in the next case's set-up, written before that case starts)
    assert 20_000 + 200 + qos1["batch_acks"] - 100 <= qos1["eventlog_rows"] <= 20_000 + 200 + qos1["batch_acks"], qos1
    assert rows["connections", "200 idle"]["eventlog_rows"] == 0
    assert "compare" not in fanout
    assert qos1["compare"] == "S=100"
    # each of the 100 subscribers acked its 200 messages in batches of at most 100
    assert qos1["duplicates"] == 0 and qos1["batch_acks"] >= 100 * 2, qos1
    latency = rows["latency", "200 msg/s x 5 subs"]
    assert latency["received"] == latency["expected"] == latency["samples"] == 1_000, latency
    assert rows["connections", "200 idle"]["open"] == 200
    churn = rows["churn", "50 concurrent"]
    assert churn["cycles"] > 0 and churn["errors"] == 0, churn
