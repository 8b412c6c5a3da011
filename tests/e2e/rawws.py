"""Raw TCP access for the tests that must send what a well-behaved client library would not."""

from __future__ import annotations

import asyncio
import base64
import os

from websockets.frames import Frame, Opcode


async def open_raw_websocket(port: int, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 101 "), head
    return reader, writer


def client_frame(opcode: Opcode, data: bytes, fin: bool = True) -> bytes:
    return Frame(opcode, data, fin).serialize(mask=True, extensions=[])


async def read_server_frame(reader: asyncio.StreamReader, timeout: float = 10) -> tuple[int, bytes]:
    """One (unmasked) server frame: (opcode, payload)."""
    head = await asyncio.wait_for(reader.readexactly(2), timeout)
    length = head[1] & 0x7F
    if length == 126:
        length = int.from_bytes(await reader.readexactly(2), "big")
    elif length == 127:
        length = int.from_bytes(await reader.readexactly(8), "big")
    return head[0] & 0x0F, await reader.readexactly(length)


async def read_close_code(reader: asyncio.StreamReader) -> int:
    """Read server frames until a close frame; return its code."""
    while True:
        opcode, body = await read_server_frame(reader)
        if opcode == Opcode.CLOSE:
            return int.from_bytes(body[:2], "big")


async def http_request(port: int, raw: bytes) -> bytes:
    """Send raw bytes, return everything the server sends until it closes (or 10 s)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(1 << 20), 10)
    chunks = [data]
    while data:
        try:
            data = await asyncio.wait_for(reader.read(1 << 20), 2)
        except TimeoutError:
            break
        chunks.append(data)
    writer.close()
    return b"".join(chunks)
