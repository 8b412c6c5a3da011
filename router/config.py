"""Router configuration: defaults, a TOML config file, and ``ROUTER_*`` environment variables.

Precedence, highest first: command-line flags, environment variables
(``ROUTER_PORT=9000``, nested with ``__``: ``ROUTER_SIGNAL__RATE_LIMIT_PER_MINUTE=600``),
the config file (``--config router.toml`` or ``ROUTER_CONFIG=router.toml``), then the defaults below.
Invalid values fail at start with a message naming the field (:func:`load_settings`).
"""

from __future__ import annotations

import os
import threading
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

KIB = 1024
MIB = 1024 * 1024

ALL_SIGNAL_CAPABILITIES = ("send", "receive", "discover", "broadcast", "publish", "subscribe")
HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})
PUBLIC_KEY_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512"})


def _absolute_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError("must start with '/'")
    return value


UrlPath = Annotated[str, AfterValidator(_absolute_path)]  # a URL path: starts with "/"


class ConfigError(Exception):
    """The configuration is invalid; the message names the field and what is wrong."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EndpointConfig(_Section):
    """Where a dialect is served: a URL path, and optionally a port of its own."""

    path: UrlPath = "/"
    # None serves the dialect on the router's main port; a number opens a listener of its own
    # (gateway i of --gateways N listens on port + i; 0 lets the system pick a free port).
    port: int | None = Field(default=None, ge=0, le=65535)


class SignalAuthConfig(_Section):
    """JWT verification for ``hub:connect`` (spec section 1.3)."""

    enabled: bool = False
    # Pinned list: a token signed with any other algorithm (including "none") is refused.
    algorithms: list[str] = Field(default_factory=lambda: ["HS256"], min_length=1)
    secret: SecretStr | None = None  # HS* algorithms
    public_key: str | None = None  # PEM, RS*/ES*/PS* algorithms
    public_key_file: Path | None = None
    issuer: str | None = None
    audience: str | None = None
    leeway_s: float = Field(default=0.0, ge=0, le=300)

    @model_validator(mode="after")
    def _keys_match_algorithms(self) -> "SignalAuthConfig":
        unknown = set(self.algorithms) - HMAC_ALGORITHMS - PUBLIC_KEY_ALGORITHMS
        if unknown:
            raise ValueError(f"unsupported algorithms {sorted(unknown)}; use HS*, RS*, ES* or PS*")
        hmac = set(self.algorithms) & HMAC_ALGORITHMS
        if hmac and len(hmac) != len(self.algorithms):
            # Mixing HMAC and public-key algorithms invites key-confusion attacks.
            raise ValueError("do not mix HMAC (HS*) and public-key algorithms in one list")
        if self.enabled and hmac and self.secret is None:
            raise ValueError("auth is enabled with an HS* algorithm but 'secret' is not set")
        if self.enabled and not hmac and self.public_key is None and self.public_key_file is None:
            raise ValueError("auth is enabled with a public-key algorithm but neither 'public_key' nor 'public_key_file' is set")
        return self

    def verification_key(self) -> str:
        if set(self.algorithms) & HMAC_ALGORITHMS:
            assert self.secret is not None
            return self.secret.get_secret_value()
        if self.public_key is not None:
            return self.public_key
        assert self.public_key_file is not None
        return self.public_key_file.read_text()


class SignalHubConfig(_Section):
    """Signal Hub dialect (``signal-hub-protocol.md``)."""

    enabled: bool = True
    path: UrlPath = "/signal"
    port: int | None = Field(default=None, ge=0, le=65535)
    protocol_version: str = "1.0"
    hub_address: str = "cloudflare/signal-hub"
    auth: SignalAuthConfig = Field(default_factory=SignalAuthConfig)
    # Capabilities granted when auth is disabled.
    anonymous_capabilities: list[str] = Field(default_factory=lambda: list(ALL_SIGNAL_CAPABILITIES))
    # Token bucket per connection: `rate_limit_per_minute` refill, `rate_limit_burst` capacity.
    rate_limit_per_minute: float = Field(default=100, gt=0)
    rate_limit_burst: int | None = Field(default=None, ge=1)
    max_message_bytes: int = Field(default=512 * KIB, ge=64)
    max_frame_bytes: int = Field(default=1 * MIB, ge=64)
    heartbeat_timeout_s: float = Field(default=60, gt=0)
    max_actors: int = Field(default=50_000, ge=1)
    default_ttl_ms: int = Field(default=300_000, ge=1)
    max_ttl_ms: int = Field(default=86_400_000, ge=1)
    discover_default_limit: int = Field(default=100, ge=1)
    discover_max_limit: int = Field(default=1000, ge=1)
    max_discover_offset: int = Field(default=100_000, ge=0)
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

    @property
    def endpoint(self) -> EndpointConfig:
        return EndpointConfig(path=self.path, port=self.port)


CASHU_KINDS = ("bolt11_mint_quote", "bolt11_melt_quote", "bolt12_mint_quote", "bolt12_melt_quote", "proof_state")


class CashuSupported(_Section):
    """One entry of NUT-06 ``nuts.17.supported``: a method-unit pair and the kinds it serves."""

    method: str = Field(min_length=1)
    unit: str = Field(min_length=1)
    commands: list[str] = Field(min_length=1)

    @field_validator("commands")
    @classmethod
    def _known_kinds(cls, value: list[str]) -> list[str]:
        unknown = set(value) - set(CASHU_KINDS)
        if unknown:
            raise ValueError(f"unknown subscription kinds {sorted(unknown)}; known: {list(CASHU_KINDS)}")
        return value


def _default_cashu_supported() -> list[CashuSupported]:
    return [
        CashuSupported(method="bolt11", unit="sat",
                       commands=["bolt11_mint_quote", "bolt11_melt_quote", "proof_state"]),
        CashuSupported(method="bolt12", unit="sat",
                       commands=["bolt12_mint_quote", "bolt12_melt_quote", "proof_state"]),
    ]


class CashuConfig(_Section):
    """Cashu NUT-17 subscriptions (``cashu-nut17-websockets.md``) and the mint's state feed."""

    enabled: bool = True
    path: UrlPath = "/v1/ws"
    port: int | None = Field(default=None, ge=0, le=65535)
    info_path: UrlPath = "/v1/info"
    # The mint pushes object states here (POST, API key). No key configured: the feed is off (403).
    state_path: UrlPath = "/v1/ws/state"
    state_api_key: SecretStr | None = None
    max_states_per_push: int = Field(default=1000, ge=1)
    # NUT-06 `nuts.17.supported`; the kinds listed here are the ones a wallet may subscribe to.
    supported: list[CashuSupported] = Field(default_factory=_default_cashu_supported, min_length=1)
    # Other fields of `GET /v1/info` (name, pubkey, version, …) when no mint URL is configured.
    info: dict[str, Any] = Field(default_factory=lambda: {"name": "ray-ws-router", "version": "ray-ws-router/0.1.0"})
    max_subscriptions: int = Field(default=100, ge=1)  # per connection
    max_filters: int = Field(default=1000, ge=1)  # per subscription
    max_filters_per_connection: int = Field(default=10_000, ge=1)
    max_filter_length: int = Field(default=256, ge=1, le=4096)
    max_sub_id_length: int = Field(default=256, ge=1, le=4096)
    max_message_bytes: int = Field(default=256 * KIB, ge=256)
    max_frame_bytes: int = Field(default=1 * MIB, ge=256)
    # NUT-17: wallets send something at least every 30 s; silence for this long means a stale connection.
    idle_timeout_s: float = Field(default=45, gt=0)
    rate_limit_per_second: float = Field(default=50, gt=0)
    rate_limit_burst: int = Field(default=100, ge=1)
    # A Y the router has never seen: "unspent" answers UNSPENT (as Nutshell), "none" sends nothing (as CDK).
    unknown_proof_state: Literal["unspent", "none"] = "unspent"
    # The mint's base URL: unknown objects are fetched from its REST API, `/v1/info` merges its info.
    mint_url: str | None = None
    mint_timeout_s: float = Field(default=5, gt=0)
    mint_info_ttl_s: float = Field(default=60, ge=0)
    request_timeout_s: float = Field(default=10, gt=0)
    max_outbound_bytes: int = Field(default=8 * MIB, ge=64 * KIB)

    @field_validator("mint_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None:
            if not value.startswith(("http://", "https://")):
                raise ValueError("must be an http:// or https:// URL")
            value = value.rstrip("/")
        return value

    @model_validator(mode="after")
    def _limits_consistent(self) -> "CashuConfig":
        if self.max_message_bytes > self.max_frame_bytes:
            raise ValueError("max_message_bytes must not exceed max_frame_bytes")
        return self

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(kind for entry in self.supported for kind in entry.commands)


class MxIngestConfig(_Section):
    """How block data from a MultiversX node enters (``mx-upstream-notes.md``)."""

    # "server": the node's outport driver dials the router at `path` (its default client mode);
    # "client": the router dials the node's websocket server at `connect_url` (from gateway 0).
    mode: Literal["server", "client"] = "server"
    path: UrlPath = "/save"
    # None: the router's main port; a number opens a port of its own (22111 is the node's default).
    port: int | None = Field(default=None, ge=0, le=65535)
    connect_url: str | None = None
    # The node's marshaller; "auto" reads each frame's first byte ("{" = JSON).
    marshaller: Literal["auto", "gogo", "json"] = "auto"
    reconnect_min_s: float = Field(default=0.5, gt=0)
    reconnect_max_s: float = Field(default=5.0, gt=0)
    # The node retries a block until it is acknowledged: duplicates (by block hash) are dropped.
    dedup_window_s: float = Field(default=1800, gt=0)
    dedup_max_entries: int = Field(default=100_000, ge=1)
    max_frame_bytes: int = Field(default=64 * MIB, ge=1024)

    @model_validator(mode="after")
    def _client_needs_url(self) -> "MxIngestConfig":
        if self.mode == "client" and not self.connect_url:
            raise ValueError("mode 'client' needs connect_url (the node's ws://host:port/path)")
        if self.connect_url is not None and not self.connect_url.startswith(("ws://", "wss://")):
            raise ValueError("connect_url must be a ws:// or wss:// URL")
        return self


class MxConfig(_Section):
    """mx-notifier hub (``mx-notifier-hub.md``): node ingest and filtered binary event streams."""

    enabled: bool = True
    path: UrlPath = "/hub/ws"
    port: int | None = Field(default=None, ge=0, le=65535)
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
    ingest: MxIngestConfig = Field(default_factory=MxIngestConfig)


class BaqendConfig(_Section):
    """Baqend real-time queries (``baqend-realtime-queries.md``) and the REST API they watch."""

    enabled: bool = True
    path: str = "/v1/events"
    port: int | None = Field(default=None, ge=0, le=65535)
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
    # Token validator: JWT (claims `sub` = user id, `roles` = role names) for the documents' acl.
    auth: SignalAuthConfig = Field(default_factory=SignalAuthConfig)
    request_timeout_s: float = Field(default=10, gt=0)
    max_outbound_bytes: int = Field(default=8 * MIB, ge=64 * KIB)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("path", "rest_path")
    @classmethod
    def _path_is_absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value.rstrip("/") or "/"


class NolagLobby(_Section):
    """A lobby: a configured set of rooms, or every room whose id starts with a prefix."""

    rooms: list[str] | None = None
    prefix: str | None = None

    @model_validator(mode="after")
    def _one_of(self) -> "NolagLobby":
        if (self.rooms is None) == (self.prefix is None):
            raise ValueError("give exactly one of 'rooms' (a list of room ids) or 'prefix'")
        return self


class NolagHydration(_Section):
    """A hydration webhook: POSTed on subscribe to topics matching ``topics`` (a key ACL pattern)."""

    topics: str = Field(min_length=1)
    url: str

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value


class NolagConfig(_Section):
    """NoLag (``nolag-wire-protocol.md``): MessagePack pub/sub with keys, QoS, presence, replay."""

    enabled: bool = True
    path: UrlPath = "/ws"
    port: int | None = Field(default=None, ge=0, le=65535)
    # Keys (`router keys create|list|revoke`); default <data_dir>/keys.sqlite3.
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
    # The message log: QoS >= 1 messages are stored for replay; retention per topic pattern, else the default.
    log_retention_s: float = Field(default=3600, ge=0)
    log_retention: dict[str, float] = Field(default_factory=dict)
    max_replay: int = Field(default=1000, ge=0)
    lobbies: dict[str, NolagLobby] = Field(default_factory=dict)
    hydration: list[NolagHydration] = Field(default_factory=list)
    hydration_timeout_s: float = Field(default=3, gt=0)
    hydration_retries: int = Field(default=2, ge=0)
    request_timeout_s: float = Field(default=10, gt=0)
    max_outbound_bytes: int = Field(default=8 * MIB, ge=64 * KIB)


class ShardsConfig(_Section):
    """How many Ray actors of each kind hold the routing state (keys are hashed onto them)."""

    session: int = Field(default=2, ge=1, le=1024)
    topic: int = Field(default=2, ge=1, le=1024)
    registry: int = Field(default=2, ge=1, le=1024)
    # Baqend real-time queries (started only when baqend.enabled): documents by id, queries by subscription.
    document: int = Field(default=2, ge=1, le=1024)
    query: int = Field(default=2, ge=1, le=1024)


class GatewayConfig(_Section):
    """Gateway tuning: batching to shards, HTTP limits, timeouts."""

    # Commands and deliveries travel over lanes (one stream per gateway and shard; docs/performance.md);
    # off: every batch is a Ray call and every delivery to another gateway a Ray call.
    lanes: bool = True
    # Commands to one shard travel as one batch; a batch is flushed at this size or on the
    # next event-loop turn, whichever comes first.
    batch_max: int = Field(default=1024, ge=1)
    # Batches in flight to one shard; while they are out, new commands accumulate (larger batches).
    max_inflight_batches: int = Field(default=4, ge=1)
    # When this many commands wait to be sent, the gateway stops reading from sockets until it drains.
    max_pending_commands: int = Field(default=200_000, ge=1000)
    # A delivery that arrives out of order waits this long for the ones before it.
    reorder_timeout_s: float = Field(default=2.0, gt=0)
    handshake_timeout_s: float = Field(default=10, gt=0)
    close_timeout_s: float = Field(default=5, gt=0)
    max_http_body_bytes: int = Field(default=1 * MIB, ge=1024)
    # permessage-deflate costs about a third more CPU per delivery; off unless asked for.
    compression: bool = False
    sweep_interval_s: float = Field(default=1.0, gt=0)


class AnalyticsConfig(_Section):
    """The event log read by `router analytics` (Spark through RayDP)."""

    enabled: bool = True
    # Default: <data_dir>/events. On a cluster, point every node at shared storage to analyse all of it.
    directory: Path | None = None
    # Fraction of messages recorded, decided per message so a sampled message keeps all its deliveries.
    sample_rate: float = Field(default=1.0, ge=0, le=1)
    flush_interval_s: float = Field(default=2.0, gt=0)
    retention_hours: float = Field(default=168, gt=0)
    # "process": a writer actor per gateway (on its node) turns records into Parquet;
    # "thread": a thread of the gateway's own process does (one process fewer, more gateway CPU).
    writer: Literal["process", "thread"] = "process"


class MetricsConfig(_Section):
    """Live metrics through ray.util.metrics (Ray dashboard, Prometheus)."""

    enabled: bool = True
    interval_s: float = Field(default=1.0, gt=0)


def _default_data_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "ray-ws-router"


class RouterSettings(BaseSettings):
    """Everything the router reads at start. Frozen: actors receive a copy."""

    model_config = SettingsConfigDict(
        env_prefix="ROUTER_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    gateways: int = Field(default=1, ge=1, le=64)
    # None starts an embedded Ray on this machine; "auto" or "host:port" joins a running cluster.
    ray_address: str | None = None
    namespace: str = Field(default="router", pattern=r"^[A-Za-z0-9_.-]+$")
    # Start the Ray dashboard with an embedded Ray (it shows the router's actors and metrics).
    ray_dashboard: bool = True
    data_dir: Path = Field(default_factory=_default_data_dir)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    shards: ShardsConfig = Field(default_factory=ShardsConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    signal: SignalHubConfig = Field(default_factory=SignalHubConfig)
    cashu: CashuConfig = Field(default_factory=CashuConfig)
    mx: MxConfig = Field(default_factory=MxConfig)
    nolag: NolagConfig = Field(default_factory=NolagConfig)
    baqend: BaqendConfig = Field(default_factory=BaqendConfig)
    analytics: AnalyticsConfig = Field(default_factory=AnalyticsConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)

    @property
    def events_dir(self) -> Path:
        return self.analytics.directory or self.data_dir / "events"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = _CONFIG_FILE.get()
        if config_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
        return tuple(sources)


class _ConfigFileSlot:
    """The config file for the settings being built (pydantic-settings sources take no arguments)."""

    def __init__(self) -> None:
        self._path: Path | None = None

    def get(self) -> Path | None:
        return self._path

    def set(self, path: Path | None) -> None:
        self._path = path


_CONFIG_FILE = _ConfigFileSlot()
_CONFIG_LOCK = threading.Lock()


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(settings)"
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"  {field}: {message}")
    return "invalid configuration:\n" + "\n".join(lines)


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> RouterSettings:
    """Build the settings from defaults, ``config_file`` (or ``$ROUTER_CONFIG``), env and ``overrides``.

    Raises :class:`ConfigError` naming every invalid field.
    """
    path = config_file or os.environ.get("ROUTER_CONFIG")
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"invalid configuration:\n  config file: {path} does not exist")
    overrides = {key: value for key, value in overrides.items() if value is not None}
    with _CONFIG_LOCK:
        _CONFIG_FILE.set(path)
        try:
            return RouterSettings(**overrides)
        except ValidationError as error:
            raise ConfigError(_describe(error)) from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"invalid configuration:\n  config file {path}: {error}") from None
        except SettingsError as error:
            # e.g. ROUTER_SHARDS={bad : a structured field whose environment value is not JSON
            raise ConfigError(f"invalid configuration:\n  {error}") from None
        finally:
            _CONFIG_FILE.set(None)
