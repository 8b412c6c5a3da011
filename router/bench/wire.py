"""Minimal clients for the load generators: a WebSocket client and a Redis RESP client.

They exist so the load generator is cheap, never the bottleneck: frames are counted by their
headers without decoding the payload, a client frame is masked with the zero key (valid, and the
payload needs no XOR), and writes respect the transport's flow control. Only what the benchmark
needs: no fragmentation, no extensions.

A connection is in one of three modes:
- ``control``: every data frame is kept, for the set-up exchanges (connect, subscribe);
- ``count``: data frames are only counted (into a shared :class:`Tally`);
- ``latency``: like ``count``, and each frame's ``@<19 digits>`` send time (``time.monotonic_ns``,
  shared by all processes of the machine) is recorded in the tally's histogram;
- ``handle``: each data frame's payload goes to the connection's ``handler`` (a dialect's receiver
  that must answer, e.g. acknowledge, or read what it counts), which returns how many to count; a
  handler with a ``chunk(buffer, end, frames)`` method is handed each read's complete data frames
  at once instead, and may decline (None) to take them one by one.
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct
import time
from typing import Any

import numpy as np

CONTROL, COUNT, LATENCY, HANDLE = "control", "count", "latency", "handle"
STAMP = b"@"
STAMP_DIGITS = 19
ZERO_MASK = b"\x00\x00\x00\x00"


class Tally:
    """What one process's connections received: frame count, first/last arrival, latencies.

    Latencies (microseconds) are appended to a list while frames arrive (a few hundred ns each)
    and go into the HDR histogram afterwards, so recording never slows the receivers down."""

    __slots__ = ("count", "first", "last", "histogram", "latencies")

    def __init__(self, histogram: Any = None) -> None:
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.histogram = histogram
        self.latencies: list[int] = []

    def add(self, frames: int, now: float) -> None:
        if not self.first:
            self.first = now
        self.count += frames
        self.last = now

    def record_stamps(self, payload: bytes | bytearray, now_ns: int) -> None:
        """Record publish→receive for the send time stamped in ``payload`` (microseconds)."""
        index = payload.find(STAMP)
        if index >= 0:
            self.latencies.append((now_ns - int(payload[index + 1:index + 1 + STAMP_DIGITS])) // 1000)

    def histogram_now(self) -> Any:
        """The HDR histogram with every latency recorded so far."""
        record = self.histogram.record_value
        for value in self.latencies:
            record(max(1, value))
        self.latencies = []
        return self.histogram


def stamp(now_ns: int) -> str:
    """The send-time marker a latency payload carries."""
    return f"@{now_ns:0{STAMP_DIGITS}d}"


def client_frame(payload: bytes, opcode: int = 0x1) -> bytes:
    """A masked (zero key) final client frame."""
    length = len(payload)
    if length < 126:
        header = struct.pack("!BB", 0x80 | opcode, 0x80 | length)
    elif length < 65536:
        header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
    return header + ZERO_MASK + payload


def parse_server_frames(buffer: bytes | bytearray, start: int = 0) -> tuple[list[tuple[int, int, int]], int]:
    """Complete unmasked frames in ``buffer`` from ``start``: ``[(opcode, payload_start, payload_end)]``
    and the offset after the last complete frame."""
    frames = []
    position = start
    size = len(buffer)
    while size - position >= 2:
        length = buffer[position + 1] & 0x7F
        header = 2
        if length == 126:
            if size - position < 4:
                break
            length = (buffer[position + 2] << 8) | buffer[position + 3]
            header = 4
        elif length == 127:
            if size - position < 10:
                break
            length = int.from_bytes(buffer[position + 2:position + 10], "big")
            header = 10
        end = position + header + length
        if end > size:
            break
        frames.append((buffer[position] & 0x0F, position + header, end))
        position = end
    return frames, position


CONTROL_FRAMES = "control-frames"  # internal: a COUNT connection's chunk that holds a control frame


UNIFORM_MIN = 24  # frames: fewer are walked one by one (the arrays' set-up costs about 24 frames' walk)


def uniform_frames(buffer: bytes | bytearray, size: int) -> tuple[int, int]:
    """``(frames, stride)``: how many data frames from the start of ``buffer[:size]`` have the
    first one's header (so its length), one after the other every ``stride`` bytes, checked in
    numpy; (0, 0) when the first is a control frame, its length takes 8 bytes, or fewer than
    ``UNIFORM_MIN`` such frames would fit. A receiver's frames of one case are mostly one size."""
    stride = _first_stride(buffer)
    fits = size // stride if stride else 0
    if fits < UNIFORM_MIN:
        return 0, 0
    header = 2 if buffer[1] & 0x7F < 126 else 4
    heads = np.frombuffer(buffer, np.uint8, fits * stride).reshape(fits, stride)[:, :header]
    same = (heads == heads[0]).all(axis=1)
    # Frame k starts at k * stride only if every frame before it has the first one's length.
    return (fits if same.all() else int(same.argmin())), stride


def _first_stride(buffer: bytes | bytearray) -> int:
    """The length of the first frame in ``buffer`` (header included) when it is a data frame
    whose length takes at most 2 bytes; else 0."""
    if len(buffer) < 4 or buffer[0] & 0x08 or buffer[1] & 0x7F == 127:
        return 0
    length = buffer[1] & 0x7F
    return 2 + length if length < 126 else 4 + ((buffer[2] << 8) | buffer[3])


def count_data_frames(buffer: bytes | bytearray) -> tuple[int, int, bool]:
    """Count complete data frames from the start of ``buffer`` (the receivers' hot path): the
    count, the offset after the last complete frame, and whether a control frame was seen
    (then nothing is consumed and the caller parses the chunk in full). A run of frames of one
    size from the start is counted at once (:func:`uniform_frames`), the rest walked."""
    count = position = 0
    size = len(buffer)
    if size >= 2:
        count, stride = uniform_frames(buffer, size)
        position = count * stride
    while size - position >= 2:
        first = buffer[position]
        length = buffer[position + 1] & 0x7F
        if length < 126:
            end = position + 2 + length
        elif length == 126:
            if size - position < 4:
                break
            end = position + 4 + ((buffer[position + 2] << 8) | buffer[position + 3])
        else:
            if size - position < 10:
                break
            end = position + 10 + int.from_bytes(buffer[position + 2:position + 10], "big")
        if end > size:
            break
        if first & 0x08:  # opcodes 8-15: control frames
            return 0, 0, True
        count += 1
        position = end
    return count, position, False


class _Stream(asyncio.Protocol):
    """Shared by both clients: flow control on writes, a future for what set-up waits for."""

    def __init__(self, tally: Tally | None) -> None:
        self.tally = tally
        self.mode = CONTROL
        self.transport: asyncio.Transport | None = None
        self.inbox: list[bytes] = []
        self.closed = asyncio.get_running_loop().create_future()
        self._waiter: tuple[int, asyncio.Future] | None = None
        self._writable: asyncio.Future | None = None
        self.acks = 0  # count of replies in COUNT mode on a publisher's connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)
        for future in (self._writable, self._waiter[1] if self._waiter else None):
            if future is not None and not future.done():
                future.set_exception(ConnectionError("connection lost"))

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    async def drain(self) -> None:
        if self._writable is not None:
            await self._writable

    def _counted(self, messages: int) -> None:
        """``messages`` arrived in a counting mode: a receiver tallies them, a publisher counts acks."""
        if self.tally is not None:
            self.tally.add(messages, time.monotonic())
        else:
            self.acks += messages
            self._progress(self.acks)

    def _progress(self, value: int) -> None:
        waiter = self._waiter
        if waiter is not None and value >= waiter[0] and not waiter[1].done():
            waiter[1].set_result(None)
            self._waiter = None

    async def _wait_for(self, target: int, current: int, timeout: float) -> None:
        if current >= target:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiter = (target, future)
        await asyncio.wait_for(future, timeout)

    async def messages(self, count: int, timeout: float = 30) -> list[bytes]:
        """The next ``count`` messages received in CONTROL mode."""
        await self._wait_for(count, len(self.inbox), timeout)
        taken, self.inbox = self.inbox[:count], self.inbox[count:]
        return taken

    async def wait_acks(self, count: int, timeout: float = 60) -> None:
        await self._wait_for(count, self.acks, timeout)


class WsClient(_Stream):
    """A WebSocket client connection (RFC 6455); it sends text frames, or binary ones with
    ``opcode`` 0x2 (a dialect whose frames are not UTF-8: MessagePack, protobuf). ``headers`` are
    extra request header lines, each ending in CRLF (e.g. a bearer token)."""

    def __init__(self, host: str, port: int, path: str, tally: Tally | None = None, opcode: int = 0x1,
                 headers: str = "") -> None:
        super().__init__(tally)
        self.opcode = opcode
        self.request = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                        f"Connection: Upgrade\r\nSec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\n"
                        f"Sec-WebSocket-Version: 13\r\n{headers}\r\n").encode()
        self.upgraded = asyncio.get_running_loop().create_future()
        self.buffer = bytearray()
        self._open = False
        self.handler: Any = None  # HANDLE mode: payload bytes -> frames to count

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        if not self._open:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            status = bytes(buffer[:end].split(b"\r\n", 1)[0])
            del buffer[:end + 4]
            if b" 101 " not in status + b" ":
                self.upgraded.set_exception(ConnectionError(f"upgrade refused: {status.decode(errors='replace')}"))
                self.transport.close()
                return
            self._open = True
            self.upgraded.set_result(None)
        mode = self.mode
        if mode == HANDLE and self.handler is not None and hasattr(self.handler, "chunk"):
            # A handler that reads a whole chunk of data frames at once (C-speed searches over the
            # buffer, no Python work per frame); it answers None when it cannot, then each frame
            # goes to it as below. First the frames the first one's size says the read holds,
            # handed over unchecked (the handler checks every byte it relies on, headers too);
            # then, or if it cannot take them, the complete data frames found one by one.
            stride = _first_stride(buffer)
            if stride and len(buffer) // stride >= UNIFORM_MIN:
                frames = len(buffer) // stride
                counted = self.handler.chunk(buffer, frames * stride, frames)
                if counted is not None:
                    del buffer[:frames * stride]
                    if counted:
                        self._counted(counted)
                    if not buffer:
                        return
            data_frames, consumed, control = count_data_frames(buffer)
            if not control and data_frames:
                counted = self.handler.chunk(buffer, consumed, data_frames)
                if counted is not None:
                    del buffer[:consumed]
                    if counted:
                        self._counted(counted)
                    return
        if mode == COUNT:
            data_frames, consumed, control = count_data_frames(buffer)
            if control:  # rare: a ping or a close among the data frames; take the general path
                data_frames, consumed = 0, 0
                mode = CONTROL_FRAMES
        if mode != COUNT:
            frames, consumed = parse_server_frames(buffer)
            if not frames:
                return
            data_frames = 0
            latencies = self.tally.latencies if mode == LATENCY else None
            now_ns = time.monotonic_ns()
            handler = self.handler if mode == HANDLE else None
            for opcode, start, end in frames:
                if opcode == 0x1 or opcode == 0x2:
                    if handler is not None:
                        data_frames += handler(bytes(buffer[start:end]))
                        continue
                    data_frames += 1
                    if mode == CONTROL:
                        self.inbox.append(bytes(buffer[start:end]))
                    elif latencies is not None:
                        index = buffer.find(STAMP, start, end)
                        if index >= 0:
                            latencies.append((now_ns - int(buffer[index + 1:index + 1 + STAMP_DIGITS])) // 1000)
                elif opcode == 0x9:  # ping
                    self.transport.write(client_frame(bytes(buffer[start:end]), 0xA))
                elif opcode == 0x8:
                    self.transport.close()
            mode = self.mode
        del buffer[:consumed]
        if data_frames:
            if mode == CONTROL:
                self._progress(len(self.inbox))
            else:
                self._counted(data_frames)

    def send(self, payload: bytes) -> None:
        self.transport.write(client_frame(payload, self.opcode))

    def send_all(self, payloads: list[bytes]) -> None:
        """Each of ``payloads`` as a frame, in one write."""
        opcode = self.opcode
        self.transport.write(b"".join([client_frame(payload, opcode) for payload in payloads]))

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(client_frame(struct.pack("!H", 1000), 0x8))
            self.transport.close()

    async def close_read(self, timeout: float = 60) -> None:
        """Send a close frame and wait for the server's: it has then read everything written before.
        Closing at once and ending the process loses what the transport has not handed to the
        kernel yet, when the server is not reading (a gateway that paused its reads: a shard backlog)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(client_frame(struct.pack("!H", 1000), 0x8))
        await asyncio.wait_for(asyncio.shield(self.closed), timeout)


async def open_ws(url: str, tally: Tally | None = None, timeout: float = 30, opcode: int = 0x1, headers: str = "",
                  client_class: type[WsClient] = WsClient) -> Any:
    """A connected, upgraded ``client_class`` (a dialect's own ``WsClient`` subclass, or the plain one)."""
    host, port, path = split_url(url)
    loop = asyncio.get_running_loop()
    _, client = await asyncio.wait_for(
        loop.create_connection(lambda: client_class(host, port, path, tally, opcode, headers), host, port), timeout)
    await asyncio.wait_for(client.upgraded, timeout)
    return client


def split_url(url: str) -> tuple[str, int, str]:
    """``ws://host:port/path`` → (host, port, path); ``redis://host:port`` likewise."""
    rest = url.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    return host, int(port), "/" + path


def resp_command(*parts: bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


class RespClient(_Stream):
    """A Redis connection that counts what it waits for by markers (no reply parsing).

    - set-up: ``marker`` = ``subscribe`` confirmations (CONTROL, counted into ``inbox`` length);
    - a subscriber: ``message`` pushes, into the tally (COUNT/LATENCY);
    - a publisher: integer replies, one ``\\n`` each, into ``acks``.
    """

    SUBSCRIBED = b"$9\r\nsubscribe\r\n"
    MESSAGE = b"$7\r\nmessage\r\n"
    LINE = b"\n"

    def __init__(self, tally: Tally | None = None) -> None:
        super().__init__(tally)
        self.marker = self.SUBSCRIBED
        self.tail = b""

    def data_received(self, data: bytes) -> None:
        chunk = self.tail + data if self.tail else data
        mode = self.mode
        if mode == LATENCY:  # stamps: parse each complete "@<digits>"; keep an incomplete one
            now = time.monotonic_ns()
            index = chunk.find(STAMP)
            found = 0
            latencies = self.tally.latencies
            while index >= 0 and index + 1 + STAMP_DIGITS <= len(chunk):
                latencies.append((now - int(chunk[index + 1:index + 1 + STAMP_DIGITS])) // 1000)
                found += 1
                index = chunk.find(STAMP, index + 1 + STAMP_DIGITS)
            self.tail = chunk[index:] if index >= 0 else b""
            if found:
                self.tally.add(found, time.monotonic())
            return
        marker = self.marker
        found = chunk.count(marker)
        self.tail = chunk[-(len(marker) - 1):] if len(marker) > 1 else b""
        if not found:
            return
        if mode == CONTROL:
            self.inbox.extend([b""] * found)
            self._progress(len(self.inbox))
        else:
            self._counted(found)

    def listen(self, mode: str) -> None:
        """After set-up: count ``message`` pushes (a subscriber) or integer replies (a publisher)."""
        self.mode = mode
        self.marker = self.MESSAGE if self.tally is not None else self.LINE
        self.tail = b""

    def send(self, command: bytes) -> None:
        self.transport.write(command)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


async def open_resp(url: str, tally: Tally | None = None, timeout: float = 30) -> RespClient:
    host, port, _ = split_url(url)
    loop = asyncio.get_running_loop()
    _, client = await asyncio.wait_for(loop.create_connection(lambda: RespClient(tally), host, port), timeout)
    return client
