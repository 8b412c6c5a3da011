"""router/sqlite.py: several processes opening one new store file at once (shards of one kind
starting together), and a write transaction whose COMMIT fails."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from router.sqlite import open_wal, write_transaction


def _open(path: str) -> str:
    try:
        db = open_wal(Path(path))
        return db.execute("PRAGMA journal_mode").fetchone()[0]
    except Exception as error:  # reported, so the test names what failed
        return repr(error)


def test_processes_opening_one_new_file_together_all_get_it_in_wal_mode(tmp_path):
    """Switching a new file to WAL does not wait on the busy timeout: before, about one start in
    thirty failed with "database is locked" (and the shard starting then died)."""
    context = multiprocessing.get_context("fork")
    with context.Pool(8) as pool:
        for trial in range(20):
            path = str(tmp_path / f"store-{trial}.sqlite3")
            assert pool.map(_open, [path] * 8) == ["wal"] * 8


def test_a_commit_that_fails_leaves_no_transaction_open(tmp_path):
    """A COMMIT can fail with the transaction still open (here a deferred foreign key; a full disk
    is another): it is rolled back, and the connection takes the next write. Before, the next
    ``BEGIN IMMEDIATE`` failed ("cannot start a transaction within a transaction") until the
    process restarted: a store's every later write refused."""
    db = open_wal(tmp_path / "store.sqlite3")
    db.execute("PRAGMA foreign_keys = ON")
    db.executescript("CREATE TABLE parent (id INTEGER PRIMARY KEY);"
                     "CREATE TABLE child (parent INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);")
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
        with write_transaction(db) as tx:
            tx.execute("INSERT INTO child VALUES (1)")  # refused at COMMIT only
    assert not db.in_transaction
    with write_transaction(db) as tx:
        tx.execute("INSERT INTO parent VALUES (1)")
        tx.execute("INSERT INTO child VALUES (1)")
    assert db.execute("SELECT COUNT(*) FROM child").fetchone()[0] == 1
    db.close()
