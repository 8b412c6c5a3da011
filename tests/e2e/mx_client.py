"""mx-notifier hub test clients: a consumer of /hub/ws and a node pushing to /save (real websockets)."""

from __future__ import annotations

import asyncio
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from gateways.mx import codec, generator, node
from gateways.mx.bech32 import encode_address
from gateways.mx.pb import mx_hub_pb2


class Consumer:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.counter = 0

    @classmethod
    async def open(cls, url: str, ack: bool | None = None) -> "Consumer":
        if ack is not None:
            url += "?ack=" + ("1" if ack else "0")
        return cls(await connect(url, open_timeout=10, max_size=None, ping_interval=None))

    async def subscribe(self, level: str, address: str = "", identifier: str = "",
                        topics: list[bytes | None] | None = None, with_acknowledge: bool = True) -> None:
        """Subscribe and wait for the router's ACK of the subscribe frame (so the filter is in place)."""
        self.counter += 1
        payload = codec.subscribe_payload(level, address, identifier, topics or [])
        await self.ws.send(codec.payload_frame(self.counter, codec.SUBSCRIBE_TOPIC, payload, with_acknowledge))
        if with_acknowledge:
            frame = await self.frame()
            assert (frame.type, frame.counter, frame.topic, frame.payload) == (codec.ACK, self.counter, "", b"")

    async def barrier(self) -> None:
        """Wait until every frame sent so far on this connection has reached its topic shard.

        An acknowledged subscribe to an address no generated block uses: the connection's filters go to
        one shard, in order, so its ACK comes after every earlier (unacknowledged) subscribe is in place.
        """
        await self.subscribe("Address", encode_address(bytes(32)))

    async def frame(self, timeout: float = 10) -> mx_hub_pb2.WsMessage:
        data = await asyncio.wait_for(self.ws.recv(), timeout)
        assert isinstance(data, bytes), "the hub sends binary frames only"
        message = mx_hub_pb2.WsMessage()
        message.ParseFromString(data)
        return message

    async def event(self, timeout: float = 10) -> tuple[str, Any]:
        """The next PAYLOAD: (topic, decoded payload)."""
        frame = await self.frame(timeout)
        assert frame.type == codec.PAYLOAD and frame.version == 1, frame
        kind = {codec.EVENTS_TOPIC: mx_hub_pb2.NormalizedEvent, codec.REVERT_TOPIC: mx_hub_pb2.RevertEvent,
                codec.FINALIZED_TOPIC: mx_hub_pb2.FinalizedEvent, codec.BLOCK_TXS_TOPIC: mx_hub_pb2.BlockTxs,
                codec.BLOCK_SCRS_TOPIC: mx_hub_pb2.BlockScrs}[frame.topic]
        message = kind()
        message.ParseFromString(frame.payload)
        return frame.topic, message

    async def until_finalized(self, block_hash: str, timeout: float = 10) -> list[tuple[str, Any]]:
        """Every PAYLOAD before the FinalizedEvent of ``block_hash`` (the test's end marker)."""
        seen = []
        while True:
            topic, message = await self.event(timeout)
            if topic == codec.FINALIZED_TOPIC and message.hash == block_hash:
                return seen
            seen.append((topic, message))

    async def close(self) -> None:
        await self.ws.close()


class Node:
    """A MultiversX node's outport driver as it talks to /save: counters from 1, stop-and-wait."""

    def __init__(self, ws: ClientConnection, marshaller: str = node.GOGO) -> None:
        self.ws = ws
        self.marshaller = marshaller
        self.counter = 0

    @classmethod
    async def open(cls, url: str, marshaller: str = node.GOGO, token: str | None = None) -> "Node":
        """``token``: the router's ``mx.node_token``, sent as ``Authorization: Bearer``."""
        headers = {"Authorization": f"Bearer {token}"} if token is not None else None
        return cls(await connect(url, open_timeout=10, max_size=None, ping_interval=None, additional_headers=headers),
                   marshaller)

    async def push(self, topic: str, payload: bytes, with_acknowledge: bool = True) -> None:
        self.counter += 1
        await self.ws.send(node.encode_node_frame(topic, payload, self.counter, self.marshaller, with_acknowledge))
        if with_acknowledge:
            await self.expect_ack(self.counter)

    async def push_until_acknowledged(self, topic: str, payload: bytes, ack_timeout: float = 2.0,
                                      attempts: int = 10) -> int:
        """As the node's driver does: resend the frame (same counter) until its ACK comes; returns
        how many times it was sent."""
        self.counter += 1
        frame = node.encode_node_frame(topic, payload, self.counter, self.marshaller, True)
        for attempt in range(1, attempts + 1):
            await self.ws.send(frame)
            try:
                await self.expect_ack(self.counter, ack_timeout)
                return attempt
            except TimeoutError:
                continue
        raise AssertionError(f"no ACK for frame {self.counter} after {attempts} attempts")

    async def expect_ack(self, counter: int, timeout: float = 10) -> None:
        data = await asyncio.wait_for(self.ws.recv(), timeout)
        if isinstance(data, str):
            data = data.encode()
        frame = node.decode_node_frame(data)
        assert (frame.type, frame.counter, frame.marshaller) == (node.ACK, counter, self.marshaller), frame

    async def save(self, block: Any) -> None:
        await self.push(node.SAVE_BLOCK, generator.save_block_payload(block, self.marshaller))

    async def finalize(self, block: Any) -> None:
        await self.push(node.FINALIZED_BLOCK, generator.finalized_payload(block, self.marshaller))

    async def revert(self, block: Any) -> None:
        await self.push(node.REVERT_INDEXED_BLOCK, generator.revert_payload(block, self.marshaller))

    async def close(self) -> None:
        await self.ws.close()
