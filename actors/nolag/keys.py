"""API keys: tokens ``at_{live|sandbox}_{key_id}.{secret}``, topic ACLs, rate and monthly quota.

Behind :class:`KeyStore`, opened with :func:`open_key_store`: one SQLite file
(``nolag.keys_path``, default ``<data_dir>/keys.sqlite3``) that the CLI writes and every gateway
process of the machine reads (WAL mode lets them read beside one writer, a busy writer waits), or,
with ``store.url``, the tables ``nolag_keys`` and ``nolag_usage`` of the PostgreSQL database every
node shares, so a key created anywhere is known everywhere.

Only an HMAC-SHA256 of the secret is stored, keyed with a random salt per key; a token is checked
with ``hmac.compare_digest``. Revocation sets ``revoked_at``: :meth:`KeyStore.verify` refuses the
key at once, and gateways poll :meth:`KeyStore.revoked_among` with the keys of their live
sessions to disconnect them. The poll compares no timestamps: on a cluster the revoking machine's
clock may be behind the gateway's.

ACL patterns match topic slugs ``app/room/topic`` segment by segment:
- a literal segment (``A-Z a-z 0-9 _ . -``) matches itself;
- ``*`` (or ``+``, as in MQTT) matches exactly one segment;
- ``#``, only as the last segment, matches one or more remaining segments (``#`` alone: every topic).
So ``chat/*/messages`` allows ``chat/general/messages``, ``chat/#`` every topic of app ``chat``.

Presence rooms are the middle segment of topics, so a key reaches a room when one of its
subscribe patterns matches some topic ``app/<room>/topic`` (:func:`pattern_reaches_room`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

from psycopg_pool import ConnectionPool

from router.postgres import create_schema, pool_of
from router.sqlite import open_wal, write_transaction

ENVIRONMENTS = ("live", "sandbox")
_SEGMENT = re.compile(r"[A-Za-z0-9_.\-]+")
_KEY_ID = re.compile(r"[0-9a-f]{16}")


class AclError(ValueError):
    """An ACL pattern that is not valid; the message names it and says why."""


@lru_cache(maxsize=4096)
def parse_pattern(pattern: str) -> tuple[str, ...]:
    """The segments of an ACL pattern (``+`` normalised to ``*``), or :class:`AclError`."""
    if not isinstance(pattern, str) or not pattern:
        raise AclError("an ACL pattern must be a non-empty string")
    segments = pattern.split("/")
    for position, segment in enumerate(segments):
        if segment == "#":
            if position != len(segments) - 1:
                raise AclError(f"ACL pattern {pattern!r}: '#' is allowed only as the last segment")
        elif segment not in ("*", "+") and _SEGMENT.fullmatch(segment) is None:
            raise AclError(f"ACL pattern {pattern!r}: segment {segment!r} must be '*', '+', '#' or "
                           "letters, digits, '_', '.', '-'")
    return tuple("*" if segment == "+" else segment for segment in segments)


def pattern_matches(pattern: str, topic: str) -> bool:
    segments = parse_pattern(pattern)
    parts = topic.split("/")
    for position, segment in enumerate(segments):
        if segment == "#":
            return len(parts) > position
        if position >= len(parts) or (segment != "*" and segment != parts[position]):
            return False
    return len(parts) == len(segments)


def pattern_reaches_room(pattern: str, room: str | None) -> bool:
    """Whether ``pattern`` matches some topic ``app/<room>/topic``; with ``room`` None, one of every room."""
    segments = parse_pattern(pattern)
    if segments[0] == "#" or (len(segments) > 1 and segments[1] == "#"):
        return True
    return len(segments) == 3 and segments[1] in ("*", room)  # topics have exactly three segments


@dataclass(frozen=True, slots=True)
class KeyRecord:
    key_id: str
    environment: str
    project_id: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    rate_limit_per_s: int
    monthly_quota: int | None  # messages per calendar month (UTC); None: unlimited
    created_at: float
    revoked_at: float | None = None

    def can_publish(self, topic: str) -> bool:
        return any(pattern_matches(pattern, topic) for pattern in self.publish)

    def can_subscribe(self, topic: str) -> bool:
        return any(pattern_matches(pattern, topic) for pattern in self.subscribe)

    def can_subscribe_room(self, room: str | None) -> bool:
        """A room's presence is its subscribers': the key may take part if it may subscribe to a
        topic of the room (``None``: of every room, for the project's presence and prefix lobbies)."""
        return any(pattern_reaches_room(pattern, room) for pattern in self.subscribe)

    def to_dict(self) -> dict:
        record = asdict(self)
        record["publish"], record["subscribe"] = list(self.publish), list(self.subscribe)
        return record


def month_of(now: float) -> str:
    """``YYYY-MM`` of a Unix time, in UTC: the quota period."""
    return time.strftime("%Y-%m", time.gmtime(now))


def parse_token(token: str) -> tuple[str, str, str] | None:
    """``(environment, key_id, secret)`` of ``at_{env}_{key_id}.{secret}``, or None."""
    if not isinstance(token, str):
        return None
    parts = token.split(".")
    if len(parts) != 2 or not parts[1]:
        return None
    head, secret = parts
    for environment in ENVIRONMENTS:
        prefix = f"at_{environment}_"
        if head.startswith(prefix):
            key_id = head[len(prefix):]
            return (environment, key_id, secret) if _KEY_ID.fullmatch(key_id) else None
    return None


def _digest(salt: bytes, secret: str) -> bytes:
    return hmac.new(salt, secret.encode("utf-8"), hashlib.sha256).digest()


_MAX_KEYS_PER_QUERY = 500  # bound parameters per query (SQLite's limit is far above)
_COLUMNS = ("key_id, environment, project_id, publish, subscribe, rate_limit_per_s, monthly_quota, "
            "created_at, revoked_at")


class KeyStore(ABC):
    """The checks and the token live here; where the rows are, in the implementations.

    Calls are synchronous (the CLI; a gateway runs them in a worker thread, see
    ``gateways/nolag/session.py``), and may come from several threads at once.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock

    def create(self, project_id: str, environment: str = "live", publish: Iterable[str] = ("#",),
               subscribe: Iterable[str] = ("#",), rate_limit_per_s: int = 50,
               monthly_quota: int | None = None) -> tuple[str, KeyRecord]:
        """A new key; the token is returned here and never again."""
        if environment not in ENVIRONMENTS:
            raise ValueError(f"environment must be one of {ENVIRONMENTS}, not {environment!r}")
        if not isinstance(project_id, str) or not project_id:
            raise ValueError("project_id must be a non-empty string")
        if rate_limit_per_s <= 0:
            raise ValueError("rate_limit_per_s must be positive")
        if monthly_quota is not None and monthly_quota < 0:
            raise ValueError("monthly_quota must be 0 or more (None: unlimited)")
        publish, subscribe = tuple(publish), tuple(subscribe)
        for pattern in publish + subscribe:
            parse_pattern(pattern)
        secret = secrets.token_urlsafe(32)  # 32 random bytes; the alphabet has no '.'
        salt = secrets.token_bytes(16)
        record = KeyRecord(secrets.token_hex(8), environment, project_id, publish, subscribe, rate_limit_per_s,
                           monthly_quota, self._clock())
        self._insert((record.key_id, environment, project_id, salt, _digest(salt, secret), json.dumps(list(publish)),
                      json.dumps(list(subscribe)), rate_limit_per_s, monthly_quota, record.created_at))
        return f"at_{environment}_{record.key_id}.{secret}", record

    def verify(self, token: str) -> KeyRecord | None:
        """The key of a valid token; None for a malformed, unknown, wrong or revoked one."""
        parsed = parse_token(token)
        if parsed is None:
            return None
        environment, key_id, secret = parsed
        row = self._secret_row(key_id)
        if row is None:
            return None
        record = _record(row[:9])
        if not hmac.compare_digest(_digest(bytes(row[9]), secret), bytes(row[10])):
            return None
        if record.environment != environment or record.revoked_at is not None:
            return None
        return record

    def consume(self, key_id: str, count: int = 1, now: float | None = None) -> bool:
        """Count ``count`` messages against this month's quota; False (nothing counted) if it would
        go over, or the key is unknown. Atomic across processes.

        A write per call: gateways should reserve blocks (``count`` > 1) rather than call it per message.
        """
        if count < 0:
            raise ValueError("count must be 0 or more")
        return self._consume(key_id, count, month_of(self._clock() if now is None else now))

    @abstractmethod
    def _insert(self, row: tuple) -> None:
        """Store a new key's row (the columns of ``_COLUMNS`` with salt and secret_hash after project_id)."""

    @abstractmethod
    def _secret_row(self, key_id: str) -> tuple | None:
        """The key's ``_COLUMNS``, then its salt and secret hash."""

    @abstractmethod
    def _consume(self, key_id: str, count: int, month: str) -> bool: ...

    @abstractmethod
    def get(self, key_id: str) -> KeyRecord | None: ...

    @abstractmethod
    def list(self) -> list[KeyRecord]:
        """Every key, oldest first (ties by key id)."""

    @abstractmethod
    def revoke(self, key_id: str) -> bool:
        """True if the key existed and was active."""

    def revoked_among(self, key_ids: Iterable[str]) -> list[str]:
        """Which of ``key_ids`` are revoked (or gone), sorted."""
        wanted = sorted(set(key_ids))
        active: set[str] = set()
        for start in range(0, len(wanted), _MAX_KEYS_PER_QUERY):
            active.update(self._active(wanted[start:start + _MAX_KEYS_PER_QUERY]))
        return [key_id for key_id in wanted if key_id not in active]

    @abstractmethod
    def _active(self, key_ids: list[str]) -> list[str]:
        """Those of ``key_ids`` that exist and are not revoked."""

    @abstractmethod
    def usage(self, key_id: str, month: str) -> int: ...

    def close(self) -> None:
        pass


class SqliteKeyStore(KeyStore):
    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        self.path = path
        # One connection, used by a gateway's worker threads: the lock keeps one transaction on it at a time.
        self._lock = threading.Lock()
        self._db = open_wal(path)
        self._db.executescript(
            "CREATE TABLE IF NOT EXISTS keys (key_id TEXT PRIMARY KEY, environment TEXT NOT NULL, "
            "project_id TEXT NOT NULL, salt BLOB NOT NULL, secret_hash BLOB NOT NULL, publish TEXT NOT NULL, "
            "subscribe TEXT NOT NULL, rate_limit_per_s INTEGER NOT NULL, monthly_quota INTEGER, "
            "created_at REAL NOT NULL, revoked_at REAL);"
            "CREATE INDEX IF NOT EXISTS keys_revoked ON keys (revoked_at);"
            "CREATE TABLE IF NOT EXISTS usage (key_id TEXT NOT NULL, month TEXT NOT NULL, "
            "count INTEGER NOT NULL, PRIMARY KEY (key_id, month));"
        )

    def _insert(self, row: tuple) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO keys (key_id, environment, project_id, salt, secret_hash, publish, subscribe, "
                "rate_limit_per_s, monthly_quota, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

    def _secret_row(self, key_id: str) -> tuple | None:
        with self._lock:
            return self._db.execute(f"SELECT {_COLUMNS}, salt, secret_hash FROM keys WHERE key_id = ?",
                                    (key_id,)).fetchone()

    def get(self, key_id: str) -> KeyRecord | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_COLUMNS} FROM keys WHERE key_id = ?", (key_id,)).fetchone()
        return None if row is None else _record(row)

    def list(self) -> list[KeyRecord]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_COLUMNS} FROM keys ORDER BY created_at, key_id").fetchall()
        return [_record(row) for row in rows]

    def revoke(self, key_id: str) -> bool:
        with self._lock:
            cursor = self._db.execute("UPDATE keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL",
                                      (self._clock(), key_id))
            return cursor.rowcount == 1

    def _active(self, key_ids: list[str]) -> list[str]:
        marks = ", ".join("?" * len(key_ids))
        with self._lock:
            rows = self._db.execute(f"SELECT key_id FROM keys WHERE key_id IN ({marks}) AND revoked_at IS NULL",
                                    key_ids).fetchall()
        return [row[0] for row in rows]

    def _consume(self, key_id: str, count: int, month: str) -> bool:
        with self._lock, write_transaction(self._db) as db:  # the read and the write in one transaction
            row = db.execute("SELECT monthly_quota FROM keys WHERE key_id = ?", (key_id,)).fetchone()
            if row is None:
                return False  # nothing written: the commit ends an empty transaction
            used = db.execute("SELECT count FROM usage WHERE key_id = ? AND month = ?", (key_id, month)).fetchone()
            used = 0 if used is None else used[0]
            if row[0] is not None and used + count > row[0]:
                return False
            db.execute("INSERT INTO usage (key_id, month, count) VALUES (?, ?, ?) "
                       "ON CONFLICT (key_id, month) DO UPDATE SET count = count + excluded.count",
                       (key_id, month, count))
        return True

    def usage(self, key_id: str, month: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT count FROM usage WHERE key_id = ? AND month = ?",
                                   (key_id, month)).fetchone()
        return 0 if row is None else row[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()


class PostgresKeyStore(KeyStore):
    """The keys of every node in one database. ``close`` leaves the process's pool open (other
    stores share it)."""

    def __init__(self, pool: ConnectionPool, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        self._pool = pool
        create_schema(pool, "nolag_keys", [
            "CREATE TABLE IF NOT EXISTS nolag_keys (key_id TEXT PRIMARY KEY, environment TEXT NOT NULL, "
            "project_id TEXT NOT NULL, salt BYTEA NOT NULL, secret_hash BYTEA NOT NULL, publish TEXT NOT NULL, "
            "subscribe TEXT NOT NULL, rate_limit_per_s INTEGER NOT NULL, monthly_quota BIGINT, "
            "created_at DOUBLE PRECISION NOT NULL, revoked_at DOUBLE PRECISION)",
            "CREATE INDEX IF NOT EXISTS nolag_keys_revoked ON nolag_keys (revoked_at)",
            "CREATE TABLE IF NOT EXISTS nolag_usage (key_id TEXT NOT NULL, month TEXT NOT NULL, "
            "count BIGINT NOT NULL, PRIMARY KEY (key_id, month))",
        ])

    def _insert(self, row: tuple) -> None:
        with self._pool.connection() as db:
            db.execute(
                "INSERT INTO nolag_keys (key_id, environment, project_id, salt, secret_hash, publish, subscribe, "
                "rate_limit_per_s, monthly_quota, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", row)

    def _secret_row(self, key_id: str) -> tuple | None:
        with self._pool.connection() as db:
            return db.execute(f"SELECT {_COLUMNS}, salt, secret_hash FROM nolag_keys WHERE key_id = %s",
                              (key_id,)).fetchone()

    def get(self, key_id: str) -> KeyRecord | None:
        with self._pool.connection() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM nolag_keys WHERE key_id = %s", (key_id,)).fetchone()
        return None if row is None else _record(row)

    def list(self) -> list[KeyRecord]:
        with self._pool.connection() as db:
            rows = db.execute(f'SELECT {_COLUMNS} FROM nolag_keys ORDER BY created_at, key_id COLLATE "C"').fetchall()
        return [_record(row) for row in rows]

    def revoke(self, key_id: str) -> bool:
        with self._pool.connection() as db:
            cursor = db.execute("UPDATE nolag_keys SET revoked_at = %s WHERE key_id = %s AND revoked_at IS NULL",
                                (self._clock(), key_id))
            return cursor.rowcount == 1

    def _active(self, key_ids: list[str]) -> list[str]:
        with self._pool.connection() as db:
            rows = db.execute("SELECT key_id FROM nolag_keys WHERE key_id = ANY(%s) AND revoked_at IS NULL",
                              (key_ids,)).fetchall()
        return [row[0] for row in rows]

    def _consume(self, key_id: str, count: int, month: str) -> bool:
        # One statement: the upsert locks the month's usage row (a first insert racing another waits
        # for it, then takes the update branch), and its WHERE is checked on the row as committed,
        # so concurrent consumers on any node never count past the quota.
        with self._pool.connection() as db:
            counted = db.execute(
                "INSERT INTO nolag_usage (key_id, month, count) "
                "SELECT key_id, %s, %s FROM nolag_keys WHERE key_id = %s "
                "AND (monthly_quota IS NULL OR %s <= monthly_quota) "
                "ON CONFLICT (key_id, month) DO UPDATE SET count = nolag_usage.count + excluded.count "
                "WHERE (SELECT monthly_quota FROM nolag_keys WHERE key_id = excluded.key_id) IS NULL "
                "OR nolag_usage.count + excluded.count <= "
                "(SELECT monthly_quota FROM nolag_keys WHERE key_id = excluded.key_id) "
                "RETURNING count", (month, count, key_id, count)).fetchone()
        return counted is not None

    def usage(self, key_id: str, month: str) -> int:
        with self._pool.connection() as db:
            row = db.execute("SELECT count FROM nolag_usage WHERE key_id = %s AND month = %s",
                             (key_id, month)).fetchone()
        return 0 if row is None else row[0]


def open_key_store(settings, clock: Callable[[], float] = time.time) -> KeyStore:
    """The key store ``settings`` name: PostgreSQL with ``store.url``, else the SQLite file
    ``nolag.keys_path`` (default ``<data_dir>/keys.sqlite3``)."""
    if settings.store.postgres is not None:
        return PostgresKeyStore(pool_of(settings.store), clock)
    return SqliteKeyStore(settings.nolag.keys_file(settings.data_dir), clock)


def _record(row: tuple) -> KeyRecord:
    return KeyRecord(row[0], row[1], row[2], tuple(json.loads(row[3])), tuple(json.loads(row[4])), row[5], row[6],
                     row[7], row[8])
