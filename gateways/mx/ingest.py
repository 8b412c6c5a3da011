"""Block data from a MultiversX node: the node's outport driver frames in, normalised events out.

Server mode (the node's default client mode dials us): the node connects to ``mx.ingest.path``.
Client mode: gateway 0 dials ``mx.ingest.connect_url`` and redials with backoff when it drops;
hub consumers stay connected meanwhile and receive again once blocks flow.

Either way each frame goes through :meth:`NodeIngestDialect.receive`: decode (gogo protobuf or
JSON), normalise (``gateways/mx/node.py``), drop a block already seen (the node resends a block
until it is acknowledged), encode each event's frame tail once, and send the block to every
topic shard in one ``mxpub`` command each. The node's ACK is written when every shard has taken
the block; if one has not, no ACK: the node resends and the duplicate filter forgets the block.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any, Callable

from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

from actors.mx import contract as mx
from actors.mx.contract import Stream, block_item
from gateways.dialect import Dialect, DialectSession, Wire
from gateways.mx import codec, node
from gateways.mx.node import DuplicateSuppressor, Ignored, InvalidNodeFrame, SavedBlock
from gateways.mx.config import MxConfig
from gateways.mx.pb import mx_hub_pb2
from router import contract
from router.errors import CommandError, ShardUnavailable
from router.shardmap import TOPIC

logger = logging.getLogger(__name__)

DIALECT = "mx"  # ingress is counted under the hub's name: one dialect in the analytics


def block_items(output: Any) -> tuple[str, list[tuple]]:
    """What the topic shards need of one normalised payload: (block hash, items)."""
    if isinstance(output, SavedBlock):
        items: list[tuple] = []
        for event in output.events:
            tail = codec.frame_tail(codec.EVENTS_TOPIC, event.SerializeToString())
            items.append(block_item(Stream.EVENT, (event.address, event.identifier, tuple(event.topics)),
                                    codec.EVENTS_TOPIC, tail))
        if output.txs.txs:
            items.append(block_item(Stream.ALL, None, codec.BLOCK_TXS_TOPIC,
                                    codec.frame_tail(codec.BLOCK_TXS_TOPIC, output.txs.SerializeToString())))
        if output.scrs.scrs:
            items.append(block_item(Stream.ALL, None, codec.BLOCK_SCRS_TOPIC,
                                    codec.frame_tail(codec.BLOCK_SCRS_TOPIC, output.scrs.SerializeToString())))
        return output.hash, items
    if isinstance(output, mx_hub_pb2.RevertEvent):
        topic = codec.REVERT_TOPIC
    else:
        topic = codec.FINALIZED_TOPIC
    return output.hash, [block_item(Stream.BLOCK, None, topic, codec.frame_tail(topic, output.SerializeToString()))]


class NodeIngestDialect(Dialect):
    name = "mx-node"

    def __init__(self, gateway: Any, config: MxConfig, hub: Any) -> None:
        super().__init__(gateway)
        self.config = config.ingest
        self.hub = hub
        self.dedup = DuplicateSuppressor(self.config.dedup_window_s, self.config.dedup_max_entries)
        self.counts: Counter = Counter()
        self.client: NodeClient | None = None

    def new_session(self, wire: Wire, request_headers: Any) -> "NodeSession":
        return NodeSession(self, wire)

    async def start(self) -> None:
        if self.config.mode == "client" and self.gateway.index == 0:
            self.client = NodeClient(self)
            self.client.start()

    async def close(self) -> None:
        if self.client is not None:
            await self.client.stop()

    def stats(self) -> dict[str, Any]:
        return {
            "nodes": len(self.sessions),
            "upstream": None if self.client is None else self.client.describe(),
            **dict(self.counts),
        }

    # -- one frame from the node ----------------------------------------------------------------

    def receive(self, data: bytes, reply: Callable[[bytes], Any]) -> None:
        counts = self.counts
        try:
            frame = node.decode_node_frame(data, self.config.marshaller)
        except InvalidNodeFrame as invalid:
            counts["dropped_" + invalid.reason] += 1
            return
        if frame.type == node.ACK:
            return  # nothing is sent to a node that would need acknowledging
        t0 = time.time_ns()
        try:
            output = node.handle_payload(frame)
        except InvalidNodeFrame as invalid:
            counts["dropped_" + invalid.reason] += 1
            logger.warning("mx ingest: %s frame %d dropped: %s", frame.topic, frame.counter, invalid)
            return

        def acknowledge() -> None:
            if frame.with_acknowledge:
                reply(node.node_ack_frame(frame.counter, frame.marshaller))

        if isinstance(output, Ignored):
            counts["ignored" if output.known else "ignored_unknown_topic"] += 1
            acknowledge()
            return
        block_hash, items = block_items(output)
        key = node.dedup_key(frame.topic, block_hash)
        if not self.dedup.first_seen(key, time.monotonic()):
            counts["duplicates"] += 1
            acknowledge()
            return
        gateway = self.gateway
        meta = contract.event_meta(gateway.id, gateway.next_seq(), t0, DIALECT, frame.topic, block_hash)
        gateway.accepted(meta, frame.counter, len(data), -1)
        counts[frame.topic] += 1
        counts["events"] += sum(1 for stream, _, _, _ in items if stream == Stream.EVENT)
        if not items:
            acknowledge()
            return

        def taken(results: list) -> None:
            if any(isinstance(result, (ShardUnavailable, CommandError)) for result in results):
                counts["unacknowledged"] += 1
                self.dedup.forget(key)  # the node will resend it: let it through then
            else:
                acknowledge()

        self.shards.send_all(self.shards.all(TOPIC), mx.publish(items, meta), taken)


class NodeSession(DialectSession):
    """A node connected to us (server mode)."""

    def on_message(self, data: bytes, is_text: bool) -> None:
        self.dialect.receive(data, self.wire.send_binary)


class NodeClient:
    """Client mode: keep one connection to the node's websocket server, redialling with backoff."""

    def __init__(self, dialect: NodeIngestDialect) -> None:
        self.dialect = dialect
        self.config = dialect.config
        self.task: asyncio.Task | None = None
        self.connected = False
        self.connects = 0
        self.disconnects = 0
        self.failures = 0
        self.last_error = ""

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass

    def describe(self) -> dict[str, Any]:
        return {"url": self.config.connect_url, "connected": self.connected, "connects": self.connects,
                "disconnects": self.disconnects, "failures": self.failures, "last_error": self.last_error}

    async def _run(self) -> None:
        delay = self.config.reconnect_min_s
        while True:
            try:
                async with connect(self.config.connect_url, max_size=self.config.max_frame_bytes,
                                   open_timeout=10, ping_interval=20, ping_timeout=20, max_queue=64) as ws:
                    self.connected, delay = True, self.config.reconnect_min_s
                    self.connects += 1
                    logger.info("mx ingest: connected to %s", self.config.connect_url)
                    await self._serve(ws)
            except (OSError, WebSocketException, asyncio.TimeoutError) as error:
                self.failures += 1
                self.last_error = f"{type(error).__name__}: {error}"
                logger.info("mx ingest: %s: %s; retrying in %.1f s", self.config.connect_url, self.last_error, delay)
            finally:
                if self.connected:
                    self.disconnects += 1
                    logger.warning("mx ingest: lost %s; redialling", self.config.connect_url)
                self.connected = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.reconnect_max_s)

    async def _serve(self, ws: Any) -> None:
        replies: asyncio.Queue[bytes] = asyncio.Queue()

        async def write() -> None:
            while True:
                await ws.send(await replies.get())

        writer = asyncio.get_running_loop().create_task(write())
        try:
            async for message in ws:
                self.dialect.receive(message.encode() if isinstance(message, str) else message, replies.put_nowait)
        finally:
            writer.cancel()
