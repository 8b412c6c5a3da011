"""Where the event log lives: ``analytics.directory`` as a local folder or a pyarrow filesystem URL,
and the paths Spark is given for it (router/eventlog.py ``event_location``, router/config.py).

Building an S3 or GCS filesystem object makes no request (the region is given), so those run
without a store; HDFS's needs libhdfs and a JVM to be built, so its Spark path is checked on the
pure function.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest

from router.config import ConfigError
from router.eventlog import event_location, redact, spark_prefix
from router.settings import load_settings


def test_a_local_folder_is_the_local_filesystem_and_spark_reads_the_absolute_path(tmp_path):
    location = event_location(tmp_path / "events")
    assert isinstance(location.filesystem, pafs.LocalFileSystem)
    assert location.root == str(tmp_path / "events")
    assert location.has_directories
    assert location.spark_path(location.path("date=2026-11-22", "hour=05", "a.parquet")) == (
        f"{tmp_path}/events/date=2026-11-22/hour=05/a.parquet"
    )
    assert location.display == str(tmp_path / "events")


def test_a_relative_folder_is_made_absolute_and_shown_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    location = event_location("logs/events/")
    assert location.root == f"{tmp_path}/logs/events"
    assert location.display == "logs/events/"


@pytest.mark.parametrize("url", ["file:///srv/events", "file:///srv/events/", "file:/srv/events"])
def test_a_file_url_is_the_local_filesystem_and_spark_reads_file_urls(url):
    location = event_location(url)
    assert isinstance(location.filesystem, pafs.LocalFileSystem)
    assert location.root == "/srv/events"
    assert location.has_directories
    assert location.spark_path(location.path("date=2026-11-22")) == "file:///srv/events/date=2026-11-22"
    assert location.display == url


def test_a_path_object_of_a_file_url_is_still_that_url():
    # Path("file:///srv/events") is file:/srv/events: a caller wrapping the setting in Path loses a slash.
    assert event_location(Path("file:///srv/events")).root == "/srv/events"


def test_an_s3_url_is_s3_without_directories_and_spark_reads_it_as_s3a():
    location = event_location("s3://analytics-bucket/router/events?region=eu-west-1")
    assert isinstance(location.filesystem, pafs.S3FileSystem)
    assert location.filesystem.region == "eu-west-1"
    assert location.root == "analytics-bucket/router/events"
    assert not location.has_directories
    assert location.spark_path(location.path("date=2026-11-22", "hour=05", "a.parquet")) == (
        "s3a://analytics-bucket/router/events/date=2026-11-22/hour=05/a.parquet"
    )


def test_an_s3_url_with_credentials_keeps_them_out_of_messages_and_spark_paths():
    location = event_location("s3://AKIAEXAMPLE:s3cr3t@analytics-bucket/events?region=eu-west-1")
    assert location.display == "s3://AKIAEXAMPLE:***@analytics-bucket/events?region=eu-west-1"
    assert location.spark_path(location.path("x")) == "s3a://analytics-bucket/events/x"


def test_a_gs_url_is_gcs_without_directories_and_spark_reads_it_as_gs():
    location = event_location("gs://analytics-bucket/events")
    assert isinstance(location.filesystem, pafs.GcsFileSystem)
    assert location.root == "analytics-bucket/events"
    assert not location.has_directories
    assert location.spark_path(location.path("date=2026-11-22")) == "gs://analytics-bucket/events/date=2026-11-22"


@pytest.mark.parametrize(
    ("url", "root", "prefix"),
    [
        ("hdfs://namenode:8020/router/events", "/router/events", "hdfs://namenode:8020"),
        ("hdfs://user:pw@namenode:8020/router/events", "/router/events", "hdfs://namenode:8020"),
        ("file:///srv/events", "/srv/events", "file://"),
        ("s3://bucket/events?region=x", "bucket/events", "s3a://"),
        ("S3://bucket/events", "bucket/events", "s3a://"),
        ("gs://bucket/events", "bucket/events", "gs://"),
        ("gcs://bucket/events", "bucket/events", "gs://"),
        ("abfs://container@account.dfs.core.windows.net/events", "container/events", "abfs://"),
    ],
)
def test_spark_prefix(url, root, prefix):
    assert spark_prefix(url, root) == prefix


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("s3://bucket/events", "s3://bucket/events"),
        ("s3://key:secret@bucket/events", "s3://key:***@bucket/events"),
        ("hdfs://user@namenode:8020/events", "hdfs://user@namenode:8020/events"),
        ("hdfs://user:pw@namenode:8020/events?x=1", "hdfs://user:***@namenode:8020/events?x=1"),
    ],
)
def test_redact(url, shown):
    assert redact(url) == shown


# -- the setting ---------------------------------------------------------------------------------


def test_events_dir_defaults_to_the_events_folder_of_the_data_dir(tmp_path):
    assert load_settings(data_dir=tmp_path).events_dir == f"{tmp_path}/events"


@pytest.mark.parametrize("url", ["file:///srv/events", "s3://bucket/router/events?region=eu-west-1",
                                 "gs://bucket/events", "hdfs://namenode:8020/events"])
def test_a_url_setting_is_kept_exactly(tmp_path, url):
    assert load_settings(data_dir=tmp_path, analytics={"directory": url}).events_dir == url


def test_a_path_setting_is_kept_as_its_text(tmp_path):
    assert load_settings(analytics={"directory": tmp_path / "shared"}).events_dir == str(tmp_path / "shared")


def test_the_setting_from_the_environment(monkeypatch):
    monkeypatch.setenv("ROUTER_ANALYTICS__DIRECTORY", "file:///mnt/shared/events")
    assert load_settings().events_dir == "file:///mnt/shared/events"


def test_the_setting_from_a_config_file(tmp_path):
    config = tmp_path / "router.toml"
    config.write_text('[analytics]\ndirectory = "s3://bucket/events?region=eu-west-1"\n')
    assert load_settings(config).events_dir == "s3://bucket/events?region=eu-west-1"


def test_a_setting_that_is_not_text_is_refused():
    with pytest.raises(ConfigError, match="analytics.directory"):
        load_settings(analytics={"directory": 5})

