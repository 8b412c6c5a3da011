"""Block data from a MultiversX node: the node's outport driver frames in, normalised events out.

Server mode (the node's default client mode dials us): the node connects to ``mx.ingest.path``.
Client mode: gateway 0 dials ``mx.ingest.connect_url`` and redials with backoff when it drops;
hub consumers stay connected meanwhile and receive again once blocks flow.

Either way each frame goes through :func:`decode` (gogo protobuf or JSON, normalised by
``gateways/mx/node.py``, each event's frame tail encoded once) and then
:meth:`NodeIngestDialect.dispatch`: drop a block already seen (the node resends a block until it
is acknowledged) and send the block to every topic shard in one ``mxpub`` command each. The
node's ACK is written when every shard has taken the block; if one has not, no ACK: the node
resends and the duplicate filter forgets the block. A frame of ``offload_frame_bytes`` or more is
decoded in a worker thread (a 32 MiB block takes seconds), one frame at a time per connection
and in order, so the gateway keeps serving everyone else meanwhile.

Who may push (server mode): with ``mx.node_token`` set, an upgrade without ``Authorization: Bearer
<token>`` gets 401 before the WebSocket opens; without a token, only loopback peers are accepted
(403 otherwise). A node's stock outport driver sends no header at all (it dials ``ws://<URL>/save``
with none), so a remote node pushes through a proxy beside it that adds the header, or the router
dials the node (client mode).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

from actors.mx import contract as mx
from actors.mx.contract import Stream, block_item
from gateways.dialect import Dialect, DialectSession, HttpRequest, HttpResponse, Wire
from gateways.mx import codec, node
from gateways.keepalive import CLOSE_IDLE, Keepalive
from gateways.mx.node import DuplicateSuppressor, Ignored, InvalidNodeFrame, SavedBlock
from gateways.mx.config import MxConfig
from gateways.mx.pb import mx_hub_pb2
from router import contract
from router.errors import CommandError, ShardUnavailable
from router.shardmap import TOPIC

logger = logging.getLogger(__name__)

DIALECT = "mx"  # ingress is counted under the hub's name: one dialect in the analytics
CLOSE_INTERNAL_ERROR = 1011
CLOSE_TRY_AGAIN = 1013

# Why an upgrade on the ingest path is refused (counted as refused_<reason>).
NO_TOKEN = "token"
NOT_LOOPBACK = "not_loopback"
REFUSALS = {
    NO_TOKEN: HttpResponse(401, b'{"error":"unauthorized","message":"node ingest needs the node token: '
                                b'Authorization: Bearer <mx.node_token>"}',
                           headers=[("WWW-Authenticate", 'Bearer realm="mx-node"')]),
    NOT_LOOPBACK: HttpResponse(403, b'{"error":"forbidden","message":"node ingest accepts only loopback '
                                    b'peers while mx.node_token is not set"}'),
}
REFUSAL_LOGS = {
    NO_TOKEN: "mx ingest: refused %s: missing or wrong node token (%d refused so far)",
    NOT_LOOPBACK: "mx ingest: refused %s: not a loopback peer (%d refused so far); set mx.node_token "
                  "(ROUTER_MX__NODE_TOKEN) and have the node's side send it to accept remote nodes",
}
REFUSAL_LOG_EVERY_S = 60.0  # a refusal is logged at most this often per reason (a scanner is not a flood)


def is_loopback(remote: str) -> bool:
    """Whether a peer (``host:port`` as the server writes it) is on this machine: 127.0.0.0/8, ::1,
    or an IPv4-mapped loopback address."""
    host = remote.rpartition(":")[0].strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def ingest_refusal(token: bytes | None, authorization: str | None, remote: str, forwarded: bool = False) -> str | None:
    """Why an upgrade on the ingest path is refused (NO_TOKEN, NOT_LOOPBACK), or None to accept.

    With a token, the ``Authorization: Bearer`` credential must equal it (compared in constant
    time), wherever the peer is; without one, only loopback peers may push, and not through a
    proxy on this machine (``forwarded``: the request carries Forwarded / X-Forwarded-For), which
    would make every client it relays look local.
    """
    if token is None:
        return None if is_loopback(remote) and not forwarded else NOT_LOOPBACK
    scheme, _, given = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token):
        return NO_TOKEN
    return None


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


def decode(data: bytes, marshaller: str) -> tuple[node.NodeFrame | None, Any]:
    """All the work on one frame before the shards, pure (so it may run in a worker thread):
    ``(frame, output)``, output an :class:`InvalidNodeFrame`, None for an ACK, :class:`Ignored`,
    or ``(block hash, items)``."""
    try:
        frame = node.decode_node_frame(data, marshaller)
    except InvalidNodeFrame as invalid:
        return None, _bare(invalid)
    if frame.type == node.ACK:
        return frame, None  # nothing is sent to a node that would need acknowledging
    try:
        output = node.handle_payload(frame)
    except InvalidNodeFrame as invalid:
        return frame, _bare(invalid)
    if isinstance(output, Ignored):
        return frame, output
    return frame, block_items(output)


def _bare(invalid: InvalidNodeFrame) -> InvalidNodeFrame:
    """The error without its traceback and context: their frames hold the whole refused frame
    (up to 64 MiB), and when decoded in a worker thread they form a cycle only a full garbage
    collection frees."""
    invalid.__context__ = None
    return invalid.with_traceback(None)


class NodeIngestDialect(Dialect):
    name = "mx-node"

    def __init__(self, gateway: Any, config: MxConfig, hub: Any) -> None:
        super().__init__(gateway)
        self.config = config.ingest
        self.mx = config
        self.hub = hub
        self.token = None if config.node_token is None else config.node_token.get_secret_value().encode()
        self.dedup = DuplicateSuppressor(self.config.dedup_window_s, self.config.dedup_max_entries)
        self.counts: Counter = Counter()
        self.refusal_logged: dict[str, float] = {}
        self.pool = ThreadPoolExecutor(self.config.decode_threads, thread_name_prefix="mx-decode")
        self.client: NodeClient | None = None

    def admit(self, request: HttpRequest) -> HttpResponse | None:
        forwarded = request.header("forwarded") is not None or request.header("x-forwarded-for") is not None
        reason = ingest_refusal(self.token, request.header("authorization"), request.remote, forwarded)
        if reason is None:
            return None
        self.counts["refused_" + reason] += 1
        now = time.monotonic()
        if now - self.refusal_logged.get(reason, -REFUSAL_LOG_EVERY_S) >= REFUSAL_LOG_EVERY_S:
            self.refusal_logged[reason] = now
            logger.warning(REFUSAL_LOGS[reason], request.remote, self.counts["refused_" + reason])
        return REFUSALS[reason]

    def new_session(self, wire: Wire, request_headers: Any) -> "NodeSession":
        return NodeSession(self, wire)

    async def start(self) -> None:
        if self.config.mode == "client" and self.gateway.index == 0:
            self.client = NodeClient(self)
            self.client.start()

    async def close(self) -> None:
        if self.client is not None:
            await self.client.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict[str, Any]:
        return {
            "nodes": len(self.sessions),
            "upstream": None if self.client is None else self.client.describe(),
            **dict(self.counts),
        }

    # -- one frame from the node ----------------------------------------------------------------

    async def decode_off_loop(self, data: bytes) -> tuple[node.NodeFrame | None, Any]:
        """:func:`decode`, in the worker thread when the frame is big enough to hold the loop up."""
        if len(data) < self.config.offload_frame_bytes:
            return decode(data, self.config.marshaller)
        return await asyncio.get_running_loop().run_in_executor(self.pool, decode, data, self.config.marshaller)

    def dispatch(self, decoded: tuple[node.NodeFrame | None, Any], size: int, t0: int,
                 reply: Callable[[bytes], Any]) -> None:
        """A decoded frame, in the order its connection sent it: duplicates, shards, the ACK."""
        counts = self.counts
        frame, output = decoded
        if isinstance(output, InvalidNodeFrame):
            counts["dropped_" + output.reason] += 1
            if frame is not None:
                logger.warning("mx ingest: %s frame %d dropped: %s", frame.topic, frame.counter, output)
            return
        if output is None:
            return

        def acknowledge() -> None:
            if frame.with_acknowledge:
                reply(node.node_ack_frame(frame.counter, frame.marshaller))

        if isinstance(output, Ignored):
            counts["ignored" if output.known else "ignored_unknown_topic"] += 1
            acknowledge()
            return
        block_hash, items = output
        key = node.dedup_key(frame.topic, block_hash)
        if not self.dedup.first_seen(key, time.monotonic()):
            counts["duplicates"] += 1
            acknowledge()
            return
        gateway = self.gateway
        meta = contract.event_meta(gateway.id, gateway.next_seq(), t0, DIALECT, frame.topic, block_hash)
        gateway.accepted(meta, frame.counter, size, -1)
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


class NodeFeed:
    """One node connection's frames, handled in arrival order.

    A small frame is handled at once. A big one is decoded in the worker thread; the frames that
    arrive meanwhile wait behind it (the connection is closed with 1013 if more than
    ``max_waiting_bytes`` would wait), so the shards see blocks, and the node its ACKs, in the
    order it sent them. ``failed`` ends the connection if handling a waiting frame raises (as the
    server does when a frame it hands over raises).
    """

    def __init__(self, dialect: NodeIngestDialect, reply: Callable[[bytes], Any], failed: Callable[[], Any]) -> None:
        self.dialect = dialect
        self.reply = reply
        self.failed = failed
        self.waiting: deque[tuple[bytes, int]] = deque()  # (frame, arrival ns), the first being decoded
        self.waiting_bytes = 0
        self.task: asyncio.Task | None = None

    def push(self, data: bytes) -> bool:
        """Take a frame; False if too much already waits (the caller closes the connection)."""
        t0 = time.time_ns()
        dialect = self.dialect
        if self.task is None and len(data) < dialect.config.offload_frame_bytes:
            dialect.dispatch(decode(data, dialect.config.marshaller), len(data), t0, self.reply)
            return True
        if self.waiting_bytes + len(data) > dialect.config.max_waiting_bytes:
            return False
        self.waiting.append((data, t0))
        self.waiting_bytes += len(data)
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._drain())
        return True

    async def _drain(self) -> None:
        dialect, waiting = self.dialect, self.waiting
        try:
            while waiting:
                data, t0 = waiting[0]
                decoded = await dialect.decode_off_loop(data)
                waiting.popleft()
                self.waiting_bytes -= len(data)
                dialect.dispatch(decoded, len(data), t0, self.reply)
        except Exception:
            logger.exception("mx ingest: a node frame failed")
            self.task = None  # over: closing the session must not cancel it
            self.failed()
        finally:
            self.task = None

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.waiting.clear()
        self.waiting_bytes = 0


class NodeSession(DialectSession):
    """A node connected to us (server mode)."""

    def __init__(self, dialect: NodeIngestDialect, wire: Wire) -> None:
        super().__init__(dialect, wire)
        self.feed = NodeFeed(dialect, self._reply,
                             lambda: self.shut(CLOSE_INTERNAL_ERROR, "internal error", "internal_error"))
        self.keepalive = Keepalive(dialect.mx.ping_interval_s, dialect.mx.idle_timeout_s)

    def _reply(self, frame: bytes) -> None:
        """An ACK leaves at once: the shards' reply that brings it also brings the block's
        deliveries, which this turn writes after it, and the node can send its next block meanwhile."""
        self.wire.send_binary(frame)
        self.wire.flush()

    def on_message(self, data: bytes, is_text: bool) -> None:
        if self.closed:
            return
        if not self.feed.push(data):
            self.shut(CLOSE_TRY_AGAIN, f"node frames waiting over {self.dialect.config.max_waiting_bytes} bytes",
                      "waiting_full")

    def on_tick(self, now: float) -> None:
        if self.closed:
            return
        self.keepalive.tend(self.wire, now, lambda reason: self.shut(CLOSE_IDLE, reason, "idle"))

    def shut(self, code: int, reason: str, counted_as: str) -> None:
        self.dialect.counts["closed_" + counted_as] += 1
        self.release()
        self.wire.close(code, reason)

    def released(self) -> None:
        self.feed.stop()


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
        dialect = self.dialect
        try:
            async for message in ws:  # the next frame is read once this one is decoded: in order
                t0 = time.time_ns()
                data = message.encode() if isinstance(message, str) else message
                dialect.dispatch(await dialect.decode_off_loop(data), len(data), t0, replies.put_nowait)
        finally:
            writer.cancel()
