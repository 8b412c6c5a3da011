"""Event log → Spark (RayDP) report, and live metrics: exact counts from real traffic."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
import ray

from tests.e2e.client import HubClient, eventually, run
from tests.e2e.conftest import start_router

ROOT = Path(__file__).resolve().parents[2]
ROUTER = str(Path(sys.executable).with_name("router"))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Ledger:
    """What the test sent, to compare with what Spark computes."""

    def __init__(self) -> None:
        self.accepted = 0
        self.bytes_in = 0
        self.rejected: dict[str, int] = {}
        self.rejected_bytes = 0
        self.delivered = 0
        self.bytes_out = 0
        self.dropped: dict[str, int] = {}

    async def send(self, client: HubClient, message: dict, deliveries: int = 0) -> str:
        frame = json.dumps(message)
        size = len(frame.encode())
        self.accepted += 1
        self.bytes_in += size
        self.delivered += deliveries
        self.bytes_out += deliveries * size
        await client.send_raw(frame)
        return frame


@pytest.fixture(scope="module")
def traffic(ray_runtime, tmp_path_factory):
    data = tmp_path_factory.mktemp("analytics-data")
    running = start_router(
        namespace="e2e-analytics", port=0, gateways=2, ray_dashboard=False, data_dir=data,
        shards={"session": 1, "topic": 2, "registry": 2},
        signal={"rate_limit_per_minute": 1e9},
        analytics={"flush_interval_s": 3600},  # the test flushes when it wants
    )
    ledger = Ledger()

    async def scenario():
        a = await HubClient.open(running.ws_urls[0], "an/a", hello=False)
        b = await HubClient.open(running.ws_urls[1], "an/b", hello=False)
        c = await HubClient.open(running.ws_urls[1], "an/c", hello=False)
        for client in (a, b, c):
            await ledger.send(client, client.envelope("hub:connect", {"version": "1.0"}))
            await client.recv()
        await ledger.send(b, b.envelope("hub:register", {"actorAddress": "an/b"}))
        await b.recv()
        for client in (b, c):
            await ledger.send(client, client.envelope("hub:subscribe", {"topic": "an/news"}))
            await client.recv()
        for n in range(30):
            await ledger.send(a, a.envelope("hub:send", {"n": n, "pad": "x" * n}, to="an/b"), deliveries=1)
        for n in range(20):
            await ledger.send(a, a.envelope("hub:publish", {"topic": "an/news", "message": n}), deliveries=2)
        for _ in range(30):
            await b.recv()
        for _ in range(20):
            await b.recv()
            await c.recv()
        for _ in range(20):
            assert (await a.recv())["type"] == "hub:delivery_ack"
        await ledger.send(a, a.envelope("hub:send", {"x": 1}, to="an/nobody", correlationId="lost"))
        assert (await a.recv())["payload"]["code"] == "unknown_actor"
        ledger.dropped["unknown_actor"] = 1
        broken = '{"type": "hub:heartbeat", "from": "an/a"'
        await a.send_raw(broken)
        assert (await a.recv())["payload"]["details"]["reason"] == "parse_error"
        ledger.rejected["parse_error"] = 1
        ledger.rejected_bytes += len(broken)
        for client in (a, b, c):
            await client.close()

    run(scenario())
    flushed = ray.get([g.actor.flush_events.remote() for g in running.router.gateways], timeout=60)
    assert sum(flushed) > 0
    yield running, ledger, running.settings.events_dir
    running.router.stop()


def _check_report(frames: dict[str, pd.DataFrame], ledger: Ledger) -> None:
    summary = frames["summary"].set_index("dialect").loc["signal"]
    assert int(summary["messages_in"]) == ledger.accepted
    assert int(summary["bytes_in"]) == ledger.bytes_in
    assert int(summary["delivered"]) == ledger.delivered
    assert int(summary["bytes_out"]) == ledger.bytes_out
    assert int(summary["rejected"]) == 1 and int(summary["dropped"]) == 1

    drops = {(row.outcome, row.reason): (row.count, row.bytes) for row in frames["drops"].itertuples()}
    assert drops[("rejected", "parse_error")] == (1, ledger.rejected_bytes)
    assert drops[("dropped", "unknown_actor")][0] == 1

    fanout = frames["fanout"].set_index("kind")
    assert int(fanout.loc["hub:publish", "messages"]) == 20
    assert int(fanout.loc["hub:publish", "deliveries"]) == 40
    assert float(fanout.loc["hub:publish", "mean"]) == 2.0 and int(fanout.loc["hub:publish", "max"]) == 2
    assert int(fanout.loc["hub:send", "messages"]) == 31  # including the one to an unknown actor
    assert int(fanout.loc["hub:send", "deliveries"]) == 30

    latency = frames["latency"].set_index("dialect").loc["signal"]
    assert int(latency["deliveries"]) == ledger.delivered
    assert 0 < latency["p50_ms"] <= latency["p90_ms"] <= latency["p99_ms"] <= latency["max_ms"] < 10_000

    throughput = frames["throughput"]
    assert int(throughput[throughput["direction"] == "in"]["messages"].sum()) == ledger.accepted
    assert int(throughput[throughput["direction"] == "out"]["bytes"].sum()) == ledger.bytes_out

    topics = frames["top_topics"].set_index("topic")
    assert int(topics.loc["an/news", "messages_in"]) == 22  # 20 publishes + 2 subscribes
    assert int(topics.loc["an/news", "deliveries"]) == 40
    assert int(topics.loc["an/b", "deliveries"]) == 30
    connections = frames["top_connections"]
    assert int(connections["deliveries"].sum()) == ledger.delivered


def _valid_png(path: Path) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    height, width = matplotlib.image.imread(path).shape[:2]
    assert height > 100 and width > 100


def test_router_analytics_command_reports_exactly_what_was_sent(traffic, ray_runtime, tmp_path):
    running, ledger, events_dir = traffic
    out = tmp_path / "report"
    result = subprocess.run(
        [ROUTER, "analytics", "--address", ray_runtime, "--events", str(events_dir), "--since", "1h",
         "--out", str(out), "--window", "5s"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "analytics: starting Spark on Ray (RayDP)" in result.stdout
    assert "analytics: computing latency" in result.stdout
    assert "Delivery latency (ms)" in result.stdout and "Drops and rejections by reason" in result.stdout
    assert f"report written to {out.resolve()}:" in result.stdout
    frames = {name: pd.read_parquet(out / f"{name}.parquet") for name in
              ("summary", "throughput", "latency", "fanout", "drops", "top_topics", "top_connections")}
    _check_report(frames, ledger)
    assert pd.read_csv(out / "summary.csv")["messages_in"].tolist() == [ledger.accepted]
    for name in ("throughput.png", "latency.png"):
        _valid_png(out / name)


def test_report_as_a_library_returns_spark_dataframes(traffic, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import DataFrame

    from router.analytics import TABLES, compute_report, load_events, spark_session
    from router.eventlog import SCHEMA, read_events

    running, ledger, events_dir = traffic
    # The log beside a file of the earlier layout (a row per delivery, one `connection`), in one of its hours.
    mixed = tmp_path / "mixed"
    shutil.copytree(events_dir, mixed)
    ours = read_events(mixed)
    assert ours.num_rows == ledger.accepted + ledger.delivered + 2  # a rejection, a drop
    first = min(ours["ts_ns"].to_pylist())
    old = [{**ours.slice(0, 1).to_pylist()[0], "ts_ns": first - 1, "direction": "out", "outcome": "delivered",
            "connection": c, "latency_ns": 1} for c in (-7, -8)]
    pq.write_table(pa.Table.from_pylist(old, schema=SCHEMA), next(mixed.glob("date=*/hour=*")) / "old-0-0-2.parquet")
    copies = _jni_copies()
    with spark_session() as spark:
        events = load_events(spark, events_dir)
        assert isinstance(events, DataFrame)
        tables = compute_report(events, window_s=5)
        assert set(tables) == set(TABLES) and all(isinstance(t, DataFrame) for t in tables.values())
        frames = {name: table.toPandas() for name, table in tables.items()}
        both = load_events(spark, mixed).toPandas()
    _check_report(frames, ledger)
    assert len(both) == ours.num_rows + 2
    assert sorted(both[both["connection"] < -1]["connection"].tolist()) == [-8, -7]  # the earlier layout's
    delivered = both[both["outcome"] == "delivered"]
    assert len(delivered) == ledger.delivered + 2
    assert _jni_copies() <= copies  # Spark's JVMs left no copy of Ray's JNI library in /tmp/ray


def _jni_copies() -> set[str]:
    from router.analytics import JNI_COPIES

    return {entry.name for entry in JNI_COPIES.iterdir() if entry.name.isdigit()} if JNI_COPIES.is_dir() else set()


def test_clear_errors_without_starting_spark(traffic, tmp_path):
    running, ledger, events_dir = traffic

    def analytics(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([ROUTER, "analytics", *args, "--out", str(tmp_path / "r")], cwd=ROOT,
                              capture_output=True, text=True, timeout=120, env=env or os.environ.copy())

    empty = analytics("--events", str(tmp_path / "empty"))
    assert empty.returncode == 1
    assert f"router analytics: the event log at {tmp_path / 'empty'} is empty" in empty.stderr

    old = analytics("--events", str(events_dir), "--since", "2001-01-01T00:00", "--until", "2001-01-01T02:00")
    assert old.returncode == 1
    assert "no events in the requested time range [2001-01-01 00:00:00 .. 2001-01-01 02:00:00] UTC" in old.stderr

    no_java = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"} | {"PATH": "/nonexistent"}
    missing = analytics("--events", str(events_dir), env=no_java)
    assert missing.returncode == 1
    assert "Java was not found" in missing.stderr and "Java 17" in missing.stderr
    assert not (tmp_path / "r").exists()


def test_metrics_are_registered_and_move_with_traffic(traffic):
    running, ledger, _ = traffic
    port = ray.nodes()[0]["MetricsExportPort"]
    gateway = running.router.gateways[0].gateway_id

    def scrape() -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()

    def value(text: str, name: str, **labels: str) -> float:
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    names = ("ray_router_messages_in_total", "ray_router_bytes_in_total", "ray_router_messages_out_total",
             "ray_router_bytes_out_total", "ray_router_delivery_latency_seconds_count",
             "ray_router_gateway_batch_size_count", "ray_router_shard_batch_size_count",
             "ray_router_shard_commands_total", "ray_router_rejections_total", "ray_router_drops_total")

    async def exported():
        # Ray's exporter publishes each process's metrics every few seconds: wait for all of them.
        text = scrape()
        return all(value(text, name) > 0 for name in names) and "ray_router_connections{" in text and text

    text = run(eventually(exported, timeout=150, interval=2), timeout=180)
    assert "ray_router_outbound_queue_bytes{" in text
    # Only this router's gateways: other tests' routers export into the same Ray session.
    def ours(name: str, **labels: str) -> float:
        return sum(value(text, name, gateway=record.gateway_id, **labels) for record in running.router.gateways)

    assert ours("ray_router_rejections_total", dialect="signal", reason="parse_error") == 1
    assert ours("ray_router_drops_total", dialect="signal", reason="unknown_actor") == 1
    assert ours("ray_router_messages_out_total", dialect="signal") == ledger.delivered
    before = value(text, "ray_router_messages_in_total", gateway=gateway, dialect="signal")
    assert before > 0

    async def more_traffic():
        client = await HubClient.open(running.ws_urls[0], "an/late")  # hub:connect is the first message
        for _ in range(5):
            await client.send("hub:heartbeat", {})
            assert (await client.recv())["type"] == "hub:heartbeat_ack"
        await client.close()

    run(more_traffic())

    async def moved():
        return value(scrape(), "ray_router_messages_in_total", gateway=gateway, dialect="signal") == before + 6

    run(eventually(moved, timeout=150, interval=2), timeout=180)
