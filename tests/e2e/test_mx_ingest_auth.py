"""mx node ingest hardening: a node credential on /save, big frames decoded off the event loop,
idle connections closed.

``mx_token``: one gateway (node and consumers on it), one topic shard, ``mx.node_token`` set, and a
short idle timeout (a quiet connection is pinged every 0.5 s and closed after 3 s of silence).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.frames import Opcode

from gateways.mx import codec, generator, node
from gateways.mx.bech32 import encode_address
from tests.e2e.client import run
from tests.e2e.conftest import RunningRouter, start_router
from tests.e2e.mx_client import Consumer, Node
from tests.e2e.rawws import client_frame, read_server_frame
from tests.e2e.test_mx import hub_stats, hub_urls

pytestmark = [pytest.mark.e2e, pytest.mark.security]

TOKEN = "e2e-node-token-" + "0123456789abcdef"
IDLE_S = 3


@pytest.fixture(scope="module")
def mx_token(ray_runtime, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="e2e-mx-auth", data_dir=tmp_path_factory.mktemp("mx-auth-data"), port=0, gateways=1,
        ray_dashboard=False, shards={"session": 1, "topic": 1, "registry": 1}, signal={"enabled": False},
        cashu={"enabled": False}, baqend={"enabled": False}, gateway={"sweep_interval_s": 0.1},
        mx={"node_token": TOKEN, "idle_timeout_s": IDLE_S, "ping_interval_s": 0.5},
    )
    yield running
    running.router.stop()


async def refused(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any, dict]:
    """Open ``url`` expecting the upgrade to be refused: (status, headers, JSON body)."""
    with pytest.raises(InvalidStatus) as refusal:
        await connect(url, open_timeout=10, additional_headers=headers)
    response = refusal.value.response
    return response.status_code, response.headers, json.loads(response.body)


UNAUTHORIZED = (401, {"error": "unauthorized", "message": "node ingest needs the node token: "
                                                          "Authorization: Bearer <mx.node_token>"})


def test_save_without_the_node_token_is_refused_with_401(mx_token):
    save_url = hub_urls(mx_token, "/save")[0]

    async def scenario():
        status, headers, body = await refused(save_url)
        assert (status, body) == UNAUTHORIZED
        assert headers["WWW-Authenticate"] == 'Bearer realm="mx-node"'
        assert hub_stats(mx_token, 0)["mx-node"]["refused_token"] >= 1
        assert hub_stats(mx_token, 0)["mx-node"]["nodes"] == 0

    run(scenario())


def test_save_with_a_wrong_token_is_refused_with_401(mx_token):
    save_url = hub_urls(mx_token, "/save")[0]

    async def scenario():
        wrong = [
            {"Authorization": "Bearer " + TOKEN[:-1] + "x"},  # one character off
            {"Authorization": "Bearer " + TOKEN + "x"},  # a longer token
            {"Authorization": "Bearer"},
            {"Authorization": "Basic " + base64.b64encode(f"node:{TOKEN}".encode()).decode()},
            {"X-Node-Token": TOKEN},  # only the Authorization header carries it
        ]
        for headers in wrong:
            status, _, body = await refused(save_url, headers)
            assert (status, body) == UNAUTHORIZED, headers
        status, _, body = await refused(f"{save_url}?token={TOKEN}")  # never in the URL (it would be logged)
        assert (status, body) == UNAUTHORIZED
        assert hub_stats(mx_token, 0)["mx-node"]["nodes"] == 0

    run(scenario())


def test_save_with_the_token_is_accepted_and_its_block_reaches_a_consumer(mx_token):
    save_url, consumer_url = hub_urls(mx_token, "/save")[0], hub_urls(mx_token)[0]

    async def scenario():
        consumer = await Consumer.open(consumer_url)
        await consumer.subscribe("All")
        feeder = await Node.open(save_url, token=TOKEN)
        saved = generator.generate_save_block(77, transactions=4)
        await feeder.save(saved)  # acknowledged: the shards have it
        await feeder.finalize(saved)
        got = await consumer.until_finalized(saved.BlockData.HeaderHash.hex())
        assert [m for t, m in got if t == codec.EVENTS_TOPIC] == node.normalize_save_block(saved).events
        await feeder.close()
        await consumer.close()

    run(scenario())


def test_router_mx_replay_sends_the_configured_node_token(mx_token, tmp_path):
    router_bin = str(Path(sys.executable).with_name("router"))
    save_url, consumer_url = hub_urls(mx_token, "/save")[0], hub_urls(mx_token)[0]
    frames = tmp_path / "blocks.jsonl"
    done = subprocess.run([router_bin, "mx", "generate", str(frames), "--blocks", "2", "--transactions", "3",
                           "--seed", "60"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    blocks = [generator.generate_save_block(60 + i, transactions=3) for i in range(2)]
    env = {name: value for name, value in os.environ.items() if not name.startswith("ROUTER_")}

    async def scenario():
        consumer = await Consumer.open(consumer_url)
        await consumer.subscribe("All")
        replay = [router_bin, "mx", "replay", str(frames), "--url", save_url]
        without = await asyncio.to_thread(subprocess.run, replay, capture_output=True, text=True, timeout=60, env=env)
        assert without.returncode == 1 and without.stderr.strip().endswith("HTTP 401"), without.stderr
        with_token = await asyncio.to_thread(subprocess.run, replay, capture_output=True, text=True, timeout=60,
                                             env={**env, "ROUTER_MX__NODE_TOKEN": TOKEN})
        assert with_token.returncode == 0, with_token.stderr
        assert (json.loads(with_token.stdout)["frames"], json.loads(with_token.stdout)["acknowledged"]) == (4, 4)
        for saved in blocks:
            got = await consumer.until_finalized(saved.BlockData.HeaderHash.hex())
            assert [m for t, m in got if t == codec.EVENTS_TOPIC] == node.normalize_save_block(saved).events
        await consumer.close()

    run(scenario())


# -- idle connections -----------------------------------------------------------------------------


async def open_raw(port: int, path: str, headers: dict[str, str]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WebSocket client that never answers a ping (a peer that is gone, or holds the socket open)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 101 "), head
    return reader, writer


async def pings_until_close(reader: asyncio.StreamReader, timeout: float) -> tuple[int, int, str]:
    """Read server frames without answering: (pings seen, close code, close reason)."""
    pings = 0
    while True:
        opcode, body = await read_server_frame(reader, timeout)
        if opcode == Opcode.PING:
            pings += 1
        elif opcode == Opcode.CLOSE:
            return pings, int.from_bytes(body[:2], "big"), body[2:].decode()


def test_idle_consumer_and_node_connections_are_closed_but_a_quiet_one_answering_pings_stays(mx_token):
    port = mx_token.router.endpoints()[0]["listeners"][0]["port"]
    save_url, consumer_url = hub_urls(mx_token, "/save")[0], hub_urls(mx_token)[0]

    async def scenario():
        quiet = await Consumer.open(consumer_url)  # the websockets client answers pings by itself
        await quiet.subscribe("All")  # its last frame: from here on it sends only pongs
        idle_consumer = await open_raw(port, "/hub/ws", {})
        reader, writer = idle_consumer
        subscribe = codec.payload_frame(1, codec.SUBSCRIBE_TOPIC, codec.subscribe_payload("All"), False)
        writer.write(client_frame(Opcode.BINARY, subscribe))  # an un-acked consumer, then silence
        idle_node = await open_raw(port, "/save", {"Authorization": f"Bearer {TOKEN}"})
        consumer_end, node_end = await asyncio.gather(pings_until_close(idle_consumer[0], IDLE_S + 10),
                                                      pings_until_close(idle_node[0], IDLE_S + 10))
        for pings, code, reason in (consumer_end, node_end):
            assert pings >= 1  # each was asked for a pong first
            assert (code, reason) == (1001, f"idle for {IDLE_S} s")
        for _, writer in (idle_consumer, idle_node):
            writer.close()
        stats = hub_stats(mx_token, 0)
        assert stats["mx"]["closed"]["idle"] >= 1 and stats["mx-node"]["closed_idle"] >= 1
        # Silent for longer than the idle timeout too, but it answered every ping: still served.
        assert quiet.ws.close_code is None
        feeder = await Node.open(save_url, token=TOKEN)
        saved = generator.generate_save_block(78, transactions=3)
        await feeder.save(saved)
        await feeder.finalize(saved)
        got = await quiet.until_finalized(saved.BlockData.HeaderHash.hex())
        assert [m for t, m in got if t == codec.EVENTS_TOPIC] == node.normalize_save_block(saved).events
        await feeder.close()
        await quiet.close()

    run(scenario())


# -- big frames -----------------------------------------------------------------------------------

MARKER = bytes(31) + b"\x2a"  # an address only the marker events use


def with_marker(block, topic: bytes):
    """``block`` with one more log whose single event is at MARKER (what the consumer selects)."""
    log = block.TransactionPool.Logs.add(TxHash=(topic * 64)[:64].decode())
    log.Log.Address = MARKER
    log.Log.Events.add(Address=MARKER, Identifier=b"marker", Topics=[topic])
    return block


def test_a_32_mib_frame_is_decoded_while_other_connections_are_served(mx_token):
    save_url, consumer_url = hub_urls(mx_token, "/save")[0], hub_urls(mx_token)[0]
    big = with_marker(generator.generate_save_block(90, transactions=38_000), b"b")
    big_frame = node.encode_node_frame(node.SAVE_BLOCK, generator.save_block_payload(big), 1)
    assert len(big_frame) >= 32 << 20
    small = with_marker(generator.generate_save_block(91, transactions=2), b"s")
    big_marker_order = sum(len(log.Log.Events) for log in big.TransactionPool.Logs) - 1  # the last event

    async def scenario():
        consumer = await Consumer.open(consumer_url)
        await consumer.subscribe("Address", encode_address(MARKER))
        big_node = await Node.open(save_url, token=TOKEN)
        small_node = await Node.open(save_url, token=TOKEN)
        await big_node.ws.send(big_frame)
        # The pong comes after the gateway has read the whole frame (one stream, in order).
        await asyncio.wait_for(await big_node.ws.ping(), 30)
        # While the big block decodes, the gateway still serves: a consumer's ping, another node's
        # block, acknowledged and delivered first.
        await asyncio.wait_for(await consumer.ws.ping(), 10)
        await small_node.save(small)
        topic, first = await consumer.event()
        assert (topic, first.block_hash, first.topics) == (codec.EVENTS_TOPIC, small.BlockData.HeaderHash.hex(), [b"s"])
        # The big block follows whole, and its node gets its ACK (counter 1).
        topic, second = await consumer.event(timeout=90)
        assert (topic, second.block_hash, second.topics) == (codec.EVENTS_TOPIC, big.BlockData.HeaderHash.hex(), [b"b"])
        assert second.order == big_marker_order
        await big_node.expect_ack(1, timeout=90)
        for client in (big_node, small_node, consumer):
            await client.close()

    run(scenario(), timeout=180)
