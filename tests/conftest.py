"""Test-session plumbing shared by every suite: quiet local Ray, and one Ray runtime per session."""

from __future__ import annotations

import logging
import os

# Keep Ray quiet and local in every process the tests start (set before Ray is imported).
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import pytest  # noqa: E402
import ray  # noqa: E402

from router.runtime import LOCAL_RAY_SYSTEM_CONFIG  # noqa: E402


@pytest.fixture(scope="session")
def ray_runtime() -> str:
    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="tests", logging_level=logging.WARNING,
             _system_config=LOCAL_RAY_SYSTEM_CONFIG)  # as the embedded router starts it
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="session")
def postgres_server():
    """One throwaway PostgreSQL server for the session (tests/pg.py), started on first use. Fails,
    naming what to install, when PostgreSQL is missing: the store contract is tested on both."""
    from tests.pg import PostgresServer

    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture
def pg_url(postgres_server) -> str:
    """A PostgreSQL URL whose search path is a new, empty schema: each test its own tables."""
    return postgres_server.fresh_url()


def pytest_addoption(parser) -> None:
    parser.addoption("--store", choices=("sqlite", "postgresql"), default="sqlite",
                     help="the store of every router the e2e, chaos and security tests start: SQLite files under "
                          "its data_dir (default), or a fresh schema of the session's PostgreSQL server")
