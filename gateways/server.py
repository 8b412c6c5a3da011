"""One port, two protocols: HTTP/1.1 requests and WebSocket connections.

Each accepted socket starts as HTTP, parsed by ``httptools`` (llhttp, C). A request that asks to
upgrade to WebSocket on a dialect's path is handed to the ``websockets`` library's sans-I/O
``ServerProtocol``, which does the handshake and frame parsing (masks, fragments, control frames,
close handshake, size limit). Everything else is answered as plain HTTP with a body, so REST
endpoints share the port with the WebSocket endpoints (docs/server.md says why this stack).

There is no task per connection: bytes arrive in ``data_received`` and go straight to the
dialect. The common client frame (final, unfragmented, masked text or binary, under 64 KiB, no
extension) is unmasked here, at about a sixth of the cost of ``websockets``' generator-based parser;
everything else (control frames, fragments, large or malformed frames, a frame split across reads)
goes to ``websockets``, which fails the connection as RFC 6455 says. Fan-out writes a frame built once (header + payload) to every recipient's transport;
server frames are unmasked, so the same bytes are valid on every connection that did not
negotiate compression.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import httptools
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.frames import Opcode
from websockets.protocol import OPEN, State
from websockets.server import ServerProtocol

try:
    from websockets.speedups import apply_mask as _unmask
except ImportError:  # websockets without its C extension
    from websockets.utils import apply_mask as _unmask

from gateways.dialect import Dialect, DialectSession, HttpRequest, HttpResponse, HttpRoute

if TYPE_CHECKING:
    from gateways.gateway import Gateway

logger = logging.getLogger(__name__)
# websockets logs every connection open/close at INFO; at 10,000 connections that is noise.
_ws_logger = logging.getLogger("gateways.websocket")
_ws_logger.setLevel(logging.WARNING)

_TEXT = Opcode.TEXT
_BINARY = Opcode.BINARY
_CONT = Opcode.CONT
_CLOSING = State.CLOSING
HTTP_PARSE_SLICE = 1024  # bytes fed to the HTTP parser at a time (the pipelining cap is checked between)
# After a refusal, the client's remaining bytes are read and dropped for this long, up to this many.
LINGER_S = 2.0
LINGER_MAX_BYTES = 4 << 20

_STATUS_PHRASES = {
    200: "OK", 201: "Created", 202: "Accepted", 204: "No Content", 400: "Bad Request", 401: "Unauthorized",
    403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict", 412: "Precondition Failed",
    413: "Content Too Large", 426: "Upgrade Required", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
    500: "Internal Server Error", 503: "Service Unavailable",
}


def frame_header(opcode: int, length: int) -> bytes:
    """Header of an unmasked, final WebSocket frame (RFC 6455 section 5.2)."""
    if length < 126:
        return bytes((0x80 | opcode, length))
    if length < 65536:
        return struct.pack("!BBH", 0x80 | opcode, 126, length)
    return struct.pack("!BBQ", 0x80 | opcode, 127, length)


def joined_frames(opcode: int, payloads: list[bytes]) -> bytes:
    """``payloads`` as frames of ``opcode`` (each with its :func:`frame_header`), back to back.
    Payloads of one size in a row (a topic's messages, mostly) share one header."""
    parts = []
    size, header = -1, b""
    for payload in payloads:
        if len(payload) != size:
            size = len(payload)
            header = frame_header(opcode, size)
        parts += (header, payload)
    return b"".join(parts)


def encode_http_response(response: HttpResponse, keep_alive: bool) -> bytes:
    phrase = _STATUS_PHRASES.get(response.status, "Unknown")
    lines = [f"HTTP/1.1 {response.status} {phrase}"]
    if response.status != 204:
        lines.append(f"Content-Type: {response.content_type}")
        lines.append(f"Content-Length: {len(response.body)}")
    lines.extend(f"{name}: {value}" for name, value in response.headers)
    lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + (response.body if response.status != 204 else b"")


def json_response(status: int, body: bytes) -> HttpResponse:
    return HttpResponse(status, body, "application/json")


class Listener:
    """A listening port: WebSocket paths to dialects, plus HTTP routes."""

    def __init__(self, host: str, port: int, dialects: list[Dialect], http_routes: list[HttpRoute]) -> None:
        self.host = host
        self.port = port
        self.ws_routes: dict[str, Dialect] = {d.path: d for d in dialects}
        self.http_routes = http_routes
        self.server: asyncio.AbstractServer | None = None

    def http_route(self, method: str, path: str) -> tuple[HttpRoute | None, bool]:
        """The route for (method, path), and whether the path exists under another method."""
        path_known = False
        for route in self.http_routes:
            if route.matches(path):
                if route.method == method:
                    return route, True
                path_known = True
        return None, path_known


class Connection(asyncio.Protocol):
    """One TCP connection: HTTP until it upgrades, then a WebSocket bound to a dialect session."""

    def __init__(self, gateway: "Gateway", listener: Listener) -> None:
        self.gateway = gateway
        self.listener = listener
        self.id = 0
        self.transport: asyncio.Transport | None = None
        self.remote = ""
        self.host: str | None = None  # the client max_connections_per_ip counts it as (None: exempt)
        self.path = ""
        self.query = ""
        self.ws: ServerProtocol | None = None
        self.session: DialectSession | None = None
        self.dialect: Dialect | None = None
        self.compressed = False
        self.max_outbound = 8 << 20
        self.dropped = 0
        self.flushes = 0  # writes of data frames (a session reads it to tell whether it wrote anything)
        self.opened_at = time.monotonic()
        self.last_activity = self.opened_at
        self.closing_since: float | None = None
        self._corked: list[bytes] = []
        self._corked_bytes = 0
        self._paused = False
        self._failed = False
        self._fragments: list[bytes] | None = None
        self._partial = b""  # the start of a simple frame whose end has not arrived yet
        self._fragments_text = False
        self._held = False  # this connection stopped reading: its own output is not being read
        self._refused = False  # refused at accept (connection limits): never counted, never read
        # HTTP state
        self._parser: Any = httptools.HttpRequestParser(self)
        self._request_started: float | None = None  # first byte of the request being received
        self._head_bytes = 0  # bytes received since the last request's headers were complete
        self._headers_done = False
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._body = bytearray()
        self._requests: deque[tuple[HttpRequest, bool]] = deque()
        self._http_task: asyncio.Task | None = None
        self._drained: asyncio.Future | None = None
        self._unparsed = b""  # read but not parsed: past max_pipelined_requests
        self._last_word_due: bytes | None = None  # a refusal waiting for the answers before it
        self._stalled_since: float | None = None  # held, and its output has not shrunk since
        self._stalled_bytes = 0
        self._rejected = False
        self._discarded = 0  # bytes read and dropped after a refusal, while the client reads it

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.remote = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)
        host = peer[0] if isinstance(peer, tuple) and peer else ""
        refusal = self.gateway.admit(host)
        if refusal is not None:
            # Over a connection limit: a plain HTTP answer the client can read, then close.
            self._refused = True
            self._last_word(encode_http_response(json_response(*refusal), keep_alive=False))
            asyncio.get_running_loop().call_later(LINGER_S, transport.abort)
            return
        self.id = self.gateway.add_connection(self, host)

    def data_received(self, data: bytes) -> None:
        self.last_activity = time.monotonic()
        if self.ws is not None:
            self._ws_received(data)
        elif not self._rejected and not self._refused:
            self._http_received(data)
        else:
            self._discarded += len(data)
            if self._discarded > LINGER_MAX_BYTES:
                self.transport.abort()

    def eof_received(self) -> bool | None:
        if self.ws is not None:
            self.ws.receive_eof()
            self._write_out(self.ws.data_to_send())
        return None  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self.gateway.remove_connection(self)
        if self._http_task is not None:
            self._http_task.cancel()
        # Let go of buffers now: a session's reference cycles keep this object until a full
        # garbage collection, and a parse error's traceback keeps the parser's read buffer.
        self._fragments = None
        self._partial = b""
        if self.ws is not None:
            self.ws.parser_exc = None
        session, self.session = self.session, None
        if session is not None:
            try:
                session.on_close()
            except Exception:
                logger.exception("connection %s: dialect cleanup failed", self.id)

    def pause_writing(self) -> None:
        self._paused = True
        self._update_hold()

    def resume_writing(self) -> None:
        self._paused = False
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)
        self._update_hold()
        session = self.session
        if session is not None:
            try:
                session.on_drain()
            except Exception:
                logger.exception("connection %s: dialect failed on drain", self.id)

    # -- what a dialect session may call (gateways.dialect.Wire) --------------------------

    @property
    def writing_paused(self) -> bool:
        return self._paused

    def outbound_bytes(self) -> int:
        transport = self.transport
        if transport is None or transport.is_closing():
            return 0
        return transport.get_write_buffer_size() + self._corked_bytes

    def receiving(self) -> bool:
        ws = self.ws
        return ws is not None and ws._state is OPEN and not self._failed

    def send_text(self, payload: bytes) -> bool:
        return self._send(_TEXT, payload)

    def send_binary(self, payload: bytes) -> bool:
        return self._send(_BINARY, payload)

    def send_binaries(self, payloads: list[bytes]) -> bool:
        """Binary messages in order: their frames in one corked write (through ``websockets``, one by
        one, when the connection is compressed)."""
        if self.compressed:
            return all([self.send_frame(b"", _BINARY, payload) for payload in payloads])
        return self.send_frame(joined_frames(_BINARY, payloads), _BINARY, b"")

    def send_frame(self, frame: bytes, opcode: int, payload: bytes | None = None) -> bool:
        """Write a frame prebuilt by :func:`frame_header` (fan-out); falls back when compressed (on
        ``payload``, else the frame without its header)."""
        ws = self.ws
        # ``_state``, what websockets' ``state`` property returns, read without the property call:
        # this runs once per recipient of every fan-out (tests/unit/test_server_ws_state.py holds
        # websockets to it).
        if ws is None or ws._state is not OPEN:
            return False
        if self._paused and self.outbound_bytes() > self.max_outbound:
            self.dropped += 1
            return False
        if self.compressed:
            if payload is None:
                code = frame[1] & 0x7F
                payload = frame[2 if code < 126 else 4 if code == 126 else 10:]
            (ws.send_text if opcode == _TEXT else ws.send_binary)(payload)
            self._write_out(ws.data_to_send())
            self.flushes += 1  # written now, not corked
            return True
        # Corked: frames written in one event-loop turn leave in one write, one system call for a
        # burst. Measured: per-frame writes took over half of a gateway's time when one connection
        # received many frames per turn (a block of mx events, a NoLag fan-out, point-to-point floods).
        corked = self._corked
        if not corked:
            self.gateway.cork(self)
        corked.append(frame)
        self._corked_bytes += len(frame)
        return True

    def takes_frames(self) -> bool:
        """Whether :meth:`send_frame` takes every frame given now, as it is: the connection is open,
        not compressed and its writing not paused (paused, a frame is refused once the outbound
        bytes pass the limit). A fan-out of a run of messages corks them as one piece with
        :meth:`cork_frames` only to connections for which this holds."""
        ws = self.ws
        return ws is not None and ws._state is OPEN and not self._paused and not self.compressed

    def cork_frames(self, frames: bytes) -> None:
        """Frames prebuilt by :func:`frame_header`, joined, corked as one piece: what
        :meth:`send_frame` does with each of them when :meth:`takes_frames` holds."""
        corked = self._corked
        if not corked:
            self.gateway.cork(self)
        corked.append(frames)
        self._corked_bytes += len(frames)

    def flush(self) -> None:
        corked = self._corked
        if not corked:
            return
        self._corked, self._corked_bytes = [], 0
        self.flushes += 1
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(corked[0] if len(corked) == 1 else b"".join(corked))

    def _send(self, opcode: int, payload: bytes) -> bool:
        return self.send_frame(frame_header(opcode, len(payload)) + payload, opcode, payload)

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Start the closing handshake; the transport closes when the client answers (or times out)."""
        ws = self.ws
        if ws is None:
            if self.transport is not None:
                self.transport.close()
            return
        if ws.state is OPEN:
            ws.send_close(code, reason)
            self.closing_since = time.monotonic()
            self._write_out(ws.data_to_send())

    def ping(self) -> None:
        ws = self.ws
        if ws is not None and ws.state is OPEN:
            ws.send_ping(b"")
            self._write_out(ws.data_to_send())

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -- reading ------------------------------------------------------------------------

    def _update_hold(self) -> None:
        """Stop reading a client that does not read what it asked for.

        HTTP: while ``max_pipelined_requests`` wait to be answered, or while an answer cannot be
        written. WebSocket: while its unread output (pongs, replies) is over ``max_outbound``
        (deliveries past that are dropped, so only what its own frames cause can pile up). What
        it sent meanwhile waits in its own socket buffers, not in our memory.
        """
        if self._refused:
            return
        if self.ws is None:
            hold = (len(self._requests) >= self.gateway.settings.gateway.max_pipelined_requests
                    or bool(self._unparsed) or (self._paused and self._http_task is not None))
        else:
            hold = self._paused and self.outbound_bytes() > self.max_outbound
        if hold != self._held:
            self._held = hold
            self._stalled_since = None
            self.update_reading()

    def update_reading(self) -> None:
        """Read unless this connection holds or the gateway paused every socket (a shard backlog)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._held or self.gateway.reading_paused:
            transport.pause_reading()
        else:
            if self._request_started is not None:
                # We were not reading (a shard backlog, or this client's hold): that time is not the client's.
                self._request_started = time.monotonic()
            transport.resume_reading()

    def _stalled(self, now: float, timeout: float) -> bool:
        """Whether this held connection's unread output has not shrunk for ``timeout``."""
        outbound = self.outbound_bytes()
        if self._stalled_since is None or outbound < self._stalled_bytes:
            self._stalled_since = now
        self._stalled_bytes = outbound
        return now - self._stalled_since > timeout

    @property
    def reading_held(self) -> bool:
        return self._held

    def queued_requests(self) -> int:
        return len(self._requests)

    # -- timers ---------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        settings = self.gateway.settings.gateway
        if self._held and self._paused:
            if self._stalled(now, settings.stall_timeout_s):
                self.abort()  # it asked for more than it reads, and has read nothing for stall_timeout_s
                return
        else:
            self._stalled_since = None
        if self.ws is None:
            if self._rejected:
                if self.closing_since is not None and now - self.closing_since > LINGER_S:
                    self.abort()
                return
            if self._held or self.gateway.reading_paused:
                return
            started = self._request_started
            if started is not None:
                # An absolute deadline for the whole request: a byte every few seconds does not extend it.
                if now - started > settings.handshake_timeout_s:
                    self._reject(408, b'{"error":"request_timeout","message":"the request did not arrive in time"}')
            elif self._http_task is None and now - self.last_activity > settings.handshake_timeout_s:
                self.transport.close()  # idle between requests (keep-alive) or never sent one
            return
        if self.ws.state is _CLOSING or self.closing_since is not None:
            since = self.closing_since or now
            self.closing_since = since
            if now - since > settings.close_timeout_s:
                self.abort()
            return
        if self.session is not None:
            self.session.on_tick(now)

    # -- WebSocket ------------------------------------------------------------------------

    def _ws_received(self, data: bytes) -> None:
        ws = self.ws
        if self._partial:
            data, self._partial = self._partial + data, b""
        if (ws.state is OPEN and not ws.reader.buffer and ws.current_size is None and self._fragments is None
                and not self.compressed):
            taken = self._simple_frames(data)
            if taken == len(data) or self._failed:
                if self._paused:
                    self._update_hold()
                return
            if taken:
                data = data[taken:]
        ws.receive_data(data)
        events = ws.events_received()
        out = ws.data_to_send()
        if out:
            self._write_out(out)
        for frame in events:
            opcode = frame.opcode
            if self.closing_since is not None and (opcode is _TEXT or opcode is _BINARY or opcode is _CONT):
                continue  # this side is closing: what the client sent after it is not handed over
            if opcode is _TEXT or opcode is _BINARY:
                if frame.fin:
                    self._message(frame.data, opcode is _TEXT)
                else:
                    self._fragments = [frame.data]
                    self._fragments_text = opcode is _TEXT
            elif opcode is _CONT and self._fragments is not None:
                self._fragments.append(frame.data)
                if frame.fin:
                    data, self._fragments = b"".join(self._fragments), None
                    self._message(data, self._fragments_text)
            if self._failed:
                break  # we failed the connection (e.g. invalid UTF-8): discard the rest
        if self._paused:
            self._update_hold()

    def _simple_frames(self, data: bytes) -> int:
        """Handle the complete simple frames at the start of ``data`` (FIN, text or binary, masked,
        no RSV bit, at most 65,535 bytes and within the size limits); returns how many bytes were
        taken. The start of a simple frame cut off by the end of the read is kept (``_partial``, at
        most one frame) and counts as taken. Called only where ``websockets`` waits for the start
        of a frame, so whatever is left is parsed by it from a frame boundary."""
        ws = self.ws
        limit = ws.max_message_size
        if ws.max_fragment_size is not None and (limit is None or ws.max_fragment_size < limit):
            limit = ws.max_fragment_size
        session = self.session
        # A session that takes binary messages in rows gets the read's consecutive ones in one call
        # (DialectSession.on_binaries); the others each message as it is parsed.
        row: list[bytes] | None = [] if session is not None and session.takes_binaries else None
        position, size = 0, len(data)
        cut = False  # the read ends inside a frame: kept in ``_partial``
        while position < size:
            first = data[position]
            if first != 0x81 and first != 0x82:  # not FIN + text/binary with no RSV bit
                break
            if size - position < 2:
                cut = True
                break
            second = data[position + 1]
            if second < 0x80:  # unmasked: websockets refuses it
                break
            length = second & 0x7F
            header = 6
            if length == 126:
                if size - position < 4:
                    cut = True
                    break
                length = (data[position + 2] << 8) | data[position + 3]
                header = 8
            elif length == 127:
                break
            if limit is not None and length > limit:
                break
            end = position + header + length
            if end > size:
                cut = True
                break
            payload = _unmask(data[position + header:end], data[position + header - 4:position + header])
            if row is not None and first == 0x82:
                row.append(payload)
                position = end
                continue
            if row:  # the binary messages before this text one go first
                self._binaries(row)
                row = []
                if ws._state is not OPEN:
                    return position  # this frame is left to websockets, as after any message that closed
            self._message(payload, first == 0x81)
            position = end
            if self._failed or ws._state is not OPEN:  # send_frame's read of the state, once per frame
                return position
        if row:
            self._binaries(row)
            if ws._state is not OPEN:
                return position
        if cut:
            self._partial = data[position:]
            return size
        return position

    def _binaries(self, payloads: list[bytes]) -> None:
        """Binary messages of one read, in order, to a session that takes them in rows."""
        session = self.session
        if session is not None:
            try:
                session.on_binaries(payloads)
            except Exception:
                logger.exception("connection %s: dialect failed on a message", self.id)
                self.close(1011, "internal error")

    def _message(self, data: bytes, is_text: bool) -> None:
        if type(data) is not bytes:  # a frame's data from websockets may be any bytes-like object
            data = bytes(data)
        if is_text and not data.isascii():  # ASCII is valid UTF-8: only other text is decoded to check it
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                self._failed = True
                self.ws.fail(1007, "invalid UTF-8 in a text frame")
                self._write_out(self.ws.data_to_send())
                return
        session = self.session
        if session is not None:
            try:
                session.on_message(data, is_text)
            except Exception:
                logger.exception("connection %s: dialect failed on a message", self.id)
                self.close(1011, "internal error")

    def _write_out(self, chunks: list[bytes]) -> None:
        if self._corked:
            self.flush()  # control frames (pong, close) never overtake data frames
        transport = self.transport
        for chunk in chunks:
            if chunk:
                transport.write(chunk)
            else:  # websockets' SEND_EOF: the server closes the TCP connection
                transport.close()
                return

    # -- HTTP -----------------------------------------------------------------------------

    def _http_received(self, data: bytes) -> None:
        """Parse in slices, and stop at ``max_pipelined_requests`` waiting: the rest of the read is
        kept as bytes (at most one read) until answers make room, so a read of 256 KiB of tiny
        pipelined requests never becomes thousands of request objects."""
        limits = self.gateway.settings.gateway
        position, size = 0, len(data)
        while position < size and not self._rejected:
            if len(self._requests) >= limits.max_pipelined_requests:
                self._unparsed = data[position:]
                break
            piece = data[position:position + HTTP_PARSE_SLICE]
            position += len(piece)
            if self._request_started is None:
                self._request_started = time.monotonic()
            if not self._headers_done:
                self._head_bytes += len(piece)
            try:
                self._parser.feed_data(piece)
            except httptools.HttpParserUpgrade as upgrade:
                self._upgrade(piece[upgrade.args[0]:] + data[position:])
                return
            except httptools.HttpParserError:
                self._reject(400, b'{"error":"bad_request","message":"malformed HTTP request"}')
                return
            if not self._rejected and not self._headers_done and self._head_bytes > limits.max_http_header_bytes:
                self._headers_too_large()  # still no end of headers: llhttp would buffer them whole
        self._update_hold()
        if self._requests and self._http_task is None:
            self._http_task = asyncio.get_running_loop().create_task(self._serve_http())

    def _headers_too_large(self) -> None:
        self._reject(431, b'{"error":"headers_too_large","message":"request headers too large or too many"}')

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._body = bytearray()
        self._headers_done = False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._rejected:
            return
        limits = self.gateway.settings.gateway
        if len(self._headers) >= limits.max_http_headers:
            self._headers_too_large()
            return
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        if self._rejected:
            return
        limits = self.gateway.settings.gateway
        head = len(self._url) + sum(len(name) + len(value) + 4 for name, value in self._headers)
        if head > limits.max_http_header_bytes:
            self._headers_too_large()
            return
        self._headers_done = True
        self._head_bytes = 0
        length = next((v for k, v in self._headers if k.lower() == "content-length"), None)
        if length is not None and length.isdigit() and int(length) > limits.max_http_body_bytes:
            self._reject(413, b'{"error":"too_large","message":"request body too large"}')

    def on_body(self, body: bytes) -> None:
        if self._rejected:
            return
        if len(self._body) + len(body) > self.gateway.settings.gateway.max_http_body_bytes:
            self._reject(413, b'{"error":"too_large","message":"request body too large"}')
            return
        self._body += body

    def on_message_complete(self) -> None:
        if self._rejected or self._parser.should_upgrade():
            return  # an upgrade is handled when the parser raises HttpParserUpgrade
        url = httptools.parse_url(self._url)
        request = HttpRequest(
            method=self._parser.get_method().decode("latin-1"),
            path=url.path.decode("latin-1"),
            query=(url.query or b"").decode("latin-1"),
            headers=self._headers,
            body=bytes(self._body),
            remote=self.remote,
        )
        self._requests.append((request, self._parser.should_keep_alive()))
        self._request_started = None
        self._headers_done = False
        self._head_bytes = 0

    async def _serve_http(self) -> None:
        try:
            while self._requests and not self.transport.is_closing():
                if self._paused:  # the client is not reading: answer more only when it does
                    self._drained = asyncio.get_running_loop().create_future()
                    await self._drained
                    continue
                request, keep_alive = self._requests.popleft()
                response = await self._answer(request)
                if self.transport.is_closing():
                    return
                self.transport.write(encode_http_response(response, keep_alive))
                if not keep_alive:
                    self.transport.close()
                    return
                if self._unparsed and not self._rejected:
                    unparsed, self._unparsed = self._unparsed, b""
                    self._http_received(unparsed)  # room again: parse what waited
                self._update_hold()
        finally:
            self._http_task = None
            self.last_activity = time.monotonic()
            due, self._last_word_due = self._last_word_due, None
            if due is not None and not self.transport.is_closing():
                self._last_word(due)  # a refusal, after the answers to the requests before it
            self._update_hold()

    async def _answer(self, request: HttpRequest) -> HttpResponse:
        route, path_known = self.listener.http_route(request.method, request.path)
        if route is None:
            if path_known or request.path in self.listener.ws_routes:
                status, body = 405, b'{"error":"method_not_allowed","message":"method not allowed on this path"}'
                if request.path in self.listener.ws_routes:
                    status, body = 426, b'{"error":"upgrade_required","message":"this path is a WebSocket endpoint"}'
                return json_response(status, body)
            return json_response(404, b'{"error":"not_found","message":"no such endpoint"}')
        try:
            return await route.handler(request)
        except Exception:
            logger.exception("HTTP %s %s failed", request.method, request.path)
            return json_response(500, b'{"error":"internal_error","message":"internal error"}')

    def _reject(self, status: int, body: bytes) -> None:
        self._refuse(encode_http_response(json_response(status, body), keep_alive=False))

    def _refuse(self, response: bytes) -> None:
        """Answer, then close once the client has read it (the sweep ends it after LINGER_S)."""
        if self._rejected:
            return
        self._rejected = True
        self._unparsed = b""
        self.closing_since = time.monotonic()
        if self._requests or self._http_task is not None:
            self.closing_since = None  # lingers from when it is written
            self._last_word_due = response  # the requests before it are answered first
            return
        self._last_word(response)

    def _last_word(self, response: bytes) -> None:
        """Write a final answer and end our side, but keep reading (and dropping) what the client
        still sends: closing a socket with unread bytes sends a reset, which can destroy the
        answer before the client reads it (a 431 for 1 MB of headers, say)."""
        transport = self.transport
        self.closing_since = time.monotonic()
        transport.write(response)
        if transport.can_write_eof():
            transport.write_eof()
        else:
            transport.close()

    def _upgrade(self, rest: bytes) -> None:
        if self._rejected:
            return  # its headers were refused (431)
        if self._requests or self._http_task is not None:
            # An upgrade pipelined behind requests not yet answered: its 101 would overtake them.
            self._reject(400, b'{"error":"bad_request","message":"upgrade pipelined behind other requests"}')
            return
        url = httptools.parse_url(self._url)
        path = url.path.decode("latin-1")
        dialect = self.listener.ws_routes.get(path)
        if dialect is None:
            self._reject(404, b'{"error":"not_found","message":"no WebSocket endpoint on this path"}')
            return
        method = self._parser.get_method().decode("latin-1")
        refusal = dialect.admit(HttpRequest(method, path, (url.query or b"").decode("latin-1"), self._headers, b"",
                                            self.remote))
        if refusal is not None:
            self._refuse(encode_http_response(refusal, keep_alive=False))
            return
        # The websockets handshake reads the head again, rebuilt from what llhttp parsed and checked.
        head = "".join([f"{method} {self._url.decode('latin-1')} HTTP/{self._parser.get_http_version()}\r\n",
                        *(f"{name}: {value}\r\n" for name, value in self._headers), "\r\n"])
        extensions = [ServerPerMessageDeflateFactory()] if self.gateway.settings.gateway.compression else None
        ws = ServerProtocol(extensions=extensions, max_size=dialect.max_frame_bytes, logger=_ws_logger)
        ws.receive_data(head.encode("latin-1"))
        events = ws.events_received()
        if not events:  # websockets could not parse what llhttp accepted
            self._reject(400, b'{"error":"bad_request","message":"malformed upgrade request"}')
            return
        request = events[0]
        response = ws.accept(request)
        ws.send_response(response)
        self._write_out(ws.data_to_send())
        if ws.state is not OPEN:
            self.transport.close()
            return
        self.path = path
        self.query = (url.query or b"").decode("latin-1")
        self._request_started = None
        self.ws = ws
        self.dialect = dialect
        self.compressed = bool(ws.extensions)
        self.max_outbound = dialect.max_outbound_bytes
        self._parser = None
        self.session = dialect.open_session(self, request.headers)
        if rest:
            self._ws_received(rest)
