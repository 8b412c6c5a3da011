"""Configuration of the Signal Hub dialect: the ``[signal]`` section."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from router.config import KIB, MIB, JwtConfig, OwnPort, Section, UrlPath


ALL_SIGNAL_CAPABILITIES = ("send", "receive", "discover", "broadcast", "publish", "subscribe")


class SignalHubConfig(Section):
    """Signal Hub dialect (``signal-hub-protocol.md``)."""

    enabled: bool = True
    path: UrlPath = "/signal"
    port: OwnPort = None
    protocol_version: str = "1.0"
    hub_address: str = "cloudflare/signal-hub"
    auth: JwtConfig = Field(default_factory=JwtConfig)
    # Capabilities granted when auth is disabled.
    anonymous_capabilities: list[str] = Field(default_factory=lambda: list(ALL_SIGNAL_CAPABILITIES))
    # Token bucket per connection: `rate_limit_per_minute` refill, `rate_limit_burst` capacity.
    rate_limit_per_minute: float = Field(default=100, gt=0)
    rate_limit_burst: int | None = Field(default=None, ge=1)
    max_message_bytes: int = Field(default=512 * KIB, ge=64)
    max_frame_bytes: int = Field(default=1 * MIB, ge=64)
    heartbeat_timeout_s: float = Field(default=60, gt=0)
    # The whole registry, split evenly over the registry shards; a full shard answers `rate_limited`.
    max_actors: int = Field(default=50_000, ge=1)
    # Per connection, counted by its gateway (a refusal costs no shard work), over either `rate_limited`:
    # the actors it has registered (a client registers one, a process hosting actors a few; 100 x 16 KiB
    # metadata is 1.6 MiB, and filling max_actors takes 500 connections) and the topics it subscribes to
    # (a subscription is a few hundred bytes in a topic shard).
    max_registrations_per_connection: int = Field(default=100, ge=1)
    max_subscriptions_per_connection: int = Field(default=1000, ge=1)
    default_ttl_ms: int = Field(default=300_000, ge=1)
    max_ttl_ms: int = Field(default=86_400_000, ge=1)
    # Discovery: a larger `limit` is clamped to discover_max_limit (as the reference hub does), a larger
    # `offset` is refused. Each registry shard looks for at most offset + limit + 1 matches.
    discover_default_limit: int = Field(default=100, ge=1)
    discover_max_limit: int = Field(default=100, ge=1)
    max_discover_offset: int = Field(default=10_000, ge=0)
    # The `actors` of one discovery reply encode to at most this (the spec's recommended message size);
    # a page cut short says so with `hasMore` and a `count` below the limit.
    max_discover_reply_bytes: int = Field(default=512 * KIB, ge=1 * KIB)
    max_pattern_length: int = Field(default=256, ge=1, le=4096)
    max_topic_length: int = Field(default=256, ge=1, le=4096)
    # Per registration: bounds what 50,000 registrations can cost a registry shard.
    max_capabilities: int = Field(default=64, ge=1)
    max_metadata_bytes: int = Field(default=16 * KIB, ge=2)
    # A request that waits longer than this for a shard gets `timeout`.
    request_timeout_s: float = Field(default=10, gt=0)
    # Bytes queued to a slow client before further deliveries to it are dropped (counted as failed).
    max_outbound_bytes: int = Field(default=8 * MIB, ge=64 * KIB)

    @field_validator("anonymous_capabilities")
    @classmethod
    def _known_capabilities(cls, value: list[str]) -> list[str]:
        unknown = set(value) - set(ALL_SIGNAL_CAPABILITIES)
        if unknown:
            raise ValueError(f"unknown capabilities {sorted(unknown)}; known: {list(ALL_SIGNAL_CAPABILITIES)}")
        return value

    @model_validator(mode="after")
    def _limits_consistent(self) -> "SignalHubConfig":
        if self.max_message_bytes > self.max_frame_bytes:
            raise ValueError("max_message_bytes must not exceed max_frame_bytes")
        if self.discover_default_limit > self.discover_max_limit:
            raise ValueError("discover_default_limit must not exceed discover_max_limit")
        if self.default_ttl_ms > self.max_ttl_ms:
            raise ValueError("default_ttl_ms must not exceed max_ttl_ms")
        return self
