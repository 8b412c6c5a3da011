"""The event log: one record per ingress, delivery and rejection, as rolled Parquet files.

Layout: ``<dir>/date=YYYY-MM-DD/hour=HH/<gateway>-<node>-<first ts>-<flush no.>-<rows>.parquet`` (UTC), one
file per flush and partition. ``<dir>`` is a local folder or a URL of pyarrow's filesystems (``file://``,
``s3://``, ``gs://``, ``hdfs://``): on a cluster every gateway of every node writes to one shared place, and
the gateway id with the node's id keeps their names apart. Where renaming is atomic (a local or shared
file system, HDFS) a file is written under a dot-name and renamed; an object store shows an object only
once its upload completed. Either way a reader never sees half a file.

A file holds a row per message received, per refusal and per drop, and a row per *fan-out group*: a
message delivered to several connections of a gateway at once is one row, whose ``connections`` lists
them (:data:`FILE_SCHEMA`). :func:`read_events` (pyarrow) and ``router.analytics.load_events`` (Spark)
give the log as :data:`SCHEMA` says, an event a row: a group's row becomes a row per connection.
Files of the earlier layout, a row per delivery with one ``connection``, read the same.

The hot path packs the two records of every message into preallocated chunks (bytearrays of fixed
size, ``struct.pack_into``): one per message received (``ingress``) and one per fan-out group (its
connection ids go to one array). A record's strings (origin, dialect, kind, topic) become a stream
number, kept in a table per flush.
So a message leaves no Python object behind it until the flush, and the chunks go back to a pool
once written: allocating a tuple per record, and freeing them all at each flush, had Python hand
its memory arenas back to the system and fault them in again (0.19 page faults a message in a
gateway, 3 µs each on a VM, docs/performance.md §7). Drops and rejections, rare, stay tuples of
atomic values (the garbage collector stops tracking them the first time it looks at them).

Every ``flush_interval_s`` the event loop hands a :class:`Flush` to a writer thread, which has the
records turned into rows with numpy and pyarrow and written. Sampling is decided per message (its
sequence number), so a sampled message keeps all its deliveries and fan-out stays exact.
"""

from __future__ import annotations

import array
import calendar
import io
import itertools
import logging
import os
import pickle
import re
import secrets
import struct
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from router.contract import META_FIELDS

logger = logging.getLogger(__name__)

# The columns the log fills itself, never null: a file holds them as required. A nullable column
# costs its definition levels and validity bits at every row, which were about a fifth of a
# flush's write (a flush of fan-out rows S=100: 107 -> 84 ns a row).
NEVER_NULL = frozenset(("ts_ns", "dialect", "direction", "gateway", "connections", "origin", "msg_seq", "bytes",
                        "outcome"))
_FIELDS = (
    ("ts_ns", pa.int64()),  # when the router saw it (UTC epoch ns)
    ("dialect", pa.string()),
    ("direction", pa.string()),  # "in" (from a client) or "out" (to a client)
    ("kind", pa.string()),  # the protocol's message type, e.g. hub:publish
    ("topic", pa.string()),  # topic, or target address for point-to-point
    ("gateway", pa.string()),  # the gateway that wrote the record
    ("connection", pa.int64()),  # opaque id, unique within its gateway
    ("origin", pa.string()),  # gateway where the message entered the router
    ("msg_seq", pa.int64()),  # with origin: the router's id of the message
    ("protocol_id", pa.string()),  # the protocol's own message id (correlationId, msgId), if any
    ("bytes", pa.int64()),
    ("latency_ns", pa.int64()),  # deliveries: egress time - ingress time
    ("outcome", pa.string()),  # accepted, delivered, rejected, dropped
    ("reason", pa.string()),  # for rejected/dropped: rate_limited, slow_consumer, ...
)
# The log as its readers see it (read_events, analytics.load_events): an event a row.
_EVENT_NEVER_NULL = NEVER_NULL - {"connections"} | {"connection"}
SCHEMA = pa.schema([pa.field(name, type_, nullable=name not in _EVENT_NEVER_NULL) for name, type_ in _FIELDS])
COLUMNS = SCHEMA.names
_EVENTS_NULLABLE = pa.schema([field.with_nullable(True) for field in SCHEMA])  # a flush written with a null in them
# As a file holds it: ``connection`` is ``connections``, the ids of a fan-out group's row (one for
# the other rows). Groups of 100 written as 100 rows each cost the writer 125 ns a delivery, as one
# row with a list of 100 ids 34 (docs/performance.md §7, nineteenth pass).
CONNECTIONS = pa.list_(pa.field("element", pa.int64(), nullable=False))
FILE_SCHEMA = pa.schema([pa.field("connections", CONNECTIONS, nullable=False) if name == "connection"
                         else pa.field(name, type_, nullable=name not in NEVER_NULL) for name, type_ in _FIELDS])
# How read_events reads a folder of files of either layout: a column a file lacks is null.
_READ_SCHEMA = pa.schema([field.with_nullable(True) for field in FILE_SCHEMA] + [pa.field("connection", pa.int64())])
# What a file is written with should one of the NEVER_NULL columns hold a null after all (a record
# from a path that sets none, a bug): every column nullable, so the flush is still written whole.
_NULLABLE_SCHEMA = pa.schema([field.with_nullable(True) for field in FILE_SCHEMA])
# A flush's table as it is built: the columns of few distinct values (a stream's fields, the
# constants) as dictionaries, whose indices repeat a handful of strings, instead of a string per row
# (sorting a table of those moved every string; Parquet hashed every one to build the dictionary it
# stores a string column as). The files hold plain strings, as FILE_SCHEMA says (written without the
# Arrow schema, a reader takes the column's Parquet type: a string).
_DICTIONARY = pa.dictionary(pa.int32(), pa.string())
_CODED = frozenset(("dialect", "direction", "kind", "topic", "gateway", "origin", "outcome"))
_BUILD_SCHEMA = pa.schema([field.with_type(_DICTIONARY) if field.name in _CODED else field for field in FILE_SCHEMA])
_BUILD_NULLABLE = pa.schema([field.with_nullable(True) for field in _BUILD_SCHEMA])
# How a file is written: zstd; without the Arrow schema (above); min/max statistics for the columns
# that are not coded (the coded ones' took a third of the write: a reader filters them by the
# dictionary Parquet keeps of each, and by the folders for the time); a dictionary only for the
# columns of few values. A timestamp, a sequence number, a latency or a protocol id is new at
# nearly every message: hashing each into a dictionary that overflows to plain pages anyway took
# time and space (a flush of S=1 rows 158 -> 126 ns and 7.3 -> 5.5 bytes a row, of fan-out rows
# S=100 62 -> 56 ns and 0.47 -> 0.30 bytes).
_PLAIN = frozenset(("ts_ns", "msg_seq", "protocol_id", "latency_ns"))
# A list column is named by its leaf (``connections.list.element``); its ids repeat from group to
# group (a topic's subscribers), so it has a dictionary and no statistics (nothing filters on them).
_LEAF = {"connections": "connections.list.element"}
_PARQUET = {"compression": "zstd", "store_schema": False,
            "write_statistics": [field.name for field in FILE_SCHEMA if field.name not in _CODED | {"connections"}],
            "use_dictionary": [_LEAF.get(field.name, field.name) for field in FILE_SCHEMA if field.name not in _PLAIN]}

Meta = tuple  # router.contract.EventMeta: (origin gateway, msg_seq, ingress ts_ns, dialect, kind, topic)

HOUR_NS = 3_600_000_000_000
# "scheme:/": a URL. One slash is enough: file:/path is a file URL too, and it is what a URL becomes
# when passed through Path. Two letters at least, so a Windows drive is not a scheme.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")
# File systems: real folders, and an atomic rename, so a file is written under a dot-name and renamed.
# Object stores (S3, GCS, Azure) have neither: an object is written in place, and appears whole once uploaded.
_FILE_SYSTEMS = {"local", "hdfs"}
# Spark (Hadoop) names some stores differently: its S3 connector is s3a.
_SPARK_SCHEMES = {"s3": "s3a", "gcs": "gs"}


@dataclass(frozen=True)
class Location:
    """Where the event log lives: a filesystem of pyarrow's and the log's folder in it."""

    filesystem: pafs.FileSystem
    root: str  # the folder, as the filesystem names it (no trailing slash)
    spark_prefix: str  # what makes a path of the filesystem a path Spark reads
    display: str  # for messages: as configured, without a password

    @property
    def has_directories(self) -> bool:
        """Object stores have none: a prefix exists while objects are under it."""
        return self.filesystem.type_name in _FILE_SYSTEMS

    def path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def spark_path(self, path: str) -> str:
        return self.spark_prefix + path

    def folders(self, path: str, prefix: str) -> list[pafs.FileInfo]:
        """The folders directly under ``path`` whose names start with ``prefix``, sorted; none if it is gone."""
        selector = pafs.FileSelector(path, allow_not_found=True)
        return sorted((info for info in self.filesystem.get_file_info(selector)
                       if info.type == pafs.FileType.Directory and info.base_name.startswith(prefix)),
                      key=lambda info: info.path)

    def files(self, path: str, suffix: str) -> list[str]:
        """The files directly under ``path`` ending in ``suffix``, sorted, without hidden (dot-named) ones."""
        selector = pafs.FileSelector(path, allow_not_found=True)
        return sorted(info.path for info in self.filesystem.get_file_info(selector)
                      if info.type == pafs.FileType.File and info.base_name.endswith(suffix)
                      and not info.base_name.startswith("."))


def event_location(directory: str | os.PathLike) -> Location:
    """A local folder (on a cluster: shared storage such as NFS, mounted at the same path on every node)
    or a URL that ``pyarrow.fs.FileSystem.from_uri`` understands (``file:///…``, ``s3://bucket/…``,
    ``gs://bucket/…``, ``hdfs://namenode:port/…``)."""
    text = os.fspath(directory)
    if not _URL.match(text):
        return Location(pafs.LocalFileSystem(), os.path.abspath(text), "", text)
    filesystem, root = pafs.FileSystem.from_uri(text)
    return Location(filesystem, root.rstrip("/"), spark_prefix(text, root), redact(text))


def spark_prefix(url: str, root: str) -> str:
    """pyarrow names an object ``bucket/key`` (S3, GCS) and a file ``/path`` (the host, if any, stays
    in the filesystem object); Spark wants a whole URL in its own scheme."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    authority = parts.netloc.rpartition("@")[2] if root.startswith("/") else ""
    return f"{_SPARK_SCHEMES.get(scheme, scheme)}://{authority}"


def redact(url: str) -> str:
    """The URL without its password (``s3://key:secret@bucket`` is a form pyarrow accepts)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def _node_tag() -> str:
    """This Ray node's id, shortened: with the gateway id, file names stay unique across the nodes
    sharing one folder. Outside Ray (tools, tests) a random tag of the same length."""
    ray = sys.modules.get("ray")  # a Ray worker has it imported; nothing else needs it
    if ray is not None and ray.is_initialized():
        return ray.get_runtime_context().get_node_id()[:12]
    return secrets.token_hex(6)


# The packed records, little-endian int64s. An accepted message: when, its sequence number and
# ingress time, its size, its connection, its stream (origin, dialect, kind, topic: a number in the
# flush's table). A fan-out group: when, sequence number, ingress time, size, stream, how many
# connections, and the connection when there is one; for a larger group, where its ids start in
# ``Flush.ids`` (the groups of a run share them).
_INGRESS = struct.Struct("<6q")
_GROUP = struct.Struct("<7q")
_INGRESS_SIZE = _INGRESS.size
_GROUP_SIZE = _GROUP.size
_INGRESS_DTYPE = np.dtype([(name, "<i8") for name in ("ts_ns", "seq", "ingress_ns", "bytes", "connection", "stream")])
_GROUP_DTYPE = np.dtype([(name, "<i8") for name in ("ts_ns", "seq", "ingress_ns", "bytes", "stream", "count",
                                                    "connection")])
CHUNK_RECORDS = 16_384  # records per chunk: under a MiB each, so glibc serves it from its heap
_NO_PROTOCOL_IDS = (None,) * CHUNK_RECORDS
_INGRESS_CHUNK = CHUNK_RECORDS * _INGRESS_SIZE
_GROUP_CHUNK = CHUNK_RECORDS * _GROUP_SIZE
# Free chunks a log keeps for its next flushes, of each kind, at most (about 26 MiB of each): a flush
# of 2 s at 100,000 messages/s fills 13 of each. The pool follows the flushes: one chunk more than
# the last flush written filled.
POOL_CHUNKS = 32


@dataclass
class Flush:
    """One flush's packed records, as the writer takes them (pickled whole to a writer process).

    ``ingress`` and ``groups`` are chunks of packed records, every one full but the last, which is
    filled up to ``ingress_end`` / ``groups_end`` bytes. To a writer process the chunks and ``ids`` go
    as pickle buffers (out of band: Ray copies them into its object store without pickling them),
    and ``protocol_ids`` as pickled lists."""

    ingress: list[Any]
    ingress_end: int
    groups: list[Any]
    groups_end: int
    ids: Any  # an int64 array: the connection ids of the groups of more than one connection, each run's once
    streams: list[tuple]  # (origin, dialect, kind, topic) by stream number
    protocol_ids: list[Any]  # by ingress chunk, the protocol's id of each record (or None)

    @property
    def ingress_count(self) -> int:
        return (len(self.ingress) - 1) * CHUNK_RECORDS + self.ingress_end // _INGRESS_SIZE if self.ingress else 0

    @property
    def group_count(self) -> int:
        return (len(self.groups) - 1) * CHUNK_RECORDS + self.groups_end // _GROUP_SIZE if self.groups else 0

    @property
    def records(self) -> int:
        return self.ingress_count + self.group_count

    @property
    def weight(self) -> int:
        """What it counts against ``max_unwritten_records``: its records, or the records its chunks
        hold room for if that is more (a flush of one message holds a chunk of each kind)."""
        return max(self.records, (len(self.ingress) + len(self.groups)) * CHUNK_RECORDS)


class EventLog:
    """Buffers records for one gateway and writes them as Parquet off the event loop."""

    def __init__(
        self,
        directory: str | os.PathLike,
        gateway_id: str,
        sample_rate: float = 1.0,
        retention_hours: float = 168,
        remote: Any = None,
        max_rejected_per_flush: int = 10_000,
        max_unwritten_records: int = 4_000_000,
    ) -> None:
        # A Ray actor handle with write_flush(flush, row slices) and ready(): the Arrow and Parquet
        # work then runs in that process, and this one only hands the flush over (actors/eventwriter.py).
        self._remote = remote
        self.gateway_id = gateway_id
        self.sample_every = max(1, round(1 / sample_rate)) if sample_rate > 0 else 0
        self.retention_ns = int(retention_hours * 3600 * 1e9)
        # Rejections and drops, (ts_ns, *meta, protocol_id, bytes, connection, outcome, reason): one row each
        self._rows: list[tuple] = []
        # Chunks back from the writer, for the next records: (packed records, their protocol ids) for
        # accepted messages, packed records for groups.
        self._free_ingress: list[tuple[bytearray, list]] = []
        self._free_groups: list[bytearray] = []
        self._start_flush()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eventlog")
        self._pending: list[Future] = []
        # Bounds for floods: refused frames logged per flush (a client hammering a rate limit
        # would otherwise write a row per frame), and records handed to the writer but not yet
        # written (a writer that falls behind would otherwise queue every flush in memory).
        self.max_rejected_per_flush = max_rejected_per_flush
        self.max_unwritten_records = max_unwritten_records
        self._rejected_in_flush = 0
        self._submitted = 0  # records handed to the writer (counted on the loop's thread)
        self._finished = 0  # records the writer is done with (counted on the writer's thread)
        self.rejected_unlogged = 0  # refused frames past max_rejected_per_flush: in metrics only
        self.records_dropped = 0  # records of flushes dropped because the writer was behind
        self._last_retention = 0.0
        self._files = itertools.count()
        self.rows_written = 0  # rows in the files (a fan-out group is one)
        self.events_written = 0  # the events they hold: a message in, a delivery, a refusal, a drop
        self.files_written = 0
        self.write_cpu_s = 0.0  # CPU time this process spent writing (converting, or handing to `remote`)
        # Opened where the files are written: with a `remote`, that is the writer's process.
        self.location = None if remote is not None else event_location(directory)
        self.node = _node_tag()
        if self.location is not None:
            self._check_location()

    def _check_location(self) -> None:
        """Create the folder (or, in an object store, look at it): a wrong path, URL or credentials
        fail at start, not on the first flush."""
        location = self.location
        if location.has_directories:
            location.filesystem.create_dir(location.root, recursive=True)
        else:
            location.filesystem.get_file_info(location.root)

    def warm_up(self) -> Future:
        """Run one tiny conversion and write: pyarrow imports and initialises what they need on first
        use (about a second of CPU); the gateway waits for this before it takes traffic."""
        if self._remote is not None:
            return self._writer.submit(_ray_get, self._remote.ready.remote())
        return self._writer.submit(_warm_up)

    # -- hot path: one packed record per message received or fan-out group ----------------

    def sampled(self, seq: int) -> bool:
        every = self.sample_every
        return every == 1 or (every > 1 and seq % every == 0)

    def ingress(self, ts_ns: int, meta: Meta, protocol_id: str | None, nbytes: int, connection: int) -> None:
        origin, seq, ingress_ns, dialect, kind, topic = meta
        key = (origin, dialect, kind, topic)
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = len(self._streams)
        offset = self._ingress_at
        if offset == _INGRESS_CHUNK:
            offset = self._next_ingress_chunk()
        _INGRESS.pack_into(self._ingress_chunk, offset, ts_ns, seq, ingress_ns, nbytes, connection, stream)
        self._protocol_ids[offset // _INGRESS_SIZE] = protocol_id
        self._ingress_at = offset + _INGRESS_SIZE

    def rejected(self, ts_ns: int, meta: Meta, protocol_id: str | None, nbytes: int, connection: int,
                 reason: str) -> None:
        if self._rejected_in_flush >= self.max_rejected_per_flush:
            self.rejected_unlogged += 1
            return
        self._rejected_in_flush += 1
        origin, seq, ingress_ns, dialect, kind, topic = meta
        self._rows.append((ts_ns, origin, seq, ingress_ns, dialect, kind, topic, protocol_id, nbytes, connection,
                           "rejected", reason))

    def delivered(self, ts_ns: int, meta: Meta, nbytes: int, connections: tuple[int, ...] | list[int]) -> None:
        """One fan-out group of ``connections`` (a tuple or a list of ids). The stream and the
        chunk are found as in :meth:`ingress`, inline: a call would cost as much as the lookup.
        A group of none (each of its deliveries failed) has no row, nor a stream: its strings
        would sit in the file's dictionaries unused. A group that cannot be stored (a bad id)
        raises and leaves nothing either: its stream is kept only once its record is."""
        count = len(connections)
        if not count:
            return
        if count > 1:
            if connections is self._run_ids:
                at, packed = self._run_at, None  # the run's ids are in the flush already
            else:
                packed = array.array("q", connections)  # a bad id raises here
                at = len(self._ids)
        origin, seq, ingress_ns, dialect, kind, topic = meta
        key = (origin, dialect, kind, topic)
        streams = self._streams
        stream = streams.get(key)
        new = stream is None
        if new:
            stream = len(streams)
        offset = self._groups_at
        if offset == _GROUP_CHUNK:
            offset = self._next_group_chunk()
        if count == 1:
            _GROUP.pack_into(self._group_chunk, offset, ts_ns, seq, ingress_ns, nbytes, stream, 1, connections[0])
        else:
            _GROUP.pack_into(self._group_chunk, offset, ts_ns, seq, ingress_ns, nbytes, stream, count, at)
            if packed is not None:
                self._ids.extend(packed)  # from an array: a copy of its bytes, not an int at a time
                if type(connections) is tuple:  # immutable: the next groups of a run point at these ids
                    self._run_ids, self._run_at = connections, at
        if new:
            streams[key] = stream
        self._groups_at = offset + _GROUP_SIZE

    def delivered_items(self, ts_ns: int, items: list) -> None:
        """:meth:`delivered` of each of ``items`` (gateway delivery items, ``(kind, payload,
        connections, meta)``: a group of ``connections`` each sent ``payload``; one whose meta is
        None is not logged) at ``ts_ns``, sampled as the gateway samples."""
        delivered, every = self.delivered, self.sample_every
        for _, payload, connections, meta in items:
            if meta is not None and (every == 1 or self.sampled(meta[1])):
                delivered(ts_ns, meta, len(payload), connections)

    def dropped(self, ts_ns: int, meta: Meta, nbytes: int, connection: int, reason: str) -> None:
        origin, seq, ingress_ns, dialect, kind, topic = meta
        self._rows.append((ts_ns, origin, seq, ingress_ns, dialect, kind, topic, None, nbytes, connection,
                           "dropped", reason))

    # -- flushing -------------------------------------------------------------------------

    def _start_flush(self) -> None:
        """Empty buffers for the next flush's records. A chunk is taken (from the pool) by the first
        record that needs one: the current chunk reads as full until then."""
        self._streams: dict[tuple, int] = {}
        self._ids = array.array("q")
        # The last tuple of connection ids of a group of several, and where its ids start in ``_ids``:
        # a fan-out run's groups (a topic's reply to a window of publishes) share one tuple, so its
        # ids are packed and sent to the writer once a flush, every group pointing at them.
        self._run_ids: tuple | None = None
        self._run_at = 0
        self._ingress_full: list[tuple[bytearray, list]] = []
        self._ingress_chunk: bytearray | None = None
        self._protocol_ids: list | None = None
        self._ingress_at = _INGRESS_CHUNK
        self._groups_full: list[bytearray] = []
        self._group_chunk: bytearray | None = None
        self._groups_at = _GROUP_CHUNK

    def _next_ingress_chunk(self) -> int:
        if self._ingress_chunk is not None:
            self._ingress_full.append((self._ingress_chunk, self._protocol_ids))
        self._ingress_chunk, self._protocol_ids = _ingress_chunk(self._free_ingress)
        self._ingress_at = 0
        return 0

    def _next_group_chunk(self) -> int:
        if self._group_chunk is not None:
            self._groups_full.append(self._group_chunk)
        self._group_chunk = _chunk(self._free_groups, _GROUP_CHUNK)
        self._groups_at = 0
        return 0

    def _take(self) -> Flush:
        """The buffered packed records, as a :class:`Flush`; the buffers start again empty."""
        ingress = self._ingress_full
        if self._ingress_chunk is not None:
            ingress.append((self._ingress_chunk, self._protocol_ids))
        groups = self._groups_full
        if self._group_chunk is not None:
            groups.append(self._group_chunk)
        flush = Flush([chunk for chunk, _ in ingress], self._ingress_at if ingress else 0, groups,
                      self._groups_at if groups else 0, self._ids, list(self._streams), [ids for _, ids in ingress])
        self._start_flush()
        return flush

    def _recycle(self, flush: Flush) -> None:
        """``flush`` is written: its chunks serve the next records (any thread: a list's ``extend`` is
        atomic, as is the loop's ``pop``). The pool keeps about what a flush like this one fills, at
        most ``POOL_CHUNKS``: after a burst, the next quiet flushes let the rest go. A list of protocol
        ids lets go of its ids here, not when the loop's next records overwrite them, and before it is
        pooled (the loop may take it at once)."""
        ingress = list(zip(flush.ingress, flush.protocol_ids))
        for _, ids in ingress:
            ids[:] = _NO_PROTOCOL_IDS
        for chunks, free in ((ingress, self._free_ingress), (flush.groups, self._free_groups)):
            room = min(POOL_CHUNKS, len(chunks) + 1) - len(free)
            if room > 0:
                free.extend(chunks[:room])
            else:
                del free[len(free) + room:]  # past what this flush needed: freed
        flush.ingress, flush.groups, flush.protocol_ids = [], [], []

    def flush(self) -> Future | None:
        """Hand the buffered records to the writer thread (call from the event loop)."""
        if not self._rows and self._ingress_chunk is None and self._group_chunk is None:
            return None
        rows, packed = self._rows, self._take()
        self._rows = []
        self._rejected_in_flush = 0
        count = len(rows) + packed.records
        weight = len(rows) + packed.weight  # a flush holds its chunks whole until written
        behind = self._submitted - self._finished
        if behind and behind + weight > self.max_unwritten_records:  # one flush alone is always taken
            self.records_dropped += count
            self._recycle(packed)
            logger.warning("event log: the writer is %d records behind; dropped %d records", behind, count)
            return None
        self._submitted += weight
        future = self._writer.submit(self._write, rows, packed, count, weight)
        self._pending = [f for f in self._pending if not f.done()] + [future]
        return future

    def flush_all(self) -> Future | None:
        """:meth:`flush`, and the future of the last write handed to the writer (this flush's or an
        earlier one still running: the writer thread writes them in order), None when none is left.
        Once it is done, every record recorded before the call is written (or counted dropped)."""
        self.flush()
        pending = [future for future in self._pending if not future.done()]
        return pending[-1] if pending else None

    def close(self, timeout: float = 30) -> None:
        pending = self.flush_all()
        if pending is not None:
            pending.result(timeout)
        self._writer.shutdown(wait=True)

    def _write(self, rows: list[tuple], packed: Flush, count: int, weight: int) -> None:
        started = time.thread_time()
        try:
            if self._remote is not None:
                # The rows pickled here: Ray's own serializer takes several times longer on many
                # small tuples. In slices, letting go of the GIL between them: one pickle call over
                # many held it for milliseconds, which the event loop saw as a latency tail.
                call = self._remote.write_flush.remote(_for_transfer(packed), _pickled_slices(rows, PICKLE_SLICE))
                self.rows_written, self.events_written, self.files_written = _ray_get(call)
            else:
                self.write(rows, packed)
        except Exception:
            logger.exception("event log: writing %d records failed", count)
        finally:
            self._recycle(packed)
            self.write_cpu_s += time.thread_time() - started
            self._finished += weight

    def write(self, rows: list[tuple], packed: Flush | None = None) -> tuple[int, int, int]:
        """Convert a flush's records and write them; returns (rows, events, files) written so far."""
        parts = []
        if rows:
            parts.append(self._rows_table(rows))
        if packed is not None:
            if packed.records:
                parts.append(self._packed_table(packed))
        if parts:
            self._write_partitions(pa.concat_tables(parts) if len(parts) > 1 else parts[0])
        self._apply_retention()
        return self.rows_written, self.events_written, self.files_written

    def _rows_table(self, rows: list[tuple]) -> pa.Table:
        """Rejection and drop records: rejections are "in", drops "out" (with latency)."""
        outcome = pa.array(_column(rows, 10), pa.string())
        outbound = pc.equal(outcome, "dropped")
        return self._assemble(
            rows, pa.array(_column(rows, 7), pa.string()), _column(rows, 8), pa.array(_column(rows, 9), pa.int64()),
            outcome.dictionary_encode(), pa.array(_column(rows, 11), pa.string()),
            pc.if_else(outbound, "out", "in").dictionary_encode(), outbound,
        )

    def _packed_table(self, packed: Flush) -> pa.Table:
        """The rows of a flush's packed records, in timestamp order: an accepted message's "in"
        row, and a fan-out group's "out" row with its connections. The records are sorted
        (stably, the accepted messages first, as their rows come first in the log) only when they
        are out of order. Each field is read straight from the chunks."""
        ingress = _views(packed.ingress, packed.ingress_end, _INGRESS_DTYPE)
        groups = _views(packed.groups, packed.groups_end, _GROUP_DTYPE)

        def both(name: str) -> np.ndarray:  # a field of every record: the accepted messages', then the groups'
            return np.concatenate([view[name] for view in ingress] + [view[name] for view in groups])

        def of_groups(name: str) -> np.ndarray:
            return np.concatenate([view[name] for view in groups]) if groups else np.empty(0, dtype=np.int64)

        accepted = sum(len(view) for view in ingress)
        group_counts = of_groups("count")
        delivered = len(group_counts)
        total = accepted + delivered
        ts = both("ts_ns")
        order = None
        if total > 1 and not (ts[1:] >= ts[:-1]).all():
            order = np.argsort(ts, kind="stable")

        def ordered(values: np.ndarray) -> np.ndarray:  # a value per record, in the rows' order
            return values if order is None else values[order]

        out_rows = None
        if accepted and delivered:
            out_rows = ordered(np.concatenate((np.zeros(accepted, dtype=bool), np.ones(delivered, dtype=bool))))
        if not delivered:
            latency = pa.nulls(total, pa.int64())
        else:
            values = ordered(np.concatenate((np.zeros(accepted, dtype=np.int64),
                                             of_groups("ts_ns") - of_groups("ingress_ns"))))
            latency = pa.array(values) if out_rows is None else _valid_where(values, out_rows)
        codes = both("stream")  # a record's stream
        streams = packed.streams

        def stream_field(position: int) -> pa.Array:  # of (origin, dialect, kind, topic), coded
            values: dict[str, int] = {}
            numbers = np.array([-1 if stream[position] is None else values.setdefault(stream[position], len(values))
                                for stream in streams], dtype=np.int32)
            if len(values) == 1 and not numbers.any():  # one value and no None (a dialect, an origin)
                return _constant(next(iter(values)), total)
            indices = ordered(numbers[codes])
            missing = indices < 0
            return pa.DictionaryArray.from_arrays(pa.array(indices, mask=missing if missing.any() else None),
                                                  pa.array(list(values), pa.string()))

        def either(inbound: str, outbound: str) -> pa.Array:  # "in"/"out", "accepted"/"delivered": those used
            if out_rows is None:
                return _constant(outbound if delivered else inbound, total)
            return pa.DictionaryArray.from_arrays(pa.array(out_rows.view(np.int8).astype(np.int32)),
                                                  pa.array([inbound, outbound], pa.string()))

        return pa.Table.from_arrays(
            [
                pa.array(ordered(ts)),
                stream_field(1),  # dialect
                either("in", "out"),
                stream_field(2),  # kind
                stream_field(3),  # topic
                _constant(self.gateway_id, total),
                _connections(both("connection"), group_counts, accepted, packed.ids, order),
                stream_field(0),  # origin
                pa.array(ordered(both("seq"))),  # msg_seq
                self._protocol_id_column(packed, accepted, delivered, ordered, total),
                pa.array(ordered(both("bytes"))),
                latency,
                either("accepted", "delivered"),
                pa.nulls(total, pa.string()),  # reason
            ],
            schema=_BUILD_SCHEMA,
        )

    @staticmethod
    def _protocol_id_column(packed: Flush, accepted: int, group_count: int, ordered: Callable,
                            total: int) -> pa.Array:
        """The protocol's id of each row: an accepted message's, or null."""
        values: list[str | None] = []
        for ids in packed.protocol_ids:  # a chunk's, as long as the chunk or longer
            values.extend(itertools.islice(pickle.loads(ids) if isinstance(ids, bytes) else ids, CHUNK_RECORDS))
        protocol_id = pa.array(values[:accepted], pa.string())
        if protocol_id.null_count == accepted:
            return pa.nulls(total, pa.string())
        index = ordered(np.concatenate((np.arange(accepted, dtype=np.int64), np.full(group_count, -1, np.int64))))
        if not group_count and (index[1:] > index[:-1]).all():
            return protocol_id
        return protocol_id.take(pa.array(index, mask=index < 0))

    def _assemble(self, records: list[tuple], protocol_id: pa.Array, sizes: list, connection: pa.Array,
                  outcome: pa.Array, reason: pa.Array, direction: pa.Array, has_latency: Any) -> pa.Table:
        """The table of rejections and drops; ``records`` start with (ts_ns, *meta).

        Columns are pulled with itemgetter, not ``zip(*records)``: that would allocate an iterator per
        record, and the garbage collector would walk the whole heap several times per flush.
        """
        ts_ns = np.fromiter(map(itemgetter(0), records), dtype=np.int64, count=len(records))
        t0 = np.fromiter(map(itemgetter(1 + META_FIELDS["ingress_ns"]), records), dtype=np.int64,
                         count=len(records))
        latency = pa.array(ts_ns - t0)
        if has_latency is not True:
            latency = pc.if_else(has_latency, latency, pa.scalar(None, pa.int64()))

        def per_record(values: Any, type_: pa.DataType) -> pa.Array:
            return values if isinstance(values, pa.Array) else pa.array(values, type_)

        def meta_field(name: str, type_: pa.DataType) -> pa.Array:
            return per_record(_column(records, 1 + META_FIELDS[name]), type_)

        def coded(name: str) -> pa.Array:
            return meta_field(name, pa.string()).dictionary_encode()

        return pa.Table.from_arrays(
            [
                per_record(ts_ns, pa.int64()),
                coded("dialect"),
                direction,
                coded("kind"),
                coded("topic"),
                _constant(self.gateway_id, len(connection)),
                _one_each(connection),
                coded("origin"),
                meta_field("seq", pa.int64()),  # msg_seq
                protocol_id,
                per_record(sizes, pa.int64()),
                per_record(latency, pa.int64()),
                outcome,
                reason,
            ],
            schema=_BUILD_SCHEMA,
        )

    def _write_partitions(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        file_schema = FILE_SCHEMA
        if any(table.column(name).null_count for name in NEVER_NULL):
            logger.warning("event log: a null where the log always sets a value; these %d rows are written "
                           "with every column nullable", table.num_rows)
            table, file_schema = table.cast(_BUILD_NULLABLE), _NULLABLE_SCHEMA
        location = self.location
        filesystem = location.filesystem
        hours = pa.array(table["ts_ns"].to_numpy() // HOUR_NS)
        distinct = pc.unique(hours).to_pylist()
        for hour in distinct:
            # A part of a flush that spans hours: its coded columns as plain strings, so that its
            # file's dictionaries hold only its own values (a filter keeps the whole dictionary).
            part = table if len(distinct) == 1 else table.filter(pc.equal(hours, hour)).cast(file_schema)
            stamp = time.gmtime(hour * 3600)
            folder = location.path(f"date={time.strftime('%Y-%m-%d', stamp)}", f"hour={stamp.tm_hour:02d}")
            first = pc.min(part["ts_ns"]).as_py()
            # the node and gateway keep writers apart; the flush number, two flushes starting in the same ns
            name = f"{self.gateway_id}-{self.node}-{first}-{next(self._files)}-{part.num_rows}.parquet"
            if location.has_directories:
                filesystem.create_dir(folder, recursive=True)
                temporary = f"{folder}/.{name}.tmp"
                pq.write_table(_by_time(part), temporary, filesystem=filesystem, **_PARQUET)
                filesystem.move(temporary, f"{folder}/{name}")
            else:
                pq.write_table(_by_time(part), f"{folder}/{name}", filesystem=filesystem, **_PARQUET)
            self.rows_written += part.num_rows
            self.events_written += _events(part)
            self.files_written += 1

    def _apply_retention(self) -> None:
        """Delete hour folders past retention, and a date folder once its whole day is (so a writer
        starting the new day's first hour never loses its folder to another writer's pruning).

        Every writer prunes the shared folder: one that finds a folder gone (another writer's
        pruning) goes on."""
        now = time.time()
        if now - self._last_retention < 600:
            return
        self._last_retention = now
        cutoff_hour = int((time.time_ns() - self.retention_ns) // HOUR_NS)
        location = self.location
        for day in location.folders(location.root, "date="):
            for hour in location.folders(day.path, "hour="):
                epoch_hour = folder_hour(day.base_name, hour.base_name)
                if epoch_hour is not None and epoch_hour < cutoff_hour:
                    self._delete(hour.path)
            midnight = folder_hour(day.base_name, "hour=00")
            if midnight is not None and midnight + 24 <= cutoff_hour:
                if not location.filesystem.get_file_info(pafs.FileSelector(day.path, allow_not_found=True)):
                    self._delete(day.path)

    def _delete(self, folder: str) -> None:
        try:
            self.location.filesystem.delete_dir(folder)
        except OSError:  # FileNotFoundError included: another writer pruned it first
            logger.debug("event log: could not delete %s", folder, exc_info=True)


def read_events(source: Any, **dataset_options: Any) -> pa.Table:
    """The events of log files (a path, a list of paths or a folder, as ``pyarrow.dataset`` takes them),
    or of a table read from them, as :data:`SCHEMA` says: a fan-out group's row becomes a row per
    connection, in the group's order. Rows of the earlier layout (one ``connection`` each) read as
    they are, alone or beside new ones."""
    import pyarrow.dataset as ds

    if isinstance(source, pa.Table):
        table = source
    else:
        table = ds.dataset(source, format="parquet", schema=_READ_SCHEMA, **dataset_options).to_table()
    lists = (table["connections"].combine_chunks() if "connections" in table.column_names
             else pa.nulls(table.num_rows, CONNECTIONS))
    lengths, empty = _event_counts(lists)
    rows = pa.array(np.repeat(np.arange(len(lengths)), lengths))
    flat = pc.list_flatten(lists).to_numpy(zero_copy_only=False)
    if not empty.any():
        column = pa.array(flat, pa.int64())
    else:  # a row of the earlier layout, or one whose connection was not recorded: one event
        single = (table["connection"].combine_chunks() if "connection" in table.column_names
                  else pa.nulls(table.num_rows, pa.int64()))
        alone = single.filter(pa.array(empty))
        at_empty = np.repeat(empty, lengths)
        values = np.zeros(len(at_empty), dtype=np.int64)
        values[~at_empty] = flat
        values[at_empty] = alone.fill_null(0).to_numpy(zero_copy_only=False)
        missing = np.zeros(len(at_empty), dtype=bool)
        missing[at_empty] = alone.is_null().to_numpy(zero_copy_only=False)
        column = pa.array(values, mask=missing if missing.any() else None)
    columns = [column if name == "connection" else table[name].take(rows) for name in COLUMNS]
    whole = all(not columns[COLUMNS.index(name)].null_count for name in _EVENT_NEVER_NULL)
    return pa.Table.from_arrays(columns, schema=SCHEMA if whole else _EVENTS_NULLABLE)


def folder_hour(date_folder: str, hour_folder: str) -> int | None:
    """The UTC hour (epoch hours) of the folders date=YYYY-MM-DD and hour=HH; None when the names do not parse."""
    try:
        stamp = time.strptime(f"{date_folder} {hour_folder}", "date=%Y-%m-%d hour=%H")
    except ValueError:
        return None
    return calendar.timegm(stamp) // 3600


def _column(records: list[tuple], position: int) -> list:
    return list(map(itemgetter(position), records))


def _chunk(free: list[bytearray], size: int) -> bytearray:
    """A chunk for packed records: a free one, else a new one."""
    try:
        return free.pop()
    except IndexError:
        return bytearray(size)


def _ingress_chunk(free: list[tuple[bytearray, list]]) -> tuple[bytearray, list]:
    """A chunk for accepted messages and the list of their protocol ids: a free pair, else a new one."""
    try:
        return free.pop()
    except IndexError:
        return bytearray(_INGRESS_CHUNK), [None] * CHUNK_RECORDS


def _for_transfer(packed: Flush) -> Flush:
    """``packed`` as it goes to a writer process: the chunks and ids as pickle buffers (Ray copies
    them as they are), each chunk's protocol ids pickled apart, letting go of the GIL in between (one
    pickle call over a flush's strings held it for milliseconds)."""
    count = packed.ingress_end // _INGRESS_SIZE
    protocol_ids = []
    for number, ids in enumerate(packed.protocol_ids):
        used = ids[:CHUNK_RECORDS if number < len(packed.protocol_ids) - 1 else count]
        protocol_ids.append(pickle.dumps(used, protocol=pickle.HIGHEST_PROTOCOL))
        time.sleep(0)
    return Flush(_buffers(packed.ingress, packed.ingress_end), packed.ingress_end,
                 _buffers(packed.groups, packed.groups_end), packed.groups_end, pickle.PickleBuffer(packed.ids),
                 packed.streams, protocol_ids)


def _buffers(chunks: list[bytearray], end: int) -> list[pickle.PickleBuffer]:
    """``chunks`` as pickle buffers, the last one only as far as it is filled."""
    return [pickle.PickleBuffer(chunk if number < len(chunks) - 1 else memoryview(chunk)[:end])
            for number, chunk in enumerate(chunks)]


def _views(chunks: list[bytearray], end: int, dtype: np.dtype) -> list[np.ndarray]:
    """The packed records of ``chunks`` (all full but the last, filled up to ``end`` bytes), a
    view of each chunk: a field is copied once, from the chunks into its column."""
    views = [np.frombuffer(chunk, dtype=dtype, count=CHUNK_RECORDS) for chunk in chunks[:-1]]
    if chunks:
        views.append(np.frombuffer(chunks[-1], dtype=dtype, count=end // dtype.itemsize))
    return views


def _event_counts(lists: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each row's events, and which rows have no connection: a row's connections, or one event for a
    row of none (a null list, or an empty one, which the log does not write; as Spark's ``explode_outer``)."""
    lengths = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False)
    empty = lengths == 0
    return np.where(empty, 1, lengths), empty


def _events(table: pa.Table) -> int:
    """The events of a table of rows."""
    return int(_event_counts(table["connections"])[0].sum())


def _connections(connection: np.ndarray, group_counts: np.ndarray, accepted: int, ids: Any,
                 order: np.ndarray | None) -> pa.Array:
    """The ``connections`` column: each record's ids, the records taken in ``order``. ``connection``
    holds every record's own (the accepted messages', then the groups'); for a group of several,
    where its ids start in ``ids`` (its count of them; the groups of a run point at the same ones)."""
    if not len(group_counts) or (group_counts == 1).all():  # one id a record: the records' own
        values = connection if order is None else connection[order]
        return _list_of(np.arange(len(values) + 1, dtype=np.int64), values)
    lengths = np.concatenate((np.ones(accepted, dtype=np.int64), group_counts))
    # Each record's ids are a span of ``connection`` followed by ``ids``: its own connection, or a
    # group's ids where it points; the spans are taken in the records' order in one gather.
    several = lengths != 1
    starts = np.arange(len(lengths), dtype=np.int64)
    starts[several] = len(connection) + connection[several]
    if order is not None:
        starts, lengths = starts[order], lengths[order]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    spans = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    values = np.concatenate((connection, np.frombuffer(ids, dtype=np.int64)))[spans]
    return _list_of(offsets, values)


def _list_of(offsets: np.ndarray, values: Any, missing: Any = None) -> pa.Array:
    """A list array of ``values`` split at ``offsets``, of type :data:`CONNECTIONS`; null where ``missing``."""
    if len(values) >= 2**31:
        raise ValueError(f"a flush of {len(values):,} connection ids: more than a list column holds")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, pa.int64()),
                                    type=CONNECTIONS, mask=missing)


def _one_each(connection: pa.Array) -> pa.Array:
    """``connection`` (int64) as the ``connections`` column: a list of one per row, null where it is."""
    offsets = np.arange(len(connection) + 1, dtype=np.int64)
    if not connection.null_count:
        return _list_of(offsets, connection.to_numpy())
    return _list_of(offsets, connection.fill_null(0), connection.is_null())


def _valid_where(values: np.ndarray, valid: np.ndarray) -> pa.Array:
    """``values`` (int64) as an Arrow array, null where ``valid`` is False (the bitmap packed by
    numpy: pyarrow's ``mask=`` takes several times longer)."""
    bitmap = np.packbits(valid, bitorder="little")
    return pa.Array.from_buffers(pa.int64(), len(values), [pa.py_buffer(bitmap), pa.py_buffer(values)])


def _by_time(table: pa.Table) -> pa.Table:
    """``table``'s rows in timestamp order, the order of equal ones kept (as ``sort_by``; a stable
    sort in numpy and one ``take``, none when they are in order: a third of ``sort_by``'s time)."""
    ts = table["ts_ns"].to_numpy()
    if len(ts) < 2 or (ts[1:] >= ts[:-1]).all():
        return table
    # one dictionary per column across the table's chunks (the flush's parts each coded their own)
    return table.unify_dictionaries().take(pa.array(np.argsort(ts, kind="stable")))


def _constant(value: str, count: int) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(count, dtype=np.int32)), pa.array([value], pa.string()))


PICKLE_SLICE = 256  # records per pickle call (each well under a millisecond)


def _pickled_slices(records: list[tuple], size: int) -> list[bytes]:
    out = []
    for start in range(0, len(records), size):
        out.append(pickle.dumps(records[start:start + size], protocol=pickle.HIGHEST_PROTOCOL))
        time.sleep(0)  # releases the GIL: the event loop runs between slices
    return out


def unpickle_slices(slices: list[bytes]) -> list[tuple]:
    records: list[tuple] = []
    for part in slices:
        records.extend(pickle.loads(part))
    return records


def _ray_get(ref: Any) -> Any:
    """Wait for a Ray call from the writer thread (``ray.get`` would warn inside an async actor)."""
    return ref.future().result(timeout=120)


def _warm_up() -> None:
    log = EventLog.__new__(EventLog)
    log.gateway_id = "warm-up"
    log._free_ingress, log._free_groups = [], []
    log._start_flush()
    meta = ("warm-up", 1, 0, "", "", None)
    log.ingress(1, meta, "p", 1, 1)
    log.delivered(1, meta, 1, (1, 2))
    log.delivered(1, meta, 1, (3,))
    packed = log._take()
    table = pa.concat_tables([log._rows_table([(1, *meta, None, 1, 1, "dropped", "")]), log._packed_table(packed)])
    pq.write_table(_by_time(table), io.BytesIO(), **_PARQUET)
