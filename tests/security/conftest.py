"""The hostile-client suite: attacks on a running router over real sockets (``pytest tests/security``).

``guarded``: one gateway with small limits so each one is reached quickly; loopback is not exempt
from the per-address limit, and each test speaks from its own loopback address (127.0.0.N) so
one test's sockets never count against another's.
``fuzzed``: one gateway with every dialect at its default limits, except the per-connection and
per-client rate limits, raised so that hostile frames reach the codecs instead of being refused
as too many; the Cashu state feed on (``CASHU_FEED_KEY``) for a well-behaved mint.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.e2e.conftest import RunningRouter, start_router, store_backend  # noqa: F401  (autouse: --store)

_addresses = itertools.count(10)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/security/" in str(item.path):
            item.add_marker(pytest.mark.security)


CASHU_FEED_KEY = "fuzz-feed-key-0123456789abcdef"


@pytest.fixture(scope="session")
def guarded(ray_runtime: str, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="security-guarded",
        data_dir=tmp_path_factory.mktemp("guarded-data"),
        port=0,
        gateways=1,
        ray_dashboard=False,
        shards={"session": 1, "topic": 1, "registry": 1, "document": 1, "query": 1},
        gateway={
            "sweep_interval_s": 0.1,
            "handshake_timeout_s": 1.5,
            "stall_timeout_s": 6,
            "max_http_header_bytes": 4096,
            "max_http_headers": 20,
            "max_pipelined_requests": 4,
            "max_connections": 12,
            "max_connections_per_ip": 5,
            "connection_limit_exempt": [],
        },
        cashu={"max_outbound_bytes": 1 << 20},
    )
    yield running
    running.router.stop()


@pytest.fixture(scope="module")
def fuzzed(ray_runtime: str, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="security-fuzzed",
        data_dir=tmp_path_factory.mktemp("fuzzed-data"),
        port=0,
        gateways=1,
        ray_dashboard=False,
        shards={"session": 1, "topic": 1, "registry": 1, "document": 1, "query": 1},
        signal={"rate_limit_per_minute": 6_000_000},
        cashu={"state_api_key": CASHU_FEED_KEY, "rate_limit_per_second": 100_000, "rate_limit_burst": 100_000},
        baqend={"subscribe_rate_limit_per_minute": 6_000_000, "subscribe_rate_limit_burst": 100_000,
                "rest_rate_limit_per_minute": 6_000_000, "rest_rate_limit_burst": 100_000},
    )
    yield running
    running.router.stop()


def own_address() -> str:
    """A loopback address no other test of this session speaks from."""
    return f"127.0.0.{next(_addresses)}"


def main_port(running: RunningRouter) -> int:
    return running.router.endpoints()[0]["listeners"][0]["port"]


async def gateway_stats(running: RunningRouter) -> dict:
    return await running.router.gateways[0].actor.stats.remote()


async def connect(port: int, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
