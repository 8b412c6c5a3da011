"""What a dialect gives the server, and what the server gives a dialect.

The server moves bytes; a dialect turns a connection's messages into shard commands and shard
results into frames. A dialect never touches a socket: it writes through :class:`Wire`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol

if TYPE_CHECKING:
    from gateways.gateway import Gateway
    from gateways.shardclient import ShardLink, ShardView


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes
    remote: str

    def header(self, name: str) -> str | None:
        name = name.lower()
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None


@dataclass(slots=True)
class HttpResponse:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


HttpHandler = Callable[[HttpRequest], Awaitable[HttpResponse]]


@dataclass(frozen=True, slots=True)
class HttpRoute:
    method: str
    path: str
    handler: HttpHandler
    prefix: bool = False  # match every path below ``path`` as well

    def matches(self, path: str) -> bool:
        if self.prefix:
            return path == self.path or path.startswith(self.path.rstrip("/") + "/")
        return path == self.path


class Wire(Protocol):
    """The server side of one WebSocket connection, as a dialect session sees it."""

    id: int
    remote: str
    path: str
    query: str
    dropped: int
    flushes: int  # how many times the connection wrote data frames (corked ones count once per write)
    last_activity: float  # time.monotonic() of the last bytes received (pings included)
    compressed: bool  # permessage-deflate: a prebuilt frame is not written as it is (send_frame)

    def send_text(self, payload: bytes) -> bool: ...

    def send_binary(self, payload: bytes) -> bool: ...

    def send_binaries(self, payloads: list[bytes]) -> bool:
        """Binary messages in order, their frames in one write."""

    def send_frame(self, frame: bytes, opcode: int, payload: bytes | None = None) -> bool:
        """Write ``frame`` (``gateways.server.frame_header`` + ``payload``), built once and shared by
        every recipient of a fan-out. Without ``payload`` the connection takes it from ``frame``
        when it needs it (a compressed connection)."""

    def takes_frames(self) -> bool:
        """Whether :meth:`send_frame` would take every frame given now, as it is (open, not
        compressed, writing not paused): then :meth:`cork_frames` may write several joined."""

    def cork_frames(self, frames: bytes) -> None:
        """Prebuilt frames, joined, written as :meth:`send_frame` writes each (after :meth:`takes_frames`)."""

    def flush(self) -> None:
        """Write now what this connection holds for the end of the loop turn (frames are corked:
        a turn's frames leave in one write)."""

    def close(self, code: int = 1000, reason: str = "") -> None: ...

    def receiving(self) -> bool:
        """Whether messages read from the client are still handed over (open, not failed)."""
        ...

    def ping(self) -> None:
        """A WebSocket ping: the client's pong (any bytes) moves ``last_activity``."""

    def outbound_bytes(self) -> int: ...

    @property
    def writing_paused(self) -> bool: ...


class DialectSession(ABC):
    """Per-connection state machine of a dialect."""

    def __init__(self, dialect: "Dialect", wire: Wire) -> None:
        self.dialect = dialect
        self.config = dialect.config
        self.wire = wire
        self.gateway = dialect.gateway
        self.shards = dialect.shards
        self.closed = False  # released: it no longer holds anything on shards

    # True: the connection hands the binary messages of one read to :meth:`on_binaries` together
    takes_binaries = False

    @abstractmethod
    def on_message(self, data: bytes, is_text: bool) -> None:
        """A complete WebSocket message arrived (text already checked to be UTF-8)."""

    def on_binaries(self, payloads: list[bytes]) -> None:
        """Binary messages that arrived in one read, in order (for a session that
        ``takes_binaries``): each, as :meth:`on_message` would take it, after the one before,
        until one closes the connection (:meth:`Wire.receiving`; the rest of the read is dropped,
        as when the connection hands messages over one by one)."""
        wire = self.wire
        for data in payloads:
            self.on_message(data, False)
            if not wire.receiving():
                return

    def on_event(self, payload: Any) -> None:
        """A shard delivered a dialect event (``DELIVER_EVENT``) to this connection."""

    def on_drain(self) -> None:
        """The socket's write buffer drained below its high-water mark: queued frames may go."""

    def on_tick(self, now: float) -> None:
        """Called about once per ``gateway.sweep_interval_s`` with ``time.monotonic()``."""

    def on_close(self) -> None:
        """The connection is gone (closed by either side)."""
        self.release()

    def reannounce(self, link: "ShardLink") -> None:
        """The shard behind ``link`` restarted empty (Ray gave it a new epoch): send it again what
        this connection holds there, with the same commands that created it. Queued before any
        command that waited meanwhile. The client sees nothing unless what it should see changed
        (e.g. a retained state that moved on while the shard was down)."""

    def release(self) -> None:
        """End the session, once (on close, or when the router ends it first): it leaves its
        dialect's ``sessions`` and :meth:`released` gives back what it held."""
        if self.closed:
            return
        self.closed = True
        self.dialect.sessions.discard(self)
        self.released()

    def released(self) -> None:
        """Give back what the session held (subscriptions on shards, tasks, queued frames)."""


class Dialect(ABC):
    """One protocol: where it is served, its frame limits, and its sessions."""

    name: str = ""
    config: Any = None  # the dialect's config section: path, port and limits are read from it

    def __init__(self, gateway: "Gateway") -> None:
        self.gateway = gateway
        self.sessions: set[DialectSession] = set()  # open, not yet released

    @property
    def path(self) -> str:
        return self.config.path

    @property
    def port(self) -> int | None:
        """A port of its own, or None for the router's main port."""
        return getattr(self.config, "port", None)

    @property
    def request_timeout_s(self) -> float:
        """How long its requests wait for a shard: its section's ``request_timeout_s``, else the
        gateway's."""
        timeout = getattr(self.config, "request_timeout_s", None)
        return timeout if timeout is not None else self.gateway.settings.gateway.request_timeout_s

    @cached_property
    def shards(self) -> "ShardView":
        """The gateway's shard client, with this dialect's request timeout."""
        return self.gateway.shards.view(self.request_timeout_s)

    @property
    def max_frame_bytes(self) -> int:
        return getattr(self.config, "max_frame_bytes", 1 << 20)

    @property
    def max_outbound_bytes(self) -> int:
        return getattr(self.config, "max_outbound_bytes", 8 << 20)

    def open_session(self, wire: Wire, request_headers: Any) -> DialectSession:
        """A connection was accepted on this dialect's path: its session, kept in ``sessions``."""
        session = self.new_session(wire, request_headers)
        self.sessions.add(session)
        return session

    @abstractmethod
    def new_session(self, wire: Wire, request_headers: Any) -> DialectSession: ...

    def admit(self, request: HttpRequest) -> HttpResponse | None:
        """Checked before a WebSocket upgrade on this dialect's path is accepted (a credential, the
        peer's address): a response to refuse it with, or None to accept."""
        return None

    def http_routes(self) -> list[HttpRoute]:
        return []

    def shard_restarted(self, link: "ShardLink") -> None:
        """The shard behind ``link`` restarted empty: every session re-announces what it held there."""
        for session in list(self.sessions):
            if not session.closed:
                session.reannounce(link)

    def stats(self) -> dict[str, Any]:
        return {}

    async def start(self) -> None:
        """The gateway is listening: start what the dialect runs beside its connections."""

    async def close(self) -> None:
        """The gateway is stopping: release what the dialect holds beyond its connections."""
