"""``gateway.compression``: permessage-deflate negotiated with clients that offer it; fan-out frames
built once (Signal Hub) or per consumer (mx, whose block of frames for a consumer goes to
``send_binaries``, one compressed message each) reach compressed connections whole and in order."""

from __future__ import annotations

import pytest

from gateways.mx import codec, node
from tests.e2e.client import HubClient, run
from tests.e2e.conftest import RunningRouter, start_router
from tests.e2e.mx_client import Consumer, Node
from tests.e2e.test_mx import block

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def compressed(ray_runtime, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="e2e-deflate", data_dir=tmp_path_factory.mktemp("deflate-data"), port=0, gateways=1,
        ray_dashboard=False, shards={"session": 1, "topic": 1, "registry": 1}, cashu={"enabled": False},
        baqend={"enabled": False}, nolag={"enabled": False}, gateway={"compression": True},
    )
    yield running
    running.router.stop()


def _port(running: RunningRouter) -> int:
    return running.router.endpoints()[0]["listeners"][0]["port"]


def test_mx_consumers_on_compressed_connections_get_their_own_frames_in_order(compressed):
    port = _port(compressed)

    async def scenario():
        saved = block(10)
        events = node.normalize_save_block(saved).events
        consumers = [await Consumer.open(f"ws://127.0.0.1:{port}/hub/ws") for _ in range(3)]
        for consumer in consumers:
            assert [e.name for e in consumer.ws.protocol.extensions] == ["permessage-deflate"]
            await consumer.subscribe("All")
        feeder = await Node.open(f"ws://127.0.0.1:{port}/save")
        await feeder.save(saved)
        await feeder.finalize(saved)
        for consumer in consumers:
            counters, got = [], []
            while True:
                frame = await consumer.frame()
                counters.append(frame.counter)
                if frame.topic == codec.FINALIZED_TOPIC:
                    break
                got.append(frame)
            assert [f.payload for f in got if f.topic == codec.EVENTS_TOPIC] == \
                [e.SerializeToString() for e in events]
            # each delivery carries the consumer's own next counter
            assert counters == list(range(1, 1 + len(counters)))
            await consumer.close()
        await feeder.close()

    run(scenario())


def test_signal_fan_out_reaches_compressed_subscribers(compressed):
    url = compressed.ws_urls[0]

    async def scenario():
        subscribers = [await HubClient.open(url, f"seag/z-{i}") for i in range(3)]
        for subscriber in subscribers:
            assert [e.name for e in subscriber.ws.protocol.extensions] == ["permessage-deflate"]
            await subscriber.request("hub:subscribe", {"topic": "zip"})
        publisher = await HubClient.open(url, "browser/zip")
        for n in range(5):
            await publisher.send("hub:publish", {"topic": "zip", "message": "x" * 300 + str(n)})
        for subscriber in subscribers:
            assert [(await subscriber.recv())["payload"]["message"] for _ in range(5)] == \
                ["x" * 300 + str(n) for n in range(5)]
        for client in subscribers + [publisher]:
            await client.close()

    run(scenario())
