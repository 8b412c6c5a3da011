"""actors/nolag/messagelog.py: appends in one transaction, replay order and limits, per-topic retention.

Every test takes ``store_settings`` and opens the log with ``open_message_log``: each runs on
SQLite and on PostgreSQL.
"""

from __future__ import annotations

import sqlite3

import msgpack
import psycopg
import pytest

from actors.nolag import messagelog
from actors.nolag.messagelog import LogRecord, MessageLog, PostgresMessageLog, SqliteMessageLog, open_message_log


@pytest.fixture
def log(store_settings) -> MessageLog:
    store = open_message_log(store_settings)
    yield store
    store.close()


def test_the_factory_picks_the_backend(store_settings, log):
    if store_settings.store.postgres is None:
        assert type(log) is SqliteMessageLog and log.path == store_settings.data_dir / "nolag-log.sqlite3"
    else:
        assert type(log) is PostgresMessageLog
        assert not (store_settings.data_dir / "nolag-log.sqlite3").exists()


def record(topic: str, msg_id: str, ts_ms: int, qos: int = 1, filter: str | None = None) -> LogRecord:
    return LogRecord(topic, msg_id, ts_ms, msgpack.packb({"id": msg_id}), qos, filter)


def test_append_and_since_in_timestamp_then_append_order(log):
    log.append("a/b/c", "m1", 100, b"\x01", 1)
    assert log.append_many([record("a/b/c", "m3", 300), record("x/y/z", "m2", 200, 2, "user_1"),
                            record("a/b/c", "m4", 200)]) == 3
    assert log.since(["a/b/c", "x/y/z"], 0, 10) == [
        LogRecord("a/b/c", "m1", 100, b"\x01", 1, None),
        record("x/y/z", "m2", 200, 2, "user_1"),
        record("a/b/c", "m4", 200),
        record("a/b/c", "m3", 300),
    ]
    assert [r.msg_id for r in log.since(["a/b/c"], 100, 10)] == ["m4", "m3"]  # strictly after
    assert log.since(["a/b/c"], 300, 10) == []
    assert log.since(["nope"], 0, 10) == [] and log.since([], 0, 10) == [] and log.since(["a/b/c"], 0, 0) == []


def test_limit_oldest_first_or_newest(log):
    log.append_many([record("t/t/t", f"m{index}", index) for index in range(10)])
    log.append_many([record("u/u/u", f"n{index}", index) for index in range(10)])
    assert [r.msg_id for r in log.since(["t/t/t"], 2, 3)] == ["m3", "m4", "m5"]
    assert [r.msg_id for r in log.since(["t/t/t"], 2, 3, newest=True)] == ["m7", "m8", "m9"]
    assert [r.msg_id for r in log.since(["t/t/t", "u/u/u"], 7, 3)] == ["m8", "n8", "m9"]
    assert [r.msg_id for r in log.since(["t/t/t", "u/u/u"], 0, 3, newest=True)] == ["n8", "m9", "n9"]


def test_many_topics_are_queried_in_chunks(log, monkeypatch):
    monkeypatch.setattr(messagelog, "_MAX_VARIABLES", 2)
    log.append_many([record(f"t/t/{index}", f"m{index}", 10 - index) for index in range(5)])
    topics = [f"t/t/{index}" for index in range(5)] + ["t/t/0"]
    assert [r.msg_id for r in log.since(topics, 0, 10)] == ["m4", "m3", "m2", "m1", "m0"]
    assert [r.msg_id for r in log.since(topics, 0, 2)] == ["m4", "m3"]
    assert [r.msg_id for r in log.since(topics, 0, 2, newest=True)] == ["m1", "m0"]


def test_a_msg_id_is_stored_once(log):
    assert log.append_many([record("a/b/c", "m1", 1)]) == 1
    assert log.append_many([record("a/b/c", "m1", 2), record("a/b/c", "m2", 3)]) == 1
    assert [(r.msg_id, r.ts_ms) for r in log.since(["a/b/c"], 0, 10)] == [("m1", 1), ("m2", 3)]
    assert log.append_many([]) == 0


def test_a_failing_batch_stores_nothing(log, store_settings):
    error = sqlite3.IntegrityError if store_settings.store.postgres is None else psycopg.errors.NotNullViolation
    log.append("a/b/c", "before", 0, b"\x01", 1)
    with pytest.raises(error):
        log.append_many([record("a/b/c", "ok", 1), LogRecord("a/b/c", "bad", 2, None, 1)])  # NOT NULL data
    assert log.count() == 1
    log.append("a/b/c", "after", 3, b"\xc0", 0)
    assert [(r.msg_id, r.data_packed) for r in log.since(["a/b/c"], -1, 10)] == [
        ("before", b"\x01"), ("after", b"\xc0")]


def test_prune_with_per_topic_retention(log):
    log.append_many([record("keep/a/b", "k", 0), record("short/a/b", "s1", 500), record("short/a/b", "s2", 950),
                     record("day/a/b", "d1", 0), record("day/a/b", "d2", 1)])
    retention = {"keep/a/b": None, "short/a/b": 100}.get
    assert log.prune(1000, lambda topic: retention(topic, messagelog.DEFAULT_RETENTION_MS)) == 1
    assert sorted(r.msg_id for r in log.since(["keep/a/b", "short/a/b", "day/a/b"], -1, 10)) == [
        "d1", "d2", "k", "s2"]
    day = messagelog.DEFAULT_RETENTION_MS
    assert log.prune(day + 1) == 2  # the log's default, one day for every topic: k and d1 (ts 0) go
    assert [r.msg_id for r in log.since(["keep/a/b", "short/a/b", "day/a/b"], -1, 10)] == ["d2", "s2"]
    assert log.prune(day + 1, lambda topic: None) == 0


def test_configured_default_retention_and_sharing_the_store(store_settings):
    one = open_message_log(store_settings, lambda topic: 10)
    two = open_message_log(store_settings)
    one.append("a/b/c", "m1", 0, b"\x01", 1)
    two.append("a/b/c", "m2", 5, b"\x02", 2)
    assert [r.msg_id for r in two.since(["a/b/c"], -1, 10)] == ["m1", "m2"]
    assert two.append_many([record("a/b/c", "m1", 7)]) == 0  # the other store's msgId
    assert one.prune(12) == 1
    assert [r.data_packed for r in two.since(["a/b/c"], -1, 10)] == [b"\x02"]
    if store_settings.store.postgres is None:
        assert one._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    one.close()
    two.close()
    reopened = open_message_log(store_settings)
    assert reopened.count() == 1
    assert reopened.since(["a/b/c"], -1, 10) == [LogRecord("a/b/c", "m2", 5, b"\x02", 2, None)]
    reopened.close()


def test_last_stamps_per_topic(log):
    assert log.last_stamps(0) == {}
    log.append_many([record("a/a/a", "a1", 100), record("a/a/a", "a2", 300), record("b/b/b", "b1", 200),
                     record("c/c/c", "c1", 50)])
    assert log.last_stamps(200) == {"a/a/a": 300, "b/b/b": 200}  # at or after
    assert log.last_stamps(0) == {"a/a/a": 300, "b/b/b": 200, "c/c/c": 50}
    assert log.last_stamps(301) == {}


def test_ties_keep_the_append_order_across_batches(log):
    log.append_many([record("t/t/t", "z", 5), record("t/t/t", "a", 5)])
    log.append_many([record("t/t/t", "m", 5), record("t/t/t", "b", 4)])
    assert [r.msg_id for r in log.since(["t/t/t"], 0, 10)] == ["b", "z", "a", "m"]
    assert [r.msg_id for r in log.since(["t/t/t"], 0, 2, newest=True)] == ["a", "m"]


def test_client_chosen_text_with_nul_is_stored_and_read_back(log):
    """A publish's filter comes from the client: PostgreSQL text cannot hold NUL, and one such
    filter must not fail the batch it is appended with (router/pgtext.py)."""
    records = [record("a/b/c", "m\x00\x01", 1, filter="f\x00\x01x"), record("a/b/c", "m2", 2, filter="plain")]
    assert log.append_many(records) == 2
    assert log.since(["a/b/c"], 0, 10) == records
