"""PostgreSQL, the shared store of a cluster (``store.url = "postgresql://…"``).

Every durable kind of state has a store interface with two implementations: SQLite files under
``data_dir`` (the embedded default, ``router/sqlite.py``) and PostgreSQL through this module. A
process keeps one connection pool per URL (:func:`pool`), shared by every store it opens: a shard,
a gateway, the CLI. Connections are in autocommit; a store's write of one batch runs in one
transaction (:func:`transaction`), so it is all or nothing, as with SQLite.

psycopg prepares a statement on the server once a connection has run it ``PREPARE_THRESHOLD``
times, so the hot statements (log appends, retained and document writes) run prepared; batches go
through ``executemany``, which psycopg pipelines (one round trip per batch, not per row).

Schemas are created at first use, under a transaction-level advisory lock so that many shards
starting at once on a fresh database do not race on ``CREATE TABLE IF NOT EXISTS`` (PostgreSQL
can fail one of two concurrent creations of the same table).
"""

from __future__ import annotations

import sqlite3
import threading
import zlib
from contextlib import contextmanager
from typing import Iterator

import psycopg
from psycopg_pool import ConnectionPool

PREPARE_THRESHOLD = 2
_pools: dict[tuple[str, int, int], ConnectionPool] = {}
_lock = threading.Lock()


class StoreUnavailable(RuntimeError):
    """PostgreSQL could not be reached in time; the message says where and why (no password)."""


# What a store raises while its database cannot be reached (a pool that times out raises
# psycopg_pool.PoolTimeout, an OperationalError; a SQLite file locked past the busy timeout too).
STORE_ERRORS = (StoreUnavailable, psycopg.OperationalError, sqlite3.OperationalError)


def redact(url: str) -> str:
    """``url`` without its password, for messages and ``router status``."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://(unparsable URL)"
    user = info.get("user")
    host = info.get("host", "localhost")
    port = info.get("port", "5432")
    return f"postgresql://{user + '@' if user else ''}{host}:{port}/{info.get('dbname', '')}"


def _configure(connection: psycopg.Connection) -> None:
    connection.prepare_threshold = PREPARE_THRESHOLD


def pool(url: str, min_size: int = 1, max_size: int = 4, timeout_s: float = 10.0) -> ConnectionPool:
    """This process's pool for ``url`` (opened on first use, then shared)."""
    key = (url, min_size, max_size)
    with _lock:
        found = _pools.get(key)
        if found is not None:
            return found
        created = ConnectionPool(url, min_size=min_size, max_size=max(max_size, 1), timeout=timeout_s,
                                 kwargs={"autocommit": True, "connect_timeout": max(1, int(timeout_s))},
                                 configure=_configure, check=ConnectionPool.check_connection, open=False,
                                 name=f"router-store-{len(_pools)}")
        try:
            created.open(wait=min_size > 0, timeout=timeout_s)
        except Exception as error:
            created.close()
            raise StoreUnavailable(f"PostgreSQL at {redact(url)} is not reachable within {timeout_s:g} s: "
                                   f"{error}") from None
        _pools[key] = created
        return created


def pool_of(config) -> ConnectionPool:
    """The pool for a ``StoreConfig`` that has a PostgreSQL URL."""
    url = config.postgres
    if url is None:
        raise ValueError("store.url is not set: this store is SQLite")
    return pool(url, config.pool_min, config.pool_max, config.connect_timeout_s)


@contextmanager
def transaction(source: ConnectionPool) -> Iterator[psycopg.Connection]:
    """A connection from ``source`` inside one transaction: committed when the block ends,
    rolled back if it raises."""
    with source.connection() as connection, connection.transaction():
        yield connection


def create_schema(source: ConnectionPool, name: str, statements: list[str]) -> None:
    """Run ``statements`` (``CREATE … IF NOT EXISTS``) once, serialised across processes by an
    advisory lock named after ``name``."""
    with transaction(source) as connection:
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (zlib.crc32(name.encode()),))
        for statement in statements:
            connection.execute(statement)


def health(source: ConnectionPool) -> dict:
    """What ``router status`` shows of the store: reachable, server version, pool figures."""
    stats = source.get_stats()
    try:
        with source.connection(timeout=5) as connection:
            version = connection.execute("SHOW server_version").fetchone()[0]
        ok, error = True, None
    except Exception as failure:  # shown to the operator, not raised
        ok, version, error = False, None, f"{type(failure).__name__}: {failure}"
    return {"ok": ok, "server_version": version, "error": error,
            "pool_size": stats.get("pool_size", 0), "pool_available": stats.get("pool_available", 0)}


def close_all() -> None:
    """Close every pool of this process (a stopping shard or CLI)."""
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    for each in pools:
        each.close()
