"""Retained values: the last payload published on a key, versioned, kept across restarts.

A dialect that must send "the current state first, then every change" (Cashu NUT-17) keeps each
object's last state here, in the topic shard that owns the object's key. Because the shard runs
commands one at a time, "subscribe and read the current value" and "store a new value and publish
it" are atomic with respect to each other; the version (1, 2, 3, … per key) lets a subscriber drop
anything older than what it has already seen, whatever order results and deliveries arrive in.

Storage sits behind :class:`RetainedStore`, opened by :func:`open_retained_store`. The embedded
default is SQLite in WAL mode, one file shared by every topic shard of the machine; with
``store.url`` it is one PostgreSQL table shared by every topic shard of the cluster. Either way
keys are read on demand, so changing the number of shards (or the node a shard runs on) between
runs loses nothing. Writes of one shard batch are committed together, before the batch's results
go back (a value that was acknowledged is stored).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from pathlib import Path
from typing import Any, NamedTuple

from psycopg_pool import ConnectionPool

from router.pgtext import to_text
from router.postgres import create_schema, pool_of, transaction
from router.sqlite import open_wal, write_transaction


class Retained(NamedTuple):
    """A key's current value: versions count 1, 2, 3, … per key."""

    version: int
    payload: bytes


class RetainedStore(ABC):
    @abstractmethod
    def load(self, key: str) -> Retained | None: ...

    @abstractmethod
    def save(self, rows: list[tuple[str, int, bytes]]) -> None:
        """Write ``(key, version, payload)`` rows atomically (all or none)."""

    def close(self) -> None:
        pass


class MemoryRetainedStore(RetainedStore):
    """For tests and for routers that need no persistence."""

    def __init__(self) -> None:
        self.rows: dict[str, Retained] = {}

    def load(self, key: str) -> Retained | None:
        return self.rows.get(key)

    def save(self, rows: list[tuple[str, int, bytes]]) -> None:
        for key, version, payload in rows:
            self.rows[key] = Retained(version, payload)


class SqliteRetainedStore(RetainedStore):
    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = open_wal(path)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS retained (key TEXT PRIMARY KEY, version INTEGER NOT NULL, payload BLOB NOT NULL)"
        )

    def load(self, key: str) -> Retained | None:
        row = self._db.execute("SELECT version, payload FROM retained WHERE key = ?", (key,)).fetchone()
        return None if row is None else Retained(row[0], bytes(row[1]))

    def save(self, rows: list[tuple[str, int, bytes]]) -> None:
        with write_transaction(self._db) as db:
            db.executemany(
                "INSERT INTO retained (key, version, payload) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET version = excluded.version, payload = excluded.payload",
                rows,
            )

    def close(self) -> None:
        self._db.close()


class PostgresRetainedStore(RetainedStore):
    """Table ``cashu_retained`` of the cluster's database: every topic shard of every node reads
    and writes the same rows. Keys go through :mod:`router.pgtext` (text cannot hold NUL)."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        create_schema(pool, "cashu_retained", [
            "CREATE TABLE IF NOT EXISTS cashu_retained "
            "(key TEXT PRIMARY KEY, version BIGINT NOT NULL, payload BYTEA NOT NULL)"])

    def load(self, key: str) -> Retained | None:
        with self._pool.connection() as connection:
            row = connection.execute("SELECT version, payload FROM cashu_retained WHERE key = %s",
                                     (to_text(key),)).fetchone()
        return None if row is None else Retained(row[0], bytes(row[1]))

    def save(self, rows: list[tuple[str, int, bytes]]) -> None:
        with transaction(self._pool) as connection:
            connection.cursor().executemany(
                "INSERT INTO cashu_retained (key, version, payload) VALUES (%s, %s, %s) "
                "ON CONFLICT (key) DO UPDATE SET version = excluded.version, payload = excluded.payload",
                [(to_text(key), version, payload) for key, version, payload in rows])


def open_retained_store(settings: Any) -> RetainedStore:
    """PostgreSQL when ``settings.store.url`` is set, else the machine's SQLite file under ``data_dir``."""
    if settings.store.postgres:
        return PostgresRetainedStore(pool_of(settings.store))
    return SqliteRetainedStore(settings.data_dir / "retained.sqlite3")


_ABSENT = Retained(0, b"")  # cached "no value": version 0 is never stored


class RetainedValues:
    """A bounded read cache and a write buffer over a :class:`RetainedStore`."""

    def __init__(self, store: RetainedStore, max_cached: int = 100_000) -> None:
        self.store = store
        self.max_cached = max_cached
        self._cache: OrderedDict[str, Retained] = OrderedDict()
        self._pending: dict[str, Retained] = {}
        self.loads = 0
        self.writes = 0

    def get(self, key: str) -> Retained | None:
        value = self._cache.get(key)
        if value is None:
            value = self._pending.get(key)
            if value is None:
                self.loads += 1
                value = self.store.load(key) or _ABSENT
            self._remember(key, value)
        else:
            self._cache.move_to_end(key)
        return None if value is _ABSENT or value.version == 0 else value

    def put(self, key: str, payload: bytes) -> int:
        """Store a new value; returns its version (one more than the previous)."""
        current = self.get(key)
        version = 1 if current is None else current.version + 1
        value = Retained(version, payload)
        self._remember(key, value)
        self._pending[key] = value
        return version

    def put_if_absent(self, key: str, payload: bytes) -> tuple[Retained, bool]:
        """Store ``payload`` only when the key has no value; returns (the value now, stored?)."""
        current = self.get(key)
        if current is not None:
            return current, False
        return Retained(self.put(key, payload), payload), True

    @property
    def dirty(self) -> bool:
        return bool(self._pending)

    def commit(self) -> int:
        """Write the buffered values; returns how many."""
        if not self._pending:
            return 0
        rows = [(key, version, payload) for key, (version, payload) in self._pending.items()]
        self.store.save(rows)
        self._pending.clear()
        self.writes += len(rows)
        return len(rows)

    def _remember(self, key: str, value: Retained) -> None:
        cache = self._cache
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > self.max_cached:
            cache.popitem(last=False)  # pending values are still in _pending until the commit

    def stats(self) -> dict[str, int]:
        return {"cached": len(self._cache), "loads": self.loads, "writes": self.writes}

    def close(self) -> None:
        self.store.close()
