"""The event-log writer keeps the memory a flush frees for the next one, and hands it back after a
flush far larger than usual (``actors/eventwriter.py``). Plain objects: the writer class without Ray,
its niceness and allocator calls recorded instead of made on the test process."""

from __future__ import annotations

import time

import pytest

import actors.eventwriter as module
from router.eventlog import PICKLE_SLICE, EventLog, _pickled_slices



@pytest.fixture
def writer(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(module.os, "nice", lambda increment: calls.append(f"nice {increment}"))
    monkeypatch.setattr(module, "keep_memory", lambda: calls.append("keep") or True)
    monkeypatch.setattr(module, "trim_memory", lambda: calls.append("trim") or True)
    monkeypatch.setattr(module, "TRIM_AFTER_RECORDS", 100)
    instance = module.EventLogWriter(str(tmp_path), "gw", 1.0)
    instance.calls = calls
    return instance


def payload(count: int) -> tuple:
    """A gateway's flush of ``count`` accepted messages and one drop, as its log hands it over."""
    now = time.time_ns()
    gateway = EventLog("unused", "gw", remote=object())  # a remote writer: this side opens no folder
    for i in range(count - 1):
        gateway.ingress(now, ("gw", i, now, "signal", "hub:publish", "t"), None, 10, 1)
    # (ts_ns, origin, seq, ingress_ns, dialect, kind, topic, protocol id, bytes, connection, outcome, reason)
    dropped = [(now, "gw", count, now, "signal", "hub:publish", "t", None, 10, 1, "dropped", "slow_consumer")]
    return gateway._take(), _pickled_slices(dropped, PICKLE_SLICE)


def test_memory_is_kept_from_the_start_and_trimmed_only_after_a_large_flush(writer):
    assert writer.calls == ["nice 10", "keep"]
    assert writer.write_flush(*payload(100)) == (100, 100, 1)  # rows, events, files; not more than the bound: kept
    assert writer.calls == ["nice 10", "keep"]
    assert writer.write_flush(*payload(101)) == (201, 201, 2)  # past it: trimmed once written
    assert writer.calls == ["nice 10", "keep", "trim"]
