"""The SQLite store's table: its columns, its schema version, and a row as a ``Record``.

- :func:`ensure_schema` creates the table and its indexes and keeps the layout's version per
  table in ``langchain_idempotent_layout``. There is one layout, version 1 (the first
  release's); from the next layout on, upgrades are the append-only :data:`MIGRATIONS`. It
  refuses, and leaves untouched, a table without a row there (an earlier development build
  wrote it: those kept a version in ``langchain_idempotent_schema``) and a table of another
  version (a newer release's). Nothing else lives in the database: every decision is Python
  (this package's), so no older code can stay behind in a file.
- :func:`write_row` writes a record with its expiry (``INSERT OR REPLACE``);
  :func:`live` reads one back, an expired row being absent; :func:`decode` raises
  :class:`~langchain_idempotent.errors.CorruptRecordError` naming what is wrong rather than
  half-reading a row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
from typing import Any

from ...core.record import FORMAT_VERSION, Record, State
from ...errors import CorruptRecordError, StoreUnavailableError

__all__ = [
    "COLUMNS",
    "SCHEMA_VERSION",
    "decode",
    "ensure_schema",
    "expired",
    "live",
    "rollback",
    "write_row",
]

#: Upgrades from the first release on, append-only: ``MIGRATIONS[i]`` holds the statements
#: (``{t}``: the table) that take a table from layout version ``i + 1`` to ``i + 2``, to run
#: in :func:`ensure_schema`'s transaction (the first migration adds that step), each tested
#: from the previous release's recorded layout. Empty: version 1 is the first release's
#: layout, and no table a development build wrote is upgraded (:func:`ensure_schema`
#: refuses it).
MIGRATIONS: tuple[tuple[str, ...], ...] = ()
#: Version of the table layout below; kept per table in ``langchain_idempotent_layout``.
SCHEMA_VERSION = 1 + len(MIGRATIONS)
_SCHEMA_TABLE = "langchain_idempotent_layout"
#: Where development builds before the first release kept their schema version.
_DEVELOPMENT_TABLE = "langchain_idempotent_schema"
#: The record's columns: the fields of ``Record``, in order.
_FIELDS = tuple(f.name for f in dataclasses.fields(Record))
COLUMNS = ", ".join(_FIELDS)
_TYPES = {
    "owner": str,
    "fingerprint": str,
    "meta": str,
    "fence": int,
    "lease_until": int,
    "attempt": int,
    "created_at": int,
    "updated_at": int,
    "effect": str,
}
_EFFECTS = ("unmarked", "before", "entered")
_STATES = {s.value: s for s in State}


def ensure_schema(db: sqlite3.Connection, path: str, table: str, key: str | None) -> None:
    """Create ``table`` in one ``BEGIN IMMEDIATE`` transaction, or check that it is this
    layout (idempotent); refuse anything else without changing it."""
    t = table
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute(
            f"CREATE TABLE IF NOT EXISTS {_SCHEMA_TABLE} "
            "(name TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        row = db.execute(f"SELECT version FROM {_SCHEMA_TABLE} WHERE name = ?", (t,)).fetchone()
        if row is None and _exists(db, t):
            raise StoreUnavailableError(_earlier(db, t, path), key=key)
        if row is not None and row[0] != SCHEMA_VERSION:
            raise StoreUnavailableError(_refusal(t, path, row[0]), key=key)
        if row is None:
            db.execute(
                f"CREATE TABLE {t} ("
                "key TEXT PRIMARY KEY NOT NULL, state TEXT NOT NULL, owner TEXT NOT NULL, "
                "fence INTEGER NOT NULL, lease_until INTEGER NOT NULL, "
                "fingerprint TEXT NOT NULL, attempt INTEGER NOT NULL, payload BLOB, "
                "created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, "
                "version INTEGER NOT NULL, meta TEXT NOT NULL, "
                "effect TEXT NOT NULL DEFAULT 'unmarked', namespace TEXT, thread_id TEXT, "
                "expires_at INTEGER NOT NULL)"
            )
            db.execute(f"CREATE INDEX {t}_by_thread ON {t} (thread_id, namespace)")
            db.execute(f"CREATE INDEX {t}_by_namespace ON {t} (namespace)")
            db.execute(f"CREATE INDEX {t}_by_expiry ON {t} (expires_at)")
            db.execute(
                f"INSERT INTO {_SCHEMA_TABLE} (name, version) VALUES (?, ?)",
                (t, SCHEMA_VERSION),
            )
        db.execute("COMMIT")
    except BaseException:
        rollback(db)
        raise


def _exists(db: sqlite3.Connection, name: str) -> bool:
    found = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    return db.execute(found, (name,)).fetchone() is not None


def _earlier(db: sqlite3.Connection, table: str, path: str) -> str:
    """Why a table with no layout row is refused: what was found, and the way out."""
    found = "no layout version"
    if _exists(db, _DEVELOPMENT_TABLE):
        old = f"SELECT version FROM {_DEVELOPMENT_TABLE} WHERE name = ?"
        row = db.execute(old, (table,)).fetchone()
        if row is not None:
            found = f"schema version {row[0]!r} in {_DEVELOPMENT_TABLE}"
    return (
        f"table {table} in {path} was not set up by this release ({found}): an earlier "
        f"development build of langchain-idempotent wrote it, and this release keeps one "
        f"layout (version {SCHEMA_VERSION} in {_SCHEMA_TABLE}) and upgrades none that came "
        f"before it. It was left as it is. Drop it (DROP TABLE {table}, or delete the file) "
        "and run again to set it up afresh; its records are then gone, so a call recorded "
        "only there can run again"
    )


def _refusal(table: str, path: str, stored: object) -> str:
    """Why a table of another layout version is refused, and what to do (never: delete it)."""
    if isinstance(stored, int) and stored > SCHEMA_VERSION:
        return (
            f"table {table} in {path} was set up by a newer langchain-idempotent (schema "
            f"version {stored}; this one knows versions up to {SCHEMA_VERSION}). Upgrade "
            "langchain-idempotent on this worker to the version the other workers run. Keep "
            "the table: it holds completed records, and deleting them (or pointing this "
            "worker at another table) would run their calls again"
        )
    return (
        f"table {table} in {path} has schema version {stored!r} in {_SCHEMA_TABLE}, which "
        f"no langchain-idempotent wrote; set its row back to {SCHEMA_VERSION}, the version "
        "its layout has"
    )


def rollback(db: sqlite3.Connection) -> None:
    """Roll back the open transaction, if any (a failed rollback changes nothing more)."""
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")


def write_row(db: sqlite3.Connection, table: str, rec: Record, expires: int) -> None:
    """Write ``rec`` with its ``expires_at``, replacing the row under its key."""
    meta = dict(rec.meta)
    db.execute(
        f"INSERT OR REPLACE INTO {table} ({COLUMNS}, namespace, thread_id, "
        "expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            rec.key,
            rec.state.value,
            rec.owner,
            rec.fence,
            rec.lease_until,
            rec.fingerprint,
            rec.attempt,
            rec.payload,
            rec.created_at,
            rec.updated_at,
            rec.version,
            json.dumps(meta, sort_keys=True, ensure_ascii=False, separators=(",", ":")),
            rec.effect,
            meta.get("namespace"),
            meta.get("thread_id"),
            expires,
        ),
    )


def live(key: str, row: Any, now: int, table: str) -> tuple[Record | None, int | None]:
    """Decode a row (its columns, then ``expires_at``) with its expiry; an expired row is
    absent."""
    if row is None:
        return None, None
    expires = row[-1]
    if type(expires) is not int:
        raise CorruptRecordError(
            f"record {key!r} in {table} has a malformed expires_at {expires!r}", key=key
        )
    if expires <= now:
        return None, None
    return decode(key, row[:-1], table), expires


def decode(key: str, row: Any, table: str) -> Record:
    """A row as a :class:`Record`, or :class:`CorruptRecordError` naming what is wrong."""
    col = dict(zip(_FIELDS, row, strict=True))
    try:
        if type(col["version"]) is not int or col["version"] != FORMAT_VERSION:
            raise ValueError(f"unknown format version {col['version']!r}")
        if col["state"] not in _STATES:
            raise ValueError(f"unknown state {col['state']!r}")
        if col["effect"] not in _EFFECTS:
            raise ValueError(f"unknown effect mark {col['effect']!r}")
        wrong = [name for name, kind in _TYPES.items() if type(col[name]) is not kind]
        if col["payload"] is not None and type(col["payload"]) is not bytes:
            wrong.append("payload")
        if wrong:
            raise ValueError("ill-typed columns " + ", ".join(wrong))
        meta = json.loads(col["meta"])
        if not isinstance(meta, dict) or not all(
            type(k) is str and type(v) is str for k, v in meta.items()
        ):
            raise ValueError("meta is not a JSON object of strings")
    except ValueError as exc:
        raise CorruptRecordError(
            f"record {key!r} in {table} cannot be decoded: {exc}", key=key
        ) from exc
    return Record(**{**col, "key": key, "state": _STATES[col["state"]], "meta": meta})


def expired(expires: object, now: int) -> bool:
    """Whether an ``expires_at`` value has passed (a malformed one has not)."""
    return type(expires) is int and expires <= now
