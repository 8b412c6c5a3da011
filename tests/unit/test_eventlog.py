"""router/eventlog.py: buffered event records written as hour-partitioned Parquet files.

Records carry fixed timestamps (March 2026), so the folders they land in are known exactly. The
log applies retention against the wall clock on its first write, so every log here keeps data
(practically) forever, except in the retention tests, which use timestamps relative to now.
"""

from __future__ import annotations

import calendar
import logging
import re
import struct
import time
from concurrent.futures import Future
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router import eventlog
from router.eventlog import COLUMNS, FILE_SCHEMA, SCHEMA, EventLog, read_events

GATEWAY = "gw-a"
OTHER_GATEWAY = "gw-b"
KEEP_FOREVER = 1_000_000  # hours (~114 years): retention never touches the fixed 2026 timestamps
HOUR_NS = 3_600_000_000_000
WAIT = 30


def at(year: int, month: int, day: int, hour: int, minute: int = 0, second: int = 0, ns: int = 0) -> int:
    """A UTC time as epoch nanoseconds, computed with integers only."""
    return calendar.timegm((year, month, day, hour, minute, second)) * 1_000_000_000 + ns


T0 = at(2026, 3, 1, 10, 15)  # 2026-03-01 10:15:00 UTC


def meta(seq: int = 7, t0: int = T0, origin: str = GATEWAY, dialect: str = "signal", kind: str = "hub:publish",
         topic: str | None = "rooms/lobby") -> tuple:
    """(origin gateway, msg_seq, ingress ts_ns, dialect, kind, topic)"""
    return (origin, seq, t0, dialect, kind, topic)


def row(**values: object) -> dict:
    """A full row: every column, None unless given."""
    unknown = set(values) - set(COLUMNS)
    assert not unknown, unknown
    return {name: values.get(name) for name in COLUMNS}


def files_under(directory: Path) -> list[str]:
    """Every file below ``directory`` (hidden ones included), as sorted relative POSIX paths."""
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())


def read_rows(directory: Path) -> list[dict]:
    """All events of all Parquet files below ``directory`` (a fan-out group's row is a row per
    connection: ``read_events``), ordered by (ts_ns, connection)."""
    return sorted(read_events(directory).to_pylist(), key=lambda r: (r["ts_ns"], r["connection"] or 0))


def written(log: EventLog) -> None:
    """Flush and wait for the writer thread."""
    future = log.flush()
    assert future is not None
    assert future.result(timeout=WAIT) is None


@pytest.fixture
def events_dir(tmp_path: Path) -> Path:
    return tmp_path / "events"


@pytest.fixture
def log(events_dir: Path):
    log = EventLog(events_dir, GATEWAY, retention_hours=KEEP_FOREVER)
    yield log
    log.close()


# -- schema ---------------------------------------------------------------------------------------


def test_columns_are_the_schema_names_in_order():
    assert COLUMNS == [
        "ts_ns", "dialect", "direction", "kind", "topic", "gateway", "connection", "origin", "msg_seq",
        "protocol_id", "bytes", "latency_ns", "outcome", "reason",
    ]


def test_schema_types():
    int64 = {"ts_ns", "connection", "msg_seq", "bytes", "latency_ns"}
    assert {f.name: f.type for f in SCHEMA} == {
        name: pa.int64() if name in int64 else pa.string() for name in COLUMNS
    }
    # what the log fills itself is never null: a file holds those columns as required
    assert {f.name for f in SCHEMA if not f.nullable} == {
        "ts_ns", "dialect", "direction", "gateway", "connection", "origin", "msg_seq", "bytes", "outcome"}


def test_a_file_holds_the_columns_the_log_always_fills_as_required(log, events_dir):
    """Parquet's own schema of a file: required (no definition levels, no validity bits) where the
    log always sets a value, optional elsewhere; records of each kind in one flush."""
    log.ingress(T0, meta(seq=1), "m-1", 10, 1)
    log.delivered(T0 + 5, meta(seq=1), 10, (2, 3))
    log.rejected(T0 + 6, meta(seq=2, kind=None, topic=None), None, 4, 1, "bad_request")
    log.dropped(T0 + 7, meta(seq=1), 10, 4, "slow_consumer")
    written(log)
    [path] = files_under(events_dir)
    parquet = pq.ParquetFile(events_dir / path).schema
    levels = {parquet.column(i).path.split(".")[0]:  # a list's leaf counts a level for the list's repetition
              parquet.column(i).max_definition_level - parquet.column(i).max_repetition_level
              for i in range(len(FILE_SCHEMA))}
    assert levels == {name: 0 if name in eventlog.NEVER_NULL else 1 for name in FILE_SCHEMA.names}
    assert parquet.column(FILE_SCHEMA.names.index("connections")).path == "connections.list.element"
    assert pq.read_schema(events_dir / path).equals(FILE_SCHEMA)
    assert pq.ParquetFile(events_dir / path).metadata.num_rows == 4  # the fan-out group is one row
    assert len(read_rows(events_dir)) == 5


def test_a_null_where_the_log_always_sets_a_value_is_written_not_lost(log, events_dir, caplog):
    """Should a record come with a null in a column the log holds as required (a bug elsewhere),
    its flush is written whole, every column nullable, and a warning says so."""
    log.ingress(T0, meta(seq=1), None, 10, 1)
    log.dropped(T0 + 5, meta(seq=1), 10, None, "no_route")  # no connection: not a path the router has
    with caplog.at_level(logging.WARNING, logger="router.eventlog"):
        written(log)
    [path] = files_under(events_dir)
    assert pq.read_schema(events_dir / path).equals(eventlog._NULLABLE_SCHEMA)
    assert [(r["outcome"], r["connection"]) for r in read_rows(events_dir)] == [("accepted", 1), ("dropped", None)]
    assert "written with every column nullable" in caplog.text


def test_stream_fields_of_one_value_and_of_several_in_one_flush(log, events_dir):
    """A flush whose records share a dialect and an origin but not a kind or a topic (one None):
    each row keeps its record's values, the groups' rows too."""
    log.ingress(T0, meta(seq=1, kind="Publish", topic="a"), None, 1, 1)
    log.ingress(T0 + 1, meta(seq=2, kind="Auth", topic=None), None, 1, 1)
    log.delivered(T0 + 2, meta(seq=1, kind="Publish", topic="a"), 1, (5, 6))
    log.delivered(T0 + 3, meta(seq=3, kind="Message", topic="b"), 1, (7,))
    written(log)
    rows = read_rows(events_dir)
    assert [(r["ts_ns"] - T0, r["dialect"], r["origin"], r["kind"], r["topic"], r["connection"]) for r in rows] == [
        (0, "signal", GATEWAY, "Publish", "a", 1), (1, "signal", GATEWAY, "Auth", None, 1),
        (2, "signal", GATEWAY, "Publish", "a", 5), (2, "signal", GATEWAY, "Publish", "a", 6),
        (3, "signal", GATEWAY, "Message", "b", 7)]


def test_constructor_creates_the_directory(events_dir):
    EventLog(events_dir / "nested" / "deeper", GATEWAY).close()
    assert (events_dir / "nested" / "deeper").is_dir()


# -- records --------------------------------------------------------------------------------------


def test_ingress_is_one_accepted_in_row(log, events_dir):
    log.ingress(T0, meta(seq=7), "corr-1", 120, 3)
    written(log)
    assert read_rows(events_dir) == [
        row(ts_ns=T0, dialect="signal", direction="in", kind="hub:publish", topic="rooms/lobby", gateway=GATEWAY,
            connection=3, origin=GATEWAY, msg_seq=7, protocol_id="corr-1", bytes=120, latency_ns=None,
            outcome="accepted", reason=None),
    ]


def test_ingress_takes_its_timestamp_from_the_argument_not_the_meta(log, events_dir):
    log.ingress(T0 + 5, meta(t0=T0), None, 10, 1)
    written(log)
    [only] = read_rows(events_dir)
    assert only["ts_ns"] == T0 + 5
    assert only["latency_ns"] is None


def test_ingress_without_protocol_id_or_topic_stores_nulls(log, events_dir):
    log.ingress(T0, meta(topic=None), None, 10, 1)
    written(log)
    [only] = read_rows(events_dir)
    assert only["protocol_id"] is None
    assert only["topic"] is None


def test_a_flood_of_refused_frames_records_at_most_the_cap_per_flush(events_dir):
    """A client hammering a rate limit used to get a row (and writer work) for every frame."""
    log = EventLog(events_dir, GATEWAY, retention_hours=KEEP_FOREVER, max_rejected_per_flush=100)
    for seq in range(50_000):
        log.rejected(T0 + seq, meta(seq=seq), None, 64, 4, "rate_limited")
    log.ingress(T0, meta(seq=99_999), None, 10, 1)  # accepted messages are never capped
    written(log)
    rows = read_rows(events_dir)
    assert [r["msg_seq"] for r in rows if r["outcome"] == "rejected"] == list(range(100))
    assert [r["msg_seq"] for r in rows if r["outcome"] == "accepted"] == [99_999]
    assert log.rejected_unlogged == 49_900
    log.rejected(T0, meta(seq=123_456), None, 64, 4, "rate_limited")  # the cap is per flush
    written(log)
    assert len(read_rows(events_dir)) == 102
    log.close()


def test_flushes_past_the_unwritten_bound_are_dropped_and_counted(events_dir):
    """A writer that falls behind used to queue every flush in memory."""
    release = threading.Event()

    # A flush counts the records its chunks hold room for: 600 messages fill one chunk of 16,384.
    log = EventLog(events_dir, GATEWAY, retention_hours=KEEP_FOREVER,
                   max_unwritten_records=eventlog.CHUNK_RECORDS * 3 // 2)
    blocked = log._writer.submit(release.wait, WAIT)  # the writer thread is busy
    for seq in range(600):
        log.ingress(T0, meta(seq=seq), None, 10, 1)
    first = log.flush()
    for seq in range(600, 1200):
        log.ingress(T0, meta(seq=seq), None, 10, 1)
    assert log.flush() is None  # a chunk waiting + a chunk more would pass one and a half
    assert log.records_dropped == 600
    release.set()
    assert blocked.result(WAIT) is True and first.result(WAIT) is None
    log.ingress(T0, meta(seq=5_000), None, 10, 1)
    written(log)  # the writer caught up: flushes go again
    assert sorted(r["msg_seq"] for r in read_rows(events_dir)) == [*range(600), 5_000]
    log.close()


def test_rejected_is_one_in_row_with_its_reason(log, events_dir):
    log.rejected(T0, meta(seq=8, kind="hub:subscribe", topic="rooms/vip"), "corr-2", 64, 4, "rate_limited")
    written(log)
    assert read_rows(events_dir) == [
        row(ts_ns=T0, dialect="signal", direction="in", kind="hub:subscribe", topic="rooms/vip", gateway=GATEWAY,
            connection=4, origin=GATEWAY, msg_seq=8, protocol_id="corr-2", bytes=64, latency_ns=None,
            outcome="rejected", reason="rate_limited"),
    ]


def test_delivered_fan_out_group_expands_to_one_row_per_connection(log, events_dir):
    # The message entered the router at another gateway; this gateway delivered it to three connections.
    log.delivered(T0 + 1_500, meta(seq=9, origin=OTHER_GATEWAY), 200, (11, 12, 13))
    written(log)
    assert read_rows(events_dir) == [
        row(ts_ns=T0 + 1_500, dialect="signal", direction="out", kind="hub:publish", topic="rooms/lobby",
            gateway=GATEWAY, connection=connection, origin=OTHER_GATEWAY, msg_seq=9, protocol_id=None, bytes=200,
            latency_ns=1_500, outcome="delivered", reason=None)
        for connection in (11, 12, 13)
    ]


@pytest.mark.parametrize("way", ["delivered", "delivered_items"])
def test_a_group_with_a_bad_id_is_not_logged_and_leaves_the_others_in_step(log, events_dir, way):
    """A group whose ids cannot be stored raises and leaves no trace: the groups after it keep
    their own ids (the ids of groups of more than one are stored apart, in order)."""

    def group(seq: int, connections: tuple) -> None:
        if way == "delivered":
            log.delivered(T0 + seq, meta(seq=seq), 10, connections)
        else:
            log.delivered_items(T0 + seq, [(0, b"x" * 10, connections, meta(seq=seq))])

    group(1, (11, 12))
    with pytest.raises(TypeError):
        group(2, (21, "not an id"))
    group(3, (31, 32))
    written(log)
    assert [(r["msg_seq"], r["connection"]) for r in read_rows(events_dir)] == [(1, 11), (1, 12), (3, 31), (3, 32)]


def test_groups_sharing_their_ids_each_keep_the_ids_they_had_when_logged(log, events_dir):
    """A run's groups share one tuple of ids (packed once for all of them); a list is read at each
    group, so one changed between two groups logs what it held each time; another tuple between
    two groups of the run is read on its own, and a bad one leaves the run's ids as they were."""
    run = (11, 12, 13)
    changing = [21, 22]
    log.delivered(T0 + 1, meta(seq=1), 10, run)
    log.delivered(T0 + 2, meta(seq=2), 10, run)
    log.delivered(T0 + 3, meta(seq=3), 10, changing)
    changing[1] = 23
    changing.append(24)
    log.delivered(T0 + 4, meta(seq=4), 10, changing)
    log.delivered_items(T0 + 5, [(0, b"x" * 10, run, meta(seq=5)), (0, b"x" * 10, (11, 12, 14), meta(seq=6)),
                                 (0, b"x" * 10, run, meta(seq=7))])
    with pytest.raises(TypeError):
        log.delivered(T0 + 8, meta(seq=8), 10, (run[0], "not an id"))
    log.delivered(T0 + 9, meta(seq=9), 10, run)
    written(log)
    assert sorted((r["msg_seq"], r["connection"]) for r in read_rows(events_dir)) == [
        (1, 11), (1, 12), (1, 13), (2, 11), (2, 12), (2, 13), (3, 21), (3, 22), (4, 21), (4, 23), (4, 24),
        (5, 11), (5, 12), (5, 13), (6, 11), (6, 12), (6, 14), (7, 11), (7, 12), (7, 13), (9, 11), (9, 12), (9, 13)]


def test_a_runs_groups_send_its_ids_to_the_writer_once_a_flush(log, events_dir):
    """Every group of a run points at one copy of its ids in the flush. Before, each group copied
    them: a fan-out to 100 subscribers sent 800 bytes of ids a message to the writer process (24 MB
    a second at NoLag QoS 1's 3 M deliveries a second), which its gateway packed and Ray carried."""
    run = tuple(range(100, 200))
    for seq in range(1, 51):
        log.delivered(T0 + seq, meta(seq=seq), 10, run)
    log.delivered(T0 + 51, meta(seq=51), 10, [7, 8])  # a list is read at each group
    log.delivered(T0 + 52, meta(seq=52), 10, run)  # after it, the run's ids are still where they were
    taken = log._take()
    assert list(taken.ids) == [*run, 7, 8]
    groups = [struct.unpack_from("<7q", taken.groups[0], offset)
              for offset in range(0, taken.groups_end, struct.calcsize("<7q"))]
    assert [(count, at) for *_, count, at in groups] == [(100, 0)] * 50 + [(2, 100), (100, 0)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["run", "other", "list", "one", "in"])),
                min_size=1, max_size=40))
def test_groups_and_messages_in_any_time_order_each_keep_their_own_ids(tmp_path_factory, steps):
    """Runs, other tuples, lists, groups of one and accepted messages, their times out of order
    (the rows are sorted by time at the writer): every event carries its own group's ids."""
    directory = tmp_path_factory.mktemp("events")
    log = EventLog(directory, GATEWAY, retention_hours=KEEP_FOREVER)
    run, expected = (11, 12, 13), []
    try:
        for seq, (ts, kind) in enumerate(steps, 1):
            ids = {"run": run, "other": (seq, seq + 1000, seq + 2000), "list": [seq, seq + 500], "one": (seq,),
                   "in": (seq,)}[kind]
            if kind == "in":
                log.ingress(T0 + ts, meta(seq=seq), None, 10, seq)
            else:
                log.delivered(T0 + ts, meta(seq=seq), 10, ids)
            expected += [(T0 + ts, seq, connection) for connection in ids]
        written(log)
    finally:
        log.close()
    assert sorted((r["ts_ns"], r["msg_seq"], r["connection"]) for r in read_events(directory).to_pylist()) == \
        sorted(expected)


def test_delivered_groups_keep_their_own_meta_and_latency(log, events_dir):
    log.delivered(T0 + 100, meta(seq=1, t0=T0, dialect="signal", kind="a", topic="t1"), 10, [1, 2])
    log.delivered(T0 + 900, meta(seq=2, t0=T0 + 400, dialect="mqtt", kind="b", topic="t2"), 20, [3])
    written(log)
    assert [
        (r["ts_ns"], r["connection"], r["msg_seq"], r["dialect"], r["kind"], r["topic"], r["bytes"], r["latency_ns"])
        for r in read_rows(events_dir)
    ] == [
        (T0 + 100, 1, 1, "signal", "a", "t1", 10, 100),
        (T0 + 100, 2, 1, "signal", "a", "t1", 10, 100),
        (T0 + 900, 3, 2, "mqtt", "b", "t2", 20, 500),
    ]


def test_delivered_group_without_connections_adds_no_rows(log, events_dir):
    log.delivered(T0 + 100, meta(seq=1), 10, ())
    log.delivered(T0 + 200, meta(seq=2), 10, (5,))
    written(log)
    assert [(r["msg_seq"], r["connection"]) for r in read_rows(events_dir)] == [(2, 5)]
    assert log.rows_written == 1


def test_a_group_without_connections_leaves_nothing_in_the_files_dictionaries(log, events_dir):
    """A group every delivery of which failed has no connection left: no row, and its stream's
    strings (kind, topic, origin) are not in the file's dictionaries either; nor are those of a
    group refused for a bad id (one of several, or its only one)."""
    log.delivered(T0 + 100, meta(seq=1, origin=OTHER_GATEWAY, kind="hub:ghost", topic="rooms/nobody"), 10, [])
    for bad in ((7, "not an id"), ("not an id",)):
        with pytest.raises((TypeError, struct.error)):
            log.delivered(T0 + 150, meta(seq=3, origin="gw-bad", kind="hub:bad", topic="rooms/bad"), 10, bad)
    log.delivered(T0 + 200, meta(seq=2), 10, (5,))
    written(log)
    [path] = events_dir.rglob("*.parquet")
    table = pq.read_table(path, columns=["kind", "topic", "origin"], read_dictionary=["kind", "topic", "origin"])
    assert {name: table.column(name).unify_dictionaries().chunk(0).dictionary.to_pylist()
            for name in ("kind", "topic", "origin")} == {"kind": ["hub:publish"], "topic": ["rooms/lobby"],
                                                         "origin": [GATEWAY]}


def test_dropped_is_one_out_row_with_latency_and_reason(log, events_dir):
    log.dropped(T0 + 2_000, meta(seq=10, origin=OTHER_GATEWAY), 300, 21, "slow_consumer")
    written(log)
    assert read_rows(events_dir) == [
        row(ts_ns=T0 + 2_000, dialect="signal", direction="out", kind="hub:publish", topic="rooms/lobby",
            gateway=GATEWAY, connection=21, origin=OTHER_GATEWAY, msg_seq=10, protocol_id=None, bytes=300,
            latency_ns=2_000, outcome="dropped", reason="slow_consumer"),
    ]


def test_unroutable_drop_has_connection_minus_one(log, events_dir):
    log.dropped(T0 + 50, meta(seq=11), 30, -1, "no_route")
    written(log)
    [only] = read_rows(events_dir)
    assert (only["connection"], only["outcome"], only["reason"], only["latency_ns"]) == (-1, "dropped", "no_route", 50)


def test_one_flush_writes_every_kind_of_record_together(log, events_dir):
    m = meta(seq=42, t0=T0)
    log.ingress(T0, m, "p-42", 100, 1)
    log.delivered(T0 + 10, m, 100, (2, 3))
    log.dropped(T0 + 20, m, 100, 4, "slow_consumer")
    log.rejected(T0 + 30, meta(seq=43, t0=T0 + 30), "p-43", 50, 1, "too_large")
    written(log)
    assert [(r["ts_ns"] - T0, r["direction"], r["connection"], r["outcome"], r["latency_ns"], r["reason"])
            for r in read_rows(events_dir)] == [
        (0, "in", 1, "accepted", None, None),
        (10, "out", 2, "delivered", 10, None),
        (10, "out", 3, "delivered", 10, None),
        (20, "out", 4, "dropped", 20, "slow_consumer"),
        (30, "in", 1, "rejected", None, "too_large"),
    ]
    [path] = files_under(events_dir)
    assert pq.read_schema(events_dir / path).equals(FILE_SCHEMA)
    table = pq.read_table(events_dir / path)
    assert list(zip(table["outcome"].to_pylist(), table["connections"].to_pylist())) == [
        ("accepted", [1]), ("delivered", [2, 3]), ("dropped", [4]), ("rejected", [1])]


def test_files_of_the_earlier_layout_read_as_events_beside_new_ones(log, events_dir):
    """A log written before fan-out groups became one row (a row per delivery, ``connection``)
    reads as it did, alone or in one folder with files of groups."""
    old = events_dir / "date=2026-03-01" / "hour=09"
    old.mkdir(parents=True)
    before = [row(ts_ns=T0 - HOUR_NS, dialect="signal", direction="out", kind="hub:publish", topic="rooms/lobby",
                  gateway=GATEWAY, connection=c, origin=GATEWAY, msg_seq=1, bytes=5, latency_ns=3, outcome="delivered")
              for c in (8, 9)]
    pq.write_table(pa.Table.from_pylist(before, schema=SCHEMA), old / f"{GATEWAY}-old-0-0-2.parquet")
    assert read_events(old).to_pylist() == before
    log.delivered(T0, meta(seq=2), 5, (4, 5, 6))
    written(log)
    assert [(r["msg_seq"], r["connection"]) for r in read_rows(events_dir)] == [(1, 8), (1, 9), (2, 4), (2, 5), (2, 6)]


def test_a_row_without_connections_reads_as_one_event_without_one():
    """A null list (a flush written with every column optional) or an empty one (which the log
    never writes) is one event with no connection, as Spark's ``explode_outer`` reads it."""
    base = row(ts_ns=T0, dialect="signal", direction="out", gateway=GATEWAY, origin=GATEWAY, msg_seq=1, bytes=5,
               outcome="dropped")
    rows = [{**{k: v for k, v in base.items() if k != "connection"}, "connections": ids} for ids in ([], None, [3])]
    table = pa.Table.from_pylist(rows, schema=eventlog._NULLABLE_SCHEMA)
    assert [r["connection"] for r in read_events(table).to_pylist()] == [None, None, 3]
    assert eventlog._events(table) == 3


def test_a_group_of_a_thousand_is_one_row_and_a_thousand_events(log, events_dir):
    ids = tuple(range(1000, 2000))
    log.ingress(T0, meta(seq=1), "m", 10, 1)
    log.delivered(T0 + 5, meta(seq=1), 10, ids)
    written(log)
    [path] = files_under(events_dir)
    table = pq.read_table(events_dir / path)
    assert table.num_rows == 2 and table["connections"].to_pylist() == [[1], list(ids)]
    assert (log.rows_written, log.events_written) == (2, 1001)
    assert [r["connection"] for r in read_events(table).to_pylist()] == [1, *ids]


def test_rows_in_a_file_are_sorted_by_timestamp(log, events_dir):
    log.ingress(T0 + 30, meta(seq=3), None, 1, 1)
    log.delivered(T0 + 10, meta(seq=1), 1, (1,))
    log.ingress(T0 + 20, meta(seq=2), None, 1, 1)
    log.dropped(T0, meta(seq=0), 1, 1, "slow_consumer")
    written(log)
    [path] = files_under(events_dir)
    assert pq.read_table(events_dir / path)["ts_ns"].to_pylist() == [T0, T0 + 10, T0 + 20, T0 + 30]
    # the time's range is in the file's statistics, for a reader to skip the file
    stats = pq.ParquetFile(events_dir / path).metadata.row_group(0).column(SCHEMA.names.index("ts_ns")).statistics
    assert (stats.min, stats.max) == (T0, T0 + 30)


def test_rows_of_the_same_timestamp_keep_the_order_they_were_recorded_in(log, events_dir):
    log.delivered(T0 + 10, meta(seq=1), 1, (5, 6))
    log.ingress(T0 + 10, meta(seq=2), "b", 1, 1)
    log.ingress(T0, meta(seq=3), "a", 1, 1)
    written(log)
    [path] = files_under(events_dir)
    table = pq.read_table(events_dir / path)
    assert list(zip(table["ts_ns"].to_pylist(), table["connections"].to_pylist(), table["msg_seq"].to_pylist())) == [
        (T0, [1], 3), (T0 + 10, [1], 2), (T0 + 10, [5, 6], 1)]  # accepted ones are built first
    assert [(r["ts_ns"], r["connection"], r["msg_seq"]) for r in read_events(table).to_pylist()] == [
        (T0, 1, 3), (T0 + 10, 1, 2), (T0 + 10, 5, 1), (T0 + 10, 6, 1)]


# Any mix of records, as a reference builds their rows: each record's row (a group's with its
# connections; read_events makes it a row per connection) in the order the log takes them (rejections and drops, then accepted messages, then
# groups, each in the order recorded), sorted stably by timestamp. Chunks of 3 records, so a flush
# spans several; timestamps collide often, as a fan-out's and its publish's do.
_RECORD = st.tuples(
    st.sampled_from(["ingress", "delivered", "dropped", "rejected"]),
    st.integers(0, 6),  # ts_ns - T0
    st.integers(0, 5),  # latency (ingress ts_ns = ts_ns - latency)
    st.sampled_from([GATEWAY, OTHER_GATEWAY]),
    st.sampled_from(["signal", "nolag"]),
    st.sampled_from(["hub:publish", "message", None]),
    st.sampled_from(["rooms/a", "rooms/b", None]),
    st.sampled_from([None, "p-1", "p-2"]),
    st.lists(st.integers(1, 9), max_size=4),  # a group's connections (the first for one-connection records)
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_RECORD, max_size=25))
def test_a_flush_writes_every_record_as_a_reference_would_in_timestamp_order(tmp_path_factory, records):
    directory = tmp_path_factory.mktemp("events")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(eventlog, "CHUNK_RECORDS", 3)
        patch.setattr(eventlog, "_NO_PROTOCOL_IDS", (None,) * 3)
        patch.setattr(eventlog, "_INGRESS_CHUNK", 3 * eventlog._INGRESS_SIZE)
        patch.setattr(eventlog, "_GROUP_CHUNK", 3 * eventlog._GROUP_SIZE)
        log = EventLog(directory, GATEWAY, retention_hours=KEEP_FOREVER)
        rows, accepted, groups = [], [], []
        for seq, (kind, offset, latency, origin, dialect, message_kind, topic, protocol_id, connections) in enumerate(
                records):
            ts = T0 + offset
            m = meta(seq=seq, t0=ts - latency, origin=origin, dialect=dialect, kind=message_kind, topic=topic)
            common = dict(ts_ns=ts, dialect=dialect, kind=message_kind, topic=topic, gateway=GATEWAY, origin=origin,
                          msg_seq=seq, bytes=10 + seq)
            connection = connections[0] if connections else -1
            if kind == "ingress":
                log.ingress(ts, m, protocol_id, 10 + seq, connection)
                accepted.append(row(**common, direction="in", connection=[connection], protocol_id=protocol_id,
                                    outcome="accepted"))
            elif kind == "delivered":
                log.delivered(ts, m, 10 + seq, tuple(connections))
                if connections:  # a group of none has no row
                    groups.append(row(**common, direction="out", connection=list(connections), latency_ns=latency,
                                      outcome="delivered"))
            elif kind == "dropped":
                log.dropped(ts, m, 10 + seq, connection, "slow_consumer")
                rows.append(row(**common, direction="out", connection=[connection], latency_ns=latency,
                                outcome="dropped", reason="slow_consumer"))
            else:
                log.rejected(ts, m, protocol_id, 10 + seq, connection, "too_large")
                rows.append(row(**common, direction="in", connection=[connection], protocol_id=protocol_id,
                                outcome="rejected", reason="too_large"))
        expected = sorted(rows + accepted + groups, key=lambda each: each["ts_ns"])  # stable
        events = [{**each, "connection": one} for each in expected for one in each["connection"]]
        expected = [{("connections" if name == "connection" else name): value for name, value in each.items()}
                    for each in expected]
        future = log.flush()
        if future is not None:
            assert future.result(timeout=WAIT) is None
        log.close()
    paths = files_under(directory)
    assert len(paths) == (1 if expected else 0)
    for path in paths:
        table = pq.read_table(directory / path)
        assert table.schema.equals(FILE_SCHEMA)
        assert table.to_pylist() == expected
        assert read_events(table).to_pylist() == events
        assert read_events(table).schema.equals(SCHEMA)


# -- flushing -------------------------------------------------------------------------------------


def test_flush_returns_a_future_of_the_write(log, events_dir):
    log.ingress(T0, meta(), None, 1, 1)
    future = log.flush()
    assert isinstance(future, Future)
    assert future.result(timeout=WAIT) is None
    assert log.rows_written == 1


def test_the_gateways_flush_waits_for_a_write_the_periodic_flush_started(log, events_dir):
    """`flush_events` (what `router bench` and the analytics tests wait on before they count events)
    must not answer while an earlier flush is still being written: with nothing left to hand over,
    it waited for nothing and read a stale row count."""
    import asyncio
    from types import SimpleNamespace

    from gateways.gateway import Gateway

    started, release = threading.Event(), threading.Event()
    write = log.write

    def held(rows, packed=None):
        started.set()
        assert release.wait(WAIT)
        return write(rows, packed)

    log.write = held
    log.ingress(T0, meta(seq=1), None, 1, 1)
    assert log.flush() is not None  # the periodic flush: its write is held
    assert started.wait(WAIT)

    async def settle() -> int:
        task = asyncio.ensure_future(Gateway.flush_events(SimpleNamespace(events=log)))
        for _ in range(20):  # loop turns, no clock: the task must still be waiting for the write
            await asyncio.sleep(0)
        assert not task.done()
        release.set()
        return await asyncio.wait_for(task, WAIT)

    try:
        assert asyncio.run(settle()) == 1
    finally:
        release.set()
    assert log.rows_written == 1


def test_flush_with_nothing_buffered_returns_none_and_writes_nothing(log, events_dir):
    assert log.flush() is None
    assert files_under(events_dir) == []
    assert (log.rows_written, log.files_written) == (0, 0)


def test_flush_empties_the_buffers(log, events_dir):
    log.ingress(T0, meta(), None, 1, 1)
    log.delivered(T0 + 1, meta(), 1, (2,))
    written(log)
    assert log.flush() is None
    assert (log.rows_written, log.files_written) == (2, 1)


def test_close_flushes_what_is_buffered_and_waits(events_dir):
    log = EventLog(events_dir, GATEWAY, retention_hours=KEEP_FOREVER)
    log.ingress(T0, meta(seq=1), None, 1, 1)
    log.delivered(T0 + 5, meta(seq=1), 1, (2, 3))
    log.close()
    assert (log.rows_written, log.events_written, log.files_written) == (2, 3, 1)
    assert [(r["msg_seq"], r["connection"]) for r in read_rows(events_dir)] == [(1, 1), (1, 2), (1, 3)]


def test_close_waits_for_earlier_flushes_too(events_dir):
    log = EventLog(events_dir, GATEWAY, retention_hours=KEEP_FOREVER)
    log.ingress(T0, meta(seq=1), None, 1, 1)
    log.flush()
    log.ingress(T0 + 1, meta(seq=2), None, 1, 1)
    log.close()
    assert (log.rows_written, log.files_written) == (2, 2)
    assert [r["msg_seq"] for r in read_rows(events_dir)] == [1, 2]


def test_close_with_nothing_buffered_writes_nothing(events_dir):
    log = EventLog(events_dir, GATEWAY, retention_hours=KEEP_FOREVER)
    log.close()
    assert files_under(events_dir) == []


def test_a_failed_write_is_logged_not_raised(log, events_dir, caplog):
    (events_dir / "date=2026-03-01").write_text("a file where the date folder should be")
    log.ingress(T0, meta(), None, 1, 1)
    with caplog.at_level(logging.ERROR, logger="router.eventlog"):
        written(log)
    assert [r.getMessage() for r in caplog.records] == ["event log: writing 1 records failed"]
    assert (log.rows_written, log.files_written) == (0, 0)


# -- partitioning ---------------------------------------------------------------------------------


def test_records_land_in_the_folder_of_their_utc_hour(log, events_dir):
    last_of_10 = at(2026, 3, 1, 10, 59, 59, 999_999_999)
    first_of_11 = at(2026, 3, 1, 11)
    log.ingress(last_of_10, meta(seq=1), None, 1, 1)
    log.ingress(first_of_11, meta(seq=2), None, 1, 1)
    log.delivered(first_of_11 + 7, meta(seq=2, t0=first_of_11), 1, (2, 3))
    written(log)
    assert files_under(events_dir) == [
        f"date=2026-03-01/hour=10/{GATEWAY}-{log.node}-{last_of_10}-0-1.parquet",
        f"date=2026-03-01/hour=11/{GATEWAY}-{log.node}-{first_of_11}-1-2.parquet",  # its rows: the group is one
    ]
    day = events_dir / "date=2026-03-01"
    hour_10 = pq.read_table(day / "hour=10" / f"{GATEWAY}-{log.node}-{last_of_10}-0-1.parquet")
    hour_11 = pq.read_table(day / "hour=11" / f"{GATEWAY}-{log.node}-{first_of_11}-1-2.parquet")
    assert hour_10["msg_seq"].to_pylist() == [1]
    assert hour_11["msg_seq"].to_pylist() == [2, 2]
    assert hour_11["connections"].to_pylist() == [[1], [2, 3]]


def test_a_file_of_a_flush_that_spans_hours_holds_only_its_own_strings(log, events_dir):
    """A part of a flush keeps its own values only: a topic of the next hour is not in the
    dictionary of the file of this one (which a reader would take for a value it holds)."""
    last_of_10, first_of_11 = at(2026, 3, 1, 10, 59, 59), at(2026, 3, 1, 11)
    log.ingress(last_of_10, meta(seq=1, topic="rooms/ten"), None, 1, 1)
    log.delivered(first_of_11, meta(seq=2, t0=first_of_11, topic="rooms/eleven"), 1, (2, 3))
    written(log)
    ten, eleven = [events_dir / path for path in files_under(events_dir)]
    for path, own in ((ten, ["rooms/ten"]), (eleven, ["rooms/eleven"])):  # the file's dictionary, as stored
        assert pq.read_table(path, read_dictionary=["topic"])["topic"].chunk(0).dictionary.to_pylist() == own
    assert pq.read_table(ten)["topic"].to_pylist() == ["rooms/ten"]
    assert pq.read_table(eleven)["topic"].to_pylist() == ["rooms/eleven"]
    assert pq.read_schema(ten).equals(FILE_SCHEMA) and pq.read_schema(eleven).equals(FILE_SCHEMA)


def test_partitions_follow_the_utc_date_across_midnight(log, events_dir):
    before = at(2026, 2, 28, 23, 59, 59)
    after = at(2026, 3, 1, 0, 0, 0)
    log.ingress(before, meta(seq=1), None, 1, 1)
    log.ingress(after, meta(seq=2), None, 1, 1)
    written(log)
    assert files_under(events_dir) == [
        f"date=2026-02-28/hour=23/{GATEWAY}-{log.node}-{before}-0-1.parquet",
        f"date=2026-03-01/hour=00/{GATEWAY}-{log.node}-{after}-1-1.parquet",
    ]


def test_file_name_is_gateway_node_first_timestamp_flush_number_and_row_count(log, events_dir):
    log.ingress(T0 + 300, meta(seq=1), None, 1, 1)
    log.delivered(T0 + 100, meta(seq=0), 1, (1, 2, 3, 4))
    written(log)
    [path] = files_under(events_dir)
    assert Path(path).name == f"{GATEWAY}-{log.node}-{T0 + 100}-0-2.parquet"  # rows: the group of 4 is one
    assert Path(path).name.startswith(GATEWAY)


def test_each_flush_writes_its_own_file(log, events_dir):
    log.ingress(T0, meta(seq=1), None, 1, 1)
    written(log)
    log.ingress(T0 + 1, meta(seq=2), None, 1, 1)
    log.ingress(T0 + 2, meta(seq=3), None, 1, 1)
    written(log)
    assert files_under(events_dir) == [
        f"date=2026-03-01/hour=10/{GATEWAY}-{log.node}-{T0}-0-1.parquet",
        f"date=2026-03-01/hour=10/{GATEWAY}-{log.node}-{T0 + 1}-1-2.parquet",
    ]


def test_two_flushes_starting_in_the_same_nanosecond_keep_both_files(log, events_dir):
    log.ingress(T0, meta(seq=1), None, 1, 1)
    written(log)
    log.ingress(T0, meta(seq=2), None, 1, 1)
    written(log)
    assert files_under(events_dir) == [
        f"date=2026-03-01/hour=10/{GATEWAY}-{log.node}-{T0}-0-1.parquet",
        f"date=2026-03-01/hour=10/{GATEWAY}-{log.node}-{T0}-1-1.parquet",
    ]
    assert [r["msg_seq"] for r in read_rows(events_dir)] == [1, 2]


def test_no_temporary_or_hidden_files_remain(log, events_dir):
    for hour in range(3):
        log.ingress(T0 + hour * HOUR_NS, meta(seq=hour), None, 1, 1)
    written(log)
    paths = files_under(events_dir)
    assert len(paths) == 3
    assert [p for p in paths if any(part.startswith(".") for part in p.split("/")) or p.endswith(".tmp")] == []


def test_counters_count_rows_events_and_files_across_flushes(log, events_dir):
    assert (log.rows_written, log.events_written, log.files_written) == (0, 0, 0)
    log.ingress(T0, meta(seq=1), None, 1, 1)
    log.ingress(T0 + HOUR_NS, meta(seq=2), None, 1, 1)
    written(log)
    assert (log.rows_written, log.events_written, log.files_written) == (2, 2, 2)
    log.delivered(T0 + 1, meta(seq=1), 1, (4, 5, 6))
    log.dropped(T0 + 2, meta(seq=1), 1, 7, "slow_consumer")
    written(log)
    assert (log.rows_written, log.events_written, log.files_written) == (4, 6, 3)


def test_two_gateways_share_a_directory_without_clashing(events_dir):
    a = EventLog(events_dir, "gw-a", retention_hours=KEEP_FOREVER)
    b = EventLog(events_dir, "gw-b", retention_hours=KEEP_FOREVER)
    a.ingress(T0, meta(seq=1, origin="gw-a"), None, 1, 1)
    b.ingress(T0, meta(seq=1, origin="gw-b"), None, 1, 1)
    a.close()
    b.close()
    assert files_under(events_dir) == [
        f"date=2026-03-01/hour=10/gw-a-{a.node}-{T0}-0-1.parquet",
        f"date=2026-03-01/hour=10/gw-b-{b.node}-{T0}-0-1.parquet",
    ]


def test_two_nodes_writing_the_same_gateway_id_and_records_keep_both_files(events_dir, monkeypatch):
    # Two writers on shared storage with one gateway id, the same first timestamp, flush number and
    # row count: the node part of the name keeps them apart. The two nodes' ids are given: this
    # process may be a Ray driver (the test session's), and then both writers would be on its node.
    nodes = iter(["0123456789ab", "ba9876543210"])
    monkeypatch.setattr(eventlog, "_node_tag", lambda: next(nodes))
    a = EventLog(events_dir, GATEWAY, retention_hours=KEEP_FOREVER)
    b = EventLog(events_dir, GATEWAY, retention_hours=KEEP_FOREVER)
    a.ingress(T0, meta(seq=1), None, 1, 1)
    b.ingress(T0, meta(seq=2), None, 1, 1)
    a.close()
    b.close()
    assert a.node != b.node
    assert files_under(events_dir) == sorted([
        f"date=2026-03-01/hour=10/{GATEWAY}-{a.node}-{T0}-0-1.parquet",
        f"date=2026-03-01/hour=10/{GATEWAY}-{b.node}-{T0}-0-1.parquet",
    ])
    assert sorted(r["msg_seq"] for r in read_rows(events_dir)) == [1, 2]


def test_the_node_part_outside_ray_is_twelve_hex_digits(log):
    assert re.fullmatch(r"[0-9a-f]{12}", log.node)


# -- a folder or a URL ----------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["file URL", "file URL passed through Path"])
def test_a_file_url_writes_the_same_files_as_a_path(events_dir, form):
    url = events_dir.as_uri()  # file:///…
    # Path(url) is file:/… (one slash): a caller that wraps the setting in Path passes that.
    log = EventLog(url if form == "file URL" else Path(url), GATEWAY, retention_hours=KEEP_FOREVER)
    assert events_dir.is_dir()
    log.ingress(T0, meta(seq=1), None, 1, 1)
    log.delivered(T0 + HOUR_NS, meta(seq=1), 1, (4, 5))
    log.close()
    assert files_under(events_dir) == [
        f"date=2026-03-01/hour=10/{GATEWAY}-{log.node}-{T0}-0-1.parquet",
        f"date=2026-03-01/hour=11/{GATEWAY}-{log.node}-{T0 + HOUR_NS}-1-1.parquet",
    ]
    assert [r["connection"] for r in read_rows(events_dir)] == [1, 4, 5]
    assert (log.rows_written, log.events_written, log.files_written) == (2, 3, 2)


def test_an_unknown_url_scheme_fails_at_construction(events_dir):
    with pytest.raises(pa.ArrowInvalid, match="Unrecognized filesystem type in URI: nosuchfs://x/events"):
        EventLog("nosuchfs://x/events", GATEWAY)


# -- sampling -------------------------------------------------------------------------------------


def test_sample_rate_one_samples_every_message(events_dir):
    log = EventLog(events_dir, GATEWAY, sample_rate=1)
    assert [seq for seq in range(10) if log.sampled(seq)] == list(range(10))
    log.close()


def test_sample_rate_a_quarter_samples_every_fourth_sequence_number(events_dir):
    log = EventLog(events_dir, GATEWAY, sample_rate=0.25)
    assert [seq for seq in range(20) if log.sampled(seq)] == [0, 4, 8, 12, 16]
    log.close()


def test_sample_rate_zero_samples_nothing(events_dir):
    log = EventLog(events_dir, GATEWAY, sample_rate=0)
    assert [seq for seq in range(20) if log.sampled(seq)] == []
    log.close()


def test_sample_rate_is_rounded_to_one_in_n(events_dir):
    log = EventLog(events_dir, GATEWAY, sample_rate=0.3)  # 1 / 0.3 = 3.33 -> every 3rd
    assert [seq for seq in range(10) if log.sampled(seq)] == [0, 3, 6, 9]
    log.close()


# -- retention ------------------------------------------------------------------------------------


def hour_folder(directory: Path, ts_ns: int) -> Path:
    stamp = time.gmtime(ts_ns // 1_000_000_000)
    return directory / f"date={time.strftime('%Y-%m-%d', stamp)}" / f"hour={stamp.tm_hour:02d}"


def old_folder(directory: Path, ts_ns: int) -> Path:
    """An hour folder of an earlier run, holding one (dummy) file."""
    folder = hour_folder(directory, ts_ns)
    folder.mkdir(parents=True)
    (folder / "gw-old-1-1.parquet").write_bytes(b"old")
    return folder


def test_retention_removes_hour_folders_older_than_retention_and_their_empty_date(events_dir):
    now = time.time_ns()
    stale = old_folder(events_dir, now - 30 * 24 * HOUR_NS)
    log = EventLog(events_dir, GATEWAY, retention_hours=24)
    log.ingress(now, meta(t0=now), None, 1, 1)
    written(log)
    log.close()
    assert not stale.exists()
    assert not stale.parent.exists()
    current = hour_folder(events_dir, now)
    assert [p.name for p in current.iterdir()] == [f"{GATEWAY}-{log.node}-{now}-0-1.parquet"]


def test_retention_keeps_hour_folders_within_retention(events_dir):
    now = time.time_ns()
    recent = old_folder(events_dir, now - 2 * HOUR_NS)
    log = EventLog(events_dir, GATEWAY, retention_hours=24)
    log.ingress(now, meta(t0=now), None, 1, 1)
    written(log)
    log.close()
    assert [p.name for p in recent.iterdir()] == ["gw-old-1-1.parquet"]


def test_retention_keeps_a_date_folder_that_still_has_recent_hours(events_dir):
    # Two folders of one old date: retention is set so its cutoff falls at noon of that date, so
    # hour 00 is past it and hour 23 is not (a clock tick to the next hour moves the cutoff to 13:00).
    now = time.time_ns()
    day_hour = (now // HOUR_NS // 24 - 41) * 24  # midnight UTC 41 days ago, in epoch hours
    expired = old_folder(events_dir, day_hour * HOUR_NS)
    kept = old_folder(events_dir, (day_hour + 23) * HOUR_NS)
    log = EventLog(events_dir, GATEWAY, retention_hours=now // HOUR_NS - (day_hour + 12))
    log.ingress(now, meta(t0=now), None, 1, 1)
    written(log)
    log.close()
    assert not expired.exists()
    assert [p.name for p in kept.iterdir()] == ["gw-old-1-1.parquet"]


def test_retention_leaves_folders_it_cannot_parse_alone(events_dir):
    odd = events_dir / "date=someday" / "hour=noon"
    odd.mkdir(parents=True)
    (odd / "x.parquet").write_bytes(b"x")
    now = time.time_ns()
    log = EventLog(events_dir, GATEWAY, retention_hours=1)
    log.ingress(now, meta(t0=now), None, 1, 1)
    written(log)
    log.close()
    assert (odd / "x.parquet").read_bytes() == b"x"


def test_retention_runs_at_most_every_ten_minutes(events_dir):
    now = time.time_ns()
    log = EventLog(events_dir, GATEWAY, retention_hours=24)
    log.ingress(now, meta(t0=now), None, 1, 1)
    written(log)  # the first write applies retention
    stale = old_folder(events_dir, now - 30 * 24 * HOUR_NS)
    log.ingress(now + 1, meta(t0=now), None, 1, 1)
    written(log)  # within 600 s of the last run: not applied again
    assert stale.is_dir()
    log._last_retention -= 601  # as if ten minutes had passed
    log.ingress(now + 2, meta(t0=now), None, 1, 1)
    written(log)
    log.close()
    assert not stale.exists()


def test_retention_on_a_file_url(events_dir):
    now = time.time_ns()
    stale = old_folder(events_dir, now - 30 * 24 * HOUR_NS)
    recent = old_folder(events_dir, now - 2 * HOUR_NS)
    log = EventLog(events_dir.as_uri(), GATEWAY, retention_hours=24)
    log.ingress(now, meta(t0=now), None, 1, 1)
    written(log)
    log.close()
    assert not stale.exists()
    assert not stale.parent.exists()
    assert [p.name for p in recent.iterdir()] == ["gw-old-1-1.parquet"]
    assert [p.name for p in hour_folder(events_dir, now).iterdir()] == [f"{GATEWAY}-{log.node}-{now}-0-1.parquet"]


def test_retention_removes_an_empty_date_folder_only_once_its_whole_day_is_past(events_dir):
    # Another writer may have just created a date folder for its first hour (its clock a little
    # ahead): an empty date folder goes only when every hour of its day is past retention.
    now = time.time_ns()
    past_day = hour_folder(events_dir, now - 30 * 24 * HOUR_NS).parent
    next_day = hour_folder(events_dir, now + 24 * HOUR_NS).parent
    past_day.mkdir(parents=True)
    next_day.mkdir(parents=True)
    log = EventLog(events_dir, GATEWAY, retention_hours=24)
    log.ingress(now, meta(t0=now), None, 1, 1)
    written(log)
    log.close()
    assert not past_day.exists()
    assert next_day.is_dir()


def test_retention_goes_on_when_another_writer_pruned_a_folder_first(log, events_dir):
    assert log._delete(str(events_dir / "date=2026-01-01" / "hour=00")) is None


def test_buffered_records_leave_the_garbage_collector_at_its_first_look(tmp_path):
    """A record that held the message's meta (a tuple) stayed tracked past the youngest collection
    (the collector reaches a record before its meta, and keeps a tuple that holds a tracked one), so
    every buffered record was walked again by the next middle-generation collection: 100-500 ms
    each in a gateway under a flood."""
    import gc

    log = EventLog(tmp_path, GATEWAY, retention_hours=KEEP_FOREVER)
    try:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            for seq in range(50):
                each = meta(seq=seq, topic=f"rooms/{seq}")  # a fresh tuple a message, as a gateway makes them
                log.ingress(T0 + seq, each, f"id-{seq}", 100, seq)
                log.delivered(T0 + seq + 1, each, 100, (seq,))
                log.delivered(T0 + seq + 2, each, 100, [seq, seq + 1, seq + 2])
                log.dropped(T0 + seq + 3, each, 100, seq, "slow_consumer")
            log.rejected(T0, meta(seq=99), None, 100, 1, "rate_limited")
            gc.collect(0)
            # Accepted messages and deliveries are packed (no object a message); drops and rejections
            # are tuples, and the flush's stream table holds tuples of strings.
            assert [record for record in log._rows + list(log._streams) if gc.is_tracked(record)] == []
        finally:
            if was_enabled:
                gc.enable()
        log.flush().result(WAIT)
        rows = read_rows(tmp_path)
        assert len(rows) == 50 * 6 + 1
        delivered = sorted((r["msg_seq"], r["connection"]) for r in rows if r["outcome"] == "delivered")
        assert delivered == sorted([(seq, seq) for seq in range(50)] + [(seq, seq + k) for seq in range(50)
                                                                        for k in range(3)])
        assert {r["topic"] for r in rows if r["msg_seq"] == 7} == {"rooms/7"}
    finally:
        log.close()


def test_records_filling_several_chunks_are_all_written_and_the_chunks_serve_the_next_flush(log, events_dir):
    """Accepted messages and fan-out groups are packed into chunks of CHUNK_RECORDS records; a flush
    hands over every chunk filled, and once written they take the next flush's records (a new
    chunk would be memory the system hands in again, page by page)."""
    count = 2 * eventlog.CHUNK_RECORDS + 5
    for seq in range(count):
        each = meta(seq=seq, t0=T0 + seq, topic=f"rooms/{seq % 3}")
        log.ingress(T0 + seq, each, f"id-{seq}" if seq % 1000 == 999 else None, 10, seq)
        log.delivered(T0 + seq + 1, each, 20, (seq,) if seq % 2 else (seq, seq + 1))
    log.delivered(T0, meta(seq=count), 20, ())  # no connection: no row
    chunks = [chunk for chunk, _ in log._ingress_full] + [log._ingress_chunk] + log._groups_full + [log._group_chunk]
    assert len(chunks) == 6
    written(log)
    table = read_events(events_dir)  # an event a row
    assert table.num_rows == count + count + count // 2 + (count + 1) // 2 - count // 2
    accepted = table.filter(pa.compute.equal(table["outcome"], "accepted")).sort_by("msg_seq").to_pydict()
    assert accepted["msg_seq"] == list(range(count)) and accepted["connection"] == list(range(count))
    assert accepted["protocol_id"] == [f"id-{seq}" if seq % 1000 == 999 else None for seq in range(count)]
    assert accepted["topic"] == [f"rooms/{seq % 3}" for seq in range(count)]
    assert set(accepted["latency_ns"]) == {None} and set(accepted["direction"]) == {"in"}
    delivered = table.filter(pa.compute.equal(table["outcome"], "delivered"))
    pairs = sorted(zip(delivered["msg_seq"].to_pylist(), delivered["connection"].to_pylist()))
    assert pairs == sorted([(seq, seq) for seq in range(count)] + [(seq, seq + 1) for seq in range(0, count, 2)])
    assert set(delivered["latency_ns"].to_pylist()) == {1} and set(delivered["bytes"].to_pylist()) == {20}
    # Written, the chunks wait in the pool, their protocol ids let go; the next records go into them.
    free = [chunk for chunk, _ in log._free_ingress] + log._free_groups
    assert {id(chunk) for chunk in free} == {id(chunk) for chunk in chunks}
    assert all(ids == [None] * eventlog.CHUNK_RECORDS for _, ids in log._free_ingress)
    log.ingress(T0, meta(seq=count + 1), None, 10, 1)
    log.delivered(T0, meta(seq=count + 1), 10, (1,))
    assert id(log._ingress_chunk) in {id(chunk) for chunk in chunks}
    assert id(log._group_chunk) in {id(chunk) for chunk in chunks}
    written(log)
    assert len(read_rows(events_dir)) == table.num_rows + 2


def test_the_chunk_pool_keeps_at_most_its_bound(events_dir, monkeypatch):
    monkeypatch.setattr(eventlog, "POOL_CHUNKS", 2)
    log = EventLog(events_dir, GATEWAY, retention_hours=KEEP_FOREVER)
    try:
        for seq in range(3 * eventlog.CHUNK_RECORDS):
            log.ingress(T0, meta(seq=seq), None, 10, 1)
        written(log)
        assert len(log._free_ingress) == 2 and len(log._free_groups) == 0  # 2 of the 3 filled; no group chunk taken
    finally:
        log.close()


def test_the_chunk_pool_shrinks_to_what_a_quieter_flush_fills(log, events_dir):
    for seq in range(3 * eventlog.CHUNK_RECORDS):
        log.ingress(T0, meta(seq=seq), None, 10, 1)
    written(log)
    assert len(log._free_ingress) == 3  # the three it filled
    log.ingress(T0, meta(seq=0), None, 10, 1)
    written(log)  # one chunk, taken from the pool: the pool keeps two
    assert len(log._free_ingress) == 2


def test_a_flush_sent_to_a_writer_process_out_of_band_writes_the_same_rows(events_dir):
    """A remote writer gets the chunks and ids as pickle buffers and the protocol ids pickled per chunk
    (``_for_transfer``); pickled as Ray does it (protocol 5, buffers apart), it writes what the
    gateway recorded."""
    import pickle

    gateway = EventLog(events_dir / "unused", GATEWAY, remote=object())
    count = eventlog.CHUNK_RECORDS + 3
    for seq in range(count):
        each = meta(seq=seq, t0=T0 + seq, topic=f"rooms/{seq % 2}")
        gateway.ingress(T0 + seq, each, f"p{seq}" if seq % 7 == 0 else None, 10, seq)
        gateway.delivered(T0 + seq + 5, each, 30, (seq, seq + 1) if seq % 3 == 0 else [seq])
    buffers: list = []
    data = pickle.dumps(eventlog._for_transfer(gateway._take()), protocol=5, buffer_callback=buffers.append)
    # Two chunks of each kind, the last only as far as it is filled, and the ids.
    assert [memoryview(buffer).nbytes for buffer in buffers] == [
        eventlog.CHUNK_RECORDS * 48, 3 * 48, eventlog.CHUNK_RECORDS * 56, 3 * 56, 8 * 2 * (count // 3 + 1)]
    loaded = pickle.loads(data, buffers=buffers)
    writer = EventLog(events_dir, GATEWAY, retention_hours=KEEP_FOREVER)
    try:
        writer.write([], loaded)
    finally:
        writer.close()
    table = read_events(events_dir)  # an event a row
    accepted = table.filter(pa.compute.equal(table["outcome"], "accepted")).sort_by("msg_seq").to_pydict()
    assert accepted["protocol_id"] == [f"p{seq}" if seq % 7 == 0 else None for seq in range(count)]
    assert accepted["connection"] == list(range(count)) and set(accepted["bytes"]) == {10}
    delivered = table.filter(pa.compute.equal(table["outcome"], "delivered"))
    assert sorted(zip(delivered["msg_seq"].to_pylist(), delivered["connection"].to_pylist(),
                      delivered["latency_ns"].to_pylist(), delivered["topic"].to_pylist())) == sorted(
        [(seq, seq, 5, f"rooms/{seq % 2}") for seq in range(count)]
        + [(seq, seq + 1, 5, f"rooms/{seq % 2}") for seq in range(0, count, 3)])


def test_a_stalled_writer_holds_at_most_the_bound_in_chunks_however_small_the_flushes(events_dir):
    """Before: a flush counted its records only, so flushes of one message each (a chunk each, 1.75
    MiB with the group's) piled up behind a stalled writer far past the bound's memory."""
    release = threading.Event()
    log = EventLog(events_dir, GATEWAY, retention_hours=KEEP_FOREVER,
                   max_unwritten_records=4 * eventlog.CHUNK_RECORDS)
    blocked = log._writer.submit(release.wait, WAIT)
    try:
        futures = []
        for seq in range(10):
            log.ingress(T0, meta(seq=seq), None, 10, 1)
            log.delivered(T0, meta(seq=seq), 10, (1,))  # a chunk of each kind: weighs two chunks
            futures.append(log.flush())
        assert [future is not None for future in futures] == [True, True] + [False] * 8
        assert log.records_dropped == 16
    finally:
        release.set()
        blocked.result(WAIT)
        log.close()
    assert sorted(r["msg_seq"] for r in read_rows(events_dir)) == [0, 0, 1, 1]


def test_a_group_with_a_bad_id_is_refused_whole_and_the_flush_goes_on(log, events_dir):
    """Before: the ids before the bad one stayed, out of step with the groups, and the flush was lost."""
    with pytest.raises(TypeError):
        log.delivered(T0, meta(seq=1), 10, [1, 2, "x"])
    log.delivered(T0 + 1, meta(seq=2), 10, [4, 5])
    log.ingress(T0 + 2, meta(seq=3), None, 10, 6)
    written(log)
    assert [(r["msg_seq"], r["connection"], r["outcome"]) for r in read_rows(events_dir)] == [
        (2, 4, "delivered"), (2, 5, "delivered"), (3, 6, "accepted")]


def test_a_bound_below_a_chunk_still_lets_a_flush_through_when_the_writer_is_idle(events_dir):
    """The configuration allows a bound of 1,000 records: a flush weighs at least a chunk (16,384),
    and was dropped every time before one flush alone was always taken."""
    log = EventLog(events_dir, GATEWAY, retention_hours=KEEP_FOREVER, max_unwritten_records=1_000)
    try:
        log.ingress(T0, meta(seq=1), None, 10, 1)
        log.delivered(T0, meta(seq=1), 10, (2,))
        written(log)
        assert log.records_dropped == 0
        assert [(r["msg_seq"], r["outcome"]) for r in read_rows(events_dir)] == [(1, "accepted"), (1, "delivered")]
    finally:
        log.close()
