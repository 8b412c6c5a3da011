"""The NoLag message log: stored publishes (they carry a ``msgId``) for replay after a reconnect.

Behind :class:`MessageLog`, opened with :func:`open_message_log`: the embedded default is SQLite
in WAL mode, one file (``<data_dir>/nolag-log.sqlite3``) that every topic shard of the machine
shares (a writer waits for another instead of failing); with ``store.url`` it is the table
``nolag_message_segments`` of the PostgreSQL database every node shares, so a topic shard that Ray
restarts on another node finds its log. A shard appends the publishes of one batch in one
transaction (:meth:`MessageLog.append_many`) before the batch's results go back, so a message that
was acknowledged with ``published`` can be replayed.

A batch's records of one topic are stored together as one *segment*: a row holding the topic, the
lowest and highest ``ts_ms`` of its records, their count and the records themselves packed in one
MessagePack array (``[msgId, ts_ms, data, qos, filter]`` each, at most ``SEGMENT_MAX_RECORDS``,
about ``SEGMENT_MAX_BYTES`` or a ts range of ``SEGMENT_MAX_SPAN_MS`` a segment). A row and an index
entry per record cost SQLite about 4.8 µs a record, a segment about 0.7 (docs/performance.md §7,
twenty-fifth pass): at NoLag QoS 1 the topic shard's log was half of its work. A read
(:meth:`MessageLog.since`) pages the segments' ts ranges in index order from where it starts
(:func:`ordered_metas`), decodes only the segments that may hold what it asks for and stops when no
other can: its work does not grow with the topic's history.

Records keep the client's packed ``data`` bytes: replay splices them into ``message`` frames
without decoding. A ``msgId`` appended twice (a publish retried after its shard restarted) is
stored twice and read once, at its first place in (ts, append) order (see
:meth:`MessageLog.since`). Retention is per topic: a callable from topic to milliseconds (None:
keep forever), or the log's default; :meth:`MessageLog.prune` applies it record by record (a
segment across the cut is rewritten).

Logs written by the router before segments (one row per record, the tables ``messages`` and
``nolag_messages``) are moved into segments when the log is first opened, a chunk of rows a
transaction.
"""

from __future__ import annotations

import heapq
import zlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable, Iterable, Iterator, NamedTuple

import msgpack
from psycopg_pool import ConnectionPool

from router.pgtext import from_text
from router.postgres import create_schema, pool_of, transaction
from router.sqlite import open_wal, write_transaction

Retention = Callable[[str], "int | None"]  # topic -> milliseconds to keep, None: forever

DEFAULT_RETENTION_MS = 24 * 3600 * 1000
SEGMENT_MAX_RECORDS = 512
SEGMENT_MAX_BYTES = 1 << 20  # a segment is closed once its records' data pass this
SEGMENT_MAX_SPAN_MS = 60_000  # max_ts - min_ts of a segment at most this (reads rely on it: never raise it)
_FETCH_SEGMENTS = 8  # segments a read fetches first (then what the records still missing need) and ranges
_MAX_PAGE = 1024  # ranges asked for at most in one query (pages grow by 4 from _FETCH_SEGMENTS)
_MAX_FETCH = 500  # segments fetched at most in one query (bound parameters: SQLite before 3.32 allows 999)
_MIGRATE_CHUNK = 8192  # rows of a log of one row per record moved into segments a transaction
_TOP = (1 << 63) - 1  # the ends of a BIGINT: a ts is above _BOTTOM and at most _TOP, a read's "after"
_BOTTOM = -(1 << 63)  # is held between them (no ts is lost), cursors start there


class LogRecord(NamedTuple):
    """One stored publish. (A tuple: made at every logged publish, a frozen dataclass set each
    field through ``object.__setattr__``, 1.0 against 0.3 µs.)"""

    topic: str
    msg_id: str
    ts_ms: int
    data_packed: bytes
    qos: int
    filter: str | None = None


Segment = tuple  # (topic, min_ts, max_ts, count, packed records): a row to insert
_PACK = msgpack.Packer(use_bin_type=True).pack


def segments_of(records: Iterable[LogRecord]) -> list[Segment]:
    """The records as segments, per topic in the order given; a segment is closed at
    ``SEGMENT_MAX_RECORDS`` records, ``SEGMENT_MAX_BYTES`` of data or when its ts range would pass
    ``SEGMENT_MAX_SPAN_MS``. Each record is checked first (a record that could not be read back
    fails the whole append, before anything is written)."""
    by_topic: dict[str, list[list]] = {}  # topic -> its pieces: [items, lowest ts, highest ts, data bytes]
    for record in records:
        topic, msg_id, ts_ms, data, qos, filter_ = record
        if (type(topic) is not str or type(msg_id) is not str or type(ts_ms) is not int or type(data) is not bytes
                or type(qos) is not int or not (filter_ is None or type(filter_) is str)
                or not _BOTTOM < ts_ms <= _TOP):
            raise ValueError(f"not a storable log record: {record!r:.200}")
        pieces = by_topic.get(topic)
        piece = pieces[-1] if pieces else None
        if (piece is None or len(piece[0]) >= SEGMENT_MAX_RECORDS or piece[3] >= SEGMENT_MAX_BYTES
                or max(piece[2], ts_ms) - min(piece[1], ts_ms) > SEGMENT_MAX_SPAN_MS):
            piece = [[], ts_ms, ts_ms, 0]
            by_topic.setdefault(topic, []).append(piece)
        piece[0].append((msg_id, ts_ms, data, qos, filter_))
        if ts_ms < piece[1]:
            piece[1] = ts_ms
        elif ts_ms > piece[2]:
            piece[2] = ts_ms
        piece[3] += len(data)
    return [(topic, low, high, len(items), _PACK(items))
            for topic, pieces in by_topic.items() for items, low, high, _ in pieces]


def records_of(topic: str, packed: bytes) -> list[LogRecord]:
    return [LogRecord(topic, msg_id, ts_ms, data, qos, filter_)
            for msg_id, ts_ms, data, qos, filter_ in msgpack.unpackb(packed, raw=False, use_list=False)]


def read_segments(metas: Iterable[tuple[int, int, int]], fetch: Callable[[list[int]], Iterable[tuple[int, str, bytes]]],
                  after_ts_ms: int, limit: int, newest: bool) -> list[LogRecord]:
    """The records :meth:`MessageLog.since` returns, from the candidate segments' ``(seq, min_ts,
    max_ts)`` in reading order (oldest first: by ``(min_ts, seq)``; with ``newest``, by ``(max_ts,
    seq)`` descending) and ``fetch`` (seqs -> their ``(seq, topic, records)``). ``metas`` is pulled
    lazily, and no further once no segment left can hold a record among the ``limit``."""
    metas = iter(metas)
    found: list[tuple[int, int, int, LogRecord]] = []  # (ts, seq, place in its segment, record)
    chosen: list[tuple] = []
    upcoming = next(metas, None)
    batch = _FETCH_SEGMENTS
    read = 0
    while upcoming is not None:
        wanted = []
        while upcoming is not None and len(wanted) < batch:
            wanted.append(upcoming[0])
            upcoming = next(metas, None)
        read += len(wanted)
        for seq, topic, packed in fetch(wanted):
            for place, record in enumerate(records_of(topic, packed)):
                if record.ts_ms > after_ts_ms:
                    found.append((record.ts_ms, seq, place, record))
        chosen = _first_of_each(found)
        if len(chosen) >= limit and upcoming is not None:
            if newest:
                if upcoming[2] < chosen[-limit][0]:  # every segment left holds only records older than the last limit
                    break
            elif upcoming[1] > chosen[limit - 1][0]:  # every segment left holds only records newer than the first limit
                break
        # as many segments again as the records still missing would fill at the rate seen so far
        per_segment = max(len(found) / read, 1.0)
        batch = min(max(_FETCH_SEGMENTS, int((limit - len(chosen)) / per_segment) + 1), _MAX_FETCH)
    records = [entry[3] for entry in chosen]
    return records[-limit:] if newest else records[:limit]


Page = Callable[[str, bool, int, tuple[int, int], int], list]  # (topic, newest, after, cursor, count) -> metas


def ordered_metas(page: Page, topics: Iterable[str], after_ts_ms: int, newest: bool) -> Iterator[tuple[int, int, int]]:
    """The ``(seq, min_ts, max_ts)`` of the segments of ``topics`` that may hold a record after
    ``after_ts_ms``, in :func:`read_segments`' reading order, asked of the store page by page
    (``page`` gives up to ``count`` of one topic's after ``cursor`` in that order) and merged across
    topics. Oldest first, a segment spans at most ``SEGMENT_MAX_SPAN_MS``: one with a record after
    ``after_ts_ms`` starts after ``after_ts_ms - SEGMENT_MAX_SPAN_MS``, so the pages start there
    (on the ``min_ts`` index) rather than at the topic's first segment. ``after_ts_ms`` is held
    within a BIGINT for the store (no ts is lost: a ts is above its lowest value)."""
    after_ts_ms = min(max(after_ts_ms, _BOTTOM), _TOP)

    def one(topic: str) -> Iterator[tuple[int, int, int]]:
        if newest:
            cursor = (_TOP, _TOP)
        elif after_ts_ms - SEGMENT_MAX_SPAN_MS >= _BOTTOM:
            cursor = (after_ts_ms - SEGMENT_MAX_SPAN_MS, _TOP)  # min_ts > after - span
        else:
            cursor = (_BOTTOM, -1)  # every min_ts (a seq is never negative)
        count = _FETCH_SEGMENTS
        while True:
            rows = page(topic, newest, after_ts_ms, cursor, count)
            yield from rows
            if len(rows) < count:
                return
            seq, min_ts, max_ts = rows[-1]
            cursor = (max_ts, seq) if newest else (min_ts, seq)
            count = min(count * 4, _MAX_PAGE)

    streams = [one(topic) for topic in sorted(set(topics))]
    if len(streams) == 1:
        return streams[0]
    order = (lambda meta: (-meta[2], -meta[0])) if newest else (lambda meta: (meta[1], meta[0]))
    return heapq.merge(*streams, key=order)


def _first_of_each(found: list[tuple]) -> list[tuple]:
    """``found`` in (ts, append) order, a ``msgId`` seen again left out."""
    found.sort(key=lambda entry: entry[:3])
    seen: set[str] = set()
    kept = []
    for entry in found:
        msg_id = entry[3].msg_id
        if msg_id not in seen:
            seen.add(msg_id)
            kept.append(entry)
    return kept


def _pruned(packed: bytes, cut: int) -> tuple[tuple[int, int, bytes], int]:
    """A segment's records at or after ``cut`` (one at least: the caller's segment ends there or
    later) as its new ``(min_ts, count, records)``, and how many went."""
    items = msgpack.unpackb(packed, raw=False, use_list=False)
    kept = [item for item in items if item[1] >= cut]
    return (min(item[1] for item in kept), len(kept), _PACK(kept)), len(items) - len(kept)


class MessageLog(ABC):
    def append(self, topic: str, msg_id: str, ts_ms: int, data_packed: bytes, qos: int,
               filter: str | None = None) -> None:
        self.append_many([LogRecord(topic, msg_id, ts_ms, data_packed, qos, filter)])

    @abstractmethod
    def append_many(self, records: Iterable[LogRecord]) -> int:
        """Store the records atomically (all or none); returns how many were stored."""

    @abstractmethod
    def since(self, topics: list[str], after_ts_ms: int, limit: int, newest: bool = False) -> list[LogRecord]:
        """Records of ``topics`` with ``ts_ms > after_ts_ms`` in (ts, append) order: the first
        ``limit`` of them, or with ``newest`` the last ``limit``. Records of one ts keep their
        topic's append order; across topics (stamped by different shards) a batch's segments
        come in the order its topics first appear. A ``msgId`` stored twice is given once, at its
        first place among the segments the read looks at (one that stops before the first copy
        gives the later one)."""

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
            "CREATE TABLE IF NOT EXISTS message_segments (seq INTEGER PRIMARY KEY, topic TEXT NOT NULL, "
            "min_ts INTEGER NOT NULL, max_ts INTEGER NOT NULL, count INTEGER NOT NULL, records BLOB NOT NULL);"
            "CREATE INDEX IF NOT EXISTS message_segments_topic_max ON message_segments (topic, max_ts, seq, min_ts);"
            "CREATE INDEX IF NOT EXISTS message_segments_topic_min ON message_segments (topic, min_ts, seq, max_ts);"
        )
        self._migrate()

    def _migrate(self) -> None:
        """Move a log of one row per record (the table ``messages``) into segments, a chunk of rows
        a transaction (each moves its rows and deletes them: a crash resumes where it stopped, and
        other shards wait a chunk, not the whole move); every shard that opens the log meanwhile
        takes part, and none reads before the old table is gone."""
        exists = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'messages'"
        if self._db.execute(exists).fetchone() is None:
            return
        while True:
            with write_transaction(self._db) as db:
                if db.execute(exists).fetchone() is None:
                    return  # another shard moved the rest
                chunk = db.execute("SELECT seq, topic, msg_id, ts_ms, data, qos, filter FROM messages ORDER BY seq "
                                   "LIMIT ?", (_MIGRATE_CHUNK,)).fetchall()
                if not chunk:
                    db.execute("DROP TABLE messages")
                    return
                db.executemany(_SQLITE_INSERT, segments_of(
                    LogRecord(topic, msg_id, ts_ms, bytes(data), qos, filter_)
                    for _, topic, msg_id, ts_ms, data, qos, filter_ in chunk))
                db.execute("DELETE FROM messages WHERE seq <= ?", (chunk[-1][0],))

    def append_many(self, records: Iterable[LogRecord]) -> int:
        rows = segments_of(records)
        if not rows:
            return 0
        with write_transaction(self._db) as db:
            db.executemany(_SQLITE_INSERT, rows)
        return sum(row[3] for row in rows)

    def since(self, topics: list[str], after_ts_ms: int, limit: int, newest: bool = False) -> list[LogRecord]:
        if limit <= 0 or not topics:
            return []
        db = self._db
        db.execute("BEGIN")  # one snapshot for the ranges and the segments read after them
        try:
            metas = ordered_metas(self._page, topics, after_ts_ms, newest)
            return read_segments(metas, self._fetch, after_ts_ms, limit, newest)
        finally:
            db.execute("COMMIT")

    def _page(self, topic: str, newest: bool, after_ts_ms: int, cursor: tuple[int, int], count: int) -> list:
        query = _SQLITE_NEWEST if newest else _SQLITE_OLDEST
        return self._db.execute(query, (topic, after_ts_ms, *cursor, count)).fetchall()

    def _fetch(self, seqs: list[int]) -> list[tuple[int, str, bytes]]:
        marks = ", ".join("?" * len(seqs))
        return self._db.execute(f"SELECT seq, topic, records FROM message_segments WHERE seq IN ({marks})",
                                seqs).fetchall()

    def prune(self, now_ms: int, retention_ms_by_topic: Retention | None = None) -> int:
        retention = retention_ms_by_topic or self.retention_ms_by_topic
        topics = [row[0] for row in self._db.execute("SELECT DISTINCT topic FROM message_segments").fetchall()]
        cuts = [(topic, now_ms - keep) for topic in topics if (keep := retention(topic)) is not None]
        if not cuts:
            return 0
        removed = 0
        with write_transaction(self._db) as db:
            for topic, cut in cuts:
                removed += db.execute("SELECT COALESCE(SUM(count), 0) FROM message_segments "
                                      "WHERE topic = ? AND max_ts < ?", (topic, cut)).fetchone()[0]
                db.execute("DELETE FROM message_segments WHERE topic = ? AND max_ts < ?", (topic, cut))
                across = db.execute("SELECT seq, records FROM message_segments WHERE topic = ? AND min_ts < ? "
                                    "AND max_ts >= ?", (topic, cut, cut)).fetchall()
                for seq, packed in across:
                    kept, gone = _pruned(packed, cut)
                    removed += gone
                    db.execute("UPDATE message_segments SET min_ts = ?, count = ?, records = ? WHERE seq = ?",
                               (*kept, seq))
        return removed

    def last_stamps(self, since_ts_ms: int) -> dict[str, int]:
        rows = self._db.execute("SELECT topic, MAX(max_ts) FROM message_segments GROUP BY topic "
                                "HAVING MAX(max_ts) >= ?", (since_ts_ms,)).fetchall()
        return dict(rows)

    def count(self) -> int:
        return self._db.execute("SELECT COALESCE(SUM(count), 0) FROM message_segments").fetchone()[0]

    def close(self) -> None:
        self._db.close()


_SQLITE_INSERT = "INSERT INTO message_segments (topic, min_ts, max_ts, count, records) VALUES (?, ?, ?, ?, ?)"
# One page of a topic's segment ranges after a cursor, in reading order, from the index alone.
_SQLITE_NEWEST = ("SELECT seq, min_ts, max_ts FROM message_segments WHERE topic = ? AND max_ts > ? "
                  "AND (max_ts, seq) < (?, ?) ORDER BY max_ts DESC, seq DESC LIMIT ?")
_SQLITE_OLDEST = ("SELECT seq, min_ts, max_ts FROM message_segments WHERE topic = ? AND max_ts > ? "
                  "AND (min_ts, seq) > (?, ?) ORDER BY min_ts, seq LIMIT ?")
_POSTGRES_NEWEST = ("SELECT seq, min_ts, max_ts FROM nolag_message_segments WHERE topic = %s AND max_ts > %s "
                    "AND (max_ts, seq) < (%s, %s) ORDER BY max_ts DESC, seq DESC LIMIT %s")
_POSTGRES_OLDEST = ("SELECT seq, min_ts, max_ts FROM nolag_message_segments WHERE topic = %s AND max_ts > %s "
                    "AND (min_ts, seq) > (%s, %s) ORDER BY min_ts, seq LIMIT %s")
_POSTGRES_INSERT = ("INSERT INTO nolag_message_segments (topic, min_ts, max_ts, count, records) "
                    "VALUES (%s, %s, %s, %s, %s)")


_MIGRATE_LOCK = zlib.crc32(b"nolag_message_segments")
_PRUNE_LOCK = zlib.crc32(b"nolag_message_segments prune")


class PostgresMessageLog(MessageLog):
    """The log of every node in one table; ``seq`` (BIGSERIAL) is the append order. ``close``
    leaves the process's pool open (other stores share it)."""

    def __init__(self, pool: ConnectionPool, retention_ms_by_topic: Retention | None = None) -> None:
        self._pool = pool
        self.retention_ms_by_topic = retention_ms_by_topic or (lambda topic: DEFAULT_RETENTION_MS)
        create_schema(pool, "nolag_message_segments", [
            "CREATE TABLE IF NOT EXISTS nolag_message_segments (seq BIGSERIAL PRIMARY KEY, topic TEXT NOT NULL, "
            "min_ts BIGINT NOT NULL, max_ts BIGINT NOT NULL, count INTEGER NOT NULL, records BYTEA NOT NULL)",
            "CREATE INDEX IF NOT EXISTS nolag_message_segments_topic_max ON nolag_message_segments "
            "(topic, max_ts, seq) INCLUDE (min_ts)",
            "CREATE INDEX IF NOT EXISTS nolag_message_segments_topic_min ON nolag_message_segments "
            "(topic, min_ts, seq) INCLUDE (max_ts)",
        ])
        self._migrate()

    def _migrate(self) -> None:
        """Move a log of one row per record (the table ``nolag_messages``) into segments, a chunk of
        rows a transaction as on SQLite, each under the schema's advisory lock (shards of several
        nodes open the log at once)."""
        with self._pool.connection() as db:
            if db.execute("SELECT to_regclass('nolag_messages')").fetchone()[0] is None:
                return
        while True:
            with transaction(self._pool) as db:
                db.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
                if db.execute("SELECT to_regclass('nolag_messages')").fetchone()[0] is None:
                    return  # another shard moved the rest
                db.execute("LOCK TABLE nolag_messages IN EXCLUSIVE MODE")  # a node of the old version waits
                chunk = sorted(db.execute(
                    "DELETE FROM nolag_messages WHERE seq IN (SELECT seq FROM nolag_messages ORDER BY seq LIMIT %s) "
                    "RETURNING seq, topic, msg_id, ts_ms, data, qos, filter", (_MIGRATE_CHUNK,)).fetchall())
                if not chunk:
                    db.execute("DROP TABLE nolag_messages")
                    return
                with db.cursor() as cursor:
                    cursor.executemany(_POSTGRES_INSERT, segments_of(
                        LogRecord(topic, from_text(msg_id), ts_ms, bytes(data), qos,
                                  None if filter_ is None else from_text(filter_))
                        for _, topic, msg_id, ts_ms, data, qos, filter_ in chunk))

    def append_many(self, records: Iterable[LogRecord]) -> int:
        rows = segments_of(records)
        if not rows:
            return 0
        with transaction(self._pool) as db, db.cursor() as cursor:
            cursor.executemany(_POSTGRES_INSERT, rows)  # pipelined: one round trip for the batch
        return sum(row[3] for row in rows)

    def since(self, topics: list[str], after_ts_ms: int, limit: int, newest: bool = False) -> list[LogRecord]:
        if limit <= 0 or not topics:
            return []
        with transaction(self._pool) as db:
            db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")  # one snapshot for every read

            def page(topic: str, newest: bool, after: int, cursor: tuple[int, int], count: int) -> list:
                return db.execute(_POSTGRES_NEWEST if newest else _POSTGRES_OLDEST,
                                  (topic, after, *cursor, count)).fetchall()

            def fetch(seqs: list[int]) -> list[tuple[int, str, bytes]]:
                return db.execute("SELECT seq, topic, records FROM nolag_message_segments WHERE seq = ANY(%s)",
                                  (seqs,)).fetchall()

            return read_segments(ordered_metas(page, topics, after_ts_ms, newest), fetch, after_ts_ms, limit, newest)

    def prune(self, now_ms: int, retention_ms_by_topic: Retention | None = None) -> int:
        retention = retention_ms_by_topic or self.retention_ms_by_topic
        with self._pool.connection() as db:
            topics = [row[0] for row in db.execute("SELECT DISTINCT topic FROM nolag_message_segments").fetchall()]
        cuts = [(topic, now_ms - keep) for topic in topics if (keep := retention(topic)) is not None]
        if not cuts:
            return 0
        arrays = ([topic for topic, _ in cuts], [cut for _, cut in cuts])
        with transaction(self._pool) as db:
            # Shards of every node prune the one table: one at a time, the others skip (a segment
            # across the cut is rewritten from what this transaction read).
            if not db.execute("SELECT pg_try_advisory_xact_lock(%s)", (_PRUNE_LOCK,)).fetchone()[0]:
                return 0
            gone = db.execute("DELETE FROM nolag_message_segments AS m USING unnest(%s::text[], %s::bigint[]) "
                              "AS c (topic, cut) WHERE m.topic = c.topic AND m.max_ts < c.cut RETURNING m.count",
                              arrays).fetchall()
            removed = sum(row[0] for row in gone)
            across = db.execute("SELECT m.seq, m.records, c.cut FROM nolag_message_segments AS m "
                                "JOIN unnest(%s::text[], %s::bigint[]) AS c (topic, cut) "
                                "ON m.topic = c.topic AND m.min_ts < c.cut AND m.max_ts >= c.cut", arrays).fetchall()
            for seq, packed, cut in across:
                kept, gone = _pruned(bytes(packed), cut)
                removed += gone
                db.execute("UPDATE nolag_message_segments SET min_ts = %s, count = %s, records = %s WHERE seq = %s",
                           (*kept, seq))
        return removed

    def last_stamps(self, since_ts_ms: int) -> dict[str, int]:
        with self._pool.connection() as db:
            rows = db.execute("SELECT topic, MAX(max_ts) FROM nolag_message_segments GROUP BY topic "
                              "HAVING MAX(max_ts) >= %s", (since_ts_ms,)).fetchall()
        return dict(rows)

    def count(self) -> int:
        with self._pool.connection() as db:
            return db.execute("SELECT COALESCE(SUM(count), 0) FROM nolag_message_segments").fetchone()[0]


def open_message_log(settings, retention_ms_by_topic: Retention | None = None) -> MessageLog:
    """The message log ``settings`` name: PostgreSQL with ``store.url``, else
    ``<data_dir>/nolag-log.sqlite3``."""
    if settings.store.postgres is not None:
        return PostgresMessageLog(pool_of(settings.store), retention_ms_by_topic)
    return SqliteMessageLog(settings.data_dir / "nolag-log.sqlite3", retention_ms_by_topic)
