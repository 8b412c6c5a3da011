"""Configuration of the mx-notifier hub and its node ingest: the ``[mx]`` section."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from router.config import KIB, MIB, OwnPort, Section, UrlPath


class MxIngestConfig(Section):
    """How block data from a MultiversX node enters (``mx-upstream-notes.md``)."""

    # "server": the node's outport driver dials the router at `path` (its default client mode);
    # "client": the router dials the node's websocket server at `connect_url` (from gateway 0).
    mode: Literal["server", "client"] = "server"
    path: UrlPath = "/save"
    # None: the router's main port; a number opens a port of its own (22111 is the node's default).
    port: OwnPort = None
    connect_url: str | None = None
    # The node's marshaller; "auto" reads each frame's first byte ("{" = JSON).
    marshaller: Literal["auto", "gogo", "json"] = "auto"
    reconnect_min_s: float = Field(default=0.5, gt=0)
    reconnect_max_s: float = Field(default=5.0, gt=0)
    # The node retries a block until it is acknowledged: duplicates (by block hash) are dropped.
    dedup_window_s: float = Field(default=1800, gt=0)
    dedup_max_entries: int = Field(default=100_000, ge=1)
    max_frame_bytes: int = Field(default=64 * MIB, ge=1024)
    # Frames of at least this size are decoded in a worker thread (one frame at a time per
    # connection, in order), so the event loop keeps serving everyone else meanwhile.
    offload_frame_bytes: int = Field(default=64 * KIB, ge=1)
    decode_threads: int = Field(default=1, ge=1, le=8)  # per gateway (the GIL: more rarely helps)
    # Per node connection: frames waiting behind the one being decoded (a node that does not wait
    # for ACKs); over it the connection is closed with 1013.
    max_waiting_bytes: int = Field(default=256 * MIB, ge=1 * MIB)

    @model_validator(mode="after")
    def _client_needs_url(self) -> "MxIngestConfig":
        if self.mode == "client" and not self.connect_url:
            raise ValueError("mode 'client' needs connect_url (the node's ws://host:port/path)")
        if self.connect_url is not None and not self.connect_url.startswith(("ws://", "wss://")):
            raise ValueError("connect_url must be a ws:// or wss:// URL")
        if self.max_waiting_bytes < self.max_frame_bytes:
            raise ValueError("max_waiting_bytes must hold at least one frame of max_frame_bytes")
        return self


class MxConfig(Section):
    """mx-notifier hub (``mx-notifier-hub.md``): node ingest and filtered binary event streams."""

    enabled: bool = True
    path: UrlPath = "/hub/ws"
    port: OwnPort = None
    # Text frames on the binary-only endpoint: dropped (counted) or the connection closed with 1003.
    text_frames: Literal["drop", "close"] = "drop"
    # Stop-and-wait delivery for connections that do not say (`?ack=1` / `?ack=0` on the URL do).
    with_acknowledge: bool = False
    ack_timeout_s: float = Field(default=30, gt=0)
    # Per connection: frames waiting to be written; reaching it closes the connection with 1013.
    max_queue_depth: int = Field(default=4096, ge=1)
    # Per connection, without ACKs: unsent bytes in the socket before frames wait in the queue.
    max_write_buffer_bytes: int = Field(default=1 * MIB, ge=1024)
    # Per gateway: frames waiting over all hub connections; above it the deepest queue is closed.
    max_queued_total: int = Field(default=1_000_000, ge=1)
    max_subscriptions: int = Field(default=64, ge=1)  # filters per connection
    max_subscribe_topics: int = Field(default=32, ge=1, le=1024)
    max_field_length: int = Field(default=256, ge=1, le=4096)
    max_frame_bytes: int = Field(default=64 * KIB, ge=256)
    # What a node (or the proxy in front of it) sends on the ingest path as `Authorization: Bearer
    # <token>`, compared in constant time; without it the upgrade gets 401. None: only loopback
    # peers may push (others get 403). Set it whenever the ingest port is reachable from elsewhere.
    node_token: SecretStr | None = Field(default=None, min_length=16)
    # A consumer or node connection that sends nothing (no frame, no pong) for idle_timeout_s is
    # closed with 1001; one quiet for ping_interval_s is pinged, so a live peer's pong keeps it open.
    idle_timeout_s: float = Field(default=120, gt=0)
    ping_interval_s: float = Field(default=30, gt=0)
    ingest: MxIngestConfig = Field(default_factory=MxIngestConfig)

    @model_validator(mode="after")
    def _ping_before_idle(self) -> "MxConfig":
        if self.ping_interval_s >= self.idle_timeout_s:
            raise ValueError("ping_interval_s must be shorter than idle_timeout_s (a quiet peer is kept by its pong)")
        return self
