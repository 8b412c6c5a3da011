"""API keys: tokens ``at_{live|sandbox}_{key_id}.{secret}``, topic ACLs, rate and monthly quota.

A plain class over one SQLite file (``<data_dir>/keys.sqlite3``) that the CLI writes and every
gateway process reads: WAL mode lets them read beside one writer, a busy writer waits.

Only an HMAC-SHA256 of the secret is stored, keyed with a random salt per key; a token is checked
with ``hmac.compare_digest``. Revocation sets ``revoked_at``: :meth:`KeyStore.verify` refuses the
key at once, and gateways poll :meth:`KeyStore.revoked_since` to disconnect live sessions.

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
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable
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


_COLUMNS = ("key_id, environment, project_id, publish, subscribe, rate_limit_per_s, monthly_quota, "
            "created_at, revoked_at")


class KeyStore:
    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._clock = clock
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
        self._db.execute(
            "INSERT INTO keys (key_id, environment, project_id, salt, secret_hash, publish, subscribe, "
            "rate_limit_per_s, monthly_quota, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (record.key_id, environment, project_id, salt, _digest(salt, secret), json.dumps(list(publish)),
             json.dumps(list(subscribe)), rate_limit_per_s, monthly_quota, record.created_at),
        )
        return f"at_{environment}_{record.key_id}.{secret}", record

    def verify(self, token: str) -> KeyRecord | None:
        """The key of a valid token; None for a malformed, unknown, wrong or revoked one."""
        parsed = parse_token(token)
        if parsed is None:
            return None
        environment, key_id, secret = parsed
        row = self._db.execute(f"SELECT {_COLUMNS}, salt, secret_hash FROM keys WHERE key_id = ?",
                               (key_id,)).fetchone()
        if row is None:
            return None
        record = _record(row[:9])
        if not hmac.compare_digest(_digest(row[9], secret), row[10]):
            return None
        if record.environment != environment or record.revoked_at is not None:
            return None
        return record

    def get(self, key_id: str) -> KeyRecord | None:
        row = self._db.execute(f"SELECT {_COLUMNS} FROM keys WHERE key_id = ?", (key_id,)).fetchone()
        return None if row is None else _record(row)

    def list(self) -> list[KeyRecord]:
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM keys ORDER BY created_at, key_id").fetchall()
        return [_record(row) for row in rows]

    def revoke(self, key_id: str) -> bool:
        """True if the key existed and was active."""
        cursor = self._db.execute("UPDATE keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL",
                                  (self._clock(), key_id))
        return cursor.rowcount == 1

    def revoked_since(self, timestamp: float) -> list[str]:
        """Keys revoked at or after ``timestamp`` (inclusive: a poller loses none), oldest first."""
        rows = self._db.execute("SELECT key_id FROM keys WHERE revoked_at >= ? ORDER BY revoked_at, key_id",
                                (timestamp,)).fetchall()
        return [row[0] for row in rows]

    def consume(self, key_id: str, count: int = 1, now: float | None = None) -> bool:
        """Count ``count`` messages against this month's quota; False (nothing counted) if it would
        go over, or the key is unknown. Atomic across processes (one write transaction).

        A write per call: gateways should reserve blocks (``count`` > 1) rather than call it per message.
        """
        if count < 0:
            raise ValueError("count must be 0 or more")
        month = month_of(self._clock() if now is None else now)
        with write_transaction(self._db) as db:  # the read and the write in one transaction
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
        row = self._db.execute("SELECT count FROM usage WHERE key_id = ? AND month = ?", (key_id, month)).fetchone()
        return 0 if row is None else row[0]

    def close(self) -> None:
        self._db.close()


def _record(row: tuple) -> KeyRecord:
    return KeyRecord(row[0], row[1], row[2], tuple(json.loads(row[3])), tuple(json.loads(row[4])), row[5], row[6],
                     row[7], row[8])
