"""`router bench --dialect mx` as a user runs it: a tiny node ingest to mx-notifier hub consumers,
and idle consumers, checked through the JSON result file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gateways.mx import generator, node

ROOT = Path(__file__).resolve().parents[2]
ROUTER = str(Path(sys.executable).with_name("router"))
CONSUMERS, BLOCKS, TRANSACTIONS, SEED = 8, 12, 10, 7


def bench(tmp_path: Path, *arguments: str) -> tuple[dict, str]:
    out = tmp_path / "bench.json"
    completed = subprocess.run(
        [ROUTER, "bench", *arguments, "--dialect", "mx", "--systems", "router", "--timeout", "40",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "ROUTER_RAY_DASHBOARD": "false"},
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return json.loads(out.read_text()), completed.stdout


def frames_per_block(seed: int) -> tuple[int, int, int]:
    """Of one generated block: its log events, its ESDTTransfer events, and the whole-block frames
    (transactions, SCRs) an ``All`` consumer gets."""
    saved = node.normalize_save_block(generator.generate_save_block(seed, transactions=TRANSACTIONS))
    transfers = sum(1 for event in saved.events if event.identifier == "ESDTTransfer")
    return len(saved.events), transfers, bool(saved.txs.txs) + bool(saved.scrs.scrs)


def test_ingest_delivers_every_block_to_every_filter_and_reports_the_node_side(tmp_path):
    result, stdout = bench(tmp_path, "ingest", "--param", f"mx.consumers={CONSUMERS}",
                           "--param", f"mx.blocks={BLOCKS}", "--param", f"mx.transactions={TRANSACTIONS}",
                           "--param", f"mx.seed={SEED}")
    [row] = result["results"]
    blocks = [frames_per_block(SEED + index) for index in range(BLOCKS)]
    events = sum(block[0] for block in blocks)
    everything = events + sum(block[2] for block in blocks) + 1  # and the end marker
    transfers = sum(block[1] for block in blocks) + 1
    assert (row["scenario"], row["case"], row["dialect"], row["system"], row["metric"]) == (
        "ingest", f"{CONSUMERS} consumers, {BLOCKS} blocks x {TRANSACTIONS} txs", "mx", "router", "events/s")
    assert row["complete"] is True, row["notes"]
    assert row["received"] == row["expected"] == row["gateway_frames_written"], row
    assert (row["events"], row["blocks"], row["consumers"]) == (events, BLOCKS, CONSUMERS)
    by_filter = row["by_filter"]
    assert set(by_filter) == {"All", "Identifier", "Address", "Topics"}
    assert by_filter["All"] == {"consumers": 2, "expected_each": everything, "received_min": everything,
                                "received_max": everything}
    assert by_filter["Identifier"] == {"consumers": 2, "expected_each": transfers, "received_min": transfers,
                                       "received_max": transfers}
    for kind in ("Address", "Topics"):  # filters from the first block: at least what it matched, and the end marker
        assert by_filter[kind]["consumers"] == 2 and by_filter[kind]["expected_each"] >= 2, by_filter
        assert by_filter[kind]["received_min"] == by_filter[kind]["received_max"] == by_filter[kind]["expected_each"]
    assert row["expected"] == sum(kind["consumers"] * kind["expected_each"] for kind in by_filter.values())
    assert row["value"] > 0 and row["blocks_per_s"] > 0 and row["frames_per_s"] > 0, row
    assert row["node_resends"] == 0 and row["node_gave_up"] is False and row["consumers_closed"] == 0
    waits = row["ack_wait_ms"]
    assert 0 < waits["p50"] <= waits["p99"] <= waits["max"], waits
    assert row["server_cpu_pct"] >= 0 and row["loadgen_cpu_pct"] >= 0 and "shards_cpu_pct" in row
    assert row["notes"].startswith(f"{events:,} events in {BLOCKS} blocks, {row['received']:,} frames; ack p50 ")
    assert "ingest" in stdout and "events/s" in stdout


def test_idle_consumers_are_counted_and_measured(tmp_path):
    result, _ = bench(tmp_path, "connections", "--connections", "40")
    [row] = result["results"]
    assert (row["scenario"], row["case"], row["dialect"], row["metric"]) == (
        "connections", "40 idle", "mx", "bytes_per_connection")
    assert row["open"] == 40 and row["value"] is not None, row
    assert set(row["bytes_per_connection"]) == {"server", "shards"}


def test_latency_stamps_every_event_frame_with_its_push_time(tmp_path):
    consumers, rate, seconds = 4, 20, 1
    result, _ = bench(tmp_path, "latency", "--param", f"mx.consumers={consumers}", "--param", f"mx.rate={rate}",
                      "--param", f"mx.latency_seconds={seconds}", "--param", f"mx.transactions={TRANSACTIONS}",
                      "--param", f"mx.seed={SEED}")
    [row] = result["results"]
    blocks = rate * seconds
    assert (row["scenario"], row["case"], row["dialect"], row["metric"]) == (
        "latency", f"{rate} blocks/s x {TRANSACTIONS} txs, {consumers} consumers", "mx", "p99_ms")
    assert row["complete"] is True and row["received"] == row["expected"], row["notes"]
    assert row["blocks"] == blocks and row["node_resends"] == 0
    # Every event frame carries its block's stamp; the block-level frames (transactions, SCRs, the
    # end marker) do not.
    whole_block = sum(frames_per_block(SEED + index)[2] for index in range(blocks))
    by_filter = row["by_filter"]
    assert row["samples"] == (sum(kind["consumers"] * (kind["expected_each"] - 1) for kind in by_filter.values())
                              - by_filter["All"]["consumers"] * whole_block)
    assert row["value"] == row["p99_ms"] > 0
    assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["p99.9_ms"] <= row["max_ms"]
    assert row["events_per_s"] > 0
