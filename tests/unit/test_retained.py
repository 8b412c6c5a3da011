"""actors/cashu/retained.py: versioned last values, cached, committed per batch, kept in the store.

The store tests take ``store_settings`` (tests/unit/conftest.py): each runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import sqlite3

import psycopg
import pytest

from actors.cashu.retained import MemoryRetainedStore, Retained, RetainedValues, open_retained_store


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


def test_the_store_survives_reopening_and_is_shared(store_settings):
    first = RetainedValues(open_retained_store(store_settings))
    second = RetainedValues(open_retained_store(store_settings))  # another shard, on this node or another
    first.put("k", b'{"state":"PAID"}')
    first.put("k", b'{"state":"ISSUED"}')
    first.commit()
    second.put("j", b"x")
    second.commit()
    first.close()
    second.close()
    reopened = RetainedValues(open_retained_store(store_settings))
    assert reopened.get("k") == (2, b'{"state":"ISSUED"}')
    assert reopened.get("j") == (1, b"x")
    assert reopened.get("missing") is None
    assert reopened.put("k", b"next") == 3


def test_a_second_store_reads_what_the_first_saved_at_once(store_settings):
    writer, reader = open_retained_store(store_settings), open_retained_store(store_settings)
    assert reader.load("k") is None
    writer.save([("k", 1, b"one")])
    assert reader.load("k") == Retained(1, b"one")
    writer.save([("k", 2, b"two"), ("j", 1, b"")])
    assert (reader.load("k"), reader.load("j")) == (Retained(2, b"two"), Retained(1, b""))
    writer.close()
    reader.close()


def test_a_save_is_all_or_nothing(store_settings):
    store = open_retained_store(store_settings)
    store.save([("kept", 1, b"before")])
    failure = psycopg.errors.NotNullViolation if store_settings.store.postgres else sqlite3.IntegrityError
    with pytest.raises(failure):
        store.save([("kept", 2, b"after"), ("new", 1, b"x"), ("broken", 1, None)])  # the last row cannot be stored
    assert (store.load("kept"), store.load("new"), store.load("broken")) == (Retained(1, b"before"), None, None)
    store.save([("new", 1, b"x")])  # the store is usable after the failed transaction
    assert store.load("new") == Retained(1, b"x")
    store.close()


def test_rows_of_one_save_apply_in_order(store_settings):
    store = open_retained_store(store_settings)
    store.save([("k", 1, b"a"), ("k", 2, b"b"), ("j", 7, b"\x00\xff")])
    assert (store.load("k"), store.load("j")) == (Retained(2, b"b"), Retained(7, b"\x00\xff"))
    store.close()


def test_keys_differ_by_any_character_nul_included(store_settings):
    """PostgreSQL text cannot hold NUL: such a key must neither fail the batch nor meet another key."""
    store = open_retained_store(store_settings)
    keys = ["q", "q\x00", "q\x01", "q\x00\x01", "q\x01\x01", "q\x01\x02", "\x00", "é\x00é"]
    assert [store.load(key) for key in keys] == [None] * len(keys)
    store.save([(key, index + 1, key.encode()) for index, key in enumerate(keys)])
    assert [store.load(key) for key in keys] == [Retained(index + 1, key.encode()) for index, key in enumerate(keys)]
    assert store.load("q\x02") is None
    store.close()
