"""Configuration of the Baqend real-time query dialect: the ``[baqend]`` section."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from router.config import KIB, MIB, JwtConfig, OwnPort, Section
from router.lane import MAX_FRAME_BYTES


class BaqendConfig(Section):
    """Baqend real-time queries (``baqend-realtime-queries.md``) and the REST API they watch."""

    enabled: bool = True
    path: str = "/v1/events"
    port: OwnPort = None
    # REST base: GET <rest_path>/connect, <rest_path>/db/<Bucket>[/<key>].
    rest_path: str = "/v1"
    # What GET /v1/connect answers as "schema" (the SDK's metamodel: [{"class": "/db/Todo", "fields": {...}}]).
    schema_: list[dict[str, Any]] = Field(default_factory=list, alias="schema")
    max_subscriptions: int = Field(default=20, ge=1)  # active per connection (429 beyond)
    max_message_bytes: int = Field(default=64 * KIB, ge=256)
    max_frame_bytes: int = Field(default=1 * MIB, ge=256)
    # The Node SDK drops frames above 1 MiB: a larger initial result is refused with an error message.
    max_result_bytes: int = Field(default=1_000_000, ge=1024)
    max_document_bytes: int = Field(default=256 * KIB, ge=256)
    max_key_length: int = Field(default=256, ge=1, le=4096)
    # Work per subscribe. A document shard answers a scan in pages: at most `max_scan_documents`
    # stored rows read and `max_scan_bytes` of documents per call (plus one document, so a page
    # always moves on), far below a lane frame (router/lane.py).
    max_scan_documents: int = Field(default=1000, ge=1, le=100_000)
    max_scan_bytes: int = Field(default=1 * MIB, ge=1 * KIB, le=MAX_FRAME_BYTES // 16)
    # A query holds every document it matches (a sorted window too, to refill it): one matching
    # more documents, or more bytes of them, is refused with error 413 while its pages are read.
    max_result_documents: int = Field(default=10_000, ge=1)
    max_query_bytes: int = Field(default=16 * MIB, ge=1 * KIB, le=MAX_FRAME_BYTES // 4)
    # Per client (the token's subject, else the remote address), counted by each gateway:
    # live subscriptions over all its connections (429), subscribes and REST requests per minute
    # (token buckets: `burst` at once, refilled at the rate; over it, 429).
    max_client_subscriptions: int = Field(default=100, ge=1)
    subscribe_rate_limit_per_minute: float = Field(default=300, gt=0)
    subscribe_rate_limit_burst: int = Field(default=100, ge=1)
    rest_rate_limit_per_minute: float = Field(default=3000, gt=0)
    rest_rate_limit_burst: int = Field(default=300, ge=1)
    # /v1/events: a connection quiet this long is pinged (the SDK's WebSocket library answers with a
    # pong); one that sends nothing, not even a pong, for `idle_timeout_s` is closed with 1001, and
    # so is one that holds no subscription and sends no message for that long.
    ping_interval_s: float = Field(default=20, gt=0)
    idle_timeout_s: float = Field(default=60, gt=0)
    # Token validator: JWT (claims `sub` = user id, `roles` = role names) for the documents' acl.
    auth: JwtConfig = Field(default_factory=JwtConfig)
    request_timeout_s: float = Field(default=10, gt=0)
    max_outbound_bytes: int = Field(default=8 * MIB, ge=64 * KIB)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _ping_before_idle(self) -> "BaqendConfig":
        if self.ping_interval_s >= self.idle_timeout_s:
            raise ValueError("ping_interval_s must be below idle_timeout_s (a pong has to be able to arrive)")
        return self

    @field_validator("path", "rest_path")
    @classmethod
    def _path_is_absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value.rstrip("/") or "/"
