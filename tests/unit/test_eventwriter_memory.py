"""The event-log writer keeps the memory a flush frees for the next one, and hands it back after a
flush far larger than usual (``actors/eventwriter.py``). Plain objects: the writer class without Ray,
its niceness and allocator calls recorded instead of made on the test process."""

from __future__ import annotations

import time

import pytest

import actors.eventwriter as module
from router.eventlog import PICKLE_SLICE, _pickled_slices



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


def payload(count: int) -> list[list[bytes]]:
    now = time.time_ns()
    # (ts_ns, origin, seq, ingress_ns, dialect, kind, topic, protocol id, bytes, connection, outcome, reason)
    rows = [(now, "gw", i, now, "signal", "hub:publish", "t", None, 10, 1, "accepted", None) for i in range(count)]
    return [_pickled_slices(rows, PICKLE_SLICE), _pickled_slices([], PICKLE_SLICE)]


def test_memory_is_kept_from_the_start_and_trimmed_only_after_a_large_flush(writer):
    assert writer.calls == ["nice 10", "keep"]
    assert writer.write_slices(payload(100)) == (100, 1)  # not more than the bound: kept
    assert writer.calls == ["nice 10", "keep"]
    assert writer.write_slices(payload(101)) == (201, 2)  # past it: trimmed once written
    assert writer.calls == ["nice 10", "keep", "trim"]
