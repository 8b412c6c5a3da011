"""Lanes: the data plane between gateways and shards.

A Ray actor call costs about 0.5 ms of CPU on each side on a 2-core machine and tops out near
2,000 calls/s per caller (``docs/performance.md``). Batching hides that under load, but at a
modest steady rate every message is its own batch and pays it in full. So the commands and
deliveries travel over *lanes* instead: one persistent stream per (gateway, shard), a Unix socket
when both are on one node, TCP otherwise. Ray still owns the actors (placement, naming, restarts)
and is the control plane: a gateway asks a shard for its lane with an ordinary Ray call
(``open_lane``), which authenticates it through Ray's token and hands it the shard's secret.

Frames are a 4-byte big-endian length and a body. The first frame from a gateway is the hello:
the shard's 32-byte secret followed by the gateway id; nothing is unpickled before it matched.
After it, gateway → shard frames are a pickled command batch; shard → gateway frames are pickled
``(REPLY, results, bundle)`` in batch order, or ``(PUSH, bundle)`` for deliveries that other
gateways' batches produced. One stream carries both, in order.

This module is plain asyncio: :class:`LaneServer` runs its own event loop in a thread of the
shard process and calls ``execute(gateway_id, commands)`` for every batch; :class:`LaneClient` is
a protocol on the gateway's loop.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import pickle
import secrets
import socket
import struct
import threading
from typing import Any, Callable

from router.proc import new_event_loop

logger = logging.getLogger(__name__)

HEADER = struct.Struct("!I")
SECRET_BYTES = 32
MAX_FRAME_BYTES = 1 << 28  # a batch is bounded by batch_max commands; this only stops a broken peer
REPLY, PUSH = 0, 1
_PROTOCOL = pickle.HIGHEST_PROTOCOL


class LaneError(Exception):
    """The peer broke the framing or the hello."""


def encode(obj: Any) -> bytes:
    body = pickle.dumps(obj, protocol=_PROTOCOL)
    return HEADER.pack(len(body)) + body


def hello(secret: bytes, gateway_id: str) -> bytes:
    body = secret + gateway_id.encode()
    return HEADER.pack(len(body)) + body


class FrameReader:
    """Splits a byte stream into frame bodies."""

    __slots__ = ("buffer",)

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self.buffer
        buffer += data
        frames = []
        position, size = 0, len(buffer)
        while size - position >= 4:
            (length,) = HEADER.unpack_from(buffer, position)
            if length > MAX_FRAME_BYTES:
                raise LaneError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
            end = position + 4 + length
            if end > size:
                break
            frames.append(bytes(buffer[position + 4:end]))
            position = end
        if position:
            del buffer[:position]
        return frames



# -- the shard's side ----------------------------------------------------------------------------

Execute = Callable[[str, list], tuple]


class _ServerLane(asyncio.Protocol):
    def __init__(self, server: "LaneServer") -> None:
        self.server = server
        self.reader = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.gateway_id: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except LaneError as error:
            logger.warning("lane from %s: %s; closing", self.gateway_id or "an unknown peer", error)
            self.transport.close()
            return
        out = []
        server = self.server
        for body in frames:
            if self.gateway_id is None:
                if len(body) <= SECRET_BYTES or not hmac.compare_digest(body[:SECRET_BYTES], server.secret):
                    server.refused += 1
                    self.transport.close()
                    return
                self.gateway_id = body[SECRET_BYTES:].decode("utf-8", "replace")
                server.attach(self.gateway_id, self)
                continue
            try:
                results, bundle = server.execute(self.gateway_id, pickle.loads(body))
                out.append(encode((REPLY, results, bundle)))
            except Exception:  # the execute callback answers every command; this is a bug
                logger.exception("lane batch from %s failed", self.gateway_id)
                self.transport.close()
                return
        if out:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])

    def connection_lost(self, exc: Exception | None) -> None:
        if self.gateway_id is not None:
            self.server.detach(self.gateway_id, self)


class LaneServer:
    """A shard's lane endpoint: its own event loop in a daemon thread.

    ``execute(gateway_id, commands) -> (results, bundle)`` runs on that thread; the shard must
    serialise it with anything else that touches its state (its Ray methods run on the main thread).
    """

    def __init__(self, name: str, execute: Execute) -> None:
        self.name = name
        self.execute = execute
        self.secret = secrets.token_bytes(SECRET_BYTES)
        self.refused = 0
        self._lanes: dict[str, _ServerLane] = {}
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"lane-{name}", daemon=True)
        self._thread.start()
        self._unix_path: str | None = None
        self._tcp: tuple[str, int] | None = None
        self._servers: list[asyncio.AbstractServer] = []

    def _run(self, coroutine: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def unix_address(self) -> str:
        """A Unix socket for gateways on this node (Linux: abstract, nothing on disk)."""
        if self._unix_path is None:
            path = f"\0router-lane-{os.getpid()}-{secrets.token_hex(6)}"
            if not hasattr(socket, "AF_UNIX") or not os.uname().sysname == "Linux":
                import tempfile

                path = os.path.join(tempfile.gettempdir(), path[1:] + ".sock")
            self._servers.append(self._run(self._loop.create_unix_server(lambda: _ServerLane(self), path)))
            self._unix_path = path
        return self._unix_path

    def tcp_address(self, host: str) -> tuple[str, int]:
        """A TCP listener on ``host`` (an ephemeral port) for gateways on other nodes."""
        if self._tcp is None:
            server = self._run(self._loop.create_server(lambda: _ServerLane(self), host, 0))
            self._servers.append(server)
            self._tcp = (host, server.sockets[0].getsockname()[1])
        return self._tcp

    # -- lanes of connected gateways (called on the lane thread) ---------------------------

    def attach(self, gateway_id: str, lane: _ServerLane) -> None:
        old = self._lanes.get(gateway_id)
        self._lanes[gateway_id] = lane
        if old is not None and old is not lane and old.transport is not None:
            old.transport.close()

    def detach(self, gateway_id: str, lane: _ServerLane) -> None:
        if self._lanes.get(gateway_id) is lane:
            del self._lanes[gateway_id]

    def connected(self) -> list[str]:
        return list(self._lanes)

    def push(self, gateway_id: str, bundle: tuple) -> bool:
        """Send deliveries to a gateway over its lane, from any thread; False if it has none."""
        lane = self._lanes.get(gateway_id)
        if lane is None or lane.transport is None or lane.transport.is_closing():
            return False
        data = encode((PUSH, bundle))
        if threading.get_ident() == self._thread.ident:
            lane.transport.write(data)
        else:
            self._loop.call_soon_threadsafe(_write_if_open, lane, data)
        return True

    def drop(self, gateway_id: str) -> None:
        """Forget a gateway (it is gone): close its lane."""
        lane = self._lanes.get(gateway_id)
        if lane is not None and lane.transport is not None:
            self._loop.call_soon_threadsafe(lane.transport.close)

    def close(self) -> None:
        def stop() -> None:
            for server in self._servers:
                server.close()
            for lane in list(self._lanes.values()):
                if lane.transport is not None:
                    lane.transport.close()
            self._loop.call_soon(self._loop.stop)

        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(stop)
            self._thread.join(5)


def _write_if_open(lane: _ServerLane, data: bytes) -> None:
    if lane.transport is not None and not lane.transport.is_closing():
        lane.transport.write(data)


# -- the gateway's side --------------------------------------------------------------------------

class LaneClient(asyncio.Protocol):
    """A gateway's end of one lane. Replies come back in the order batches were sent: the caller
    keeps its batches in a FIFO and ``on_reply`` takes the oldest."""

    def __init__(self, on_reply: Callable[[Any, Any], None], on_push: Callable[[tuple], None],
                 on_lost: Callable[["LaneClient", Exception | None], None]) -> None:
        self.on_reply = on_reply
        self.on_push = on_push
        self.on_lost = on_lost
        self.reader = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.open = False
        self.batches = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def call(self, commands: list) -> None:
        """Send one batch (raises if it cannot be pickled or the lane is closed)."""
        if not self.open:
            raise ConnectionError("lane closed")
        self.transport.write(encode(commands))
        self.batches += 1

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except LaneError as error:
            logger.error("lane: %s; closing", error)
            self.transport.close()
            return
        for body in frames:
            message = pickle.loads(body)
            if message[0] == REPLY:
                self.on_reply(message[1], message[2])
            else:
                self.on_push(message[1])

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self.on_lost(self, exc)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def connect(loop: asyncio.AbstractEventLoop, address: tuple, gateway_id: str,
                  factory: Callable[[], LaneClient]) -> LaneClient:
    """Open a lane to ``address`` (as ``open_lane`` returned it) and say hello."""
    kind = address[0]
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address[1])  # uvloop refuses abstract paths itself
        except BaseException:
            sock.close()
            raise
        _, lane = await loop.create_unix_connection(factory, sock=sock)
        secret = address[2]
    elif kind == "tcp":
        _, lane = await loop.create_connection(factory, address[1], address[2])
        secret = address[3]
    else:
        raise ValueError(f"unknown lane address kind {kind!r}")
    lane.transport.write(hello(secret, gateway_id))
    return lane
