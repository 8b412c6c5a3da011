"""router/analytics.py, the pure input side: durations, instants, event-file selection, Java lookup.

None of this starts Spark or Ray; the Spark parts of the module import them inside functions.
"""

from __future__ import annotations

import calendar
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from router.analytics import (AnalyticsError, event_files, java_runtime, parse_duration, parse_instant,
                              remove_jni_copies)

REPO = Path(__file__).resolve().parents[2]
SECOND_NS = 1_000_000_000
HOUR_NS = 3600 * SECOND_NS
NOW_NS = 1_795_323_600 * SECOND_NS + 123_456_789  # 2026-11-22 05:00:00.123456789 UTC


def at(year: int, month: int, day: int, hour: int, minute: int = 0, second: int = 0) -> int:
    """A UTC time as epoch nanoseconds, computed with integers only."""
    return calendar.timegm((year, month, day, hour, minute, second)) * SECOND_NS


def test_importing_the_module_does_not_load_spark_or_ray():
    code = (
        "import sys, router.analytics; "
        "print(sorted(m for m in ('pyspark', 'py4j', 'raydp', 'ray', 'matplotlib') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- parse_duration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("15m", 900.0),
        ("1h", 3600.0),
        ("2d", 172_800.0),
        ("1w", 604_800.0),
        ("250ms", 0.25),
        ("3", 3.0),
        ("1.5h", 5400.0),
        (" 15 m ", 900.0),
        ("0s", 0.0),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "1x", "-5s", "1h30m", "ten", "1H", "1.h", "5 mins"])
def test_parse_duration_rejects_what_is_not_a_duration(text):
    with pytest.raises(AnalyticsError) as raised:
        parse_duration(text)
    assert str(raised.value).startswith(f"not a duration: {text!r}")


# -- parse_instant --------------------------------------------------------------------------------


def test_parse_instant_of_none_is_none():
    assert parse_instant(None, NOW_NS) is None


def test_parse_instant_now_is_the_given_now():
    assert parse_instant("now", NOW_NS) == NOW_NS
    assert parse_instant(" now ", NOW_NS) == NOW_NS


@pytest.mark.parametrize(
    ("text", "ago_ns"),
    [
        ("1h", HOUR_NS),
        ("15m", 15 * 60 * SECOND_NS),
        ("90s", 90 * SECOND_NS),
        ("2d", 48 * HOUR_NS),
        ("1w", 7 * 24 * HOUR_NS),
        ("250ms", 250_000_000),
        ("3", 3 * SECOND_NS),
    ],
)
def test_parse_instant_of_a_duration_is_that_long_before_now(text, ago_ns):
    assert parse_instant(text, NOW_NS) == NOW_NS - ago_ns


def test_parse_instant_one_hour_ago_is_exact():
    assert parse_instant("1h", NOW_NS) == NOW_NS - 3_600_000_000_000


@pytest.mark.parametrize("millis", [1025, 1049, 1999, 2001])
def test_parse_instant_of_milliseconds_is_exact(millis):
    assert parse_instant(f"{millis}ms", 10**19) == 10**19 - millis * 1_000_000


def test_parse_instant_keeps_iso_microseconds_exact():
    assert parse_instant("2026-01-01T00:00:00.000001", 0) == 1_767_225_600_000_001_000


def test_parse_instant_iso_time_without_zone_is_utc():
    assert parse_instant("2026-11-22T05:00", NOW_NS) == at(2026, 11, 22, 5)
    assert parse_instant("2026-11-22T05:00:30", NOW_NS) == at(2026, 11, 22, 5, 0, 30)
    assert parse_instant("2026-11-22 05:00", NOW_NS) == at(2026, 11, 22, 5)


def test_parse_instant_iso_date_is_midnight_utc():
    assert parse_instant("2026-11-22", NOW_NS) == at(2026, 11, 22, 0)


def test_parse_instant_iso_time_with_offset_is_converted_to_utc():
    assert parse_instant("2026-11-22T07:00+02:00", NOW_NS) == at(2026, 11, 22, 5)
    assert parse_instant("2026-11-22T00:30-05:00", NOW_NS) == at(2026, 11, 22, 5, 30)
    assert parse_instant("2026-11-22T05:00Z", NOW_NS) == at(2026, 11, 22, 5)


@pytest.fixture
def tokyo_local_time(monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_parse_instant_does_not_depend_on_the_local_time_zone(tokyo_local_time):
    assert time.strftime("%Z") == "JST"
    assert parse_instant("2026-11-22T05:00", NOW_NS) == at(2026, 11, 22, 5)


@pytest.mark.parametrize("text", ["yesterday", "2026-13-01", "05:00 tomorrow", "1h ago"])
def test_parse_instant_rejects_garbage(text):
    with pytest.raises(AnalyticsError) as raised:
        parse_instant(text, NOW_NS)
    assert str(raised.value).startswith(f"not a time: {text!r}")


# -- event_files ----------------------------------------------------------------------------------


def event_file(events_dir: Path, date: str, hour: int, name: str = "gw-a-1-1.parquet") -> Path:
    folder = events_dir / f"date={date}" / f"hour={hour:02d}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"")  # event_files only looks at names
    return path


def as_read(files: list[Path]) -> list[str]:
    """What event_files returns for local files: their paths, as text (Spark reads them so)."""
    return [str(path) for path in files]


@pytest.fixture
def events_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "events"
    directory.mkdir()
    return directory


@pytest.fixture
def three_hours(events_dir: Path) -> list[Path]:
    """Files in 2026-11-22 hours 05, 06 and 07 (two gateways in hour 06)."""
    return [
        event_file(events_dir, "2026-11-22", 5, "gw-a-1-1.parquet"),
        event_file(events_dir, "2026-11-22", 6, "gw-a-2-1.parquet"),
        event_file(events_dir, "2026-11-22", 6, "gw-b-3-1.parquet"),
        event_file(events_dir, "2026-11-22", 7, "gw-a-4-1.parquet"),
    ]


def test_event_files_of_an_empty_log_is_an_error(events_dir):
    with pytest.raises(AnalyticsError) as raised:
        event_files(events_dir)
    assert f"the event log at {events_dir} is empty" in str(raised.value)


def test_event_files_of_a_missing_directory_is_an_empty_log(tmp_path):
    with pytest.raises(AnalyticsError, match="is empty"):
        event_files(tmp_path / "nowhere")


def test_event_files_of_a_log_holding_only_hidden_files_is_empty(events_dir):
    event_file(events_dir, "2026-11-22", 5, ".gw-a-1-1.parquet")
    with pytest.raises(AnalyticsError, match="is empty"):
        event_files(events_dir)


def test_event_files_of_a_log_whose_folders_do_not_parse_is_empty(events_dir):
    event_file(events_dir, "2026-13-01", 0)
    with pytest.raises(AnalyticsError, match="is empty"):
        event_files(events_dir)


def test_event_files_without_bounds_are_all_files_sorted(events_dir, three_hours):
    assert event_files(events_dir) == as_read(three_hours)


def test_event_files_accepts_a_string_path(events_dir, three_hours):
    assert event_files(str(events_dir)) == as_read(three_hours)


def test_event_files_since_selects_the_hour_containing_since_and_later(events_dir, three_hours):
    assert event_files(events_dir, since_ns=at(2026, 11, 22, 6, 59, 59)) == as_read(three_hours[1:])


def test_event_files_until_selects_the_hour_containing_until_and_earlier(events_dir, three_hours):
    assert event_files(events_dir, until_ns=at(2026, 11, 22, 6, 0, 0)) == as_read(three_hours[:3])


def test_event_files_between_selects_every_overlapping_hour(events_dir, three_hours):
    chosen = event_files(events_dir, since_ns=at(2026, 11, 22, 5, 30), until_ns=at(2026, 11, 22, 6, 10))
    assert chosen == as_read(three_hours[:3])


def test_event_files_within_one_hour_selects_that_hour(events_dir, three_hours):
    chosen = event_files(events_dir, since_ns=at(2026, 11, 22, 7, 1), until_ns=at(2026, 11, 22, 7, 2))
    assert chosen == as_read(three_hours[3:])


def test_event_files_across_midnight(events_dir):
    late = event_file(events_dir, "2026-11-21", 23)
    early = event_file(events_dir, "2026-11-22", 0)
    event_file(events_dir, "2026-11-22", 1)
    chosen = event_files(events_dir, since_ns=at(2026, 11, 21, 23, 30), until_ns=at(2026, 11, 22, 0, 30))
    assert chosen == as_read([late, early])


def test_event_files_outside_the_range_is_an_error_naming_the_hours_held(events_dir, three_hours):
    with pytest.raises(AnalyticsError) as raised:
        event_files(events_dir, since_ns=at(2026, 11, 23, 0, 0, 5))
    assert str(raised.value) == (
        "no events in the requested time range [2026-11-23 00:00:05 .. now] UTC: "
        "the log holds events from 2026-11-22 05:00 to 2026-11-22 08:00 UTC"
    )


def test_event_files_before_the_log_starts_is_an_error(events_dir, three_hours):
    with pytest.raises(AnalyticsError) as raised:
        event_files(events_dir, until_ns=at(2026, 11, 22, 4, 59, 59))
    assert str(raised.value) == (
        "no events in the requested time range [start .. 2026-11-22 04:59:59] UTC: "
        "the log holds events from 2026-11-22 05:00 to 2026-11-22 08:00 UTC"
    )


def test_event_files_ignores_hidden_files(events_dir):
    visible = event_file(events_dir, "2026-11-22", 5, "gw-a-1-1.parquet")
    event_file(events_dir, "2026-11-22", 5, ".gw-a-2-1.parquet")
    event_file(events_dir, "2026-11-22", 5, ".gw-a-3-1.parquet.tmp")
    assert event_files(events_dir) == as_read([visible])


def test_event_files_ignores_files_outside_the_layout(events_dir):
    visible = event_file(events_dir, "2026-11-22", 5)
    (events_dir / "stray.parquet").write_bytes(b"")
    (visible.parent / "notes.txt").write_text("not parquet")
    (events_dir / "other" / "hour=05").mkdir(parents=True)
    (events_dir / "other" / "hour=05" / "x.parquet").write_bytes(b"")
    assert event_files(events_dir) == as_read([visible])


def test_event_files_skips_folders_whose_date_does_not_parse(events_dir):
    visible = event_file(events_dir, "2026-11-22", 5)
    event_file(events_dir, "2026-13-40", 5)
    assert event_files(events_dir) == as_read([visible])


@pytest.mark.parametrize("form", ["file URL", "file URL passed through Path"])
def test_event_files_at_a_file_url_are_file_urls(events_dir, three_hours, form):
    url = events_dir.as_uri()  # file:///…; through Path: file:/…
    assert event_files(url if form == "file URL" else Path(url)) == [f"file://{path}" for path in three_hours]


def test_event_files_of_a_relative_folder_are_absolute_paths(events_dir, three_hours, monkeypatch):
    monkeypatch.chdir(events_dir.parent)
    assert event_files("events") == as_read(three_hours)


def test_event_files_at_a_url_select_by_hour_as_with_a_folder(events_dir, three_hours):
    chosen = event_files(events_dir.as_uri(), since_ns=at(2026, 11, 22, 5, 30), until_ns=at(2026, 11, 22, 6, 10))
    assert chosen == [f"file://{path}" for path in three_hours[:3]]


def test_event_files_of_an_empty_log_at_a_url_is_an_error_naming_the_url(tmp_path):
    url = (tmp_path / "nowhere").as_uri()
    with pytest.raises(AnalyticsError) as raised:
        event_files(url)
    assert str(raised.value).startswith(f"the event log at {url} is empty: ")


def test_event_files_at_a_url_outside_the_range_names_the_hours_held(events_dir, three_hours):
    with pytest.raises(AnalyticsError) as raised:
        event_files(events_dir.as_uri(), until_ns=at(2026, 11, 22, 4, 59, 59))
    assert str(raised.value) == (
        "no events in the requested time range [start .. 2026-11-22 04:59:59] UTC: "
        "the log holds events from 2026-11-22 05:00 to 2026-11-22 08:00 UTC"
    )


def test_hours_in_range_holding_only_hidden_files_do_not_count(events_dir):
    event_file(events_dir, "2026-11-22", 5, ".gw-a-1-1.parquet.tmp")  # a write in progress
    event_file(events_dir, "2026-11-22", 7)
    with pytest.raises(AnalyticsError) as raised:
        event_files(events_dir, until_ns=at(2026, 11, 22, 5, 30))
    assert str(raised.value) == (
        "no events in the requested time range [start .. 2026-11-22 05:30:00] UTC: "
        "the log holds events from 2026-11-22 07:00 to 2026-11-22 08:00 UTC"
    )


# -- java_runtime ---------------------------------------------------------------------------------


def fake_java(bin_dir: Path, script: str) -> Path:
    bin_dir.mkdir(parents=True)
    java = bin_dir / "java"
    java.write_text("#!/bin/sh\n" + script + "\n")
    java.chmod(0o755)
    return java


def test_java_runtime_without_java_is_an_error_asking_for_java_17(tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(AnalyticsError) as raised:
        java_runtime()
    assert "Java was not found" in str(raised.value)
    assert "Java 17" in str(raised.value)


def test_java_runtime_reports_the_installed_java_17():
    assert "17" in java_runtime()


def test_java_runtime_is_the_first_line_java_prints_on_stderr(tmp_path, monkeypatch):
    fake_java(tmp_path / "bin", "echo 'openjdk version \"17.0.99\" 2099-01-01' >&2\necho 'second line' >&2")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert java_runtime() == 'openjdk version "17.0.99" 2099-01-01'


def test_java_runtime_prefers_java_home_over_path(tmp_path, monkeypatch):
    fake_java(tmp_path / "jdk" / "bin", "echo 'from JAVA_HOME' >&2")
    fake_java(tmp_path / "path-bin", "echo 'from PATH' >&2")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    monkeypatch.setenv("PATH", str(tmp_path / "path-bin"))
    assert java_runtime() == "from JAVA_HOME"


def test_java_runtime_falls_back_to_path_when_java_home_has_no_java(tmp_path, monkeypatch):
    (tmp_path / "empty-jdk").mkdir()
    fake_java(tmp_path / "path-bin", "echo 'from PATH' >&2")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "empty-jdk"))
    monkeypatch.setenv("PATH", str(tmp_path / "path-bin"))
    assert java_runtime() == "from PATH"


def test_java_runtime_that_prints_nothing_is_named_by_its_path(tmp_path, monkeypatch):
    java = fake_java(tmp_path / "jdk" / "bin", "exit 0")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert java_runtime() == str(java)


def test_java_runtime_that_cannot_run_is_an_error(tmp_path, monkeypatch):
    java = fake_java(tmp_path / "jdk" / "bin", "exit 0")
    java.chmod(0o644)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    with pytest.raises(AnalyticsError) as raised:
        java_runtime()
    assert str(raised.value).startswith(f"Java at {java} does not run: ")



# -- the copies of Ray's JNI library Spark's JVMs leave ---------------------------------------------

def _copy(root: Path, name: str, age_s: float, extra: str | None = None) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "libcore_worker_library_java.so").write_bytes(b"\0" * 4096)
    (folder / "file_lock").write_bytes(b"")
    if extra:
        (folder / extra).write_text("x")
    stamp = time.time() - age_s
    os.utime(folder, (stamp, stamp))
    return folder


def test_jni_copies_loaded_or_left_over_are_removed_and_nothing_else(tmp_path):
    """Before: each Spark start left a 40 MB copy of Ray's JNI library in /tmp/ray/<epoch ms>/ for
    good (365 of them, 14.6 GB, on the machine this was found on)."""
    left_over = _copy(tmp_path, "1795463533758", age_s=3600)
    loading = _copy(tmp_path, "1795463551034", age_s=1)  # a JVM may be about to load it
    loaded = _copy(tmp_path, "1795463607401", age_s=1)
    other_files = _copy(tmp_path, "1795463621461", age_s=3600, extra="notes.txt")
    not_a_copy = _copy(tmp_path, "session_latest", age_s=3600)
    with open(loaded / "libcore_worker_library_java.so", "rb") as library:
        mapping = mmap.mmap(library.fileno(), 0, prot=mmap.PROT_READ)  # as a process that loaded it
    try:
        assert remove_jni_copies(tmp_path, min_age_s=60) == 2
    finally:
        mapping.close()
    assert not left_over.exists() and not loaded.exists()
    assert loading.exists() and other_files.exists() and not_a_copy.exists()
    assert remove_jni_copies(tmp_path / "missing") == 0
