"""What a SQLite store's file says about itself: the facts ``doctor`` reads.

:func:`describe_file` opens the file read-only (``mode=ro``), so it never creates the file,
the table or the WAL, and never changes the journal mode.
"""

from __future__ import annotations

import os
import pathlib
import sqlite3
from collections.abc import Callable
from typing import Any

from ...errors import StoreUnavailableError

__all__ = ["describe_file"]


def describe_file(
    path: str,
    table: str,
    *,
    synchronous: str,
    busy_timeout: float,
    now_ms: Callable[[], int],
) -> dict[str, Any]:
    """``kind`` (``"sqlite"``), ``path``, ``table``, ``synchronous``, ``exists``,
    ``journal_mode`` (``None`` when there is no file), ``has_table``, ``size_bytes`` (the
    file and its WAL) and ``records`` (live at ``now_ms()``, the store's clock). A file
    SQLite cannot read raises :class:`~langchain_idempotent.errors.StoreUnavailableError`."""
    facts: dict[str, Any] = {
        "kind": "sqlite",
        "path": path,
        "table": table,
        "synchronous": synchronous,
        "exists": os.path.exists(path),
        "journal_mode": None,
        "has_table": False,
        "size_bytes": 0,
        "records": 0,
    }
    if not facts["exists"]:
        return facts
    facts["size_bytes"] = sum(
        os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p)
    )
    read_only = pathlib.Path(path).as_uri() + "?mode=ro"
    try:
        db = sqlite3.connect(read_only, uri=True, timeout=busy_timeout)
        try:
            journal = db.execute("PRAGMA journal_mode").fetchone()[0]
            facts["journal_mode"] = str(journal).lower()
            facts["has_table"] = (
                db.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                    (table,),
                ).fetchone()
                is not None
            )
            if facts["has_table"]:
                facts["records"] = db.execute(
                    f"SELECT count(*) FROM {table} WHERE expires_at > ?", (now_ms(),)
                ).fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise StoreUnavailableError(
            f"SQLite idempotency store {path} cannot be read: {exc}"
        ) from exc
    return facts
