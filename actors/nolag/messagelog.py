"""The NoLag message log: stored publishes (they carry a ``msgId``) for replay after a reconnect.

Behind :class:`MessageLog`, opened with :func:`open_message_log`: the embedded default is SQLite
in WAL mode, one file (``<data_dir>/nolag-log.sqlite3``) that every topic shard of the machine
shares (a writer waits for another instead of failing); with ``store.url`` it is the table
``nolag_messages`` of the PostgreSQL database every node shares, so a topic shard that Ray restarts
on another node finds its log. A shard appends the publishes of one batch in one transaction
(:meth:`MessageLog.append_many`) before the batch's results go back, so a message that was
acknowledged with ``published`` can be replayed.

Records keep the client's packed ``data`` bytes: replay splices them into ``message`` frames
without decoding. A ``msgId`` is stored once; appending it again is a no-op (a retried batch).
Retention is per topic: a callable from topic to milliseconds (None: keep forever), or the log's
default; :meth:`MessageLog.prune` applies it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

from psycopg_pool import ConnectionPool

from router.pgtext import from_text, to_text
from router.postgres import create_schema, pool_of, transaction
from router.sqlite import open_wal, write_transaction

Retention = Callable[[str], "int | None"]  # topic -> milliseconds to keep, None: forever

DEFAULT_RETENTION_MS = 24 * 3600 * 1000
_MAX_VARIABLES = 500  # topics per query (SQLite's limit on bound parameters is far above)


class LogRecord(NamedTuple):
    """One stored publish; its fields are the ``INSERT``'s parameters in order. (A tuple: made at
    every logged publish, a frozen dataclass set each field through ``object.__setattr__``, 1.0
    against 0.3 µs, and SQLite takes the records as its rows as they are.)"""

    topic: str
    msg_id: str
    ts_ms: int
    data_packed: bytes
    qos: int
    filter: str | None = None


class MessageLog(ABC):
    def append(self, topic: str, msg_id: str, ts_ms: int, data_packed: bytes, qos: int,
               filter: str | None = None) -> None:
        self.append_many([LogRecord(topic, msg_id, ts_ms, data_packed, qos, filter)])

    @abstractmethod
    def append_many(self, records: Iterable[LogRecord]) -> int:
        """Store the records atomically (all or none); returns how many were new."""

    @abstractmethod
    def since(self, topics: list[str], after_ts_ms: int, limit: int, newest: bool = False) -> list[LogRecord]:
        """Records of ``topics`` with ``ts_ms > after_ts_ms`` in (ts, append) order: the first
        ``limit`` of them, or with ``newest`` the last ``limit``."""

    @abstractmethod
    def prune(self, now_ms: int, retention_ms_by_topic: Retention | None = None) -> int:
        """Delete what retention no longer keeps; returns how many records went."""

    def last_stamps(self, since_ts_ms: int) -> dict[str, int]:
        """Per topic, its newest record's ``ts_ms`` when that is at or after ``since_ts_ms`` (a
        restarted shard stamps on from there)."""
        return {}

    def close(self) -> None:
        pass


class SqliteMessageLog(MessageLog):
    def __init__(self, path: Path, retention_ms_by_topic: Retention | None = None) -> None:
        self.path = path
        self.retention_ms_by_topic = retention_ms_by_topic or (lambda topic: DEFAULT_RETENTION_MS)
        self._db = open_wal(path)
        self._db.executescript(
            "CREATE TABLE IF NOT EXISTS messages (seq INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, "
            "msg_id TEXT NOT NULL UNIQUE, ts_ms INTEGER NOT NULL, data BLOB NOT NULL, qos INTEGER NOT NULL, "
            "filter TEXT);"
            "CREATE INDEX IF NOT EXISTS messages_topic_ts ON messages (topic, ts_ms, seq);"
        )

    def append_many(self, records: Iterable[LogRecord]) -> int:
        rows = list(map(tuple, records))  # LogRecords hold the INSERT's rows (as plain tuples SQLite binds faster)
        if not rows:
            return 0
        with write_transaction(self._db) as db:
            before = db.total_changes
            # only a repeated msgId is skipped; any other constraint still fails the whole batch
            db.executemany("INSERT INTO messages (topic, msg_id, ts_ms, data, qos, filter) "
                           "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (msg_id) DO NOTHING", rows)
            added = db.total_changes - before
        return added

    def since(self, topics: list[str], after_ts_ms: int, limit: int, newest: bool = False) -> list[LogRecord]:
        if limit <= 0 or not topics:
            return []
        order = "DESC" if newest else "ASC"
        rows: list[tuple] = []
        distinct = sorted(set(topics))
        for start in range(0, len(distinct), _MAX_VARIABLES):
            chunk = distinct[start:start + _MAX_VARIABLES]
            marks = ", ".join("?" * len(chunk))
            rows += self._db.execute(
                f"SELECT ts_ms, seq, topic, msg_id, data, qos, filter FROM messages "
                f"WHERE topic IN ({marks}) AND ts_ms > ? ORDER BY ts_ms {order}, seq {order} LIMIT ?",
                (*chunk, after_ts_ms, limit),
            ).fetchall()
        rows.sort(key=lambda row: (row[0], row[1]))
        rows = rows[-limit:] if newest else rows[:limit]
        return [LogRecord(topic, msg_id, ts_ms, bytes(data), qos, filter)
                for ts_ms, _, topic, msg_id, data, qos, filter in rows]

    def prune(self, now_ms: int, retention_ms_by_topic: Retention | None = None) -> int:
        retention = retention_ms_by_topic or self.retention_ms_by_topic
        topics = [row[0] for row in self._db.execute("SELECT DISTINCT topic FROM messages").fetchall()]
        cuts = [(topic, now_ms - keep) for topic in topics if (keep := retention(topic)) is not None]
        if not cuts:
            return 0
        with write_transaction(self._db) as db:
            before = db.total_changes
            db.executemany("DELETE FROM messages WHERE topic = ? AND ts_ms < ?", cuts)
            removed = db.total_changes - before
        return removed

    def last_stamps(self, since_ts_ms: int) -> dict[str, int]:
        rows = self._db.execute("SELECT topic, MAX(ts_ms) FROM messages GROUP BY topic HAVING MAX(ts_ms) >= ?",
                                (since_ts_ms,)).fetchall()
        return dict(rows)

    def count(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM messages").fetchone()[0]

    def close(self) -> None:
        self._db.close()


class PostgresMessageLog(MessageLog):
    """The log of every node in one table; ``seq`` (BIGSERIAL) is the append order. ``close``
    leaves the process's pool open (other stores share it)."""

    def __init__(self, pool: ConnectionPool, retention_ms_by_topic: Retention | None = None) -> None:
        self._pool = pool
        self.retention_ms_by_topic = retention_ms_by_topic or (lambda topic: DEFAULT_RETENTION_MS)
        create_schema(pool, "nolag_messages", [
            "CREATE TABLE IF NOT EXISTS nolag_messages (seq BIGSERIAL PRIMARY KEY, topic TEXT NOT NULL, "
            "msg_id TEXT NOT NULL UNIQUE, ts_ms BIGINT NOT NULL, data BYTEA NOT NULL, qos SMALLINT NOT NULL, "
            "filter TEXT)",
            "CREATE INDEX IF NOT EXISTS nolag_messages_topic_ts ON nolag_messages (topic, ts_ms, seq)",
        ])

    def append_many(self, records: Iterable[LogRecord]) -> int:
        # ids and filters come from clients: text without NUL (router/pgtext.py)
        rows = [(r.topic, to_text(r.msg_id), r.ts_ms, r.data_packed, r.qos,
                 None if r.filter is None else to_text(r.filter)) for r in records]
        if not rows:
            return 0
        with transaction(self._pool) as db, db.cursor() as cursor:
            # pipelined: one round trip for the batch; rowcount sums the rows each insert added
            cursor.executemany("INSERT INTO nolag_messages (topic, msg_id, ts_ms, data, qos, filter) "
                               "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (msg_id) DO NOTHING", rows)
            return cursor.rowcount

    def since(self, topics: list[str], after_ts_ms: int, limit: int, newest: bool = False) -> list[LogRecord]:
        if limit <= 0 or not topics:
            return []
        order = "DESC" if newest else "ASC"
        with self._pool.connection() as db:
            rows = db.execute(
                f"SELECT topic, msg_id, ts_ms, data, qos, filter FROM nolag_messages "
                f"WHERE topic = ANY(%s) AND ts_ms > %s ORDER BY ts_ms {order}, seq {order} LIMIT %s",
                (sorted(set(topics)), after_ts_ms, limit)).fetchall()
        if newest:
            rows.reverse()
        return [LogRecord(topic, from_text(msg_id), ts_ms, data, qos, None if filter is None else from_text(filter))
                for topic, msg_id, ts_ms, data, qos, filter in rows]

    def prune(self, now_ms: int, retention_ms_by_topic: Retention | None = None) -> int:
        retention = retention_ms_by_topic or self.retention_ms_by_topic
        with self._pool.connection() as db:
            topics = [row[0] for row in db.execute("SELECT DISTINCT topic FROM nolag_messages").fetchall()]
            cuts = [(topic, now_ms - keep) for topic in topics if (keep := retention(topic)) is not None]
            if not cuts:
                return 0
            cursor = db.execute("DELETE FROM nolag_messages AS m USING unnest(%s::text[], %s::bigint[]) "
                                "AS c (topic, cut) WHERE m.topic = c.topic AND m.ts_ms < c.cut",
                                ([topic for topic, _ in cuts], [cut for _, cut in cuts]))
            return cursor.rowcount

    def last_stamps(self, since_ts_ms: int) -> dict[str, int]:
        with self._pool.connection() as db:
            rows = db.execute("SELECT topic, MAX(ts_ms) FROM nolag_messages GROUP BY topic HAVING MAX(ts_ms) >= %s",
                              (since_ts_ms,)).fetchall()
        return dict(rows)

    def count(self) -> int:
        with self._pool.connection() as db:
            return db.execute("SELECT COUNT(*) FROM nolag_messages").fetchone()[0]


def open_message_log(settings, retention_ms_by_topic: Retention | None = None) -> MessageLog:
    """The message log ``settings`` name: PostgreSQL with ``store.url``, else
    ``<data_dir>/nolag-log.sqlite3``."""
    if settings.store.postgres is not None:
        return PostgresMessageLog(pool_of(settings.store), retention_ms_by_topic)
    return SqliteMessageLog(settings.data_dir / "nolag-log.sqlite3", retention_ms_by_topic)
