"""mx-notifier hub, client mode: the router dials the node, survives the node going away, resumes."""

from __future__ import annotations

import asyncio

import pytest
import ray
from websockets.asyncio.server import serve

from gateways.mx import codec, generator, node
from tests.e2e.client import eventually, run
from tests.e2e.conftest import start_router
from tests.e2e.mx_client import Consumer
from tests.e2e.test_mx import hub_urls
from router.proc import free_port

pytestmark = pytest.mark.e2e


class FakeNodeServer:
    """A node's websocket server (its outport driver in server mode): pushes blocks, waits for ACKs."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.server = None
        self.ws = None
        self.connections = 0
        self.counter = 0
        self.connected = asyncio.Event()

    async def start(self) -> None:
        self.connected.clear()
        self.server = await serve(self._handler, "127.0.0.1", self.port, max_size=None, ping_interval=None)

    async def _handler(self, ws) -> None:
        self.ws = ws
        self.connections += 1
        self.connected.set()
        await ws.wait_closed()

    async def stop(self) -> None:
        self.server.close()  # closes the router's connection too
        await self.server.wait_closed()

    async def push(self, topic: str, payload: bytes) -> None:
        self.counter += 1  # per client lifetime, as a node in server mode counts
        await self.ws.send(node.encode_node_frame(topic, payload, self.counter))
        reply = node.decode_node_frame(await asyncio.wait_for(self.ws.recv(), 10))
        assert (reply.type, reply.counter) == (node.ACK, self.counter)

    async def save(self, block) -> None:
        await self.push(node.SAVE_BLOCK, generator.save_block_payload(block))

    async def finalize(self, block) -> None:
        await self.push(node.FINALIZED_BLOCK, generator.finalized_payload(block))


async def _value(value):
    return value


def test_upstream_disconnect_and_reconnect_keeps_consumers(ray_runtime, tmp_path):
    async def scenario():
        fake = FakeNodeServer(free_port())
        await fake.start()
        running = await asyncio.to_thread(
            start_router, namespace="e2e-mx-upstream", data_dir=tmp_path, port=0, gateways=1, ray_dashboard=False,
            shards={"session": 1, "topic": 1, "registry": 1}, signal={"enabled": False}, cashu={"enabled": False},
            baqend={"enabled": False}, analytics={"enabled": False}, gateway={"sweep_interval_s": 0.1},
            mx={"text_frames": "close", "ack_timeout_s": 1, "ingest": {"mode": "client", "connect_url": f"ws://127.0.0.1:{fake.port}/save",
                                                   "reconnect_min_s": 0.1, "reconnect_max_s": 0.3}})
        gateway = running.router.gateways[0].actor
        upstream = lambda: ray.get(gateway.stats.remote())["dialects"]["mx-node"]["upstream"]  # noqa: E731
        try:
            await asyncio.wait_for(fake.connected.wait(), 30)
            url = hub_urls(running)[0]
            consumer = await Consumer.open(url)
            await consumer.subscribe("All")
            first = generator.generate_save_block(7, transactions=4)
            await fake.save(first)
            await fake.finalize(first)
            got = await consumer.until_finalized(first.BlockData.HeaderHash.hex())
            assert [m for t, m in got if t == codec.EVENTS_TOPIC] == node.normalize_save_block(first).events

            await fake.stop()  # the node goes away
            await eventually(lambda: _value(not upstream()["connected"]))
            assert consumer.ws.close_code is None
            await consumer.ws.ping()  # the hub connection still answers
            await fake.start()  # the node is back on the same port: the router redials
            await asyncio.wait_for(fake.connected.wait(), 30)
            assert fake.connections == 2
            second = generator.generate_save_block(8, transactions=4)
            await fake.save(second)
            await fake.save(second)  # resent (as after an ACK timeout): acknowledged, delivered once
            await fake.finalize(second)
            got = await consumer.until_finalized(second.BlockData.HeaderHash.hex())
            assert [m for t, m in got if t == codec.EVENTS_TOPIC] == node.normalize_save_block(second).events
            assert consumer.ws.close_code is None
            state = upstream()
            assert (state["connected"], state["connects"], state["disconnects"]) == (True, 2, 1)

            # a consumer that asked for ACKs and never sends one is closed after ack_timeout_s
            silent = await Consumer.open(url, ack=True)
            await silent.subscribe("All")
            third = generator.generate_save_block(9, transactions=2)
            await fake.save(third)
            first_frame = await silent.frame()
            assert (first_frame.counter, first_frame.with_acknowledge) == (1, True)
            await asyncio.wait_for(silent.ws.wait_closed(), 10)
            assert (silent.ws.close_code, silent.ws.close_reason) == (1008, "no ACK for counter 1 within 1 s")

            # text_frames = "close": a text frame on the binary-only endpoint closes with 1003
            await consumer.ws.send("hello")
            await asyncio.wait_for(consumer.ws.wait_closed(), 10)
            assert (consumer.ws.close_code, consumer.ws.close_reason) == (1003, "binary frames only")
        finally:
            await asyncio.to_thread(running.router.stop)
            await fake.stop()

    run(scenario(), timeout=120)
