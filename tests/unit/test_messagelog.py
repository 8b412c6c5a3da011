"""actors/messagelog.py: appends in one transaction, replay order and limits, per-topic retention."""

from __future__ import annotations

import sqlite3

import msgpack
import pytest

from actors.nolag import messagelog
from actors.nolag.messagelog import LogRecord, SqliteMessageLog


@pytest.fixture
def log(tmp_path) -> SqliteMessageLog:
    store = SqliteMessageLog(tmp_path / "log" / "messages.sqlite3")
    yield store
    store.close()


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


def test_a_failing_batch_stores_nothing(log):
    with pytest.raises(sqlite3.IntegrityError):
        log.append_many([record("a/b/c", "ok", 1), LogRecord("a/b/c", "bad", 2, None, 1)])  # NOT NULL data
    assert log.count() == 0
    log.append("a/b/c", "after", 3, b"\xc0", 0)
    assert log.count() == 1


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


def test_configured_default_retention_and_sharing_the_file(tmp_path):
    path = tmp_path / "m.sqlite3"
    one = SqliteMessageLog(path, retention_ms_by_topic=lambda topic: 10)
    two = SqliteMessageLog(path)
    one.append("a/b/c", "m1", 0, b"\x01", 1)
    two.append("a/b/c", "m2", 5, b"\x02", 2)
    assert [r.msg_id for r in two.since(["a/b/c"], -1, 10)] == ["m1", "m2"]
    assert one.prune(12) == 1
    assert [r.data_packed for r in two.since(["a/b/c"], -1, 10)] == [b"\x02"]
    assert one._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    one.close()
    two.close()
    reopened = SqliteMessageLog(path)
    assert reopened.count() == 1
    reopened.close()
