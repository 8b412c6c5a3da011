"""actors/retained.py: versioned last values, cached, committed per batch, kept on disk."""

from __future__ import annotations

from actors.cashu.retained import MemoryRetainedStore, RetainedValues, SqliteRetainedStore


def test_versions_count_per_key_and_reads_see_unsaved_writes():
    values = RetainedValues(MemoryRetainedStore())
    assert values.get("a") is None
    assert values.put("a", b"1") == 1
    assert values.put("a", b"2") == 2
    assert values.put("b", b"x") == 1
    assert values.get("a") == (2, b"2")
    assert values.dirty
    assert values.commit() == 2
    assert not values.dirty
    assert values.store.rows == {"a": (2, b"2"), "b": (1, b"x")}


def test_put_if_absent_keeps_what_is_there():
    values = RetainedValues(MemoryRetainedStore())
    assert values.put_if_absent("a", b"fetched") == ((1, b"fetched"), True)
    values.put("a", b"pushed")
    assert values.put_if_absent("a", b"late") == ((2, b"pushed"), False)


def test_eviction_reloads_from_the_store_and_pending_writes_survive_it():
    values = RetainedValues(MemoryRetainedStore(), max_cached=2)
    values.put("a", b"1")
    values.put("b", b"1")
    values.put("c", b"1")  # evicts "a" from the cache before the commit
    assert values.get("a") == (1, b"1")
    values.commit()
    for key in "def":
        values.get(key)
    assert values.get("a") == (1, b"1")
    assert values.put("a", b"2") == 2


def test_sqlite_store_survives_reopening_and_is_shared(tmp_path):
    path = tmp_path / "sub" / "retained.sqlite3"
    first = RetainedValues(SqliteRetainedStore(path))
    second = RetainedValues(SqliteRetainedStore(path))  # another shard on the same file
    first.put("k", b'{"state":"PAID"}')
    first.put("k", b'{"state":"ISSUED"}')
    first.commit()
    second.put("j", b"x")
    second.commit()
    first.close()
    second.close()
    reopened = RetainedValues(SqliteRetainedStore(path))
    assert reopened.get("k") == (2, b'{"state":"ISSUED"}')
    assert reopened.get("j") == (1, b"x")
    assert reopened.get("missing") is None
    assert reopened.put("k", b"next") == 3
