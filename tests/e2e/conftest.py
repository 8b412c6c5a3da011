"""Routers started on the session's Ray runtime (tests/conftest.py) the way `router serve` does.

- ``hub``: JWT auth on (HS256), two gateways, two shards of each kind, Signal Hub at /signal on
  the main port, a high rate limit so functional tests never trip it.
- ``open_hub``: auth off, one gateway, one shard of each kind, Signal Hub at /ws on a port of its
  own, and small limits (rate, sizes, heartbeat, actors) so each limit can be hit quickly.

``pytest --store postgresql`` runs every router of the session on PostgreSQL instead of SQLite
files (:func:`store_url`); the chaos and security suites import :func:`store_backend` for the same.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pytest

from gateways.signal.config import ALL_SIGNAL_CAPABILITIES
from router.settings import load_settings
from router.runtime import Router

SECRET = "e2e-secret-" + "0123456789abcdef" * 4


@dataclass
class RunningRouter:
    router: Router
    ws_urls: list[str]
    http_urls: list[str]

    @property
    def settings(self) -> Any:
        return self.router.settings


_postgres: Any = None  # the session's PostgreSQL server under --store postgresql
_schemas: dict[str, str] = {}  # data_dir -> its routers' store URL


@pytest.fixture(scope="session", autouse=True)
def store_backend(request) -> str:
    """``--store``: with ``postgresql`` every router started here gets a store URL (:func:`store_url`)."""
    global _postgres
    backend = request.config.getoption("--store")
    if backend == "postgresql":
        _postgres = request.getfixturevalue("postgres_server")
    yield backend
    _postgres = None
    _schemas.clear()


def store_url(data_dir: Path | str | None) -> str | None:
    """Under ``--store postgresql``, the store of the routers on ``data_dir``: a fresh schema at first,
    then the same one, as routers on one data dir share its SQLite files (a restart keeps its state,
    two routers of one namespace see each other's). None with SQLite."""
    if _postgres is None:
        return None
    key = str(data_dir)
    if key not in _schemas:
        _schemas[key] = _postgres.fresh_url()
    return _schemas[key]


def store_env(data_dir: Path | str) -> dict[str, str]:
    """:func:`store_url` for a ``router serve`` process, as the environment variable it reads."""
    url = store_url(data_dir)
    return {} if url is None else {"ROUTER_STORE__URL": url}


def start_router(**overrides: Any) -> RunningRouter:
    url = store_url(overrides.get("data_dir"))
    if url is not None and "store" not in overrides:
        overrides["store"] = {"url": url}
    router = Router(load_settings(**overrides))
    endpoints = router.start()
    return RunningRouter(router, *_urls(endpoints))


def _urls(endpoints: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The Signal Hub endpoint of each gateway (other dialects' tests build their own URLs)."""
    ws_urls, http_urls = [], []
    for gateway in endpoints:
        for listener in gateway["listeners"]:
            path = listener["websocket"].get("signal")
            if path is not None:
                ws_urls.append(f"ws://127.0.0.1:{listener['port']}{path}")
                http_urls.append(f"http://127.0.0.1:{listener['port']}")
    return ws_urls, http_urls


def refresh(running: RunningRouter) -> None:
    running.ws_urls, running.http_urls = _urls(running.router.endpoints())


def make_token(actor: str, capabilities: list[str] | None = None, expires_in: float = 3600,
               secret: str = SECRET, algorithm: str = "HS256", **claims: Any) -> str:
    body = {
        "actorId": actor,
        "capabilities": list(ALL_SIGNAL_CAPABILITIES) if capabilities is None else capabilities,
        "exp": int(time.time() + expires_in),
        **claims,
    }
    return jwt.encode(body, secret, algorithm=algorithm)


def free_consecutive_ports(count: int) -> int:
    """A base port with ``count`` free ports from it (a router's gateways listen on port + i)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        sockets = []
        try:
            for offset in range(count):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", base + offset))
                sockets.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no consecutive free ports")


@pytest.fixture(scope="session")
def hub(ray_runtime: str, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="e2e-hub",
        data_dir=tmp_path_factory.mktemp("hub-data"),
        port=0,
        gateways=2,
        ray_dashboard=False,
        # Small, so that the ordering tests run through deliveries applied over several loop turns.
        gateway={"max_deliveries_per_turn": 100},
        shards={"session": 2, "topic": 2, "registry": 2},
        signal={"auth": {"enabled": True, "secret": SECRET}, "rate_limit_per_minute": 6_000_000},
    )
    yield running
    running.router.stop()


@pytest.fixture(scope="session")
def open_hub(ray_runtime: str, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="e2e-open",
        data_dir=tmp_path_factory.mktemp("open-data"),
        port=0,
        gateways=1,
        ray_dashboard=False,
        shards={"session": 1, "topic": 1, "registry": 1},
        gateway={"sweep_interval_s": 0.1},
        signal={
            "path": "/ws",
            "port": 0,
            "rate_limit_per_minute": 60,
            "rate_limit_burst": 20,
            "max_message_bytes": 4096,
            "max_frame_bytes": 8192,
            "heartbeat_timeout_s": 3,
            "max_actors": 5,
            "max_metadata_bytes": 1024,
            "request_timeout_s": 1.5,
        },
    )
    yield running
    running.router.stop()
