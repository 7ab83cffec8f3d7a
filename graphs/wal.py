"""SQLite files that several worker processes open at once, in WAL mode.

``PRAGMA journal_mode = WAL`` is retried for up to ``timeout`` seconds: while another
connection switches a new file to WAL, SQLite answers "database is locked" at once, without
waiting in the busy handler, and the batch's workers all open their fresh files together.
"""

from __future__ import annotations

import sqlite3
import time

__all__ = ["switch_to_wal"]


def switch_to_wal(db: sqlite3.Connection, timeout: float = 30.0) -> str:
    """Put ``db``'s file in WAL mode, retrying while it is locked; returns the mode in effect."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            return str(db.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
