"""Lanes, the data plane between gateways and shards (router/lane.py), through real actors."""

from __future__ import annotations

import os
import signal

import pytest
import ray

from tests.e2e.client import HubClient, eventually, run
from tests.e2e.conftest import start_router

ONLY_SIGNAL = {"cashu": {"enabled": False}, "mx": {"enabled": False}, "nolag": {"enabled": False},
               "baqend": {"enabled": False}}
SHARDS = {"session": 1, "topic": 1, "registry": 1}


def _gateway_stats(running) -> list[dict]:
    return ray.get([record.actor.stats.remote() for record in running.router.gateways], timeout=30)


async def _pubsub_across_gateways(running, prefix: str) -> None:
    """A subscriber on gateway 1, a publisher on gateway 0; and hub:send the other way."""
    subscriber = await HubClient.open(running.ws_urls[1], f"{prefix}/sub")
    publisher = await HubClient.open(running.ws_urls[0], f"{prefix}/pub")
    await subscriber.request("hub:subscribe", {"topic": f"{prefix}/news"})
    await publisher.request("hub:register", {"actorAddress": f"{prefix}/pub"})
    for n in range(20):
        ack = await publisher.request("hub:publish", {"topic": f"{prefix}/news", "message": n})
        assert ack["payload"]["subscriberCount"] == 1
    received = [(await subscriber.recv())["payload"]["message"] for _ in range(20)]
    assert received == list(range(20))
    await subscriber.send("hub:send", {"back": True}, to=f"{prefix}/pub")
    assert (await publisher.recv())["payload"] == {"back": True}
    await subscriber.close()
    await publisher.close()


@pytest.fixture(scope="module")
def laned(ray_runtime, tmp_path_factory):
    running = start_router(namespace="e2e-lanes", port=0, gateways=2, ray_dashboard=False,
                           data_dir=tmp_path_factory.mktemp("lanes-data"), shards=SHARDS,
                           signal={"request_timeout_s": 2.0}, **ONLY_SIGNAL)
    yield running
    running.router.stop()


def test_every_gateway_has_a_lane_to_every_shard_and_traffic_takes_it(laned):
    before = _gateway_stats(laned)
    assert [stats["shard_client"]["lanes"] for stats in before] == [3, 3]
    gateway_ids = sorted(record.gateway_id for record in laned.router.gateways)
    for shards in laned.router.shards.values():
        assert sorted(ray.get(shards[0].info.remote())["lanes"]) == gateway_ids

    run(_pubsub_across_gateways(laned, "lane"))

    after = _gateway_stats(laned)
    for old, new in zip(before, after):
        sent = new["shard_client"]["batches"] - old["shard_client"]["batches"]
        assert sent > 0
        assert new["shard_client"]["lane_batches"] - old["shard_client"]["lane_batches"] == sent  # none by Ray
    assert sum(stats["delivered"] for stats in after) - sum(stats["delivered"] for stats in before) >= 21


def test_a_crashed_shard_comes_back_and_the_lanes_reopen(laned):
    shard = laned.router.shards["topic"][0]
    old = ray.get(shard.info.remote())
    os.kill(old["pid"], signal.SIGKILL)

    async def scenario():
        client = await HubClient.open(laned.ws_urls[0], "lane/survivor")

        async def subscribed():
            reply = await client.request("hub:subscribe", {"topic": "lane/after"})
            return reply["type"] == "hub:subscribed"

        # Requests fail (internal_error / timeout) until Ray has restarted the shard, then work.
        await eventually(subscribed, timeout=60, interval=0.2)
        ack = await client.request("hub:publish", {"topic": "lane/after", "message": "back"})
        assert ack["payload"]["subscriberCount"] == 1
        assert (await client.recv())["payload"]["message"] == "back"
        await client.close()

    run(scenario(), timeout=90)
    new = ray.get(shard.info.remote())
    assert new["pid"] != old["pid"] and new["epoch"] != old["epoch"]

    async def reopened():
        stats = _gateway_stats(laned)
        return all(s["shard_client"]["lanes"] == 3 for s in stats) and stats

    stats = run(eventually(reopened, timeout=30, interval=0.2))
    assert all(s["shard_client"]["lanes_lost"] >= 1 for s in stats)
    assert len(ray.get(shard.info.remote())["lanes"]) == 2
    run(_pubsub_across_gateways(laned, "lane2"))


def test_with_lanes_off_every_hop_is_a_ray_call(ray_runtime, tmp_path_factory):
    running = start_router(namespace="e2e-nolanes", port=0, gateways=2, ray_dashboard=False,
                           data_dir=tmp_path_factory.mktemp("nolanes-data"), shards=SHARDS,
                           gateway={"lanes": False}, **ONLY_SIGNAL)
    try:
        run(_pubsub_across_gateways(running, "ray"))
        stats = _gateway_stats(running)
        assert [s["shard_client"]["lanes"] for s in stats] == [0, 0]
        assert [s["shard_client"]["lane_batches"] for s in stats] == [0, 0]
        assert all(s["shard_client"]["batches"] > 0 for s in stats)
        assert ray.get(running.router.shards["topic"][0].info.remote())["lanes"] is None
    finally:
        running.router.stop()
