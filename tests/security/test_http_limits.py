"""Slow and huge requests, pipelining and ping floods, connection limits: each bounded, each answered."""

from __future__ import annotations

import asyncio
import json
import socket

from websockets.frames import Opcode

from gateways.server import HTTP_PARSE_SLICE
from tests.e2e.baqend_client import Rest
from tests.e2e.client import eventually, run
from tests.e2e.rawws import client_frame
from tests.security.conftest import connect, gateway_stats, main_port, own_address

HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


async def _answer(reader: asyncio.StreamReader, timeout: float = 10) -> tuple[int, dict]:
    """The status and JSON body of one response that ends with the connection."""
    raw = await asyncio.wait_for(reader.read(), timeout)
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_a_request_trickled_a_byte_at_a_time_gets_408_at_its_deadline(guarded):
    """Each byte used to restart the timer: one byte per 9 s held a connection forever."""
    port = main_port(guarded)

    async def scenario():
        reader, writer = await connect(port, own_address())
        writer.write(b"GET /health HTTP/1.1\r\n")
        loop = asyncio.get_running_loop()
        started = loop.time()
        answer = asyncio.ensure_future(_answer(reader))
        header = b"X-Slow: " + b"a" * 200
        for byte in header:  # the attack: a byte every 0.1 s, well inside any per-byte timer
            if answer.done():
                break
            writer.write(bytes([byte]))
            await asyncio.sleep(0.1)
        status, body = await answer
        assert (status, body["error"]) == (408, "request_timeout")
        # handshake_timeout_s is 1.5 and the sweep runs every 0.1 s.
        assert loop.time() - started < 1.5 + 1.0
        writer.close()

    run(scenario())


def test_an_idle_connection_that_never_sends_a_request_is_closed(guarded):
    port = main_port(guarded)

    async def scenario():
        reader, writer = await connect(port, own_address())
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()

    run(scenario())


def test_headers_over_the_size_or_count_limit_get_431(guarded):
    port = main_port(guarded)
    cases = [
        b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * 200_000 + b"\r\n",  # 1.2 MB of headers
        b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * 21 + b"\r\n",  # one over max_http_headers
        b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n",  # one header over max_http_header_bytes
        b"GET /health?" + b"q" * 5000 + b" HTTP/1.1\r\n\r\n",  # the request line counts too
        b"GET /cashu HTTP/1.1\r\nUpgrade: websocket\r\n" + b"X: y\r\n" * 30 + b"\r\n",  # a handshake too
    ]

    async def scenario():
        source = own_address()
        for raw in cases:
            reader, writer = await connect(port, source)
            writer.write(raw)
            status, body = await _answer(reader)
            assert (status, body["error"]) == (431, "headers_too_large"), raw[:40]
            writer.close()
        # A header that never ends is refused as soon as it passes the limit, not buffered whole.
        reader, writer = await connect(port, source)
        writer.write(b"GET /health HTTP/1.1\r\nX-Endless: ")
        answer = asyncio.ensure_future(_answer(reader))
        sent = 0
        while not answer.done() and sent < 1 << 20:
            writer.write(b"a" * 1024)
            sent += 1024
            await asyncio.sleep(0.005)
        assert await answer == (431, {"error": "headers_too_large",
                                      "message": "request headers too large or too many"})
        assert sent <= 4096 + 64 * 1024  # the limit, plus what was in flight when the answer came
        writer.close()
        # Within the limits, the same port answers.
        reader, writer = await connect(port, source)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + b"X: y\r\n" * 17 + b"\r\n")
        status, body = await _answer(reader)
        assert status == 200 and body["status"] == "ok"

    run(scenario())


def _flood(port: int, source: str, chunk: bytes, total: int) -> socket.socket:
    """Write up to ``total`` bytes of ``chunk`` repeated without ever reading; stop when the
    socket stays full (the server stopped reading) and return it still open."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # we never read: keep our side small
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.settimeout(1)
    data = chunk * (total // len(chunk))
    view = memoryview(data)
    try:
        while view:
            view = view[sock.send(view[:1 << 16]):]
    except TimeoutError:
        pass  # full for 1 s: the gateway no longer reads us (it drops us after stall_timeout_s, 6 s)
    return sock


def test_pipelined_requests_that_are_never_read_stop_being_read(guarded):
    """A client pipelining 400,000 GETs and never reading answers used to have every answer
    buffered in the gateway (about 70 MB for /health)."""
    port = main_port(guarded)

    async def scenario():
        loop = asyncio.get_running_loop()
        sock = await loop.run_in_executor(None, _flood, port, own_address(), HEALTH, len(HEALTH) * 400_000)
        try:
            stats = await eventually(lambda: _held(guarded), timeout=20)
            assert stats["queued_http_requests"] <= 4 + HTTP_PARSE_SLICE // len(HEALTH) + 1  # cap + one slice
            assert stats["outbound_bytes"] <= 1 << 20
        finally:
            sock.close()

    run(scenario(), timeout=90)


def test_large_answers_pipelined_and_never_read_are_written_one_at_a_time(guarded):
    """A 250 KB Baqend document asked for 300 times in one pipeline, never read: before, every
    answer was buffered in the gateway (75 MB); now the next answer waits for the client to read."""
    port = main_port(guarded)
    source = own_address()
    get = f"GET /v1/db/Big/big HTTP/1.1\r\nHost: x\r\n\r\n".encode()

    async def scenario():
        async with Rest(f"http://127.0.0.1:{port}/v1", local_addr=(source, 0)) as rest:
            await rest.insert("Big", "big", blob="x" * 250_000)
        loop = asyncio.get_running_loop()
        sock = await loop.run_in_executor(None, _flood, port, source, get, len(get) * 300)
        try:
            # Once an answer is stuck in the gateway (the socket's buffers are full), the rest wait unanswered.
            stats = await eventually(lambda: _stuck(guarded), timeout=20)
            assert stats["queued_http_requests"] <= 4 + HTTP_PARSE_SLICE // len(get) + 1
            assert stats["outbound_bytes"] <= 2 * 256 * 1024
        finally:
            sock.close()

    run(scenario(), timeout=90)


def test_a_client_that_stops_reading_altogether_is_dropped_after_the_stall_timeout(guarded):
    """A held client used to keep its socket and everything queued for it for as long as it liked."""
    port = main_port(guarded)

    async def scenario():
        loop = asyncio.get_running_loop()
        sock = await loop.run_in_executor(None, _flood, port, own_address(), HEALTH, len(HEALTH) * 400_000)
        try:
            await eventually(lambda: _held(guarded), timeout=20)
            # stall_timeout_s is 6: the gateway lets go of it while our side is still open.
            await eventually(lambda: _released(guarded), timeout=15)
        finally:
            sock.close()

    run(scenario(), timeout=90)


def test_a_refusal_comes_after_the_answers_to_the_requests_before_it(guarded):
    """A refusal used to be written at once, ahead of the answer to an earlier pipelined request
    (which was then dropped)."""
    port = main_port(guarded)

    async def scenario():
        reader, writer = await connect(port, own_address())
        writer.write(HEALTH + b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * 30 + b"\r\n")
        raw = await asyncio.wait_for(reader.read(), 10)
        first, _, rest = raw.partition(b"HTTP/1.1 431 ")
        assert first.startswith(b"HTTP/1.1 200 OK\r\n") and b'"status":"ok"' in first
        assert b'"error":"headers_too_large"' in rest
        writer.close()

    run(scenario())


def test_pings_that_are_never_read_stop_being_read(guarded):
    """Each ping is answered with a pong of the same size: a client that pings and never reads
    used to grow the gateway's output without bound."""
    port = main_port(guarded)
    handshake = (b"GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    ping = client_frame(Opcode.PING, b"p" * 125)

    async def scenario():
        loop = asyncio.get_running_loop()

        def attack() -> socket.socket:
            sock = _flood(port, own_address(), handshake, len(handshake))
            sock.settimeout(1)
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(1024)
            assert head.startswith(b"HTTP/1.1 101 ")
            try:
                data = memoryview(ping * 400_000)  # 52 MB of pings
                while data:
                    data = data[sock.send(data[:1 << 16]):]
            except TimeoutError:
                pass
            return sock

        sock = await loop.run_in_executor(None, attack)
        try:
            stats = await eventually(lambda: _held(guarded), timeout=20)
            # cashu.max_outbound_bytes (1 MiB here) plus the pongs of one read.
            assert stats["outbound_bytes"] <= (1 << 20) + 512 * 1024
        finally:
            sock.close()

    run(scenario(), timeout=90)


async def _held(running) -> dict | None:
    stats = await gateway_stats(running)
    return stats if stats["reading_held"] >= 1 else None


def test_connections_over_the_per_address_and_gateway_limits_are_refused(guarded):
    port = main_port(guarded)

    async def scenario():
        await eventually(lambda: _quiet(guarded), timeout=20)  # earlier tests' sockets are gone
        first = own_address()
        refused_before = (await gateway_stats(guarded))["refused_connections"]
        held = [await connect(port, first) for _ in range(5)]
        await eventually(lambda: _connections(guarded, 5))
        reader, writer = await connect(port, first)
        assert await _answer(reader) == (429, {"error": "too_many_connections",
                                               "message": "too many connections from this address"})
        writer.close()
        # Other addresses fill the gateway to max_connections (12).
        second, third, fourth = own_address(), own_address(), own_address()
        held += [await connect(port, second) for _ in range(5)] + [await connect(port, third) for _ in range(2)]
        await eventually(lambda: _connections(guarded, 12))
        reader, writer = await connect(port, fourth)
        assert await _answer(reader) == (503, {"error": "too_many_connections",
                                               "message": "this gateway is at max_connections"})
        writer.close()
        stats = await gateway_stats(guarded)
        assert stats["refused_connections"] == {"max_connections": refused_before["max_connections"] + 1,
                                                "max_connections_per_ip": refused_before["max_connections_per_ip"] + 1}
        # A closed socket gives its place back, to its address and to the gateway.
        held.pop(0)[1].close()
        await eventually(lambda: _connections(guarded, 11))
        reader, writer = await connect(port, first)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, body = await _answer(reader)
        assert status == 200 and body["status"] == "ok"
        for _, w in held:
            w.close()

    run(scenario())


async def _stuck(running) -> dict | None:
    stats = await gateway_stats(running)
    return stats if stats["reading_held"] >= 1 and stats["outbound_bytes"] >= 100_000 else None


async def _released(running) -> bool:
    stats = await gateway_stats(running)
    return stats["reading_held"] == 0 and stats["outbound_bytes"] == 0


async def _connections(running, count: int) -> bool:
    return (await gateway_stats(running))["connections"] == count


async def _quiet(running) -> bool:
    return (await gateway_stats(running))["connections"] == 0
