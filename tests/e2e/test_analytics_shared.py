"""One event log for many routers: two routers in one Ray namespace (as on two nodes: each with its
own data_dir) write to the same ``analytics.directory``, given as a ``file://`` URL, and
``router analytics`` reports the traffic of both, exactly. One Spark run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import ray

from tests.e2e.client import HubClient, run
from tests.e2e.conftest import start_router

ROOT = Path(__file__).resolve().parents[2]
ROUTER = str(Path(sys.executable).with_name("router"))


class Tally:
    """What each gateway must have logged: messages in, and deliveries out, with their bytes."""

    def __init__(self) -> None:
        self.messages_in: Counter[str] = Counter()
        self.bytes_in: Counter[str] = Counter()
        self.delivered: Counter[str] = Counter()
        self.bytes_out: Counter[str] = Counter()

    async def send(self, client: HubClient, gateway: str, message: dict, delivered_by: tuple[str, ...] = ()) -> None:
        frame = json.dumps(message)
        size = len(frame.encode())
        self.messages_in[gateway] += 1
        self.bytes_in[gateway] += size
        for receiver in delivered_by:
            self.delivered[receiver] += 1
            self.bytes_out[receiver] += size
        await client.send_raw(frame)


@pytest.fixture(scope="module")
def two_routers(ray_runtime, tmp_path_factory):
    shared = tmp_path_factory.mktemp("shared-events")
    common = dict(
        namespace="e2e-analytics-shared", port=0, gateways=1, ray_dashboard=False,
        shards={"session": 1, "topic": 1, "registry": 1},
        signal={"rate_limit_per_minute": 1e9},
        analytics={"flush_interval_s": 3600, "directory": shared.as_uri()},  # the test flushes when it wants
    )
    first = start_router(data_dir=tmp_path_factory.mktemp("node-a"), **common)
    try:
        second = start_router(data_dir=tmp_path_factory.mktemp("node-b"), **common)
    except BaseException:
        first.router.stop()
        raise
    yield first, second, shared
    second.router.stop()
    first.router.stop()


@pytest.mark.timeout(600)
def test_router_analytics_reports_the_traffic_of_two_routers_sharing_one_log(two_routers, ray_runtime, tmp_path):
    first, second, shared = two_routers
    a = first.router.gateways[0].gateway_id
    b = second.router.gateways[0].gateway_id
    tally = Tally()

    async def scenario():
        x = await HubClient.open(first.ws_urls[0], "sh/x", hello=False)
        z = await HubClient.open(first.ws_urls[0], "sh/z", hello=False)
        y = await HubClient.open(second.ws_urls[0], "sh/y", hello=False)
        for client, gateway in ((x, a), (z, a), (y, b)):
            await tally.send(client, gateway, client.envelope("hub:connect", {"version": "1.0"}))
            assert (await client.recv())["type"] == "hub:connected"
        for client, gateway in ((x, a), (y, b)):
            await tally.send(client, gateway, client.envelope("hub:register", {"actorAddress": client.address}))
            await client.recv()
        for client, gateway in ((y, b), (z, a)):
            await tally.send(client, gateway, client.envelope("hub:subscribe", {"topic": "sh/news"}))
            await client.recv()
        for n in range(7):  # router A → an actor on router B
            await tally.send(x, a, x.envelope("hub:send", {"n": n}, to="sh/y"), delivered_by=(b,))
        for _ in range(7):
            assert (await y.recv())["type"] == "hub:send"
        for n in range(4):  # router B → an actor on router A
            await tally.send(y, b, y.envelope("hub:send", {"n": n, "pad": "y" * n}, to="sh/x"), delivered_by=(a,))
        for _ in range(4):
            assert (await x.recv())["type"] == "hub:send"
        for n in range(3):  # a publish on A, delivered by both
            await tally.send(x, a, x.envelope("hub:publish", {"topic": "sh/news", "message": n}), delivered_by=(a, b))
        for _ in range(3):
            assert (await y.recv())["type"] == "hub:publish"
            assert (await z.recv())["type"] == "hub:publish"
            assert (await x.recv())["type"] == "hub:delivery_ack"
        for client in (x, y, z):
            await client.close()

    run(scenario())
    assert (tally.messages_in[a], tally.delivered[a], tally.messages_in[b], tally.delivered[b]) == (14, 7, 7, 10)
    rows_a, rows_b = ray.get([router.router.gateways[0].actor.flush_events.remote() for router in (first, second)],
                             timeout=60)
    assert (rows_a, rows_b) == (14 + 7, 7 + 10)

    # One folder holds both writers' files, named apart by gateway and node; neither data_dir has a log.
    node = ray.get_runtime_context().get_node_id()[:12]
    names = [path.name for path in shared.glob("date=*/hour=*/*.parquet")]
    assert names and all(name.startswith((f"{a}-{node}-", f"{b}-{node}-")) for name in names)
    assert {name.startswith(a) for name in names} == {True, False}
    assert not list(shared.rglob(".*"))
    for router in (first, second):
        assert not (router.settings.data_dir / "events").exists()

    out = tmp_path / "report"
    result = subprocess.run(
        [ROUTER, "analytics", "--address", ray_runtime, "--since", "1h", "--out", str(out), "--window", "5s"],
        cwd=ROOT, capture_output=True, text=True, timeout=540,
        env=os.environ | {"ROUTER_ANALYTICS__DIRECTORY": shared.as_uri()},  # no --events: the setting
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"analytics: read 38 events from {shared.as_uri()}\n" in result.stdout

    summary = pd.read_parquet(out / "summary.parquet").set_index("dialect").loc["signal"]
    assert int(summary["messages_in"]) == 21 == sum(tally.messages_in.values())
    assert int(summary["bytes_in"]) == sum(tally.bytes_in.values())
    assert int(summary["delivered"]) == 17 == sum(tally.delivered.values())
    assert int(summary["bytes_out"]) == sum(tally.bytes_out.values())
    assert int(summary["rejected"]) == 0 and int(summary["dropped"]) == 0

    per_gateway = pd.read_parquet(out / "top_connections.parquet").groupby("gateway")[
        ["messages_in", "bytes_in", "deliveries", "bytes_out"]].sum()
    assert {gateway: tuple(int(v) for v in row) for gateway, row in per_gateway.iterrows()} == {
        gateway: (tally.messages_in[gateway], tally.bytes_in[gateway], tally.delivered[gateway],
                  tally.bytes_out[gateway])
        for gateway in (a, b)
    }
