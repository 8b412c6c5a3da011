"""Baqend's document shards forward their writes to the query shards over lanes
(``BaqendDocuments._send``, docs/baqend.md): a query shard killed while writes flow breaks every
document shard's lane to it; the writes of that moment go by Ray call (which waits for the
restarted shard, then is refused while it heals and sent again), and once it is back each document
shard opens a fresh lane, over which every later write reaches the live queries, exactly once and
in order."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
import ray

from actors.baqend.contract import object_key
from router.shardmap import shard_index, shard_name
from tests.e2e.baqend_client import Events, Rest, brief
from tests.e2e.client import eventually, run
from tests.e2e.conftest import RunningRouter, start_router
from tests.e2e.kills import kill_shard, shard_info
from tests.e2e.test_baqend import SCHEMA, urls

pytestmark = pytest.mark.e2e

DOCUMENT_SHARDS = 2


@pytest.fixture(scope="module")
def forwarding(ray_runtime, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="e2e-baqend-forward-lanes", data_dir=tmp_path_factory.mktemp("baqend-forward-lanes"), port=0,
        gateways=1, ray_dashboard=False,
        shards={"session": 1, "topic": 1, "registry": 1, "document": DOCUMENT_SHARDS, "query": 1},
        signal={"enabled": False}, cashu={"enabled": False}, mx={"enabled": False}, nolag={"enabled": False},
        analytics={"enabled": False},
        baqend={"schema": SCHEMA, "rest_rate_limit_per_minute": 6_000_000, "rest_rate_limit_burst": 100_000},
    )
    yield running
    running.router.stop()


def one_per_shard(bucket: str, prefix: str) -> list[str]:
    """Keys of ``bucket``, the first on document shard 0, the next on 1, and so on (round robin)."""
    keys, wanted = [], itertools.cycle(range(DOCUMENT_SHARDS))
    target = next(wanted)
    for n in itertools.count():
        key = f"{prefix}{n}"
        if shard_index(object_key(bucket, key), DOCUMENT_SHARDS) == target:
            keys.append(key)
            if len(keys) == 2 * DOCUMENT_SHARDS:
                return keys
            target = next(wanted)


def forwarded(running: RunningRouter) -> list[dict]:
    """Each document shard's forwarding counters."""
    return [{name: value for name, value in shard_info(running.router, "document", index).items()
             if name.startswith("forward_")} for index in range(DOCUMENT_SHARDS)]


def test_writes_reach_the_live_queries_over_fresh_lanes_after_the_query_shard_is_killed(forwarding):
    """Before: the document shards forwarded every batch by Ray call; there was no lane to break."""
    ((events_url, rest_url),) = urls(forwarding)
    bucket, noise = f"Fwd{time.monotonic_ns()}", f"Noise{time.monotonic_ns()}"

    async def scenario():
        client = await Events.open(events_url)
        try:
            async with Rest(rest_url) as rest:
                await client.subscribe("live", bucket, query={"on": True}, initial=True)
                assert await client.result("live") == []
                first = one_per_shard(bucket, "a")
                for key in first:
                    await rest.insert(bucket, key, on=True)
                assert await client.matches(len(first)) == [("add", "insert", key, None) for key in first]

                flowing, written = True, []

                async def flow():  # writes to both document shards until told to stop, one at a time
                    for n in itertools.count():
                        if not flowing:
                            return
                        failed = False
                        while True:  # a write that met the dying process answers 503: again
                            status, body = await rest.call("POST", f"/db/{noise}", {"id": f"/db/{noise}/w{n}"})
                            if status == 201 or (status == 409 and failed):  # 409: the failed try stored it
                                break
                            assert status in (500, 503, 504), (status, body)
                            failed = True
                        written.append(f"w{n}")

                writer = asyncio.create_task(flow())

                async def on_lanes():  # the first batch of each document shard went by Ray call
                    assert not writer.done(), writer
                    counters = await asyncio.to_thread(forwarded, forwarding)
                    return len(written) >= 4 and all(c["forward_lanes"] == 1 for c in counters)

                await eventually(on_lanes, timeout=15, what="writes flowing over lanes")
                query = shard_info(forwarding.router, "query")
                assert query["shard_lanes"] == [shard_name("document", i) for i in range(DOCUMENT_SHARDS)]
                assert query["lanes"] == [forwarding.router.gateways[0].gateway_id]  # the gateway's only
                _, epoch = kill_shard(forwarding.router, "query")

                async def back_on_fresh_lanes():  # healed, its query registered again, lanes reopened
                    assert not writer.done(), writer
                    try:
                        info = await asyncio.to_thread(shard_info, forwarding.router, "query")
                    except ray.exceptions.RayError:  # still restarting
                        return False
                    counters = await asyncio.to_thread(forwarded, forwarding)
                    return (info["epoch"] != epoch and not info["healing"] and info["queries"] == 1
                            and info["loading"] == 0 and len(info["shard_lanes"]) == DOCUMENT_SHARDS
                            and all(c["forward_lanes"] == 1 and c["forward_lanes_lost"] for c in counters)
                            and counters)

                counters = await eventually(back_on_fresh_lanes, timeout=30, what="fresh lanes")
                flowing = False
                await asyncio.wait_for(writer, 30)
                assert [c["forward_lanes_lost"] for c in counters] == [1] * DOCUMENT_SHARDS  # broke once each
                before = await asyncio.to_thread(forwarded, forwarding)
                second = one_per_shard(bucket, "b")
                for key in second:
                    await rest.insert(bucket, key, on=True)
                await rest.set(bucket, first[0], name="probe")
                # exactly these, in order: nothing from the outage (this query's result did not change)
                assert await client.matches(len(second) + 1) == (
                    [("add", "insert", key, None) for key in second] + [("change", "update", first[0], None)])
                after = await asyncio.to_thread(forwarded, forwarding)
                assert sum(a["forward_lane_batches"] - b["forward_lane_batches"] for a, b in zip(after, before)) == (
                    len(second) + 1)  # one batch each, every one over a lane
                assert [a["forward_ray_batches"] for a in after] == [b["forward_ray_batches"] for b in before]
        finally:
            await client.close()

    run(scenario(), timeout=90)
