"""router/bench/wire.py: a load generator's connection that nothing answers (Signal Hub's hub:send)
ends with ``close_read``, so a process that ends right after it loses nothing it wrote. Closing at
once lost what the transport still held when the server was not reading: 308 of 1,000,000
hub:send in one ``router bench p2p`` run, with a gateway that held flooding connections (a change
tried and not kept)."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FRAMES, SIZE = 16_000, 4096  # 64 MiB: far more than the kernel's buffers on loopback take

# A child process floods the server, then ends its connection as the load generator does, and exits.
CHILD = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, {root!r})
    from router.bench.wire import open_ws

    async def main():
        client = await open_ws("ws://127.0.0.1:{port}/x")
        frame = b"x" * {size}
        for _ in range({frames}):
            client.send(frame)
        if {wait}:
            await client.close_read(30)
        else:
            client.close()

    asyncio.run(main())
""")


class Server(asyncio.Protocol):
    """Upgrades, reads nothing until told to (as a gateway that paused its reads), then counts the
    data frames' bytes up to the client's close frame and answers it."""

    def __init__(self, done: asyncio.Future) -> None:
        self.done, self.buffer, self.upgraded, self.received = done, bytearray(), False, 0
        self.paused = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.upgraded:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            del self.buffer[:end + 4]
            self.transport.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                                 b"Sec-WebSocket-Accept: x\r\n\r\n")
            self.upgraded = True
            self.transport.pause_reading()
            self.paused.set_result(None)
        buffer, position = self.buffer, 0
        while len(buffer) - position >= 2:
            opcode, length = buffer[position] & 0x0F, buffer[position + 1] & 0x7F
            header = 2 + 4 + {126: 2, 127: 8}.get(length, 0)
            if length >= 126:
                length = int.from_bytes(buffer[position + 2:position + header - 4], "big")
            if len(buffer) - position < header + length:
                break
            position += header + length
            if opcode == 0x8:
                self.transport.write(b"\x88\x02\x03\xe8")
                self.transport.close()
                self.done.set_result(None)
                break
            self.received += length
        del buffer[:position]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def received_when_the_client_exits(wait: bool) -> int:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    server = Server(done)
    listener = await loop.create_server(lambda: server, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD.format(root=str(ROOT), port=port, size=SIZE, frames=FRAMES, wait=wait))
    await asyncio.wait_for(server.paused, 60)
    if wait:  # the child waits for the server's close: read on once it has written (or buffered) all
        await asyncio.sleep(0.5)
        server.transport.resume_reading()
        await asyncio.wait_for(child.wait(), 60)
    else:  # read nothing until the child has ended
        await asyncio.wait_for(child.wait(), 60)
        server.transport.resume_reading()
    await asyncio.wait_for(done, 60)
    listener.close()
    return server.received


def test_a_connection_closed_with_close_read_has_every_byte_read_before_the_process_ends():
    assert asyncio.run(received_when_the_client_exits(wait=True)) == FRAMES * SIZE


def test_a_connection_closed_at_once_loses_what_was_not_sent_when_the_process_ends():
    """What close_read is for: without it the server gets less than was written."""
    assert asyncio.run(received_when_the_client_exits(wait=False)) < FRAMES * SIZE
