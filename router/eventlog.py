"""The event log: one record per ingress, delivery and rejection, as rolled Parquet files.

Layout: ``<dir>/date=YYYY-MM-DD/hour=HH/<gateway>-<node>-<first ts>-<flush no.>-<rows>.parquet`` (UTC), one
file per flush and partition. ``<dir>`` is a local folder or a URL of pyarrow's filesystems (``file://``,
``s3://``, ``gs://``, ``hdfs://``): on a cluster every gateway of every node writes to one shared place, and
the gateway id with the node's id keeps their names apart. Where renaming is atomic (a local or shared
file system, HDFS) a file is written under a dot-name and renamed; an object store shows an object only
once its upload completed. Either way a reader never sees half a file.

The hot path only appends tuples: one per message received, one per *fan-out group* (a message
delivered to several connections of a gateway is one entry holding their ids), one per drop or
rejection. A record holds only atomic values (the message's meta spread into it, a group's
connection ids as one int or as packed bytes), so the garbage collector stops tracking it the first
time it looks at it: a record holding another tuple stayed tracked until a middle-generation
collection, and those walked every buffered record (100-500 ms each in a flood).

Every ``flush_interval_s`` the event loop swaps the buffers and a writer thread expands the groups
into rows with pyarrow and writes the files. Sampling is decided per message (its
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
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from router.contract import META_FIELDS

logger = logging.getLogger(__name__)

SCHEMA = pa.schema(
    [
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
    ]
)
COLUMNS = SCHEMA.names

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
        # A Ray actor handle with write(rows, groups) and ready(): the Arrow and Parquet work then
        # runs in that process, and this one only pickles the buffers (see actors/eventwriter.py).
        self._remote = remote
        self.gateway_id = gateway_id
        self.sample_every = max(1, round(1 / sample_rate)) if sample_rate > 0 else 0
        self.retention_ns = int(retention_hours * 3600 * 1e9)
        # (ts_ns, *meta, protocol_id, bytes, connection, outcome, reason): one row each
        self._rows: list[tuple] = []
        # (ts_ns, *meta, bytes, connection ids): one row per connection; the ids are one int, or
        # several packed as int64 bytes (see _ids)
        self._groups: list[tuple] = []
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
        self.rows_written = 0
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

    # -- hot path: one tuple appended per record ------------------------------------------

    def sampled(self, seq: int) -> bool:
        every = self.sample_every
        return every == 1 or (every > 1 and seq % every == 0)

    def ingress(self, ts_ns: int, meta: Meta, protocol_id: str | None, nbytes: int, connection: int) -> None:
        origin, seq, ingress_ns, dialect, kind, topic = meta
        self._rows.append((ts_ns, origin, seq, ingress_ns, dialect, kind, topic, protocol_id, nbytes, connection,
                           "accepted", None))

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
        """One fan-out group of ``connections`` (a tuple or a list of ids)."""
        origin, seq, ingress_ns, dialect, kind, topic = meta
        self._groups.append((ts_ns, origin, seq, ingress_ns, dialect, kind, topic, nbytes,
                             connections[0] if len(connections) == 1 else _ids(connections)))

    def dropped(self, ts_ns: int, meta: Meta, nbytes: int, connection: int, reason: str) -> None:
        origin, seq, ingress_ns, dialect, kind, topic = meta
        self._rows.append((ts_ns, origin, seq, ingress_ns, dialect, kind, topic, None, nbytes, connection,
                           "dropped", reason))

    # -- flushing -------------------------------------------------------------------------

    def flush(self) -> Future | None:
        """Hand the buffered records to the writer thread (call from the event loop)."""
        if not self._rows and not self._groups:
            return None
        rows, groups = self._rows, self._groups
        self._rows, self._groups = [], []
        self._rejected_in_flush = 0
        count = len(rows) + len(groups)
        behind = self._submitted - self._finished
        if behind + count > self.max_unwritten_records:
            self.records_dropped += count
            logger.warning("event log: the writer is %d records behind; dropped %d records", behind, count)
            return None
        self._submitted += count
        future = self._writer.submit(self._write, rows, groups)
        self._pending = [f for f in self._pending if not f.done()] + [future]
        return future

    def close(self, timeout: float = 30) -> None:
        self.flush()
        for future in self._pending:
            future.result(timeout)
        self._writer.shutdown(wait=True)

    def _write(self, rows: list[tuple], groups: list[tuple]) -> None:
        started = time.thread_time()
        try:
            if self._remote is not None:
                # Pickled here: Ray's own serializer takes several times longer on many small
                # tuples. In slices, letting go of the GIL between them: one pickle call over a
                # whole flush held it for milliseconds, which the event loop saw as a latency tail.
                payload = [_pickled_slices(rows, PICKLE_SLICE), _pickled_slices(groups, PICKLE_SLICE)]
                self.rows_written, self.files_written = _ray_get(self._remote.write_slices.remote(payload))
            else:
                self.write(rows, groups)
        except Exception:
            logger.exception("event log: writing %d rows failed", len(rows) + len(groups))
        finally:
            self.write_cpu_s += time.thread_time() - started
            self._finished += len(rows) + len(groups)

    def write(self, rows: list[tuple], groups: list[tuple]) -> tuple[int, int]:
        """Convert buffered records and write them; returns (rows written, files written) so far."""
        parts = []
        if rows:
            parts.append(self._rows_table(rows))
        if groups:
            parts.append(self._groups_table(groups))
        if parts:
            self._write_partitions(pa.concat_tables(parts) if len(parts) > 1 else parts[0])
        self._apply_retention()
        return self.rows_written, self.files_written

    def _rows_table(self, rows: list[tuple]) -> pa.Table:
        """Ingress, rejection and drop records: ingress ones are "in", drops "out" (with latency)."""
        outcome = pa.array(_column(rows, 10), pa.string())
        outbound = pc.equal(outcome, "dropped")
        return self._assemble(
            rows, pa.array(_column(rows, 7), pa.string()), _column(rows, 8), pa.array(_column(rows, 9), pa.int64()),
            outcome, pa.array(_column(rows, 11), pa.string()), pc.if_else(outbound, "out", "in"), outbound,
        )

    def _groups_table(self, groups: list[tuple]) -> pa.Table:
        """One row per delivered connection, from one entry per fan-out group."""
        connections = _column(groups, 8)
        if all(type(ids) is int for ids in connections):  # one connection each (S=1, point to point)
            total = len(groups)
            index, flat = None, np.fromiter(connections, dtype=np.int64, count=total)
        else:
            lengths = np.fromiter((1 if type(ids) is int else len(ids) >> 3 for ids in connections), dtype=np.int64,
                                  count=len(groups))
            total = int(lengths.sum())
            index = pa.array(np.repeat(np.arange(len(groups)), lengths))
            flat = np.frombuffer(b"".join(_ID.pack(ids) if type(ids) is int else ids for ids in connections),
                                 dtype="<i8")
        return self._assemble(
            groups, pa.nulls(total, pa.string()), _column(groups, 7), pa.array(flat),
            _constant("delivered", total), pa.nulls(total, pa.string()), _constant("out", total), True, index,
        )

    def _assemble(self, records: list[tuple], protocol_id: pa.Array, sizes: list, connection: pa.Array,
                  outcome: pa.Array, reason: pa.Array, direction: pa.Array, has_latency: Any,
                  index: pa.Array | None = None) -> pa.Table:
        """The table; ``records`` start with (ts_ns, *meta); ``index`` repeats a group's values per connection.

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
            array = values if isinstance(values, pa.Array) else pa.array(values, type_)
            return array if index is None else array.take(index)

        def meta_field(name: str, type_: pa.DataType) -> pa.Array:
            return per_record(_column(records, 1 + META_FIELDS[name]), type_)

        return pa.Table.from_arrays(
            [
                per_record(ts_ns, pa.int64()),
                meta_field("dialect", pa.string()),
                direction,
                meta_field("kind", pa.string()),
                meta_field("topic", pa.string()),
                _constant(self.gateway_id, len(connection)),
                connection,
                meta_field("origin", pa.string()),
                meta_field("seq", pa.int64()),  # msg_seq
                protocol_id,
                per_record(sizes, pa.int64()),
                per_record(latency, pa.int64()),
                outcome,
                reason,
            ],
            schema=SCHEMA,
        )

    def _write_partitions(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        location = self.location
        filesystem = location.filesystem
        hours = pa.array(table["ts_ns"].to_numpy() // HOUR_NS)
        distinct = pc.unique(hours).to_pylist()
        for hour in distinct:
            part = table if len(distinct) == 1 else table.filter(pc.equal(hours, hour))
            stamp = time.gmtime(hour * 3600)
            folder = location.path(f"date={time.strftime('%Y-%m-%d', stamp)}", f"hour={stamp.tm_hour:02d}")
            first = pc.min(part["ts_ns"]).as_py()
            # the node and gateway keep writers apart; the flush number, two flushes starting in the same ns
            name = f"{self.gateway_id}-{self.node}-{first}-{next(self._files)}-{part.num_rows}.parquet"
            if location.has_directories:
                filesystem.create_dir(folder, recursive=True)
                temporary = f"{folder}/.{name}.tmp"
                pq.write_table(part.sort_by("ts_ns"), temporary, filesystem=filesystem, compression="zstd")
                filesystem.move(temporary, f"{folder}/{name}")
            else:
                pq.write_table(part.sort_by("ts_ns"), f"{folder}/{name}", filesystem=filesystem,
                               compression="zstd")
            self.rows_written += part.num_rows
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


def folder_hour(date_folder: str, hour_folder: str) -> int | None:
    """The UTC hour (epoch hours) of the folders date=YYYY-MM-DD and hour=HH; None when the names do not parse."""
    try:
        stamp = time.strptime(f"{date_folder} {hour_folder}", "date=%Y-%m-%d hour=%H")
    except ValueError:
        return None
    return calendar.timegm(stamp) // 3600


def _column(records: list[tuple], position: int) -> list:
    return list(map(itemgetter(position), records))


_ID = struct.Struct("<q")


def _ids(connections: tuple[int, ...] | list[int]) -> bytes:
    """A group's connection ids as little-endian int64s: bytes, which the garbage collector never
    tracks (the writer may run on another node)."""
    ids = array.array("q", connections)
    if sys.byteorder != "little":  # pragma: no cover - every platform Ray runs on is little-endian
        ids.byteswap()
    return ids.tobytes()


def _constant(value: str, count: int) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(count, dtype=np.int8)), [value]).cast(pa.string())


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
    meta = ("warm-up", 1, 0, "", "", None)
    table = pa.concat_tables([log._rows_table([(1, *meta, None, 1, 1, "dropped", "")]),
                              log._groups_table([(1, *meta, 1, _ids((1, 2)))])])
    pq.write_table(table.sort_by("ts_ns"), io.BytesIO(), compression="zstd")
