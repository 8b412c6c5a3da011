"""Throughput analytics: the event log read and aggregated by Spark, run on Ray by RayDP.

As a command: ``router analytics --since 1h --out report/`` prints a summary and writes tables
(Parquet and CSV) and plots (PNG). As a library, for notebooks::

    from router.analytics import spark_session, load_events, compute_report
    with spark_session() as spark:
        events = load_events(spark, "/path/to/events", since_ns=..., until_ns=...)
        tables = compute_report(events, window_s=10)   # name -> Spark DataFrame
        tables["latency"].show()
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from router.eventlog import COLUMNS, FILE_SCHEMA, Location, event_location, folder_hour

logger = logging.getLogger(__name__)

HOUR_NS = 3_600_000_000_000
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_NS = {"ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9, "d": 86400 * 10**9, "w": 604800 * 10**9,
            None: 10**9}
TABLES = ("summary", "throughput", "topic_throughput", "latency", "fanout", "drops", "top_topics",
          "top_connections")


class AnalyticsError(Exception):
    """Analytics cannot run; the message says why and what to do."""


# -- inputs ------------------------------------------------------------------------------------


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``1h``, ``2d``, ``1w``, ``250ms`` or plain seconds, in seconds."""
    return duration_ns(text) / 1e9


def duration_ns(text: str) -> int:
    """The same as :func:`parse_duration`, in whole nanoseconds (exact: no float rounding)."""
    match = _DURATION.match(text)
    if not match:
        raise AnalyticsError(f"not a duration: {text!r} (use e.g. 30s, 15m, 1h, 2d)")
    return int(Fraction(match.group(1)) * _UNIT_NS[match.group(2)])


def parse_instant(text: str | None, now_ns: int) -> int | None:
    """An ISO time (UTC unless it says otherwise), ``now``, or a duration meaning that long ago."""
    if text is None:
        return None
    if text.strip() == "now":
        return now_ns
    if _DURATION.match(text):
        return now_ns - duration_ns(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise AnalyticsError(f"not a time: {text!r} (use an ISO time like 2026-11-22T05:00, 'now', or 1h)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    since_epoch = moment - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (since_epoch.days * 86400 + since_epoch.seconds) * 10**9 + since_epoch.microseconds * 1000


def java_runtime() -> str:
    """The ``java -version`` line of the Java runtime Spark will use; AnalyticsError if there is none."""
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home, "bin", "java") if java_home else None
    java = str(candidate) if candidate is not None and candidate.exists() else shutil.which("java")
    if java is None:
        raise AnalyticsError(
            "Java was not found (no JAVA_HOME, no 'java' on PATH). Spark needs a Java 17 runtime: "
            "install openjdk-17-jre-headless (Debian/Ubuntu) and run again."
        )
    try:
        result = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except OSError as error:
        raise AnalyticsError(f"Java at {java} does not run: {error}") from None
    first = (result.stderr or result.stdout).strip().splitlines()
    return first[0] if first else java


def _hour_folders(location: Location) -> list[tuple[int, str]]:
    """(epoch hour, folder) of every date=…/hour=… folder of the log, in order."""
    return [
        (hour, folder.path)
        for day in location.folders(location.root, "date=")
        for folder in location.folders(day.path, "hour=")
        if (hour := folder_hour(day.base_name, folder.base_name)) is not None
    ]


def event_files(events_dir: str | Path, since_ns: int | None = None, until_ns: int | None = None) -> list[str]:
    """Parquet files of the log whose hour overlaps [since, until], as Spark reads them (a local path,
    or a URL in Spark's scheme: ``s3a://`` for ``s3://``); AnalyticsError when none.

    ``events_dir`` is a local folder or a URL of pyarrow's filesystems (``router.eventlog.event_location``).
    Only the folders of the hours in range are listed (in an object store, a request or more each).
    """
    location = event_location(events_dir)
    folders = _hour_folders(location)
    low = None if since_ns is None else since_ns // HOUR_NS
    high = None if until_ns is None else until_ns // HOUR_NS
    in_range = {folder for hour, folder in folders if (low is None or hour >= low) and (high is None or hour <= high)}
    files = [location.spark_path(path) for _, folder in folders if folder in in_range
             for path in location.files(folder, ".parquet")]
    if files:
        return files
    # The error says which hours the log holds: only then are the other folders listed.
    held = [hour for hour, folder in folders if folder not in in_range and location.files(folder, ".parquet")]
    if not held:
        raise AnalyticsError(
            f"the event log at {location.display} is empty: run traffic through the router with "
            "analytics.enabled = true (the default), or point --events / ROUTER_DATA_DIR at the right place"
        )
    raise AnalyticsError(
        f"no events in the requested time range {_describe_range(since_ns, until_ns)}: the log holds events "
        f"from {_hour_label(min(held))} to {_hour_label(max(held) + 1)} UTC"
    )


def _hour_label(epoch_hour: int) -> str:
    return dt.datetime.fromtimestamp(epoch_hour * 3600, dt.timezone.utc).strftime("%Y-%m-%d %H:00")


def _describe_range(since_ns: int | None, until_ns: int | None) -> str:
    def label(ns: int | None, default: str) -> str:
        if ns is None:
            return default
        return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")

    return f"[{label(since_ns, 'start')} .. {label(until_ns, 'now')}] UTC"


# -- Spark ------------------------------------------------------------------------------------


# Ray's Java driver (each JVM RayDP starts as one) copies its JNI library, about 40 MB, into
# /tmp/ray/<epoch ms>/ on every start, a path it hard-codes, and never removes it.
JNI_COPIES = Path("/tmp/ray")
_JNI_COPY_NAME = re.compile(r"^[0-9]{13}$")
_JNI_COPY_FILES = {"libcore_worker_library_java.so", "file_lock"}


def remove_jni_copies(root: Path = JNI_COPIES, min_age_s: float = 60.0) -> int:
    """Remove the copies of Ray's JNI library its Java drivers left under ``root``: those a live
    process has loaded (the mapping outlives the file; the space is freed when it exits) and those
    no process has loaded that are older than ``min_age_s`` (leftovers; a younger one may be a JVM's
    about to load it). Only directories named by 13 digits that hold nothing but the library and
    its lock file. Returns how many were removed."""
    try:
        candidates = [entry for entry in os.scandir(root)
                      if _JNI_COPY_NAME.match(entry.name) and entry.is_dir(follow_symlinks=False)]
        if not candidates:
            return 0
        loaded = _mapped_under(str(root) + "/")
    except OSError:
        return 0
    now = time.time()
    removed = 0
    for entry in candidates:
        try:
            names = set(os.listdir(entry.path))
            if not names <= _JNI_COPY_FILES or (entry.path not in loaded and now - entry.stat().st_mtime < min_age_s):
                continue
            shutil.rmtree(entry.path)
            removed += 1
        except OSError:
            continue  # another process removed it, or it is not ours to remove
    return removed


def _mapped_under(prefix: str) -> set[str]:
    """The directories under ``prefix`` holding a file some live process has mapped."""
    found: set[str] = set()
    needle = b" " + prefix.encode()  # a line's path follows the spaces after its inode
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps", "rb") as maps:
                text = maps.read()
        except OSError:
            continue
        start = text.find(needle)
        while start != -1:
            end = text.find(b"\n", start)
            path = text[start + 1:end if end != -1 else len(text)].decode(errors="replace")
            found.add(os.path.dirname(path.removesuffix(" (deleted)")))
            start = -1 if end == -1 else text.find(needle, end)
    return found


def _remove_jni_copies_quietly() -> None:
    """:func:`remove_jni_copies`, which must never keep Spark from starting or stopping."""
    try:
        remove_jni_copies()
    except Exception:  # housekeeping only
        logger.warning("could not remove Ray's JNI library copies", exc_info=True)


@contextlib.contextmanager
def spark_session(
    address: str | None = None,
    app_name: str = "router-analytics",
    executor_memory: str = "1G",
    progress: Callable[[str], None] = lambda message: None,
    configs: Mapping[str, str] | None = None,
) -> Iterator[Any]:
    """Spark on Ray through RayDP: on the running cluster (``address`` or auto), else a local Ray.

    ``configs`` adds Spark settings, e.g. the Hadoop connector of an object store
    (``spark.jars.packages``, ``spark.hadoop.fs.s3a.*``: docs/analytics.md). Spark is always stopped
    (``raydp.stop_spark``) on the way out, error or not. The copies of Ray's JNI library its JVMs
    leave in /tmp/ray are removed (:func:`remove_jni_copies`).
    """
    version = java_runtime()
    progress(f"Java: {version}")
    import ray
    import raydp

    started_ray = False
    if not ray.is_initialized():
        try:
            ray.init(address=address or "auto", logging_level=logging.WARNING)
            progress(f"joined the Ray cluster at {ray.get_runtime_context().gcs_address}")
        except ConnectionError:
            if address:
                raise AnalyticsError(f"no Ray cluster at {address}") from None
            ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING)
            progress("no running Ray cluster: started a local one")
        started_ray = True
    progress("starting Spark on Ray (RayDP)")
    spark = raydp.init_spark(
        app_name=app_name,
        num_executors=1,
        executor_cores=1,
        executor_memory=executor_memory,
        configs={
            "spark.sql.session.timeZone": "UTC",
            "spark.ui.showConsoleProgress": "true",
            "spark.sql.shuffle.partitions": "8",
            **(configs or {}),
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        _remove_jni_copies_quietly()  # Spark's JVMs have loaded theirs
        yield spark
    finally:
        progress("stopping Spark")
        raydp.stop_spark()
        if started_ray:
            ray.shutdown()
        _remove_jni_copies_quietly()


def spark_schema() -> Any:
    """How Spark reads the log's files: their columns (``connections`` a list of ids), and
    ``connection``, which only files of the earlier layout (a row per delivery) hold."""
    from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

    kinds = {"int64": LongType(), "string": StringType()}
    fields = [StructField(f.name, ArrayType(LongType(), False) if f.name == "connections" else kinds[str(f.type)], True)
              for f in FILE_SCHEMA]
    return StructType(fields + [StructField("connection", LongType(), True)])


def load_events(spark: Any, events_dir: str | Path, since_ns: int | None = None, until_ns: int | None = None) -> Any:
    """The event log (a folder or a URL) as a Spark DataFrame of its events (columns of
    :data:`router.eventlog.SCHEMA`), time-filtered: a fan-out group's row is a row per connection."""
    from pyspark.sql import functions as F

    files = event_files(events_dir, since_ns, until_ns)
    frame = spark.read.schema(spark_schema()).parquet(*files)
    if since_ns is not None:
        frame = frame.filter(F.col("ts_ns") >= since_ns)
    if until_ns is not None:
        frame = frame.filter(F.col("ts_ns") <= until_ns)
    # A row of the earlier layout has its one connection; a row whose connection was not recorded
    # is still one event.
    ids = F.coalesce(F.col("connections"), F.array(F.col("connection")))
    return frame.withColumn("connection", F.explode_outer(ids)).select(*COLUMNS)


def compute_report(events: Any, window_s: float = 10, top: int = 10) -> dict[str, Any]:
    """The report's tables as Spark DataFrames, keyed by name (see :data:`TABLES`)."""
    from pyspark.sql import functions as F

    window_ns = int(window_s * 1e9)
    events = events.withColumn(
        "window_start", F.timestamp_seconds((F.floor(F.col("ts_ns") / window_ns) * window_ns / 1e9))
    )
    accepted = events.filter((F.col("direction") == "in") & (F.col("outcome") == "accepted"))
    delivered = events.filter(F.col("outcome") == "delivered")
    tables: dict[str, Any] = {}

    tables["summary"] = (
        events.groupBy("dialect")
        .agg(
            F.sum(F.when(F.col("outcome") == "accepted", 1).otherwise(0)).alias("messages_in"),
            F.sum(F.when(F.col("outcome") == "accepted", F.col("bytes")).otherwise(0)).alias("bytes_in"),
            F.sum(F.when(F.col("outcome") == "rejected", 1).otherwise(0)).alias("rejected"),
            F.sum(F.when(F.col("outcome") == "delivered", 1).otherwise(0)).alias("delivered"),
            F.sum(F.when(F.col("outcome") == "delivered", F.col("bytes")).otherwise(0)).alias("bytes_out"),
            F.sum(F.when(F.col("outcome") == "dropped", 1).otherwise(0)).alias("dropped"),
            (F.min("ts_ns")).alias("first_ts_ns"),
            (F.max("ts_ns")).alias("last_ts_ns"),
        )
        .orderBy("dialect")
    )

    tables["throughput"] = (
        events.filter(F.col("outcome").isin("accepted", "delivered"))
        .groupBy("window_start", "dialect", "direction")
        .agg(F.count(F.lit(1)).alias("messages"), F.sum("bytes").alias("bytes"))
        .withColumn("messages_per_s", F.col("messages") / F.lit(window_s))
        .withColumn("bytes_per_s", F.col("bytes") / F.lit(window_s))
        .orderBy("window_start", "dialect", "direction")
    )

    tables["topic_throughput"] = (
        accepted.filter(F.col("topic").isNotNull())
        .groupBy("window_start", "dialect", "topic")
        .agg(F.count(F.lit(1)).alias("messages"), F.sum("bytes").alias("bytes"))
        .withColumn("messages_per_s", F.col("messages") / F.lit(window_s))
        .orderBy("window_start", "dialect", "topic")
    )

    quantiles = F.percentile_approx("latency_ns", [0.5, 0.9, 0.99], 10000)
    tables["latency"] = (
        delivered.groupBy("dialect")
        .agg(F.count(F.lit(1)).alias("deliveries"), quantiles.alias("q"), F.max("latency_ns").alias("max_ns"))
        .select(
            "dialect", "deliveries",
            (F.col("q")[0] / 1e6).alias("p50_ms"),
            (F.col("q")[1] / 1e6).alias("p90_ms"),
            (F.col("q")[2] / 1e6).alias("p99_ms"),
            (F.col("max_ns") / 1e6).alias("max_ms"),
        )
        .orderBy("dialect")
    )

    per_message = (
        events.filter(F.col("direction") == "out")
        .groupBy("origin", "msg_seq")
        .agg(F.sum(F.when(F.col("outcome") == "delivered", 1).otherwise(0)).alias("fanout"))
    )
    fanout = (
        accepted.select("dialect", "kind", "origin", "msg_seq")
        .join(per_message, ["origin", "msg_seq"], "left")
        .fillna({"fanout": 0})
    )
    tables["fanout"] = (
        fanout.groupBy("dialect", "kind")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum("fanout").alias("deliveries"),
            F.avg("fanout").alias("mean"),
            F.percentile_approx("fanout", 0.5).alias("p50"),
            F.percentile_approx("fanout", 0.99).alias("p99"),
            F.max("fanout").alias("max"),
        )
        .filter(F.col("deliveries") > 0)
        .orderBy("dialect", "kind")
    )

    tables["drops"] = (
        events.filter(F.col("outcome").isin("rejected", "dropped"))
        .groupBy("dialect", "outcome", "reason")
        .agg(F.count(F.lit(1)).alias("count"), F.sum("bytes").alias("bytes"))
        .orderBy(F.desc("count"), "dialect", "reason")
    )

    topics_in = accepted.filter(F.col("topic").isNotNull()).groupBy("dialect", "topic").agg(
        F.count(F.lit(1)).alias("messages_in"), F.sum("bytes").alias("bytes_in"))
    topics_out = delivered.filter(F.col("topic").isNotNull()).groupBy("dialect", "topic").agg(
        F.count(F.lit(1)).alias("deliveries"), F.sum("bytes").alias("bytes_out"))
    tables["top_topics"] = (
        topics_in.join(topics_out, ["dialect", "topic"], "full_outer")
        .fillna(0, ["messages_in", "bytes_in", "deliveries", "bytes_out"])
        .withColumn("total_bytes", F.col("bytes_in") + F.col("bytes_out"))
        .orderBy(F.desc("total_bytes"), "dialect", "topic")
        .limit(top)
    )

    tables["top_connections"] = (
        events.filter(F.col("connection") >= 0)
        .groupBy("gateway", "connection", "dialect")
        .agg(
            F.sum(F.when(F.col("direction") == "in", 1).otherwise(0)).alias("messages_in"),
            F.sum(F.when(F.col("direction") == "in", F.col("bytes")).otherwise(0)).alias("bytes_in"),
            F.sum(F.when(F.col("outcome") == "delivered", 1).otherwise(0)).alias("deliveries"),
            F.sum(F.when(F.col("outcome") == "delivered", F.col("bytes")).otherwise(0)).alias("bytes_out"),
        )
        .withColumn("total_bytes", F.col("bytes_in") + F.col("bytes_out"))
        .orderBy(F.desc("total_bytes"), "gateway", "connection")
        .limit(top)
    )
    return tables


# -- outputs ----------------------------------------------------------------------------------


@dataclass
class Report:
    out_dir: Path
    frames: dict[str, Any]  # name -> pandas DataFrame
    files: list[Path] = field(default_factory=list)


def write_report(frames: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    for name, frame in frames.items():
        for suffix, write in ((".parquet", frame.to_parquet), (".csv", frame.to_csv)):
            path = out_dir / f"{name}{suffix}"
            write(path, index=False)
            files.append(path)
    files += plot_report(frames, out_dir)
    return files


def plot_report(frames: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    throughput = frames["throughput"]
    figure, axes = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    for axis, direction, title in ((axes[0], "in", "received (accepted)"), (axes[1], "out", "delivered")):
        rows = throughput[throughput["direction"] == direction]
        for dialect, group in rows.groupby("dialect"):
            axis.plot(group["window_start"], group["messages_per_s"], marker="o", markersize=3, label=dialect)
        axis.set_ylabel("messages / s")
        axis.set_title(f"Throughput per dialect: {title}")
        axis.grid(alpha=0.3)
        if len(rows):
            axis.legend(loc="upper right")
    axes[1].set_xlabel("time (UTC)")
    figure.autofmt_xdate()
    paths.append(_save(figure, out_dir / "throughput.png"))

    latency = frames["latency"]
    figure, axis = plt.subplots(figsize=(8, 4.5))
    labels = ["p50_ms", "p90_ms", "p99_ms", "max_ms"]
    width = 0.8 / max(1, len(latency))
    for offset, (_, row) in enumerate(latency.iterrows()):
        positions = [i + offset * width for i in range(len(labels))]
        axis.bar(positions, [row[label] for label in labels], width=width, label=row["dialect"])
    axis.set_xticks([i + (len(latency) - 1) * width / 2 for i in range(len(labels))])
    axis.set_xticklabels(["p50", "p90", "p99", "max"])
    axis.set_ylabel("ingress → egress (ms)")
    axis.set_title("Delivery latency percentiles per dialect")
    axis.grid(axis="y", alpha=0.3)
    if len(latency):
        axis.legend()
    paths.append(_save(figure, out_dir / "latency.png"))
    return paths


def _save(figure: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def format_table(frame: Any, title: str, columns: list[str] | None = None, limit: int = 20) -> str:
    """A plain fixed-width table for the terminal."""
    if columns is not None:
        frame = frame[columns]
    lines = [title]
    if frame.empty:
        return "\n".join(lines + ["  (none)"])
    cells = [[_cell(v) for v in row] for row in frame.head(limit).itertuples(index=False)]
    headers = list(frame.columns)
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines.append("  " + "  ".join(str(h).rjust(w) for h, w in zip(headers, widths)))
    lines.append("  " + "  ".join("-" * w for w in widths))
    lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    if len(frame) > limit:
        lines.append(f"  ... {len(frame) - limit} more rows in the CSV")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def summary_text(frames: dict[str, Any]) -> str:
    summary = frames["summary"].copy()
    if not summary.empty:
        span = (summary["last_ts_ns"] - summary["first_ts_ns"]) / 1e9
        summary["seconds"] = span.round(1)
    parts = [
        format_table(summary, "Per dialect", ["dialect", "messages_in", "bytes_in", "rejected", "delivered",
                                              "bytes_out", "dropped", "seconds"] if not summary.empty else None),
        format_table(frames["latency"], "Delivery latency (ms)"),
        format_table(frames["fanout"], "Fan-out per message (deliveries)"),
        format_table(frames["drops"], "Drops and rejections by reason"),
        format_table(frames["top_topics"], "Top topics by volume"),
        format_table(frames["top_connections"], "Top connections by volume"),
    ]
    return "\n\n".join(parts)


def run_report(
    events_dir: str | Path,
    out_dir: Path,
    since_ns: int | None = None,
    until_ns: int | None = None,
    window_s: float = 10,
    top: int = 10,
    address: str | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> Report:
    """The whole job: checks, Spark, tables, files. Raises AnalyticsError with a clear message.

    ``events_dir``: a folder or a URL (every node's gateways writing to it: docs/analytics.md)."""
    java_runtime()  # fail fast, before starting anything
    event_files(events_dir, since_ns, until_ns)
    with spark_session(address, progress=progress) as spark:
        events = load_events(spark, events_dir, since_ns, until_ns).cache()
        started = time.monotonic()
        rows = events.count()
        progress(f"read {rows:,} events from {event_location(events_dir).display}")
        if rows == 0:
            raise AnalyticsError(f"no events in the requested time range {_describe_range(since_ns, until_ns)}")
        tables = compute_report(events, window_s, top)
        frames = {}
        for name in TABLES:
            progress(f"computing {name}")
            frames[name] = tables[name].toPandas()
        progress(f"Spark finished in {time.monotonic() - started:.1f}s")
    files = write_report(frames, out_dir)
    return Report(out_dir, frames, files)
