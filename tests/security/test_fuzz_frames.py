"""Hostile frames on every dialect over real sockets, while a well-behaved client of each keeps working.

The attack: a deterministic mutation fuzzer (``tests/security/mutate.py``) seeded with real frames
of each codec (JSON for Signal Hub, Cashu and Baqend, MessagePack for NoLag, protobuf ``WsMessage``
for mx consumers at /hub/ws, gogo protobuf and JSON for mx nodes at /save) sends ``FRAMES`` random
frames per codec from its own loopback address, in windows of ``WINDOW`` closed by a marker the
dialect answers in order; then the named attacks: a value nested 33, 1,000 and 10,000 levels, a
message one byte over ``max_message_bytes``, a frame announcing one byte over ``max_frame_bytes``
(whole, and as the second fragment of a message), invalid UTF-8 in a text frame. A frame over the
frame limit is sent as its header only: the router must refuse it there, before reading it (and a
client still writing when the router closes would get a reset instead of the close frame). When
the router closes a connection the attacker opens another and goes on.

What counts as a failure: a close the frame did not deserve (anything but 1009 over the frame
limit and 1007 for invalid UTF-8), 1011 in particular; a marker not answered within
``MARKER_TIMEOUT_S`` (a hang); a reply that is not a frame of the dialect; a lost or failed round
trip of the well-behaved clients; a relayed message nested deeper than the router's limit; an
exception in the gateway's or a shard's log; a restarted shard; memory over its bounds;
something held at the end. A window whose marker went unanswered is replayed frame by frame,
each on a fresh connection, to name the frame that did it.

The well-behaved clients, one pair per dialect, each make a round trip every ``PACE_S`` during the
whole attack: Signal ``hub:send`` to a registered actor, NoLag publish to a subscriber, a Cashu
state push to a subscribed wallet, a Baqend REST write to a live query, an mx SaveBlock to a
consumer subscribed to its address.

Memory (the gateway's RSS): at most ``PEAK_BOUND_MIB`` over the warm baseline at the peak (the
fragmented oversize attack on /save makes the gateway hold a 32 MiB fragment, legitimately: the
frame limit there is 64 MiB), at most ``AFTER_BOUND_MIB`` over it once the attack is over and its
connections are gone. Measured on the 2-core machine with closed connections' buffers released
(four runs): peak +17 to +47 MiB, after +12 to +16 MiB. While a closed connection keeps its
buffers until a full garbage collection (rare in a gateway: ``router.proc.tune_gc``), after was
+18 to +65 MiB (six runs), depending on whether one happened to run, and it grows with every
such connection: the tests at the end pin that directly.

The figures (frames, closes and replies per dialect, memory, round-trip latencies) are printed
(``pytest -s``) and written to ``fuzz-summary.json`` in the test's tmp dir.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import os
import random
import statistics
import struct
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Awaitable, Callable

import aiohttp
import msgpack
import orjson
import psutil
import ray
from websockets.frames import Opcode

from actors.nolag.keys import KeyStore, open_key_store
from gateways.mx import codec as mx_codec
from gateways.mx import generator, node
from gateways.mx.bech32 import encode_address
from gateways.mx.pb import mx_hub_pb2, mx_node_pb2
from gateways.nolag.session import ENVELOPE_ALLOWANCE  # a NoLag frame is decoded up to max_message_bytes + this
from router.nesting import too_deep
from tests.e2e.baqend_client import Events, Rest, key_of
from tests.e2e.cashu_client import Wallet, mint_quote
from tests.e2e.client import HubClient, eventually, run
from tests.e2e.mx_client import Consumer, Node
from tests.e2e.nolag_client import Client
from tests.e2e.rawws import client_frame
from tests.security.conftest import CASHU_FEED_KEY, own_address
from tests.security.mutate import JSON, MSGPACK, PROTOBUF, Fuzzed, Mutator, Seed

FRAMES = 10_000  # random frames per codec
WINDOW = 32  # frames between two markers
NEST_DEPTHS = (33, 1000, 10_000)
INVALID_UTF8_FRAMES = 5
PACE_S = 0.05  # a well-behaved round trip starts every 50 ms
MARKER_TIMEOUT_S = 10.0
REPLAY_TIMEOUT_S = 3.0
ROUND_TRIP_TIMEOUT_S = 10.0
MAX_REPLAYED_WINDOWS = 3  # per dialect
PEAK_BOUND_MIB = 96
AFTER_BOUND_MIB = 32
SETTLE_S = 10.0
ABNORMAL = 1006  # the connection ended without a close frame
HUB = "cloudflare/signal-hub"
ATTACKER = "fz/attacker"
CALM_ADDRESS = bytes([7]) * 32  # the mx address only the well-behaved node's blocks use

# -- real frames of each codec -----------------------------------------------------------------


def _json_seeds(messages: list[dict]) -> list[Seed]:
    return [Seed(json.dumps(message).encode(), True) for message in messages]


def signal_seeds() -> list[Seed]:
    def envelope(kind: str, payload: dict, to: str = HUB, **extra: Any) -> dict:
        return {"type": kind, "from": ATTACKER, "to": to, "payload": payload, "correlationId": f"s-{kind}", **extra}

    return _json_seeds([
        envelope("hub:connect", {"version": "1.0"}),
        envelope("hub:heartbeat", {}, timestamp=1_700_000_000_000, ttl=3_600_000_000),
        envelope("hub:register", {"actorAddress": "fz/actor-1", "capabilities": ["chat", "inference"],
                                  "metadata": {"model": "m1", "zone": {"name": "eu"}}, "ttl": 60_000}),
        envelope("hub:unregister", {"actorAddress": "fz/actor-1"}),
        envelope("hub:renew", {"actorAddress": "fz/actor-1", "renewalToken": "token-1", "ttl": 60_000}),
        envelope("hub:discover", {"pattern": "^fz/", "capabilities": ["chat"], "metadata": {"model": "m1"},
                                  "limit": 10, "offset": 0}),
        envelope("hub:list_actors", {"limit": 5, "offset": 0}),
        envelope("hub:send", {"n": 1, "text": "hello"}, to="fz/actor-1"),
        envelope("hub:broadcast", {"notice": "x", "excludeSelf": True}),
        envelope("hub:subscribe", {"topic": "fz-news"}),
        envelope("hub:publish", {"topic": "fz-news", "message": {"n": 2}}),
        envelope("hub:unsubscribe", {"topic": "fz-news"}),
        envelope("hub:queue_stats", {}),
    ])


def nolag_seeds(token: str) -> list[Seed]:
    messages = [
        {"type": "auth", "token": token, "reconnect": False, "projectId": "fz", "protocolVersion": 2},
        {"type": "subscribe", "topic": "fz/room/t1", "qos": 1, "filters": ["user_1", "user_2"], "loadBalance": False},
        {"type": "subscribe", "topic": "fz/room/t2", "qos": 0, "loadBalance": True, "loadBalanceGroup": "g1"},
        {"type": "unsubscribe", "topic": "fz/room/t1"},
        {"type": "publish", "topic": "fz/room/t1", "data": {"text": "hello", "n": 1, "blob": b"\x00\x01"},
         "qos": 1, "echo": True, "filter": "user_1", "msgRef": 7},
        {"type": "publish", "topic": "fz/room/t2", "data": "plain", "qos": 0, "echo": False},
        {"type": "setFilters", "topic": "fz/room/t1", "filters": ["user_3"]},
        {"type": "presence", "roomId": "room", "data": {"status": "online"}},
        {"type": "getPresence", "roomId": "room"},
        {"type": "ack", "msgId": "m-1"},
        {"type": "batchAck", "msgIds": ["m-1", "m-2"]},
        {"type": "lobbySubscribe", "lobbyId": "lobby"},
        {"type": "lobbyUnsubscribe", "lobbyId": "lobby"},
        {"type": "getLobbyPresence", "lobbyId": "lobby"},
    ]
    return [Seed(msgpack.packb(message, use_bin_type=True), False) for message in messages]


def cashu_seeds() -> list[Seed]:
    y = "02e208f9a78cd523444aadf854a4e91281d20f67a923d345239c37f14e137c7c3d"
    return _json_seeds([
        {"jsonrpc": "2.0", "id": 1, "method": "subscribe",
         "params": {"kind": "bolt11_mint_quote", "filters": ["fzq1", "fzq2"], "subId": "fz-a"}},
        {"jsonrpc": "2.0", "id": 2, "method": "subscribe",
         "params": {"kind": "proof_state", "filters": [y], "subId": "fz-b"}},
        {"jsonrpc": "2.0", "id": "3", "method": "subscribe",
         "params": json.dumps({"kind": "bolt11_melt_quote", "filters": ["fzm1"], "subId": "fz-c"})},
        {"jsonrpc": "2.0", "id": 4, "method": "unsubscribe", "params": {"subId": "fz-a"}},
        {"jsonrpc": "2.0", "id": 5, "method": "heartbeat"},
    ])


def baqend_seeds() -> list[Seed]:
    return _json_seeds([
        {"id": "fz-1", "type": "subscribe", "bucket": "FzTodo", "sort": json.dumps({"n": 1}), "offset": 0, "limit": 5,
         "query": json.dumps({"name": {"$in": ["a", "b"]}, "n": {"$gt": 1}}), "initial": True},
        {"id": "fz-2", "type": "subscribe", "bucket": "FzTodo", "query": {"$or": [{"on": True}, {"n": {"$lte": 3}}]},
         "matchTypes": ["add", "remove"], "initial": False},
        {"id": "fz-3", "type": "subscribe", "bucket": "FzTodo",
         "query": {"tags": {"$all": ["x"]}, "name": {"$regex": "^a"}}, "operations": ["insert", "update"]},
        {"id": "fz-1", "type": "unsubscribe"},
    ])


def mx_hub_seeds() -> list[Seed]:
    address = encode_address(bytes(range(32)))

    def subscribe(*filter_: Any) -> Seed:
        payload = mx_codec.subscribe_payload(*filter_)
        return Seed(mx_codec.payload_frame(3, mx_codec.SUBSCRIBE_TOPIC, payload, True), False)

    return [
        subscribe("All"), subscribe("Address", address), subscribe("Identifier", "", "ESDTTransfer"),
        subscribe("AddressIdentifier", address, "writeLog"),
        subscribe("Topics", address, "ESDTTransfer", [b"WEGLD-bd4d79", None, b"\x01"]),
        Seed(mx_codec.ack_frame(1), False),
        Seed(mx_codec.payload_frame(4, mx_codec.EVENTS_TOPIC, b"\x0a\x03abc"), False),
    ]


def mx_node_seeds(marshaller: str) -> list[Seed]:
    """What a node's outport driver sends, in one marshaller; blocks of one or two transactions."""
    text = marshaller == node.JSON
    block, other = generator.generate_save_block(4242, 2), generator.generate_save_block(4243, 1)
    frames = [generator.save_block_frame(block, 1, marshaller), generator.save_block_frame(other, 2, marshaller),
              generator.revert_frame(block, 3, marshaller), generator.finalized_frame(block, 4, marshaller),
              node.encode_node_frame("Settings", b"\x08\x01", 5, marshaller), node.node_ack_frame(6, marshaller)]
    return [Seed(frame, text) for frame in frames]


# -- the frames of each dialect the router may answer with ---------------------------------------

SIGNAL_TYPES = frozenset({
    "hub:connected", "hub:heartbeat_ack", "hub:registered", "hub:unregistered", "hub:renewed", "hub:discovery_result",
    "hub:broadcast_ack", "hub:subscribed", "hub:delivery_ack", "hub:unsubscribed", "hub:queue_stats_result",
    "hub:disconnect_ack", "hub:error",
    "hub:send", "hub:publish", "hub:broadcast",  # the attacker's own messages, delivered to it
})
SIGNAL_ERRORS = frozenset({"version_mismatch", "unauthorized", "rate_limited", "unknown_actor", "message_too_large",
                           "message_expired", "timeout", "internal_error"})
NOLAG_TYPES = frozenset({"auth", "subscribed", "unsubscribed", "filtersUpdated", "published", "presence",
                         "presenceList", "lobbySubscribed", "lobbyPresenceList", "lobbyPresence", "lobbyUnsubscribed",
                         "replayStart", "replayEnd", "hydration", "error", "disconnect", "message"})
NOLAG_CODES = {"rate_limit_exceeded": 42910, "monthly_quota_exceeded": 42920, "message_too_large": 42930}
CASHU_ERRORS = frozenset({-32700, -32600, -32601, -32602, -32603, -32005})
MX_TOPICS = frozenset({mx_codec.EVENTS_TOPIC, mx_codec.REVERT_TOPIC, mx_codec.FINALIZED_TOPIC,
                       mx_codec.BLOCK_TXS_TOPIC, mx_codec.BLOCK_SCRS_TOPIC})


def _text_json(opcode: int, payload: bytes) -> Any:
    if opcode != Opcode.TEXT:
        return None
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None


def signal_reply(opcode: int, payload: bytes) -> bool:
    message = _text_json(opcode, payload)
    if not isinstance(message, dict) or message.get("type") not in SIGNAL_TYPES:
        return False
    if message["type"] != "hub:error":
        return True
    error = message.get("payload") or {}
    return error.get("code") in SIGNAL_ERRORS and isinstance(error.get("message"), str) and bool(error["message"])


def nolag_reply(opcode: int, payload: bytes) -> bool:
    if opcode != Opcode.BINARY:
        return False
    if not payload:
        return True  # a heartbeat
    try:
        message = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception:
        return False
    if not isinstance(message, dict) or message.get("type") not in NOLAG_TYPES:
        return False
    if message["type"] != "error":
        return True
    return (isinstance(message.get("error"), str) and isinstance(message.get("hint"), str) and bool(message["hint"])
            and message.get("code") == NOLAG_CODES.get(message["error"]))


def cashu_reply(opcode: int, payload: bytes) -> bool:
    message = _text_json(opcode, payload)
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return False
    if "method" in message:  # a notification
        params = message.get("params")
        return (set(message) == {"jsonrpc", "method", "params"} and message["method"] == "subscribe"
                and isinstance(params, dict) and set(params) == {"subId", "payload"})
    if "error" in message:
        error = message["error"]
        return (set(message) == {"jsonrpc", "error", "id"} and isinstance(error, dict)
                and error.get("code") in CASHU_ERRORS and isinstance(error.get("message"), str))
    result = message.get("result")
    return set(message) == {"jsonrpc", "result", "id"} and (
        result == "heartbeat" or (isinstance(result, dict) and result.get("status") == "OK"))


def baqend_reply(opcode: int, payload: bytes) -> bool:
    message = _text_json(opcode, payload)
    if not isinstance(message, dict) or not isinstance(message.get("date"), str):
        return False
    kind = message.get("type")
    if kind == "error":
        error = message.get("error")
        return (isinstance(message.get("status"), int) and isinstance(error, dict)
                and set(error) == {"message", "status", "reason"} and error["status"] == message["status"])
    return kind in ("result", "match") and isinstance(message.get("id"), str)


def mx_reply(opcode: int, payload: bytes) -> bool:
    if opcode != Opcode.BINARY:
        return False
    frame = mx_hub_pb2.WsMessage()
    try:
        frame.ParseFromString(payload)
    except Exception:
        return False
    if frame.type == mx_codec.ACK:
        return not frame.topic and not frame.payload
    return frame.type == mx_codec.PAYLOAD and frame.version == 1 and frame.topic in MX_TOPICS


def node_reply(opcode: int, payload: bytes) -> bool:
    if opcode != Opcode.BINARY:
        return False
    try:
        return node.decode_node_frame(payload).type == node.ACK
    except node.InvalidNodeFrame:
        return False


# -- targets: what the attacker speaks to -------------------------------------------------------

Match = Callable[[int, bytes], bool]


@dataclass
class Target:
    name: str
    path: str
    mutators: list[Mutator]
    max_frame_bytes: int
    marker: Callable[[int], tuple[int, bytes, Match]]  # n -> (opcode, payload, what its answer looks like)
    reply_ok: Match
    hello: Callable[["Raw"], Awaitable[None]] | None = None
    # a message just over max_message_bytes (under the frame limit), and its exact answer
    over_message: tuple[int, Callable[[int, bytes], bool]] | None = None


def _token_marker(opcode: int, frame: Callable[[str], bytes], token: Callable[[str], bytes]):
    def marker(n: int) -> tuple[int, bytes, Match]:
        name = f"fzmark-{n}"
        expected = token(name)
        return opcode, frame(name), lambda op, payload: op != Opcode.PONG and expected in payload

    return marker


def _ping_marker(n: int) -> tuple[int, bytes, Match]:
    token = f"fzmark-{n}".encode()
    return Opcode.PING, token, lambda op, payload: op == Opcode.PONG and payload == token


def _node_marker(n: int) -> tuple[int, bytes, Match]:
    counter = 2 ** 40 + n  # far from any counter a mutated seed carries
    ack = node.node_ack_frame(counter)
    return (Opcode.BINARY, node.encode_node_frame("FzMarker", b"m", counter, node.GOGO, with_acknowledge=True),
            lambda op, payload: op == Opcode.BINARY and payload == ack)


def _quoted(name: str) -> bytes:
    return json.dumps(name).encode()


def targets(running, nolag_token: str) -> list[Target]:
    settings = running.settings
    signal, nolag, cashu, baqend, mx = settings.signal, settings.nolag, settings.cashu, settings.baqend, settings.mx

    async def signal_hello(raw: Raw) -> None:
        hello = {"type": "hub:connect", "from": ATTACKER, "to": HUB, "payload": {"version": "1.0"},
                 "correlationId": "hello"}
        assert await raw.exchange(client_frame(Opcode.TEXT, json.dumps(hello).encode()),
                                  lambda op, payload: b'"hub:connected"' in payload, MARKER_TIMEOUT_S)

    async def nolag_hello(raw: Raw) -> None:
        auth = {"type": "auth", "token": nolag_token, "reconnect": False, "protocolVersion": 2}
        assert await raw.exchange(client_frame(Opcode.BINARY, msgpack.packb(auth)),
                                  lambda op, payload: b"\xa7success\xc3" in payload, MARKER_TIMEOUT_S)

    def signal_too_large(size: int, opcode: int, payload: bytes) -> bool:
        message = _text_json(opcode, payload)
        limit = signal.max_message_bytes
        return isinstance(message, dict) and message.get("type") == "hub:error" and message["payload"] == {
            "code": "message_too_large", "message": f"Message of {size} bytes exceeds the limit of {limit} bytes",
            "details": {"size": size, "maxSize": limit}}

    def nolag_too_large(size: int, opcode: int, payload: bytes) -> bool:
        message = msgpack.unpackb(payload, raw=False) if opcode == Opcode.BINARY and payload else None
        return isinstance(message, dict) and {k: v for k, v in message.items() if k != "hint"} == {
            "type": "error", "error": "message_too_large", "code": 42930, "maxSizeBytes": nolag.max_message_bytes}

    def cashu_too_large(size: int, opcode: int, payload: bytes) -> bool:
        text = f"Invalid Request: message of {size} bytes exceeds the limit of {cashu.max_message_bytes} bytes"
        return _text_json(opcode, payload) == {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": text}}

    def baqend_too_large(size: int, opcode: int, payload: bytes) -> bool:
        message = _text_json(opcode, payload)
        text = f"Message of {size} bytes exceeds the limit of {baqend.max_message_bytes} bytes"
        return isinstance(message, dict) and {k: v for k, v in message.items() if k != "date"} == {
            "type": "error", "status": 413, "error": {"message": text, "status": 413, "reason": "Payload Too Large"}}

    return [
        Target("signal", signal.path, [Mutator(signal_seeds(), JSON, 101)], signal.max_frame_bytes,
               _token_marker(Opcode.TEXT, lambda name: json.dumps({
                   "type": "hub:heartbeat", "from": ATTACKER, "to": HUB, "correlationId": name}).encode(), _quoted),
               signal_reply, signal_hello,
               over_message=(signal.max_message_bytes + 1, signal_too_large)),
        Target("nolag", nolag.path, [Mutator(nolag_seeds(nolag_token), MSGPACK, 102)], nolag.max_frame_bytes,
               _token_marker(Opcode.BINARY, lambda name: msgpack.packb(
                   {"type": "publish", "topic": "marker", "msgRef": name}), msgpack.packb),
               nolag_reply, nolag_hello,
               over_message=(nolag.max_message_bytes + ENVELOPE_ALLOWANCE + 1, nolag_too_large)),
        Target("cashu", cashu.path, [Mutator(cashu_seeds(), JSON, 103)], cashu.max_frame_bytes,
               _token_marker(Opcode.TEXT, lambda name: json.dumps(
                   {"jsonrpc": "2.0", "id": name, "method": "heartbeat"}).encode(), _quoted),
               cashu_reply, over_message=(cashu.max_message_bytes + 1, cashu_too_large)),
        Target("baqend", baqend.path, [Mutator(baqend_seeds(), JSON, 104)], baqend.max_frame_bytes,
               _token_marker(Opcode.TEXT, lambda name: json.dumps({"id": name, "type": "fzmark"}).encode(), _quoted),
               baqend_reply, over_message=(baqend.max_message_bytes + 1, baqend_too_large)),
        Target("mx", mx.path, [Mutator(mx_hub_seeds(), PROTOBUF, 105)], mx.max_frame_bytes, _ping_marker, mx_reply),
        Target("mx-node", mx.ingest.path, [Mutator(mx_node_seeds(node.GOGO), PROTOBUF, 106),
                                           Mutator(mx_node_seeds(node.JSON), JSON, 107)],
               mx.ingest.max_frame_bytes, _node_marker, node_reply),
    ]


# -- a raw WebSocket client ------------------------------------------------------------------------


class Raw:
    """One WebSocket connection written byte for byte; a task reads the router's frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.replies: list[tuple[int, bytes]] = []  # data frames not yet accounted
        self.close_code: int | None = None
        self.closed = asyncio.Event()
        self.counted = False  # its close was counted by the attacker
        self._waiting: tuple[Match, asyncio.Future] | None = None
        self._task = asyncio.ensure_future(self._read())

    @classmethod
    async def open(cls, port: int, path: str, source: str) -> "Raw":
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 101 "), head
        return cls(reader, writer)

    async def _read(self) -> None:
        reader = self.reader
        try:
            while True:
                head = await reader.readexactly(2)
                opcode, length = head[0] & 0x0F, head[1] & 0x7F
                if length == 126:
                    length = int.from_bytes(await reader.readexactly(2), "big")
                elif length == 127:
                    length = int.from_bytes(await reader.readexactly(8), "big")
                payload = await reader.readexactly(length)
                if opcode == Opcode.CLOSE:
                    self.close_code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                    self.send(client_frame(Opcode.CLOSE, payload[:2]))  # our half of the closing handshake
                    return
                if opcode == Opcode.PING:
                    self.send(client_frame(Opcode.PONG, payload))
                    continue
                if opcode != Opcode.PONG:
                    self.replies.append((opcode, payload))
                waiting = self._waiting
                if waiting is not None and not waiting[1].done() and waiting[0](opcode, payload):
                    waiting[1].set_result(True)
        except (asyncio.IncompleteReadError, ConnectionError):
            if self.close_code is None:
                self.close_code = ABNORMAL
        finally:
            self.closed.set()
            if self._waiting is not None and not self._waiting[1].done():
                self._waiting[1].set_result(False)
            self.writer.close()

    def send(self, data: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(data)

    async def exchange(self, data: bytes, match: Match, timeout: float) -> bool | None:
        """Write ``data``, then wait for a frame that ``match``es: True; False if the connection
        closed first; None if neither happened within ``timeout``."""
        if self.closed.is_set():
            return False
        future = asyncio.get_running_loop().create_future()
        self._waiting = (match, future)
        try:
            self.send(data)
            try:
                return await asyncio.wait_for(asyncio.shield(future), timeout)
            except TimeoutError:
                return None
        finally:
            self._waiting = None

    async def wait_closed(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self.closed.wait(), timeout)
            return True
        except TimeoutError:
            return False

    async def close(self) -> None:
        if not self.closed.is_set():
            self.send(client_frame(Opcode.CLOSE, (1000).to_bytes(2, "big")))
            if not await self.wait_closed(5):
                self.writer.transport.abort()
        await self._task


def wire(frame: Fuzzed) -> bytes:
    """A fuzzed frame as the client writes it: one masked frame, or its fragments."""
    opcode = Opcode.TEXT if frame.text else Opcode.BINARY
    if frame.fragments == 1:
        return client_frame(opcode, frame.payload)
    step = -(-len(frame.payload) // frame.fragments) or 1
    parts = [frame.payload[at:at + step] for at in range(0, len(frame.payload), step)] or [b""]
    out = [client_frame(opcode if index == 0 else Opcode.CONT, part, fin=index == len(parts) - 1)
           for index, part in enumerate(parts)]
    return b"".join(out)


def announced(opcode: int, length: int, fin: bool = True) -> bytes:
    """The header of a masked frame of ``length`` bytes (mask key zero), without its payload."""
    first = (0x80 if fin else 0) | opcode
    if length < 126:
        return bytes((first, 0x80 | length)) + bytes(4)
    if length < 1 << 16:
        return struct.pack("!BBH", first, 0x80 | 126, length) + bytes(4)
    return struct.pack("!BBQ", first, 0x80 | 127, length) + bytes(4)


def _shown(frame: Fuzzed) -> dict:
    head = frame.payload[:300]
    return {"op": frame.op, "bytes": len(frame.payload), "text": frame.text, "fragments": frame.fragments,
            "head": head.decode("utf-8", "backslashreplace") if frame.text else head.hex()}


# -- the attacker -------------------------------------------------------------------------------------


@dataclass
class Tally:
    frames: int = 0  # frames written, named attacks included
    random: int = 0
    connections: int = 0
    replies: int = 0
    markers: int = 0
    ops: Counter = field(default_factory=Counter)
    attacks: Counter = field(default_factory=Counter)
    closes: Counter = field(default_factory=Counter)  # close code -> connections
    invalid_replies: list = field(default_factory=list)
    failures: list = field(default_factory=list)  # what must not happen, with the frames that did it
    seconds: float = 0.0


class Attacker:
    """One codec's attack, from its own address: the named attacks, FRAMES random frames, then the
    replays of what went wrong."""

    def __init__(self, target: Target, port: int) -> None:
        self.target = target
        self.port = port
        self.source = own_address()
        self.tally = Tally()
        self.raw: Raw | None = None
        self._markers = itertools.count(1)
        self._choice = random.Random(target.name)
        self._suspects: list[tuple[str, list[Fuzzed]]] = []

    async def run(self) -> Tally:
        started = time.monotonic()
        try:
            await self._named_attacks()
            sent = 0
            while sent < FRAMES:
                frames = [self._choice.choice(self.target.mutators).next() for _ in range(min(WINDOW, FRAMES - sent))]
                sent += len(frames)
                self.tally.random += len(frames)
                self.tally.ops.update(frame.op.split("+")[0] for frame in frames)
                await self._window(frames)
            await self._replay_suspects()
        finally:
            await self._drop()
            self.tally.seconds = round(time.monotonic() - started, 1)
        return self.tally

    # -- connections --------------------------------------------------------------------------

    async def _connection(self) -> Raw:
        if self.raw is None or self.raw.closed.is_set():
            await self._drop()
            self.raw = await Raw.open(self.port, self.target.path, self.source)
            self.tally.connections += 1
            if self.target.hello is not None:
                await self.target.hello(self.raw)
                self.raw.replies.clear()
        return self.raw

    async def _drop(self) -> None:
        """Close the current connection; one the router closed unasked must have had a reason."""
        raw = self.raw
        if raw is None:
            return
        if raw.closed.is_set() and not raw.counted:  # closed after its last marker was answered
            self._fail(f"closed {self._closed()} after its marker was answered", [])
        self.raw = None
        await raw.close()
        self._account(raw)

    def _account(self, raw: Raw) -> list[tuple[int, bytes]]:
        """Count and check what the router sent since the last call; returns it."""
        replies, raw.replies = raw.replies, []
        self.tally.replies += len(replies)
        for opcode, payload in replies:
            if not self.target.reply_ok(opcode, payload) and len(self.tally.invalid_replies) < 10:
                self.tally.invalid_replies.append({"opcode": opcode, "head": payload[:300].hex()})
        return replies

    def _fail(self, what: str, frames: list[Fuzzed], **details: Any) -> None:
        self.tally.failures.append({"what": what, **details, "frames": [_shown(frame) for frame in frames[:4]]})

    # -- sending --------------------------------------------------------------------------------

    async def _window(self, frames: list[Fuzzed]) -> None:
        """Frames under the frame limit and a marker on one connection; the others one by one."""
        limit = self.target.max_frame_bytes
        regular = [frame for frame in frames if len(frame.payload) <= limit]
        if regular:
            answered = await self._send(b"".join(wire(frame) for frame in regular), MARKER_TIMEOUT_S)
            self.tally.frames += len(regular)
            if answered is not True:
                self._suspects.append(("stalled" if answered is None else f"closed {self._closed()}", regular))
        for frame in frames:
            if len(frame.payload) > limit:
                await self._terminal(announced(Opcode.TEXT if frame.text else Opcode.BINARY, len(frame.payload)),
                                     1009, frame)

    async def _send(self, data: bytes, timeout: float) -> bool | None:
        """``data`` and a marker: whether the marker was answered (None: no answer, no close)."""
        raw = await self._connection()
        opcode, payload, match = self.target.marker(next(self._markers))
        self.tally.markers += 1
        answered = await raw.exchange(data + client_frame(opcode, payload), match, timeout)
        if answered is None:
            await self._drop()
        return answered

    def _closed(self) -> int | None:
        """The close code of the current connection once it is gone (counted once), else None."""
        raw = self.raw
        if raw is None or not raw.closed.is_set():
            return None
        if not raw.counted:
            raw.counted = True
            self.tally.closes[raw.close_code] += 1
        return raw.close_code

    async def _terminal(self, data: bytes, expected: int, frame: Fuzzed) -> None:
        """A frame the router must answer by closing with ``expected``."""
        raw = await self._connection()
        raw.send(data)
        self.tally.frames += 1
        if not await raw.wait_closed(MARKER_TIMEOUT_S):
            self._fail("not closed", [frame], expected=expected)
            await self._drop()
            return
        self._account(raw)
        code = self._closed()
        if code != expected:
            self._fail(f"closed {code}", [frame], expected=expected)

    async def _alive(self, frame: Fuzzed, check: Callable[[list[tuple[int, bytes]]], bool] | None = None) -> None:
        """A frame on a fresh connection that must be answered without closing it (and as ``check`` says)."""
        await self._drop()
        self.tally.attacks[frame.op] += 1
        answered = await self._send(wire(frame), MARKER_TIMEOUT_S)
        self.tally.frames += 1
        if answered is not True:
            self._fail("stalled" if answered is None else f"closed {self._closed()}", [frame])
            return
        replies = self._account(self.raw)
        if check is not None and not check(replies):
            self._fail("wrong answer", [frame], replies=[payload[:300].hex() for _, payload in replies])

    async def _named_attacks(self) -> None:
        target = self.target
        mutator = target.mutators[0]
        for depth in NEST_DEPTHS:
            await self._alive(mutator.nested(depth))
        if target.over_message is not None:
            size, exact = target.over_message
            frame = replace(mutator.oversized(size), op="over_message_limit")
            await self._alive(frame, lambda replies: sum(exact(size, *reply) for reply in replies) == 1)
        limit = target.max_frame_bytes
        whole = mutator.oversized(limit + 1)
        opcode = Opcode.TEXT if whole.text else Opcode.BINARY
        self.tally.attacks["oversized"] += 1
        await self._terminal(announced(opcode, limit + 1), 1009, whole)
        # The same message in two fragments: the first one whole (under the limit), the second
        # announcing the rest.
        half = len(whole.payload) // 2
        self.tally.attacks["oversized_fragmented"] += 1
        await self._terminal(client_frame(opcode, whole.payload[:half], fin=False)
                             + announced(Opcode.CONT, len(whole.payload) - half), 1009, whole)
        self.tally.frames += 1  # the first fragment
        for _ in range(INVALID_UTF8_FRAMES):
            frame = mutator.invalid_utf8()
            self.tally.attacks["invalid_utf8"] += 1
            await self._terminal(client_frame(Opcode.TEXT, frame.payload), 1007, frame)

    async def _replay_suspects(self) -> None:
        """The frames of a window that went wrong, each alone on a fresh connection, until one does it again."""
        for what, frames in self._suspects[:MAX_REPLAYED_WINDOWS]:
            for frame in frames:
                await self._drop()
                answered = await self._send(wire(frame), REPLAY_TIMEOUT_S)
                if answered is not True:
                    outcome = "stalled" if answered is None else f"closed {self._closed()}"
                    self._fail(what, [frame], replayed=outcome)
                    break
            else:
                self._fail(what, frames, replayed="not reproduced alone")
                continue
            if outcome == "stalled":
                return  # the router is stuck: more replays would only wait
        if len(self._suspects) > MAX_REPLAYED_WINDOWS:
            self.tally.failures.append({"what": f"{len(self._suspects) - MAX_REPLAYED_WINDOWS} more windows went wrong",
                                        "windows": [what for what, _ in self._suspects[MAX_REPLAYED_WINDOWS:]]})


# -- the well-behaved clients ----------------------------------------------------------------------


class CalmSignal:
    """``hub:send`` from one actor to another, registered one.

    The receiver also gets the attacker's broadcasts, relayed as sent: each is checked to nest no
    deeper than the router's limit (``router.nesting``), which a JSON parser with a recursion limit
    (Python's) needs.
    """

    def __init__(self, port: int, path: str, stage: str) -> None:
        self.url = f"ws://127.0.0.1:{port}{path}"
        self.receiver_address, self.sender_address = f"calm-{stage}/receiver", f"calm-{stage}/sender"
        self.too_deep: list[str] = []  # heads of relayed frames nested deeper than MAX_NESTING

    async def open(self) -> None:
        self.receiver = await HubClient.open(self.url, self.receiver_address)
        reply = await self.receiver.request("hub:register", {"actorAddress": self.receiver_address})
        assert reply["type"] == "hub:registered", reply
        self.sender = await HubClient.open(self.url, self.sender_address)

    async def round_trip(self, n: int) -> None:
        await self.sender.send("hub:send", {"n": n}, to=self.receiver_address)
        while True:
            raw = await self.receiver.recv_raw()
            message = orjson.loads(raw)
            if too_deep(message):
                self.too_deep.append(raw[:300] if isinstance(raw, str) else raw[:300].decode("utf-8", "replace"))
            if message["type"] == "hub:send" and message["from"] == self.sender_address:  # else: broadcasts
                assert message["payload"] == {"n": n}, message
                return

    async def close(self) -> None:
        await self.receiver.close()
        await self.sender.close()


class CalmNolag:
    """A QoS 0 publish to a subscriber of the topic."""

    topic = "calm/room/t"

    def __init__(self, port: int, path: str, keys: KeyStore) -> None:
        self.url = f"ws://127.0.0.1:{port}{path}"
        self.tokens = [keys.create("calm")[0] for _ in range(2)]

    async def open(self) -> None:
        self.subscriber = await Client.open(self.url, self.tokens[0])
        await self.subscriber.subscribe(self.topic, qos=0)
        self.publisher = await Client.open(self.url, self.tokens[1])
        await self.publisher.subscribe(self.topic, qos=0)

    async def round_trip(self, n: int) -> None:
        await self.publisher.publish(self.topic, {"n": n}, qos=0, echo=False)
        message = await self.subscriber.expect("message")
        assert (message["topic"], message["data"]) == (self.topic, {"n": n}), message

    async def close(self) -> None:
        await self.subscriber.close()
        await self.publisher.close()


class CalmCashu:
    """A mint quote's state pushed over the state feed, notified to the subscribed wallet."""

    def __init__(self, port: int, path: str, state_path: str, quote: str) -> None:
        self.url = f"ws://127.0.0.1:{port}{path}"
        self.state_url = f"http://127.0.0.1:{port}{state_path}"
        self.quote = quote

    async def open(self) -> None:
        self.http = aiohttp.ClientSession(headers={"Authorization": f"Bearer {CASHU_FEED_KEY}"})
        self.wallet = await Wallet.open(self.url)
        request_id = await self.wallet.subscribe("bolt11_mint_quote", [self.quote], "calm")
        await self.wallet.expect_ok(request_id, "calm")
        await self.wallet.quiet()

    async def round_trip(self, n: int) -> None:
        state = mint_quote(self.quote, "UNPAID", amount=n)
        async with self.http.post(self.state_url, json={"kind": "bolt11_mint_quote", "payload": state}) as response:
            assert response.status == 200, await response.text()
        assert await self.wallet.notification() == ("calm", state)

    async def close(self) -> None:
        await self.wallet.close()
        await self.http.close()


class CalmBaqend:
    """A REST update of a document, seen by a live query on its bucket."""

    def __init__(self, port: int, path: str, rest_path: str, bucket: str) -> None:
        self.events_url = f"ws://127.0.0.1:{port}{path}"
        self.rest = Rest(f"http://127.0.0.1:{port}{rest_path}")
        self.bucket = bucket

    async def open(self) -> None:
        await self.rest.__aenter__()
        await self.rest.insert(self.bucket, "doc", n=0)
        self.events = await Events.open(self.events_url)
        await self.events.subscribe("calm", self.bucket, query={"n": {"$gte": 0}}, initial=True)
        assert [key_of(document) for document in await self.events.result("calm")] == ["doc"]

    async def round_trip(self, n: int) -> None:
        await self.rest.set(self.bucket, "doc", n=n)
        frame = await self.events.recv()
        assert (frame["type"], frame["matchType"], frame["data"]["n"]) == ("match", "change", n), frame

    async def close(self) -> None:
        await self.events.close()
        await self.rest.__aexit__()


class CalmMx:
    """A SaveBlock from a node, its event delivered to a consumer subscribed to the event's address."""

    def __init__(self, port: int, hub_path: str, save_path: str, salt: str) -> None:
        self.hub_url = f"ws://127.0.0.1:{port}{hub_path}"
        self.save_url = f"ws://127.0.0.1:{port}{save_path}"
        self.salt = salt

    async def open(self) -> None:
        self.consumer = await Consumer.open(self.hub_url)
        await self.consumer.subscribe("Address", encode_address(CALM_ADDRESS))
        self.node = await Node.open(self.save_url)

    def block(self, n: int) -> mx_node_pb2.OutportBlock:
        block = mx_node_pb2.OutportBlock(ShardID=0)
        block.BlockData.ShardID = 0
        block.BlockData.HeaderHash = hashlib.sha256(f"{self.salt}-{n}".encode()).digest()
        log = block.TransactionPool.Logs.add(TxHash=hashlib.sha256(f"tx-{self.salt}-{n}".encode()).hexdigest())
        log.Log.Address = CALM_ADDRESS
        log.Log.Events.append(mx_node_pb2.Event(Address=CALM_ADDRESS, Identifier=b"writeLog", Topics=[b"calm"],
                                                Data=str(n).encode()))
        return block

    async def round_trip(self, n: int) -> None:
        block = self.block(n)
        await self.node.save(block)  # returns on the node's ACK: every topic shard took the block
        wanted = block.BlockData.HeaderHash.hex()
        while True:
            topic, message = await self.consumer.event()
            if topic == mx_codec.EVENTS_TOPIC and message.block_hash == wanted:  # else: the attacker's blocks
                assert (message.address, message.data) == (encode_address(CALM_ADDRESS), str(n).encode()), message
                return

    async def close(self) -> None:
        await self.consumer.close()
        await self.node.close()


def calm_clients(running, keys: KeyStore, stage: str) -> dict[str, Any]:
    """A well-behaved pair per dialect, on objects of their own (``stage``: during or after the attack)."""
    settings = running.settings
    port = running.router.endpoints()[0]["listeners"][0]["port"]
    return {
        "signal": CalmSignal(port, settings.signal.path, stage),
        "nolag": CalmNolag(port, settings.nolag.path, keys),
        "cashu": CalmCashu(port, settings.cashu.path, settings.cashu.state_path, f"calm-{stage}"),
        "baqend": CalmBaqend(port, settings.baqend.path, settings.baqend.rest_path, f"Calm{stage}"),
        "mx": CalmMx(port, settings.mx.path, settings.mx.ingest.path, stage),
    }


@dataclass
class Steady:
    latencies_s: list = field(default_factory=list)
    failures: list = field(default_factory=list)


async def keep_working(client: Any, stop: asyncio.Event, steady: Steady, first: int) -> None:
    """A round trip every PACE_S until ``stop``; a failed one ends the loop (its state is unknown)."""
    loop = asyncio.get_running_loop()
    due = loop.time()
    for n in itertools.count(first):
        if stop.is_set():
            return
        started = loop.time()
        try:
            await asyncio.wait_for(client.round_trip(n), ROUND_TRIP_TIMEOUT_S)
        except Exception as error:
            steady.failures.append(f"round trip {n}: {type(error).__name__}: {error}"[:500])
            return
        steady.latencies_s.append(loop.time() - started)
        due = max(due + PACE_S, loop.time())
        await asyncio.sleep(due - loop.time())


def latency_figures(latencies_s: list[float]) -> dict[str, Any]:
    if not latencies_s:
        return {"round_trips": 0}
    ordered = sorted(latencies_s)

    def ms(quantile: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(quantile * len(ordered)))] * 1000, 1)

    return {"round_trips": len(ordered), "p50_ms": ms(0.5), "p99_ms": ms(0.99), "max_ms": ms(1.0)}


# -- the router's side --------------------------------------------------------------------------------


def _log_files(pids: list[int]) -> list[Path]:
    """The stderr logs of these Ray workers (a gateway and a shard log there), in this session's logs dir."""
    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    return [path for pid in pids for path in logs.glob(f"worker-*-{pid}.err")]


def _log_sizes(files: list[Path]) -> dict[Path, int]:
    return {path: path.stat().st_size for path in files}


def _logged_exceptions(sizes: dict[Path, int]) -> list[str]:
    """Each traceback logged since ``sizes`` were taken, down to its exception's line."""
    found = []
    for path, size in sizes.items():
        with path.open("rb") as log:
            log.seek(size)
            text = log.read().decode("utf-8", "replace")
        for part in text.split("Traceback (most recent call last):")[1:]:
            lines = part.splitlines()
            end = next((i for i, line in enumerate(lines[1:], 1) if line and not line.startswith(" ")), len(lines))
            found.append(f"{path.name}: Traceback (most recent call last):" + "\n".join(lines[:end + 1]))
    return found


async def _stats(running) -> dict:
    return await running.router.gateways[0].actor.stats.remote()


def _shard_info(running) -> dict[str, tuple[int, int]]:
    infos = ray.get([shard.info.remote() for shards in running.router.shards.values() for shard in shards])
    return {info["name"]: (info["epoch"], info["pid"]) for info in infos}


def _mib(rss: int) -> float:
    return round(rss / (1 << 20), 1)


async def _rss_samples(process: psutil.Process, count: int) -> list[int]:
    samples = []
    for _ in range(count):
        samples.append(process.memory_info().rss)
        await asyncio.sleep(0.1)
    return samples


async def _sample_peak(process: psutil.Process, stop: asyncio.Event, peak: list[int]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], process.memory_info().rss)
        await asyncio.sleep(0.1)


# -- the test -------------------------------------------------------------------------------------------


def test_hostile_frames_on_every_dialect_leave_the_router_serving(fuzzed, tmp_path):
    settings = fuzzed.settings
    keys = open_key_store(settings)
    nolag_token, _ = keys.create("fz", rate_limit_per_s=100_000)
    port = fuzzed.router.endpoints()[0]["listeners"][0]["port"]
    shards_before = _shard_info(fuzzed)
    summary: dict[str, Any] = {}

    async def scenario() -> None:
        gateway_pid = (await _stats(fuzzed))["pid"]
        logs = _log_sizes(_log_files([gateway_pid] + [pid for _, pid in shards_before.values()]))
        process = psutil.Process(gateway_pid)
        calm = calm_clients(fuzzed, keys, "during")
        for client in calm.values():
            await client.open()
        for n in range(1, 11):  # warm up: the first round trips load what every later one uses
            await asyncio.gather(*(client.round_trip(n) for client in calm.values()))
        before = statistics.median(await _rss_samples(process, 5))

        stop = asyncio.Event()
        peak = [process.memory_info().rss]
        steady = {name: Steady() for name in calm}
        sampler = asyncio.ensure_future(_sample_peak(process, stop, peak))
        workers = [asyncio.ensure_future(keep_working(client, stop, steady[name], 11)) for name, client in calm.items()]
        attackers = [Attacker(target, port) for target in targets(fuzzed, nolag_token)]
        started = time.monotonic()
        try:
            tallies = await asyncio.gather(*(attacker.run() for attacker in attackers))
        finally:
            stop.set()
            await asyncio.gather(*workers, sampler)
        summary["attack_s"] = round(time.monotonic() - started, 1)
        summary["dialects"] = {attacker.target.name: _tally_summary(tally)
                               for attacker, tally in zip(attackers, tallies)}
        summary["well_behaved"] = {name: {**latency_figures(s.latencies_s), "lost": len(s.failures),
                                          "failures": s.failures} for name, s in steady.items()}
        summary["relayed_too_deep"] = calm["signal"].too_deep[:5]
        for client in calm.values():
            await client.close()

        # Afterwards: fresh clients of every dialect are served, nothing is held, memory settles.
        summary["fresh_clients"] = {}
        for name, client in calm_clients(fuzzed, keys, "after").items():
            try:
                await client.open()
                await asyncio.wait_for(client.round_trip(1), ROUND_TRIP_TIMEOUT_S)
                await client.close()
                summary["fresh_clients"][name] = "served"
            except Exception as error:
                summary["fresh_clients"][name] = f"{type(error).__name__}: {error}"[:500]
        try:
            stats = await eventually(lambda: _idle(fuzzed), timeout=30)
        except AssertionError:
            stats = await _stats(fuzzed)
        summary["gateway_at_end"] = {key: stats[key] for key in ("connections", "reading_held", "queued_http_requests",
                                                                 "outbound_bytes")}

        async def settled() -> int | None:
            rss = process.memory_info().rss
            return rss if rss <= before + AFTER_BOUND_MIB * (1 << 20) else None

        try:
            after = await eventually(settled, timeout=SETTLE_S, interval=0.5)
        except AssertionError:
            after = process.memory_info().rss
        summary["gateway_rss_mib"] = {"before": _mib(before), "peak": _mib(peak[0]), "after": _mib(after),
                                      "peak_bound_over_before": PEAK_BOUND_MIB,
                                      "after_bound_over_before": AFTER_BOUND_MIB}
        summary["logged_exceptions"] = _logged_exceptions(logs)

    try:
        run(scenario(), timeout=240)
    finally:
        if summary:
            (tmp_path / "fuzz-summary.json").write_text(json.dumps(summary, indent=2, default=str))
            print("\nhostile-client fuzz:", json.dumps(summary, indent=2, default=str))

    for name, figures in summary["dialects"].items():
        assert figures["random_frames"] >= FRAMES, (name, figures)
        assert figures["failures"] == [], (name, figures["failures"])
        assert figures["invalid_replies"] == [], (name, figures["invalid_replies"])
    for name, figures in summary["well_behaved"].items():
        assert figures["lost"] == 0 and figures["round_trips"] >= 20, (name, figures)
    assert summary["relayed_too_deep"] == []
    assert set(summary["fresh_clients"].values()) == {"served"}, summary["fresh_clients"]
    assert summary["gateway_at_end"] == {"connections": 0, "reading_held": 0, "queued_http_requests": 0,
                                         "outbound_bytes": 0}
    assert summary["logged_exceptions"] == []
    assert _shard_info(fuzzed) == shards_before  # no shard restarted
    memory = summary["gateway_rss_mib"]
    assert memory["peak"] <= memory["before"] + PEAK_BOUND_MIB, memory
    assert memory["after"] <= memory["before"] + AFTER_BOUND_MIB, memory


async def _idle(running) -> dict | None:
    stats = await _stats(running)
    idle = (stats["connections"] == 0 and stats["reading_held"] == 0 and stats["queued_http_requests"] == 0
            and stats["dialects"]["mx"]["queued"] == 0)
    return stats if idle else None


def _tally_summary(tally: Tally) -> dict[str, Any]:
    return {
        "frames": tally.frames, "random_frames": tally.random, "attacks": dict(tally.attacks),
        "ops": dict(tally.ops), "connections": tally.connections,
        "closes": {str(code): count for code, count in tally.closes.items()},
        "replies": tally.replies, "markers": tally.markers, "seconds": tally.seconds,
        "failures": tally.failures, "invalid_replies": tally.invalid_replies,
    }


# -- what the fuzzing found, one frame at a time ------------------------------------------------------


def _nested_list(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_a_signal_message_nested_too_deep_outside_its_payload_is_refused_not_relayed(fuzzed):
    """The depth limit covered ``payload`` only: a broadcast whose ``correlationId`` nested 33 to
    1,023 levels was relayed as sent to every registered actor (a Python client's ``json.loads``
    fails on it from about 1,000 levels)."""
    url = f"ws://127.0.0.1:{fuzzed.router.endpoints()[0]['listeners'][0]['port']}{fuzzed.settings.signal.path}"

    async def scenario():
        receiver = await HubClient.open(url, "deep/receiver")
        assert (await receiver.request("hub:register", {"actorAddress": "deep/receiver"}))["type"] == "hub:registered"
        sender = await HubClient.open(url, "deep/sender")
        for levels in (33, 1000):
            for kind, to in (("hub:broadcast", HUB), ("hub:send", "deep/receiver")):
                await sender.send_raw('{"type": "%s", "from": "deep/sender", "to": "%s", "payload": {"n": 1}, '
                                      '"correlationId": %s}' % (kind, to, _nested_list(levels)))
                reply = await sender.recv()
                assert (reply["type"], reply["payload"]) == ("hub:error", {
                    "code": "internal_error", "message": "A message may nest at most 32 levels",
                    "details": {"reason": "too_deep"}}), reply
        await sender.send("hub:send", {"n": 2}, to="deep/receiver")
        assert (await receiver.recv())["payload"] == {"n": 2}  # the first thing it gets
        await receiver.close()
        await sender.close()

    run(scenario())


BAQEND_DEEP = [  # (where the nesting is, the message): each ended in a RecursionError and close 1011
    ("type", '{"id": "e", "type": %s}' % ('{"a":' * 1000 + "1" + "}" * 1000)),
    # The query as the SDK sends it, a string of JSON: the depth check at decode sees only the string.
    ("query string, $in", json.dumps({"id": "e", "type": "subscribe", "bucket": "T",
                                      "query": '{"n": {"$in": %s}}' % _nested_list(600)})),
    ("query string, value", json.dumps({"id": "e", "type": "subscribe", "bucket": "T",
                                        "query": '{"n": %s}' % ('{"b":' * 1000 + "1" + "}" * 1000)})),
]


def test_baqend_values_nested_hundreds_of_levels_get_an_error_message_not_an_internal_error(fuzzed):
    """Building the error message (``{value!r}``) or compiling the query recursed once per level."""
    url = f"ws://127.0.0.1:{fuzzed.router.endpoints()[0]['listeners'][0]['port']}{fuzzed.settings.baqend.path}"

    async def scenario():
        for name, message in BAQEND_DEEP:
            client = await Events.open(url)
            await client.send(message)
            frame = await client.recv()
            assert ({key: frame.get(key) for key in ("type", "id", "status")},
                    {key: frame["error"].get(key) for key in ("status", "reason")}) == (
                {"type": "error", "id": "e", "status": 400}, {"status": 400, "reason": "Bad Request"}), (name, frame)
            await client.subscribe("ok", "T", initial=True)  # the connection still works
            assert await client.result("ok") == [], name
            await client.close()

    run(scenario())


def test_connections_refused_in_the_middle_of_a_message_leave_no_memory_behind(fuzzed):
    """A fragment just under ``max_frame_bytes``, then a continuation over it: close 1009. The
    closed connection kept the fragment (and websockets its read buffer) until a full garbage
    collection: about 0.6 MiB more gateway memory per such connection to /signal."""
    port = fuzzed.router.endpoints()[0]["listeners"][0]["port"]
    path, limit = fuzzed.settings.signal.path, fuzzed.settings.signal.max_frame_bytes
    attempts = 40

    async def scenario():
        process = psutil.Process((await _stats(fuzzed))["pid"])
        source = own_address()

        async def refused() -> None:
            raw = await Raw.open(port, path, source)
            raw.send(client_frame(Opcode.TEXT, b"x" * (limit - 1), fin=False) + announced(Opcode.CONT, 2))
            assert await raw.wait_closed(10) and raw.close_code == 1009
            await raw.close()

        await refused()
        before = process.memory_info().rss
        for _ in range(attempts):
            await refused()
        grown = (process.memory_info().rss - before) / (1 << 20)
        assert grown <= 8, f"{grown:.1f} MiB more after {attempts} connections of {limit >> 20} MiB fragments"

    run(scenario())


def test_undecodable_node_frames_decoded_off_the_loop_leave_no_memory_behind(fuzzed):
    """A node frame of ``offload_frame_bytes`` or more is decoded in a worker thread; an invalid
    one came back as an exception whose traceback held the thread's frames, and with them the
    whole frame, until a full garbage collection: 4 MiB more per 4 MiB frame."""
    port = fuzzed.router.endpoints()[0]["listeners"][0]["port"]
    frames, size = 10, 4 << 20
    garbage = client_frame(Opcode.BINARY, b"\x0a\x00" + b"x" * (size - 2))  # a WsMessage of type 0: dropped

    async def scenario():
        process = psutil.Process((await _stats(fuzzed))["pid"])
        raw = await Raw.open(port, fuzzed.settings.mx.ingest.path, own_address())

        async def push(batch: int) -> None:
            opcode, marker, answered = _node_marker(batch)
            assert await raw.exchange(garbage * frames + client_frame(opcode, marker), answered, 30)
            assert raw.replies == [(Opcode.BINARY, node.node_ack_frame(2 ** 40 + batch))]  # the marker's ACK only
            raw.replies.clear()

        await push(1)  # the same load once first: what the allocator keeps after it is not a leak
        before = process.memory_info().rss
        for batch in (2, 3):
            await push(batch)
        await raw.close()
        grown = (process.memory_info().rss - before) / (1 << 20)
        # The leak kept every frame: 80 MiB here. Without it the growth is under 1 MiB: the gateway
        # serves buffers of 1 MiB and more by mmap (router.proc.tune_malloc). Before that, glibc kept
        # 4 MiB buffers freed in the decode thread's arena: -8 to +8 MiB from round to round, and
        # 13.3 MiB once, after the module's other attacks on the same gateway.
        allowed = size / (1 << 20)
        assert grown <= allowed, f"{grown:.1f} MiB more after {2 * frames} undecodable frames of {size >> 20} MiB"

    run(scenario())
