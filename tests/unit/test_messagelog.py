"""actors/nolag/messagelog.py: appends in one transaction, replay order and limits, per-topic retention.

Every test takes ``store_settings`` and opens the log with ``open_message_log``: each runs on
SQLite and on PostgreSQL.
"""

from __future__ import annotations

import sqlite3
import itertools

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.nolag import messagelog
from actors.nolag.messagelog import LogRecord, MessageLog, PostgresMessageLog, SqliteMessageLog, open_message_log
from router.postgres import pool_of


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
    # One ts, two topics: a topic's records keep their order; across topics (stamped by shards of
    # their own, so "first" means nothing there) a batch's topics come in the order it held them.
    assert log.since(["a/b/c", "x/y/z"], 0, 10) == [
        LogRecord("a/b/c", "m1", 100, b"\x01", 1, None),
        record("a/b/c", "m4", 200),
        record("x/y/z", "m2", 200, 2, "user_1"),
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


def test_many_topics_are_read_page_by_page_and_merged(log, monkeypatch):
    monkeypatch.setattr(messagelog, "_FETCH_SEGMENTS", 1)
    log.append_many([record(f"t/t/{index}", f"m{index}", 10 - index) for index in range(5)])
    for index in range(5):
        log.append_many([record(f"t/t/{index}", f"n{index}", 20 + index)])
    topics = [f"t/t/{index}" for index in range(5)] + ["t/t/0"]
    assert [r.msg_id for r in log.since(topics, 0, 20)] == ["m4", "m3", "m2", "m1", "m0", "n0", "n1", "n2", "n3", "n4"]
    assert [r.msg_id for r in log.since(topics, 0, 2)] == ["m4", "m3"]
    assert [r.msg_id for r in log.since(topics, 0, 3, newest=True)] == ["n2", "n3", "n4"]
    assert [r.msg_id for r in log.since(topics, 8, 3)] == ["m1", "m0", "n0"]


def test_a_msg_id_appended_again_is_read_once_at_its_first_place(log):
    """A publish retried after its shard restarted is stored again (with the new shard's stamp), as
    it was delivered again live: a read gives it once, where it was first among what the read looks
    at; a read that starts after that place gives the later copy."""
    assert log.append_many([record("a/b/c", "m1", 1)]) == 1
    assert log.append_many([record("a/b/c", "m1", 2), record("a/b/c", "m2", 3)]) == 2
    assert log.count() == 3
    assert [(r.msg_id, r.ts_ms) for r in log.since(["a/b/c"], 0, 10)] == [("m1", 1), ("m2", 3)]
    assert [(r.msg_id, r.ts_ms) for r in log.since(["a/b/c"], 0, 2)] == [("m1", 1), ("m2", 3)]
    assert [(r.msg_id, r.ts_ms) for r in log.since(["a/b/c"], 0, 2, newest=True)] == [("m1", 1), ("m2", 3)]
    assert [(r.msg_id, r.ts_ms) for r in log.since(["a/b/c"], 1, 10)] == [("m1", 2), ("m2", 3)]
    # a read that stops before the first copy gives the later one in its place
    assert [(r.msg_id, r.ts_ms) for r in log.since(["a/b/c"], 0, 1, newest=True)] == [("m2", 3)]
    log.append_many([record("a/b/c", "m3", 4)])
    assert [(r.msg_id, r.ts_ms) for r in log.since(["a/b/c"], 1, 2, newest=True)] == [("m2", 3), ("m3", 4)]
    assert log.append_many([]) == 0


def test_a_batch_with_a_record_that_cannot_be_stored_stores_nothing(log):
    log.append("a/b/c", "before", 0, b"\x01", 1)
    for bad in (LogRecord("a/b/c", "bad", 2, None, 1), LogRecord("a/b/c", 7, 2, b"\x01", 1),
                LogRecord("a/b/c", "bad", 2.5, b"\x01", 1), LogRecord("a/b/c", "bad", 2, b"\x01", 1, 3)):
        with pytest.raises(ValueError, match="not a storable log record"):
            log.append_many([record("a/b/c", "ok", 1), bad, record("x/y/z", "ok2", 1)])
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


@pytest.mark.parametrize("store_settings", ["postgresql"], indirect=True)  # SQLite: one writer at a time anyway
def test_one_node_prunes_the_shared_table_at_a_time(store_settings, log):
    """On PostgreSQL a prune that finds another node's prune running skips its round (each would
    rewrite the segments across the cut from what it read); the next round prunes."""
    log.append_many([record("a/a/a", "m1", 0), record("a/a/a", "m2", 50)])
    with pool_of(store_settings.store).connection() as other, other.transaction():
        other.execute("SELECT pg_advisory_xact_lock(%s)", (messagelog._PRUNE_LOCK,))  # another node's prune
        assert log.prune(100, lambda topic: 75) == 0
        assert log.count() == 2
    assert log.prune(100, lambda topic: 75) == 1
    assert [r.msg_id for r in log.since(["a/a/a"], -1, 5)] == ["m2"]


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


def test_a_batch_is_stored_as_segments_of_bounded_size(log, monkeypatch):
    monkeypatch.setattr(messagelog, "SEGMENT_MAX_RECORDS", 3)
    monkeypatch.setattr(messagelog, "SEGMENT_MAX_BYTES", 100)
    big = [LogRecord("b/b/b", f"b{index}", index, bytes(60), 1) for index in range(4)]
    small = [record("s/s/s", f"s{index}", index) for index in range(7)]
    assert log.append_many(small[:4] + big + small[4:]) == 11
    assert [(topic, count) for topic, _, _, count, _ in messagelog.segments_of(small[:4] + big + small[4:])] == [
        ("s/s/s", 3), ("s/s/s", 3), ("s/s/s", 1), ("b/b/b", 2), ("b/b/b", 2)]  # 60 bytes: a second one closes it
    assert log.count() == 11
    assert log.since(["s/s/s"], -1, 10) == small and log.since(["b/b/b"], -1, 10) == big
    assert [r.msg_id for r in log.since(["s/s/s", "b/b/b"], 2, 3)] == ["s3", "b3", "s4"]


def test_a_segment_spans_at_most_its_time_bound(log):
    """A segment's ts range stays within SEGMENT_MAX_SPAN_MS, in whatever order the records come:
    an oldest-first read starts its search that far before what it asks for."""
    span = messagelog.SEGMENT_MAX_SPAN_MS
    stamps = [0, span, span + 1, 5, 2 * span + 1, 2 * span + 2, span + 2]
    records = [record("a/a/a", f"m{index}", ts) for index, ts in enumerate(stamps)]
    assert [(low, high, count) for _, low, high, count, _ in messagelog.segments_of(records)] == [
        (0, span, 2), (5, span + 1, 2), (span + 2, 2 * span + 2, 3)]
    log.append_many(records)
    assert [r.msg_id for r in log.since(["a/a/a"], span, 3)] == ["m2", "m6", "m4"]
    assert [r.msg_id for r in log.since(["a/a/a"], span + 1, 1)] == ["m6"]
    assert [r.msg_id for r in log.since(["a/a/a"], 4, 2, newest=True)] == ["m4", "m5"]


def _steps(log: SqliteMessageLog, *args, **kwargs) -> tuple[list, int]:
    """A read's result and the SQLite VM instructions it ran (its work, not its time)."""
    ticks = [0]

    def tick() -> int:
        ticks[0] += 1
        return 0

    log._db.set_progress_handler(tick, 1)
    try:
        return log.since(*args, **kwargs), ticks[0]
    finally:
        log._db.set_progress_handler(None, 1)


def test_a_read_does_not_grow_with_the_topics_history(tmp_path, monkeypatch):
    """A quiet topic has a segment a record. A read oldest first from a point, or of the newest,
    does the same work with 200 segments as with 20,200: it pages the segment ranges in index
    order from where it starts and stops when nothing further can be among its records (the
    ranges of every candidate were read before, 20,200 of them)."""
    monkeypatch.setattr(messagelog, "SEGMENT_MAX_RECORDS", 1)
    recent = [record("q/q/q", f"r{index}", index * 1000) for index in range(200)]  # one a second
    small, big = SqliteMessageLog(tmp_path / "small.sqlite3"), SqliteMessageLog(tmp_path / "big.sqlite3")
    small.append_many(recent)
    big.append_many([record("q/q/q", f"old{index}", -10**7 - index * 1000) for index in range(10_000)])
    big.append_many(recent)
    big.append_many([record("q/q/q", f"new{index}", 10**7 + index * 1000) for index in range(10_000)])
    try:
        oldest_small, work_small = _steps(small, ["q/q/q"], 100_000, 5)
        oldest_big, work_big = _steps(big, ["q/q/q"], 100_000, 5)
        assert [r.msg_id for r in oldest_small] == [r.msg_id for r in oldest_big] == ["r101", "r102", "r103", "r104",
                                                                                      "r105"]
        assert work_big < 1.5 * work_small
        newest_small, work_small = _steps(small, ["q/q/q"], -10**8, 5, newest=True)
        newest_big, work_big = _steps(big, ["q/q/q"], -10**8, 5, newest=True)
        assert [r.msg_id for r in newest_small] == ["r195", "r196", "r197", "r198", "r199"]
        assert [r.msg_id for r in newest_big] == ["new9995", "new9996", "new9997", "new9998", "new9999"]
        assert work_big < 1.5 * work_small
    finally:
        small.close()
        big.close()


def test_prune_rewrites_a_segment_across_the_cut(log):
    log.append_many([record("a/a/a", f"a{index}", index * 10) for index in range(10)])  # one segment, ts 0..90
    assert log.prune(1_000, lambda topic: 1_000 - 45) == 5  # cut at 45: ts 0..40 go
    assert [r.ts_ms for r in log.since(["a/a/a"], -1, 20)] == [50, 60, 70, 80, 90]
    assert log.count() == 5 and log.last_stamps(0) == {"a/a/a": 90}
    assert [r.msg_id for r in log.since(["a/a/a"], 55, 2)] == ["a6", "a7"]
    assert log.prune(1_000, lambda topic: 1_000 - 100) == 5 and log.count() == 0 and log.since(["a/a/a"], -1, 5) == []


_TOPICS = ("t/a/a", "t/b/b", "t/c/c")
_record = st.tuples(st.sampled_from(_TOPICS), st.integers(0, 30))  # topic, ts (each record its own msgId)
_step = st.one_of(
    st.tuples(st.just("append"), st.lists(_record, max_size=9)),
    st.tuples(st.just("since"), st.lists(st.sampled_from(_TOPICS), max_size=3), st.integers(-1, 31),
              st.integers(0, 12), st.booleans()),
    st.tuples(st.just("prune"), st.sampled_from(_TOPICS), st.integers(0, 31)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_step, max_size=14))
def test_segments_read_as_one_row_per_record_would(store_settings, monkeypatch, steps):
    """Against a model of one row per record: every read (with its limit, oldest or newest first)
    gives the records a scan of all of them would, in (ts, topic's append) order; prune removes
    record by record. (A msgId stored twice: the test above.) Tiny segments (3 records, a span of
    6 ms) and one segment a query, so a read stops early and across many segments."""
    monkeypatch.setattr(messagelog, "SEGMENT_MAX_RECORDS", 3)
    monkeypatch.setattr(messagelog, "SEGMENT_MAX_SPAN_MS", 6)
    monkeypatch.setattr(messagelog, "_FETCH_SEGMENTS", 1)
    store = open_message_log(store_settings)
    prefix = f"x{next(_EXAMPLES)}"  # one store for every example: each its own topics
    model: list[tuple[int, int, LogRecord]] = []  # (ts, append place, record)
    place = itertools.count()
    try:
        for step in steps:
            if step[0] == "append":
                records = [LogRecord(f"{prefix}/{topic}", f"m{next(place)}", ts, b"\x01", 1) for topic, ts in step[1]]
                assert store.append_many(records) == len(records)
                for topic in dict.fromkeys(r.topic for r in records):  # a batch's topics in order, each in order
                    model += [(r.ts_ms, next(place), r) for r in records if r.topic == topic]
            elif step[0] == "since":
                _, topics, after, limit, newest = step
                wanted = {f"{prefix}/{topic}" for topic in topics}
                expected = [r for _, _, r in sorted(model, key=lambda entry: entry[:2])
                            if r.topic in wanted and r.ts_ms > after]
                expected = (expected[-limit:] if limit else []) if newest else expected[:limit]
                assert store.since([f"{prefix}/{topic}" for topic in topics], after, limit, newest) == expected
            else:
                _, topic, cut = step
                topic = f"{prefix}/{topic}"
                gone = [entry for entry in model if entry[2].topic == topic and entry[0] < cut]
                assert store.prune(cut, lambda name: 0 if name == topic else None) == len(gone)
                model = [entry for entry in model if entry not in gone]
    finally:
        store.close()


_EXAMPLES = itertools.count()


def _write_a_log_of_one_row_per_record(store_settings, rows: list[tuple]) -> None:
    """The log as the router wrote it before segments: a row a record."""
    if store_settings.store.postgres is None:
        db = sqlite3.connect(store_settings.data_dir / "nolag-log.sqlite3")
        db.executescript(
            "CREATE TABLE messages (seq INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, "
            "msg_id TEXT NOT NULL UNIQUE, ts_ms INTEGER NOT NULL, data BLOB NOT NULL, qos INTEGER NOT NULL, "
            "filter TEXT);")
        db.executemany("INSERT INTO messages (topic, msg_id, ts_ms, data, qos, filter) VALUES (?, ?, ?, ?, ?, ?)",
                       rows)
        db.commit()
        db.close()
    else:
        with pool_of(store_settings.store).connection() as db:
            db.execute("CREATE TABLE nolag_messages (seq BIGSERIAL PRIMARY KEY, topic TEXT NOT NULL, "
                       "msg_id TEXT NOT NULL UNIQUE, ts_ms BIGINT NOT NULL, data BYTEA NOT NULL, "
                       "qos SMALLINT NOT NULL, filter TEXT)")
            with db.cursor() as cursor:
                cursor.executemany("INSERT INTO nolag_messages (topic, msg_id, ts_ms, data, qos, filter) "
                                   "VALUES (%s, %s, %s, %s, %s, %s)", rows)


def test_a_log_of_one_row_per_record_is_moved_into_segments(store_settings, monkeypatch):
    """A log the router wrote before segments (one row a record) is read as before once opened:
    its rows become segments in their order (read in chunks: 32 rows here), the old table goes,
    and a second open finds nothing to move."""
    monkeypatch.setattr(messagelog, "SEGMENT_MAX_RECORDS", 2)
    monkeypatch.setattr(messagelog, "_MIGRATE_CHUNK", 32)
    more = [("m/m/m", f"n{index}", 10 + index, bytes([index]), 0, None) for index in range(70)]
    rows = [("a/b/c", "m1", 5, b"\x01", 1, None), ("x/y/z", "m2", 5, b"\x02", 2, "f"),
            ("a/b/c", "m3", 4, b"\x03", 1, None)] + more
    _write_a_log_of_one_row_per_record(store_settings, rows)
    log = open_message_log(store_settings)
    assert log.count() == 73
    assert log.since(["a/b/c", "x/y/z"], 0, 10) == [LogRecord(*rows[2]), LogRecord(*rows[0]), LogRecord(*rows[1])]
    assert log.since(["m/m/m"], 0, 100) == [LogRecord(*row) for row in more]
    assert log.last_stamps(0) == {"a/b/c": 5, "x/y/z": 5, "m/m/m": 79}
    log.close()
    again = open_message_log(store_settings)
    assert again.count() == 73
    again.close()
    if store_settings.store.postgres is None:
        db = sqlite3.connect(store_settings.data_dir / "nolag-log.sqlite3")
        assert db.execute("SELECT name FROM sqlite_master WHERE name = 'messages'").fetchall() == []
        db.close()
    else:
        with pool_of(store_settings.store).connection() as db:
            assert db.execute("SELECT to_regclass('nolag_messages')").fetchone()[0] is None


def test_a_move_into_segments_cut_off_resumes_where_it_stopped(store_settings, monkeypatch):
    """The move commits a chunk at a time: killed after the first chunk (here: a chunk that fails),
    the next open moves the rest, and every record is read once, in order."""
    monkeypatch.setattr(messagelog, "_MIGRATE_CHUNK", 4)
    rows = [("m/m/m", f"n{index}", index, bytes([index]), 1, None) for index in range(10)]
    _write_a_log_of_one_row_per_record(store_settings, rows)
    calls = itertools.count()
    real = messagelog.segments_of

    def failing_second_chunk(records):
        if next(calls) == 1:
            raise RuntimeError("cut off")
        return real(records)

    monkeypatch.setattr(messagelog, "segments_of", failing_second_chunk)
    with pytest.raises(RuntimeError, match="cut off"):
        open_message_log(store_settings)
    assert _moved_and_left(store_settings) == (4, 6)  # the first chunk stays moved
    monkeypatch.setattr(messagelog, "segments_of", real)
    log = open_message_log(store_settings)
    assert log.count() == 10
    assert log.since(["m/m/m"], -1, 20) == [LogRecord(*row) for row in rows]
    log.close()


def _moved_and_left(store_settings) -> tuple[int, int]:
    """Records in segments, and rows left in the log of one row per record."""
    if store_settings.store.postgres is None:
        db = sqlite3.connect(store_settings.data_dir / "nolag-log.sqlite3")
        try:
            return (db.execute("SELECT COALESCE(SUM(count), 0) FROM message_segments").fetchone()[0],
                    db.execute("SELECT COUNT(*) FROM messages").fetchone()[0])
        finally:
            db.close()
    with pool_of(store_settings.store).connection() as db:
        return (db.execute("SELECT COALESCE(SUM(count), 0) FROM nolag_message_segments").fetchone()[0],
                db.execute("SELECT COUNT(*) FROM nolag_messages").fetchone()[0])


def test_stamps_at_the_ends_of_the_range(log):
    """A ts is a BIGINT above its lowest value; a read's bound is held inside the range, so no ts
    is lost at either end."""
    low, high = messagelog._BOTTOM + 1, messagelog._TOP
    log.append_many([record("e/e/e", "low", low), record("e/e/e", "low2", low + 10)])
    log.append_many([record("e/e/e", "high", high)])
    for bad in (messagelog._BOTTOM, high + 1):
        with pytest.raises(ValueError, match="not a storable log record"):
            log.append_many([record("e/e/e", "bad", bad)])
    assert [r.msg_id for r in log.since(["e/e/e"], -(1 << 70), 5)] == ["low", "low2", "high"]
    assert [r.msg_id for r in log.since(["e/e/e"], messagelog._BOTTOM, 5)] == ["low", "low2", "high"]
    assert [r.msg_id for r in log.since(["e/e/e"], low, 5)] == ["low2", "high"]
    assert [r.msg_id for r in log.since(["e/e/e"], -(1 << 70), 1, newest=True)] == ["high"]
    assert log.since(["e/e/e"], high, 5) == [] and log.since(["e/e/e"], 1 << 70, 5, newest=True) == []
