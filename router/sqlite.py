"""One way to open the embedded stores' SQLite files."""

from __future__ import annotations

import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

BUSY_TIMEOUT_S = 10


def open_wal(path: Path) -> sqlite3.Connection:
    """A connection to ``path`` (created with its folder) in WAL mode, autocommit.

    Several processes share each file (shards of one kind, a gateway and the CLI): WAL lets
    readers run beside one writer; the busy timeout makes a writer in another process wait for
    its turn instead of failing; ``synchronous=NORMAL`` in WAL mode survives a crash of the
    process (not a power cut of the machine).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    # Switching a new file to WAL takes an exclusive lock and SQLite does not wait for it with the
    # busy timeout: two shards opening one new file at once saw "database is locked" and died.
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    db.execute("PRAGMA synchronous=NORMAL")
    return db


@contextmanager
def write_transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction on an autocommit connection: taken at once (``BEGIN IMMEDIATE``, so a
    writer in another process makes it wait rather than fail halfway), committed when the block
    ends, rolled back if it raises or its COMMIT fails (SQLite can leave the transaction open
    then: the connection would refuse every later ``BEGIN``)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
