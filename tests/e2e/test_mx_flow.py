"""mx-notifier hub flow control without acknowledgements: frames held back by the write-buffer
bound go out once the frames before them are written, whether or not the socket ever filled up.

``mx_small_buffer``: one gateway whose consumers may have at most 4 KiB unsent, and deep queues,
so a single block's fan-out is more than one write's worth for a consumer of every event.
"""

from __future__ import annotations

import pytest

from gateways.mx import codec, node
from tests.e2e.client import run
from tests.e2e.conftest import RunningRouter, start_router
from tests.e2e.mx_client import Consumer, Node
from tests.e2e.test_mx import block, hub_stats, hub_urls

pytestmark = pytest.mark.e2e

WRITE_BUFFER = 4096


@pytest.fixture(scope="module")
def mx_small_buffer(ray_runtime, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="e2e-mx-flow", data_dir=tmp_path_factory.mktemp("mx-flow-data"), port=0, gateways=1,
        ray_dashboard=False, shards={"session": 1, "topic": 1, "registry": 1}, signal={"enabled": False},
        cashu={"enabled": False}, baqend={"enabled": False}, nolag={"enabled": False},
        mx={"max_write_buffer_bytes": WRITE_BUFFER, "max_queue_depth": 100_000},
    )
    yield running
    running.router.stop()


def test_frames_queued_behind_the_write_bound_follow_without_the_socket_filling(mx_small_buffer):
    """A block's frames for an All consumer are many times the 4 KiB bound. Those past the bound
    wait in the consumer's queue; the kernel takes each turn's write at once on loopback, so the
    socket never pauses: the queue must be pumped once the turn's frames are written, not only
    when a paused socket resumes (before, the consumer stopped at the bound and never got the
    rest, and a node kept getting ACKs)."""
    node_url, consumer_url = hub_urls(mx_small_buffer, "/save")[0], hub_urls(mx_small_buffer)[0]

    async def scenario():
        saved = [block(40) for _ in range(3)]
        events = [e for b in saved for e in node.normalize_save_block(b).events]
        consumer = await Consumer.open(consumer_url)
        await consumer.subscribe("All", with_acknowledge=False)
        await consumer.barrier()
        feeder = await Node.open(node_url)
        for each in saved:
            await feeder.save(each)
        await feeder.finalize(saved[-1])
        got = await consumer.until_finalized(saved[-1].BlockData.HeaderHash.hex(), timeout=10)
        assert [m for t, m in got if t == codec.EVENTS_TOPIC] == events
        # a block's frames past the bound went through the queue, not one write of the whole block
        assert hub_stats(mx_small_buffer, 0)["mx"]["queued_ever"] > 0
        assert [t for t, _ in got if t != codec.EVENTS_TOPIC] == [codec.BLOCK_TXS_TOPIC, codec.BLOCK_SCRS_TOPIC] * 3
        assert sum(len(m.SerializeToString()) for t, m in got if t == codec.EVENTS_TOPIC) > 4 * WRITE_BUFFER
        await consumer.close()
        await feeder.close()

    run(scenario())
