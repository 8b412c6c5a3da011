"""One way to open the embedded stores' SQLite files."""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def open_wal(path: Path) -> sqlite3.Connection:
    """A connection to ``path`` (created with its folder) in WAL mode, autocommit.

    Several processes share each file (shards of one kind, a gateway and the CLI): WAL lets
    readers run beside one writer; the busy timeout makes a writer in another process wait for
    its turn instead of failing; ``synchronous=NORMAL`` in WAL mode survives a crash of the
    process (not a power cut of the machine).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    return db


@contextmanager
def write_transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction on an autocommit connection: taken at once (``BEGIN IMMEDIATE``, so a
    writer in another process makes it wait rather than fail halfway), committed when the block
    ends, rolled back if it raises."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
