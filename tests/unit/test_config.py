"""router/config.py: defaults, ROUTER_* environment, TOML file, precedence and error messages."""

from __future__ import annotations

import os
from pathlib import Path

import pydantic
import pytest

from gateways.signal.config import ALL_SIGNAL_CAPABILITIES
from router.config import ConfigError, JwtConfig
from router.settings import load_settings

SECRET = "unit-test-secret-" + "0123456789abcdef" * 4
PEM = "-----BEGIN PUBLIC KEY-----\nnot checked here\n-----END PUBLIC KEY-----\n"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """No ROUTER_* variable of the machine running the tests may leak into a test."""
    for name in list(os.environ):
        if name.upper().startswith("ROUTER_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


def write_toml(tmp_path: Path, text: str, name: str = "router.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def config_error(**kwargs) -> str:
    with pytest.raises(ConfigError) as raised:
        load_settings(**kwargs)
    return str(raised.value)


# -- defaults -------------------------------------------------------------------------------


def test_defaults(tmp_path):
    settings = load_settings()
    assert settings.host == "127.0.0.1"
    assert settings.port == 8080
    assert settings.gateways == 1
    assert settings.ray_address is None
    assert settings.namespace == "router"
    assert settings.ray_dashboard is True
    assert settings.data_dir == tmp_path / "xdg" / "ray-ws-router"
    assert settings.log_level == "INFO"
    assert settings.shards.model_dump() == {"session": 2, "topic": 2, "heal_timeout_s": 3.0, "registry": 2, "document": 2,
                                            "query": 2}
    assert settings.gateway.model_dump() == {
        "lanes": True,
        "batch_max": 1024,
        "max_inflight_batches": 4,
        "max_pending_commands": 200_000,
        "request_timeout_s": 10,
        "reorder_timeout_s": 2.0,
        "max_deliveries_per_turn": 100_000,
        "handshake_timeout_s": 10,
        "close_timeout_s": 5,
        "stall_timeout_s": 30,
        "max_http_body_bytes": 1024 * 1024,
        "max_http_header_bytes": 16 * 1024,
        "max_http_headers": 100,
        "max_pipelined_requests": 16,
        "max_connections": 50_000,
        "max_connections_per_ip": 1_000,
        "connection_limit_exempt": ["127.0.0.0/8", "::1/128"],
        "compression": False,
        "sweep_interval_s": 1.0,
    }


def test_signal_defaults():
    signal = load_settings().signal
    assert signal.enabled is True
    assert signal.path == "/signal"
    assert signal.port is None
    assert signal.protocol_version == "1.0"
    assert signal.hub_address == "cloudflare/signal-hub"
    assert signal.anonymous_capabilities == list(ALL_SIGNAL_CAPABILITIES)
    assert signal.rate_limit_per_minute == 100
    assert signal.rate_limit_burst is None
    assert signal.max_message_bytes == 512 * 1024
    assert signal.max_frame_bytes == 1024 * 1024
    assert signal.max_actors == 50_000
    assert signal.default_ttl_ms == 300_000
    assert signal.max_ttl_ms == 86_400_000
    assert signal.discover_default_limit == 100
    assert signal.discover_max_limit == 100
    assert signal.max_discover_offset == 10_000
    assert signal.max_discover_reply_bytes == 512 * 1024
    assert signal.max_registrations_per_connection == 100
    assert signal.max_subscriptions_per_connection == 1000
    assert signal.max_pattern_length == 256
    assert (signal.path, signal.port) == ("/signal", None)
    assert signal.auth.model_dump() == {
        "enabled": False,
        "algorithms": ["HS256"],
        "secret": None,
        "public_key": None,
        "public_key_file": None,
        "issuer": None,
        "audience": None,
        "leeway_s": 0.0,
    }


def test_default_data_dir_without_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert load_settings().data_dir == tmp_path / "home" / ".local" / "share" / "ray-ws-router"


def test_settings_are_frozen():
    settings = load_settings()
    with pytest.raises(pydantic.ValidationError):
        settings.port = 1
    with pytest.raises(pydantic.ValidationError):
        settings.signal.path = "/x"


# -- environment ----------------------------------------------------------------------------


def test_env_overrides(monkeypatch):
    monkeypatch.setenv("ROUTER_PORT", "9000")
    monkeypatch.setenv("ROUTER_HOST", "0.0.0.0")
    monkeypatch.setenv("ROUTER_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("ROUTER_RAY_DASHBOARD", "false")
    monkeypatch.setenv("ROUTER_SIGNAL__RATE_LIMIT_PER_MINUTE", "600")
    monkeypatch.setenv("ROUTER_SHARDS__TOPIC", "8")
    monkeypatch.setenv("ROUTER_GATEWAY__COMPRESSION", "true")
    settings = load_settings()
    assert settings.port == 9000
    assert settings.host == "0.0.0.0"
    assert settings.log_level == "DEBUG"
    assert settings.ray_dashboard is False
    assert settings.signal.rate_limit_per_minute == 600.0
    assert settings.signal.path == "/signal"  # the rest of the section keeps its defaults
    assert settings.shards.model_dump() == {"session": 2, "topic": 8, "heal_timeout_s": 3.0, "registry": 2, "document": 2, "query": 2}
    assert settings.gateway.compression is True


def test_env_deeply_nested_and_json_lists(monkeypatch):
    monkeypatch.setenv("ROUTER_SIGNAL__AUTH__ENABLED", "true")
    monkeypatch.setenv("ROUTER_SIGNAL__AUTH__SECRET", SECRET)
    monkeypatch.setenv("ROUTER_SIGNAL__ANONYMOUS_CAPABILITIES", '["send", "receive"]')
    auth = load_settings().signal.auth
    assert auth.enabled is True
    assert auth.secret.get_secret_value() == SECRET
    assert load_settings().signal.anonymous_capabilities == ["send", "receive"]


def test_env_error_names_the_field(monkeypatch):
    monkeypatch.setenv("ROUTER_SIGNAL__RATE_LIMIT_PER_MINUTE", "0")
    assert config_error() == (
        "invalid configuration:\n  signal.rate_limit_per_minute: Input should be greater than 0"
    )


def test_env_unparsable_number(monkeypatch):
    monkeypatch.setenv("ROUTER_PORT", "abc")
    assert config_error() == (
        "invalid configuration:\n  port: Input should be a valid integer, unable to parse string as an integer"
    )


def test_an_unknown_router_env_variable_is_refused_with_the_closest_name(monkeypatch):
    """A typo must not silently leave a default (here: JWT auth off)."""
    monkeypatch.setenv("ROUTER_SIGNAL_HUB__AUTH_ENABLED", "true")
    monkeypatch.setenv("ROUTER_NOT_A_SETTING", "1")
    assert config_error() == (
        "invalid configuration:\n"
        "  environment ROUTER_NOT_A_SETTING: no such setting\n"
        "  environment ROUTER_SIGNAL_HUB__AUTH_ENABLED: no such setting; did you mean ROUTER_SIGNAL__AUTH__ENABLED?"
    )


def test_env_names_of_every_kind_of_setting_are_accepted(monkeypatch):
    monkeypatch.setenv("router_port", "9000")  # names are case-insensitive, as pydantic-settings reads them
    monkeypatch.setenv("ROUTER_NOLAG__LOG_RETENTION", '{"chat/#": 60}')  # a mapping, whole
    monkeypatch.setenv("ROUTER_SHARDS__REGISTRY", "3")  # a dialect's shard kind
    monkeypatch.setenv("ROUTER_BAQEND__SCHEMA", "[]")  # an alias
    monkeypatch.setenv("ROUTER_MX__INGEST__MODE", "server")  # a section in a section
    monkeypatch.setenv("ROUTER_CONFIG_NOT", "x")
    assert config_error() == "invalid configuration:\n  environment ROUTER_CONFIG_NOT: no such setting"
    monkeypatch.delenv("ROUTER_CONFIG_NOT")
    settings = load_settings()
    assert (settings.port, settings.nolag.log_retention, settings.shards.registry) == (9000, {"chat/#": 60.0}, 3)


def test_an_unknown_config_file_key_is_refused_with_the_closest_name(tmp_path):
    path = write_toml(tmp_path, "[nolag]\nmax_unaked = 3\n[signal_hub]\nport = 1\n")
    assert config_error(config_file=path) == (
        "invalid configuration:\n"
        "  nolag.max_unaked: no such setting; did you mean nolag.max_unacked?\n"
        "  signal_hub: no such setting"
    )


# -- config file and precedence -------------------------------------------------------------


FILE = """
port = 9001
host = "0.0.0.0"
namespace = "from-file"

[shards]
topic = 4

[signal]
path = "/sig"
rate_limit_per_minute = 50
max_actors = 7
"""


def test_toml_file(tmp_path):
    settings = load_settings(write_toml(tmp_path, FILE))
    assert settings.port == 9001
    assert settings.host == "0.0.0.0"
    assert settings.namespace == "from-file"
    assert settings.shards.model_dump() == {"session": 2, "topic": 4, "heal_timeout_s": 3.0, "registry": 2, "document": 2, "query": 2}
    assert settings.signal.path == "/sig"
    assert settings.signal.rate_limit_per_minute == 50
    assert settings.signal.max_actors == 7
    assert settings.gateways == 1  # not in the file: default


def test_config_file_as_string(tmp_path):
    assert load_settings(str(write_toml(tmp_path, FILE))).port == 9001


def test_precedence_overrides_env_file_defaults(tmp_path, monkeypatch):
    path = write_toml(tmp_path, FILE)
    monkeypatch.setenv("ROUTER_PORT", "9002")
    monkeypatch.setenv("ROUTER_HOST", "10.0.0.1")
    monkeypatch.setenv("ROUTER_SIGNAL__RATE_LIMIT_PER_MINUTE", "600")
    settings = load_settings(path, port=9003, signal={"max_actors": 5})
    assert settings.port == 9003  # override > env > file
    assert settings.host == "10.0.0.1"  # env > file
    assert settings.namespace == "from-file"  # file > default
    assert settings.gateways == 1  # default
    # Sections merge field by field across sources.
    assert settings.signal.max_actors == 5  # override > file
    assert settings.signal.rate_limit_per_minute == 600  # env > file
    assert settings.signal.path == "/sig"  # file
    assert settings.signal.max_ttl_ms == 86_400_000  # default
    assert settings.shards.topic == 4


def test_none_overrides_are_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("ROUTER_PORT", "9002")
    settings = load_settings(write_toml(tmp_path, FILE), port=None, host=None)
    assert settings.port == 9002
    assert settings.host == "0.0.0.0"


def test_router_config_env_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("ROUTER_CONFIG", str(write_toml(tmp_path, FILE)))
    assert load_settings().port == 9001


def test_explicit_config_file_beats_router_config(tmp_path, monkeypatch):
    monkeypatch.setenv("ROUTER_CONFIG", str(write_toml(tmp_path, "port = 1111\n", "env.toml")))
    assert load_settings(write_toml(tmp_path, "port = 2222\n", "explicit.toml")).port == 2222


def test_config_file_does_not_leak_into_the_next_load(tmp_path):
    assert load_settings(write_toml(tmp_path, FILE)).port == 9001
    assert load_settings().port == 8080
    with pytest.raises(ConfigError):
        load_settings(write_toml(tmp_path, "port = 70000\n", "bad.toml"))
    assert load_settings().port == 8080


def test_missing_config_file(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as raised:
        load_settings(missing)
    assert str(raised.value) == f"invalid configuration:\n  config file: {missing} does not exist"


def test_missing_config_file_from_env(tmp_path, monkeypatch):
    missing = tmp_path / "nope.toml"
    monkeypatch.setenv("ROUTER_CONFIG", str(missing))
    assert config_error() == f"invalid configuration:\n  config file: {missing} does not exist"


def test_file_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError) as raised:
        load_settings(write_toml(tmp_path, '[signal]\nrate_limit_per_minute = -1\nbogus = 1\n'))
    assert str(raised.value) == (
        "invalid configuration:\n"
        "  signal.rate_limit_per_minute: Input should be greater than 0\n"
        "  signal.bogus: no such setting"
    )


# -- validation messages --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"signal": {"rate_limit_per_minute": 0}}, "signal.rate_limit_per_minute: Input should be greater than 0"),
        ({"port": 70000}, "port: Input should be less than or equal to 65535"),
        ({"bogus": 1}, "bogus: no such setting"),
        ({"gateway": {"path": "/x"}}, "gateway.path: no such setting"),
        ({"signal": {"path": "signal"}}, "signal.path: must start with '/'"),
        ({"namespace": "a b"}, "namespace: String should match pattern '^[A-Za-z0-9_.-]+$'"),
        ({"log_level": "TRACE"}, "log_level: Input should be 'DEBUG', 'INFO', 'WARNING' or 'ERROR'"),
        ({"signal": {"max_message_bytes": 2 * 1024 * 1024}}, "signal: max_message_bytes must not exceed max_frame_bytes"),
        ({"signal": {"discover_default_limit": 2000}}, "signal: discover_default_limit must not exceed discover_max_limit"),
        ({"signal": {"default_ttl_ms": 10**9}}, "signal: default_ttl_ms must not exceed max_ttl_ms"),
        ({"nolag": {"max_replay": 10_001}}, "nolag.max_replay: Input should be less than or equal to 10000"),
        (
            {"signal": {"anonymous_capabilities": ["send", "fly"]}},
            "signal.anonymous_capabilities: unknown capabilities ['fly']; "
            "known: ['send', 'receive', 'discover', 'broadcast', 'publish', 'subscribe']",
        ),
    ],
)
def test_error_names_the_field(overrides, message):
    assert config_error(**overrides) == "invalid configuration:\n  " + message


def test_every_invalid_field_is_listed():
    assert config_error(port=70000, gateways=0) == (
        "invalid configuration:\n"
        "  port: Input should be less than or equal to 65535\n"
        "  gateways: Input should be greater than or equal to 1"
    )


# -- signal auth ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ({"enabled": True}, "signal.auth: auth is enabled with an HS* algorithm but 'secret' is not set"),
        (
            {"algorithms": ["HS256", "RS256"], "secret": SECRET},
            "signal.auth: do not mix HMAC (HS*) and public-key algorithms in one list",
        ),
        (
            {"enabled": True, "algorithms": ["RS256"]},
            "signal.auth: auth is enabled with a public-key algorithm but neither 'public_key' nor "
            "'public_key_file' is set",
        ),
        ({"algorithms": ["none"]}, "signal.auth: unsupported algorithms ['none']; use HS*, RS*, ES* or PS*"),
        ({"algorithms": []}, "signal.auth.algorithms: List should have at least 1 item after validation, not 0"),
        ({"leeway_s": 301}, "signal.auth.leeway_s: Input should be less than or equal to 300"),
    ],
)
def test_auth_validation(auth, message):
    assert config_error(signal={"auth": auth}) == "invalid configuration:\n  " + message


def test_auth_disabled_needs_no_key():
    assert load_settings(signal={"auth": {"enabled": False}}).signal.auth.secret is None
    assert load_settings(signal={"auth": {"algorithms": ["RS256"]}}).signal.auth.public_key is None


def test_auth_hs256_with_secret():
    auth = load_settings(signal={"auth": {"enabled": True, "secret": SECRET}}).signal.auth
    assert auth.verification_key() == SECRET
    assert SECRET not in repr(auth)
    assert SECRET not in str(load_settings(signal={"auth": {"enabled": True, "secret": SECRET}}).model_dump())


def test_auth_public_key_inline_and_from_file(tmp_path):
    inline = JwtConfig(enabled=True, algorithms=["RS256", "ES256"], public_key=PEM)
    assert inline.verification_key() == PEM
    key_file = tmp_path / "key.pem"
    key_file.write_text(PEM)
    from_file = load_settings(
        signal={"auth": {"enabled": True, "algorithms": ["ES256"], "public_key_file": str(key_file)}}
    ).signal.auth
    assert from_file.public_key_file == key_file
    assert from_file.verification_key() == PEM


def test_auth_from_env(monkeypatch):
    monkeypatch.setenv("ROUTER_SIGNAL__AUTH__ENABLED", "true")
    assert config_error() == (
        "invalid configuration:\n  signal.auth: auth is enabled with an HS* algorithm but 'secret' is not set"
    )


def test_malformed_toml_is_a_config_error(tmp_path):
    path = write_toml(tmp_path, "port = \n")
    with pytest.raises(ConfigError) as raised:
        load_settings(config_file=path)
    assert str(raised.value).startswith(f"invalid configuration:\n  config file {path}: Invalid value")


def test_unparsable_structured_env_value_is_a_config_error(monkeypatch):
    monkeypatch.setenv("ROUTER_SHARDS", "{bad")
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert 'error parsing value for field "shards"' in str(raised.value)


def test_lengths_postgresql_cannot_index_are_refused_with_a_store_url():
    """A NoLag topic or Baqend key over about 2.7 KB fails a PostgreSQL index (it does not on
    SQLite): such limits are refused at start, naming each, only when store.url is set."""
    from router.config import ConfigError
    from router.settings import load_settings

    assert load_settings(None, nolag={"max_topic_length": 4096}).nolag.max_topic_length == 4096
    with pytest.raises(ConfigError) as refused:
        load_settings(None, store={"url": "postgresql://router@db/router"}, nolag={"max_topic_length": 4096},
                      baqend={"max_key_length": 501})
    assert str(refused.value) == (
        "invalid configuration:\n"
        "  nolag.max_topic_length: at most 2000 with store.url (PostgreSQL index entries are limited to about "
        "2.7 KB), not 4096\n"
        "  baqend.max_key_length: at most 500 with store.url (PostgreSQL index entries are limited to about "
        "2.7 KB), not 501")
    assert load_settings(None, store={"url": "postgresql://router@db/router"}).nolag.max_topic_length == 256
