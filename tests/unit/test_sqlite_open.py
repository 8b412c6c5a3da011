"""Several processes opening one new store file at once (shards of one kind starting together)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from router.sqlite import open_wal


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
