"""Router configuration: defaults, a TOML config file, and ``ROUTER_*`` environment variables.

Precedence, highest first: command-line flags, environment variables
(``ROUTER_PORT=9000``, nested with ``__``: ``ROUTER_SIGNAL__RATE_LIMIT_PER_MINUTE=600``),
the config file (``--config router.toml`` or ``ROUTER_CONFIG=router.toml``), then the defaults below.
Invalid values fail at start with a message naming the field (:func:`load`).

This module holds the core's sections (host and ports, shards, gateway tuning, analytics, metrics)
and the loader. Each dialect's section lives with the dialect (``gateways/<dialect>/config.py``);
``router/settings.py`` composes them into the full settings from the dialect table.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import threading
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, TypeVar, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

KIB = 1024
MIB = 1024 * 1024
SHARDS_DEFAULT = 2  # actors per shard kind
MAX_SHARDS = 1024
ENV_PREFIX = "ROUTER_"
ENV_DELIMITER = "__"
_ENV_NOT_SETTINGS = frozenset({"ROUTER_CONFIG"})  # the config file's path, read by `load` itself

HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})
PUBLIC_KEY_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512"})


def _absolute_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError("must start with '/'")
    return value


UrlPath = Annotated[str, AfterValidator(_absolute_path)]  # a URL path: starts with "/"
# A dialect's own port: None serves it on the router's main port (gateway i of N on port + i).
OwnPort = Annotated[int | None, Field(ge=0, le=65535)]


class ConfigError(Exception):
    """The configuration is invalid; the message names the field and what is wrong."""


class Section(BaseModel):
    """A configuration section (``[gateway]``, ``[nolag]``, …): unknown keys are errors, values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class JwtConfig(Section):
    """JWT verification, for a dialect that takes tokens (Signal's ``hub:connect``, Baqend's acl)."""

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
    def _keys_match_algorithms(self) -> "JwtConfig":
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


class ShardsConfig(Section):
    """How many Ray actors of each kind hold the routing state (keys are hashed onto them)."""

    session: int = Field(default=SHARDS_DEFAULT, ge=1, le=MAX_SHARDS)
    topic: int = Field(default=SHARDS_DEFAULT, ge=1, le=MAX_SHARDS)
    # A shard that Ray restarted (empty) answers only re-announcements until every gateway has sent
    # its own, or for at most this long; other commands are retried by their gateway meanwhile.
    heal_timeout_s: float = Field(default=3.0, gt=0, le=60)
    # A dialect's own kinds (e.g. `registry`) are added by router/settings.py from the dialect table.


def _networks(values: list[str]) -> list[str]:
    for value in values:
        ipaddress.ip_network(value, strict=False)  # ValueError names the bad one
    return values


class GatewayConfig(Section):
    """Gateway tuning: batching to shards, HTTP limits, connection limits, timeouts."""

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
    # A request waits this long for a shard unless its dialect's section sets its own `request_timeout_s`.
    request_timeout_s: float = Field(default=10, gt=0)
    # A delivery that arrives out of order waits this long for the ones before it.
    reorder_timeout_s: float = Field(default=2.0, gt=0)
    # Deliveries (recipients) applied in one event-loop turn; the rest of a large shard reply waits
    # for the next turns, so that reads, acks and timers run between slices. Past 8 turns' worth
    # waiting, the gateway stops reading its lanes (the shards hold the rest) until one turn's worth is left.
    max_deliveries_per_turn: int = Field(default=100_000, ge=100)
    # A request (head and body, or a WebSocket handshake) must arrive whole within this time of
    # its first byte (408), and a connection idle between requests is closed after it.
    handshake_timeout_s: float = Field(default=10, gt=0)
    close_timeout_s: float = Field(default=5, gt=0)
    # A client we stopped reading because it does not read its answers (or pongs) is dropped when
    # its unread output has not shrunk for this long.
    stall_timeout_s: float = Field(default=30, gt=0)
    max_http_body_bytes: int = Field(default=1 * MIB, ge=1024)
    # Request line and headers together, and how many headers: over either, 431.
    max_http_header_bytes: int = Field(default=16 * KIB, ge=1024, le=1 * MIB)
    max_http_headers: int = Field(default=100, ge=8, le=1000)
    # Requests a client may pipeline before it reads answers; at this many the gateway stops reading it.
    max_pipelined_requests: int = Field(default=16, ge=1, le=1024)
    # Sockets per gateway (HTTP and WebSocket) and per client address; over them, 503 / 429 and close.
    max_connections: int = Field(default=50_000, ge=1)
    max_connections_per_ip: int = Field(default=1_000, ge=1)
    # Addresses not held to max_connections_per_ip: loopback, and your load balancer's (every client
    # behind it shares its address), as addresses or networks.
    connection_limit_exempt: Annotated[list[str], AfterValidator(_networks)] = Field(
        default_factory=lambda: ["127.0.0.0/8", "::1/128"])
    # permessage-deflate costs about a third more CPU per delivery; off unless asked for.
    compression: bool = False
    sweep_interval_s: float = Field(default=1.0, gt=0)


def _as_text(value: Any) -> Any:
    """A Path kept as text: Path would turn a URL's ``//`` into ``/``."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


class AnalyticsConfig(Section):
    """The event log read by `router analytics` (Spark through RayDP)."""

    enabled: bool = True
    # Default: <data_dir>/events. On a cluster, one place every node writes to, so the report sees all
    # traffic: a folder on shared storage (NFS, mounted at the same path everywhere) or a URL of
    # pyarrow's filesystems: file:///…, s3://bucket/…, gs://bucket/…, hdfs://host:port/… (docs/analytics.md).
    directory: Annotated[str, BeforeValidator(_as_text)] | None = None
    # Fraction of messages recorded, decided per message so a sampled message keeps all its deliveries.
    sample_rate: float = Field(default=1.0, ge=0, le=1)
    flush_interval_s: float = Field(default=2.0, gt=0)
    retention_hours: float = Field(default=168, gt=0)
    # Bounds under floods: refused frames recorded per flush (the rest are counted in the metrics
    # only), and records waiting for the writer (past it, a flush is dropped and counted; a flush
    # counts at least the 16,384 records each of its chunks holds room for, and one flush alone is
    # always taken).
    max_rejected_per_flush: int = Field(default=10_000, ge=0)
    max_unwritten_records: int = Field(default=4_000_000, ge=1000)
    # "process": a writer actor per gateway (on its node) turns records into Parquet;
    # "thread": a thread of the gateway's own process does (one process fewer, more gateway CPU).
    writer: Literal["process", "thread"] = "process"


class MetricsConfig(Section):
    """Live metrics through ray.util.metrics (Ray dashboard, Prometheus)."""

    enabled: bool = True
    interval_s: float = Field(default=1.0, gt=0)


class StoreConfig(Section):
    """Where durable state lives (NoLag keys, log and actors, Cashu retained states, Baqend documents).

    No ``url``: SQLite files under ``data_dir``, the embedded default (one machine). A
    ``postgresql://user:password@host:port/db`` URL: one PostgreSQL database that every node
    shares, as a cluster needs (``docs/cluster.md``). ``?options=-csearch_path%3Dschema`` in the
    URL puts the tables in a schema of your choice.
    """

    url: SecretStr | None = None
    # Connections per process (each shard, gateway and CLI process has its own pool).
    pool_min: int = Field(default=1, ge=0, le=64)
    pool_max: int = Field(default=4, ge=1, le=256)
    connect_timeout_s: float = Field(default=10.0, gt=0, le=300)

    @model_validator(mode="after")
    def _postgres_only(self) -> "StoreConfig":
        if self.url is not None:
            scheme = self.url.get_secret_value().split(":", 1)[0]
            if scheme not in ("postgresql", "postgres"):
                raise ValueError(f"store.url must be a postgresql:// URL (got scheme {scheme!r}); "
                                 "leave it unset for SQLite under data_dir")
        if self.pool_min > self.pool_max:
            raise ValueError("store.pool_min must not exceed store.pool_max")
        return self

    @property
    def postgres(self) -> str | None:
        """The PostgreSQL URL, or None for SQLite."""
        return None if self.url is None else self.url.get_secret_value()


def _default_data_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "ray-ws-router"


class CoreSettings(BaseSettings):
    """What the core reads at start; the full settings add one section per dialect
    (``router/settings.py``). Frozen: actors receive a copy."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_DELIMITER,
        extra="forbid",
        frozen=True,
    )

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    gateways: int = Field(default=1, ge=1, le=64)
    # None starts an embedded Ray on this machine; "auto" or "host:port" joins a running cluster.
    ray_address: str | None = None
    # The node of that cluster this router's gateways run on (they listen on its machine's ports):
    # a Ray node id, or a node name (`ray start --node-name`). None: the node this process's Ray
    # driver attached to, right with one raylet per machine; where a machine runs several (a driver
    # attaches to the head's, router/localcluster.py) each router names its own (docs/cluster.md).
    ray_node: str | None = Field(default=None, min_length=1)
    namespace: str = Field(default="router", pattern=r"^[A-Za-z0-9_.-]+$")
    # Start the Ray dashboard with an embedded Ray (it shows the router's actors and metrics).
    ray_dashboard: bool = True
    data_dir: Path = Field(default_factory=_default_data_dir)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    shards: ShardsConfig = Field(default_factory=ShardsConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    analytics: AnalyticsConfig = Field(default_factory=AnalyticsConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)

    @property
    def client_host(self) -> str:
        """Where a command on this machine reaches the router (not the wildcard it listens on)."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host

    @property
    def events_dir(self) -> str:
        """Where the event log lives: a local folder or a URL (router/eventlog.py ``event_location``)."""
        return self.analytics.directory or str(self.data_dir / "events")

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


def _section(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (``X`` or ``X | None``), or None for a plain value."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _names(model: type[BaseModel]) -> dict[str, Any]:
    """Field name (and alias) -> its annotation, as settings sources spell them."""
    names: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        names[name] = info.annotation
        if info.alias:
            names[info.alias] = info.annotation
    return names


def setting_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every setting's path (``("signal", "auth", "enabled")``), sections included."""
    paths = []
    for name, annotation in _names(model).items():
        path = (*prefix, name)
        paths.append(path)
        section = _section(annotation)
        if section is not None:
            paths.extend(setting_paths(section, path))
    return paths


def _known(model: type[BaseModel], path: list[str]) -> bool:
    for index, part in enumerate(path):
        annotation = _names(model).get(part)
        if annotation is None:
            return False
        section = _section(annotation)
        if section is None:
            # a plain value ends the path; a mapping may be filled key by key
            return index == len(path) - 1 or get_origin(annotation) is dict
        model = section
    return True


def _closest(wrong: str, candidates: list[str], prefix: str = "") -> str:
    """``; did you mean <prefix><candidate>?`` for the closest candidate (case-blind), or nothing."""
    spelled = {candidate.lower(): candidate for candidate in candidates}
    match = difflib.get_close_matches(wrong.lower(), list(spelled), n=1, cutoff=0.8)
    return f"; did you mean {prefix}{spelled[match[0]]}?" if match else ""


def unknown_environment(model: type[BaseModel], environ: Mapping[str, str]) -> list[str]:
    """``ROUTER_*`` variables that name no setting (a typo would silently leave a default, such as
    auth off), each with the closest valid name."""
    valid = [ENV_DELIMITER.join(path).upper() for path in setting_paths(model)]
    problems = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in _ENV_NOT_SETTINGS:
            continue
        rest = upper[len(ENV_PREFIX):]
        if not _known(model, rest.lower().split(ENV_DELIMITER)):
            problems.append(f"  environment {name}: no such setting{_closest(rest, valid, ENV_PREFIX)}")
    return problems


def _describe(error: ValidationError, model: type[BaseModel]) -> str:
    lines = []
    dotted = [".".join(path) for path in setting_paths(model)]
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(settings)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = f"no such setting{_closest(field, dotted)}"
        lines.append(f"  {field}: {message}")
    return "invalid configuration:\n" + "\n".join(lines)


Settings = TypeVar("Settings", bound=CoreSettings)


def load(model: type[Settings], config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build ``model`` from defaults, ``config_file`` (or ``$ROUTER_CONFIG``), env and ``overrides``.

    Raises :class:`ConfigError` naming every invalid field.
    """
    path = config_file or os.environ.get("ROUTER_CONFIG")
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"invalid configuration:\n  config file: {path} does not exist")
    unknown = unknown_environment(model, os.environ)
    if unknown:
        raise ConfigError("invalid configuration:\n" + "\n".join(unknown))
    overrides = {key: value for key, value in overrides.items() if value is not None}
    with _CONFIG_LOCK:
        _CONFIG_FILE.set(path)
        try:
            return model(**overrides)
        except ValidationError as error:
            raise ConfigError(_describe(error, model)) from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"invalid configuration:\n  config file {path}: {error}") from None
        except SettingsError as error:
            # e.g. ROUTER_SHARDS={bad : a structured field whose environment value is not JSON
            raise ConfigError(f"invalid configuration:\n  {error}") from None
        finally:
            _CONFIG_FILE.set(None)
