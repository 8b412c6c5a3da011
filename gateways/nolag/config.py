"""Configuration of the NoLag dialect: the ``[nolag]`` section."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from router.config import KIB, MIB, OwnPort, Section, UrlPath


class NolagLobby(Section):
    """A lobby: a configured set of rooms, or every room whose id starts with a prefix."""

    rooms: list[str] | None = None
    prefix: str | None = None

    @model_validator(mode="after")
    def _one_of(self) -> "NolagLobby":
        if (self.rooms is None) == (self.prefix is None):
            raise ValueError("give exactly one of 'rooms' (a list of room ids) or 'prefix'")
        return self


class NolagHydration(Section):
    """A hydration webhook: POSTed on subscribe to topics matching ``topics`` (a key ACL pattern)."""

    topics: str = Field(min_length=1)
    url: str

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value


class NolagConfig(Section):
    """NoLag (``nolag-wire-protocol.md``): MessagePack pub/sub with keys, QoS, presence, replay."""

    enabled: bool = True
    path: UrlPath = "/ws"
    port: OwnPort = None
    # Keys (`router keys create|list|revoke`): the SQLite file, default <data_dir>/keys.sqlite3
    # (unused with store.url: the keys are then in PostgreSQL, shared by every node).
    keys_path: Path | None = None
    revocation_poll_s: float = Field(default=1.0, gt=0)
    auth_timeout_s: float = Field(default=10, gt=0)
    # Empty binary frames both ways; a client silent for heartbeat_timeout_s is closed.
    heartbeat_interval_s: float = Field(default=30, gt=0)
    heartbeat_timeout_s: float = Field(default=90, gt=0)
    max_message_bytes: int = Field(default=256 * KIB, ge=256)
    max_frame_bytes: int = Field(default=1 * MIB, ge=256)
    rate_limit_per_s: float = Field(default=50, gt=0)  # when the key does not set one
    max_subscriptions: int = Field(default=1000, ge=1)  # per connection
    max_filters: int = Field(default=100, ge=1, le=100)
    max_topic_length: int = Field(default=256, ge=8, le=4096)
    # QoS 1/2: an unacknowledged message is sent again after ack_timeout_s, then x ack_backoff, up to
    # max_attempts sends; at most max_unacked per connection.
    ack_timeout_s: float = Field(default=5, gt=0)
    ack_backoff: float = Field(default=2, ge=1)
    max_attempts: int = Field(default=5, ge=1)
    max_unacked: int = Field(default=1000, ge=1)
    # How often a connection tells its actor's session shard its replay positions (when they moved):
    # after a crash of its gateway, a reconnect's replay repeats at most this much QoS 1 traffic.
    checkpoint_interval_s: float = Field(default=1.0, gt=0)
    # The message log: QoS >= 1 messages are stored for replay; retention per topic pattern, else the default.
    log_retention_s: float = Field(default=3600, ge=0)
    log_retention: dict[str, float] = Field(default_factory=dict)
    max_replay: int = Field(default=1000, ge=0, le=10_000)  # messages a replay sends at most
    lobbies: dict[str, NolagLobby] = Field(default_factory=dict)
    hydration: list[NolagHydration] = Field(default_factory=list)
    hydration_timeout_s: float = Field(default=3, gt=0)
    hydration_retries: int = Field(default=2, ge=0)
    request_timeout_s: float = Field(default=10, gt=0)
    max_outbound_bytes: int = Field(default=8 * MIB, ge=64 * KIB)

    def keys_file(self, data_dir: Path) -> Path:
        """The SQLite key store the gateways read and `router keys` writes (without ``store.url``)."""
        return self.keys_path or data_dir / "keys.sqlite3"
