"""``SqliteIdempotencyStore``: one file, durable, shared by the processes of one host.

Spec:

- **Protocol.** Every record operation is one ``BEGIN IMMEDIATE`` transaction: read the row,
  apply the pure decision of :mod:`langchain_idempotent.protocol`, write the record it
  returns, commit. ``BEGIN IMMEDIATE`` takes SQLite's write lock before the read, so threads
  and processes on one host never interleave a read-decide-write. Lock waits are bounded by
  ``busy_timeout`` seconds (default 30).
- **Time.** The host clock (``clock``, seconds; default :func:`time.time`; ``now_ms()``
  reads it), read *after* the write lock is taken. One host, one clock: the store is for
  processes on one machine.
- **Retention.** A claim keeps the row ``max(ttl, lease)`` past now, a completion ``ttl``
  past now, a renewal at least ``lease`` past now, a release or an abandon does not change
  it. A row
  past its expiry is absent to every operation; every 64th write transaction deletes up
  to 256 expired rows through the ``expires_at`` index (never a full-table scan per call).
- **Columns.** One per :class:`~langchain_idempotent.record.Record` field (``meta`` as JSON
  text, ``payload`` as a BLOB), plus ``namespace`` and ``thread_id`` copied out of ``meta``
  and indexed, so ``list`` and ``purge`` by thread or namespace are index lookups. A row
  with an unknown format ``version`` or ill-typed columns raises
  :class:`~langchain_idempotent.errors.CorruptRecordError`; it is never half-read. An
  operator can still ``delete`` it.
- **Schema.** Created with ``CREATE ... IF NOT EXISTS`` on first connect. Its version is
  kept per table in ``langchain_idempotent_schema``; a table written by a newer schema is
  refused with :class:`~langchain_idempotent.errors.StoreUnavailableError`. Version 2 adds
  the ``effect`` column (the side-effect mark); a version-1 table is migrated in place
  (``ALTER TABLE ... ADD COLUMN``, its rows ``unmarked``).
- **Durability.** WAL journal with ``synchronous=NORMAL`` by default: a committed record
  survives the crash of any process, but the last transactions before a power loss or OS
  crash can roll back (the WAL is fsynced at checkpoints, not at every commit); the file
  stays consistent. A lost completion means the tool can run again, with the same key
  handed downstream. ``synchronous="FULL"`` fsyncs every commit (slower writes).
  WAL needs shared memory: use a local filesystem, never NFS or another network share.
- **Errors.** ``sqlite3`` errors (locked past ``busy_timeout``, I/O errors, a file that is not
  a database, ...) become :class:`~langchain_idempotent.errors.StoreUnavailableError`
  carrying the key, chained with ``raise ... from``. The store fails closed.
- **Connections.** Opened lazily, pooled (at most 8 idle), each used by one thread at a
  time. Constructing a store touches no file. After ``fork()`` the child opens its own
  connections; the parent's are never used *or closed* in the child (SQLite forbids both).
- **Wake-ups.** ``watch`` wakes at once for a completion, release, abandon or delete made through
  any store object of this process on the same key, and polls the file with backoff
  (2 ms doubling up to ``poll_interval``, default 50 ms) for changes made by other
  processes. It never sleeps past the lease deadline it last read.
- ``":memory:"`` is refused: each connection would see its own empty database. Use
  :class:`~langchain_idempotent.stores.memory.InMemoryIdempotencyStore` or a temporary file.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import pathlib
import re
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any, Literal, TypeAlias, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from .._durations import to_seconds
from ..errors import CorruptRecordError, StoreUnavailableError
from ..protocol import (
    decide_abandon,
    decide_claim,
    decide_complete,
    decide_mark_effect,
    decide_release,
    decide_renew,
)
from ..record import (
    FORMAT_VERSION,
    Claim,
    Completion,
    ExpiredPolicy,
    Record,
    State,
    UncertainReason,
)
from ._wakeup import Wakeup, awatch_polling, watch_polling
from .base import BaseIdempotencyStore

__all__ = ["SqliteIdempotencyStore"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: Version of the table layout below; kept per table in ``langchain_idempotent_schema``.
SCHEMA_VERSION = 2
_SCHEMA_TABLE = "langchain_idempotent_schema"
_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
#: The record's columns: the fields of ``Record``, in order.
_FIELDS = tuple(f.name for f in dataclasses.fields(Record))
_COLUMNS = ", ".join(_FIELDS)
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
_SWEEP_EVERY = 64
_SWEEP_LIMIT = 256
_MAX_IDLE = 8
_FIRST_POLL = 0.002
_STATES = {s.value: s for s in State}

# Connections inherited across fork(): the child must neither use nor close them (closing
# can delete files from under the parent), so they are kept referenced here for good.
_ABANDONED: list[sqlite3.Connection] = []
_STORES: weakref.WeakSet[SqliteIdempotencyStore] = weakref.WeakSet()
# One wake-up hub per (file, table) in this process, shared by every store object on it.
_WAKEUPS: dict[tuple[str, str], Wakeup] = {}
_WAKEUPS_LOCK = threading.Lock()

Synchronous = Literal["NORMAL", "FULL"]
#: What a decision inside a transaction returns: the answer, the record to write (``None``:
#: nothing), and that record's new ``expires_at``.
_Decided: TypeAlias = tuple[_T, Record | None, int]


class SqliteIdempotencyStore(BaseIdempotencyStore):
    """Records in one SQLite table. See the module docstring for the full contract.

    ``path`` is the database file (created on first use; its directory must exist).
    ``table`` names the records table (letters, digits, underscores). ``busy_timeout``
    bounds each wait for the write lock. ``clock`` returns seconds, for tests.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        table: str = "idempotency_records",
        busy_timeout: float | timedelta = 30.0,
        synchronous: Synchronous = "NORMAL",
        poll_interval: float | timedelta = 0.05,
        clock: Callable[[], float] = time.time,
    ) -> None:
        raw = os.fspath(path)
        if raw in ("", ":memory:") or raw.startswith("file::memory:"):
            raise ValueError(
                "SqliteIdempotencyStore needs a file: an in-memory SQLite database is private "
                "to one connection. Use InMemoryIdempotencyStore, or a temporary file."
            )
        if not _TABLE_NAME.fullmatch(table):
            raise ValueError(f"table must be a plain SQL identifier, got {table!r}")
        sync = synchronous.upper()
        if sync not in ("NORMAL", "FULL"):
            raise ValueError(f'synchronous must be "NORMAL" or "FULL", got {synchronous!r}')
        self._path = os.path.abspath(raw)
        self._table = table
        self._busy_timeout = to_seconds(
            busy_timeout, "busy_timeout", allow_zero=True, allow_inf=True
        )
        self._synchronous: Synchronous = "FULL" if sync == "FULL" else "NORMAL"
        self._poll_interval = max(
            _FIRST_POLL, to_seconds(poll_interval, "poll_interval", allow_zero=True, allow_inf=True)
        )
        self._clock = clock
        self._writes = itertools.count(1)
        self._schema_ready = False
        self._generation = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._idle: list[_Conn] = []
        self._busy: set[_Conn] = set()
        self._wakeup = _wakeup_for(self._path, table)
        _STORES.add(self)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> SqliteIdempotencyStore:
        """Build a store from ``sqlite:///relative/path.db`` or ``sqlite:////abs/path.db``.

        As in SQLAlchemy, three slashes start a relative path and four an absolute one.
        Query parameters ``table``, ``busy_timeout``, ``synchronous`` and ``poll_interval``
        set the options of the same name; keyword arguments win over them.
        ``sqlite:///:memory:`` is refused (see the module docstring).
        """
        parts = urlsplit(url)
        if parts.scheme != "sqlite":
            raise ValueError(f"not a sqlite:// URL: {url!r}")
        if parts.netloc:
            raise ValueError(
                f"sqlite URLs have no host: {url!r}; "
                "write sqlite:///relative.db or sqlite:////absolute/path.db"
            )
        path = unquote(parts.path[1:])
        options: dict[str, Any] = {}
        for name, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
            if name in ("busy_timeout", "poll_interval"):
                options[name] = to_seconds(value, name, allow_zero=True, allow_inf=True)
            elif name in ("table", "synchronous"):
                options[name] = value
            else:
                raise ValueError(f"unknown sqlite URL option {name!r} in {url!r}")
        options.update(kwargs)
        return cls(path, **options)

    @property
    def path(self) -> str:
        """The database file (absolute path)."""
        return self._path

    @property
    def table(self) -> str:
        """The records table."""
        return self._table

    @property
    def synchronous(self) -> Synchronous:
        """``"NORMAL"`` or ``"FULL"`` (see "Durability" in the module docstring)."""
        return self._synchronous

    def __repr__(self) -> str:
        return f"SqliteIdempotencyStore({self._path!r}, table={self._table!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as its configuration (spawned worker processes open their own connections).
        return (
            _restore,
            (
                self._path,
                self._table,
                self._busy_timeout,
                self._synchronous,
                self._poll_interval,
                self._clock,
            ),
        )

    # -- record operations -------------------------------------------------------------

    def claim(
        self,
        key: str,
        *,
        owner: str,
        fingerprint: str,
        lease_ms: int,
        ttl_ms: int,
        on_expired: ExpiredPolicy = "takeover",
        meta: Mapping[str, str] | None = None,
        boundary: bool = False,
    ) -> Claim:
        def decide(rec: Record | None, expires: int | None, now: int) -> _Decided[Claim]:
            answer, new = decide_claim(
                rec,
                key=key,
                owner=owner,
                fingerprint=fingerprint,
                now=now,
                lease_ms=lease_ms,
                on_expired=on_expired,
                meta=meta,
                boundary=boundary,
            )
            return answer, new, now + max(ttl_ms, lease_ms)

        return self._transact(key, decide)

    def renew(self, key: str, *, owner: str, fence: int, lease_ms: int) -> bool:
        def decide(rec: Record | None, expires: int | None, now: int) -> _Decided[bool]:
            ok, new = decide_renew(rec, owner=owner, fence=fence, now=now, lease_ms=lease_ms)
            return ok, new, max(expires or 0, now + lease_ms)

        return self._transact(key, decide)

    def complete(
        self,
        key: str,
        *,
        owner: str,
        fence: int,
        fingerprint: str,
        payload: bytes,
        failed: bool,
        ttl_ms: int,
        meta: Mapping[str, str] | None = None,
    ) -> Completion:
        def decide(rec: Record | None, expires: int | None, now: int) -> _Decided[Completion]:
            answer, new = decide_complete(
                rec,
                key=key,
                owner=owner,
                fence=fence,
                fingerprint=fingerprint,
                payload=payload,
                failed=failed,
                now=now,
                meta=meta,
            )
            return answer, new, now + ttl_ms

        answer = self._transact(key, decide)
        self._wakeup.notify(key)
        return answer

    def release(self, key: str, *, owner: str, fence: int) -> bool:
        def decide(rec: Record | None, expires: int | None, now: int) -> _Decided[bool]:
            ok, new = decide_release(rec, owner=owner, fence=fence, now=now)
            return ok, new, expires or now

        ok = self._transact(key, decide)
        if ok:
            self._wakeup.notify(key)
        return ok

    def abandon(
        self, key: str, *, owner: str, fence: int, reason: UncertainReason = "cancelled"
    ) -> bool:
        def decide(rec: Record | None, expires: int | None, now: int) -> _Decided[bool]:
            ok, new = decide_abandon(rec, owner=owner, fence=fence, reason=reason, now=now)
            return ok, new, expires or now

        ok = self._transact(key, decide)
        if ok:
            self._wakeup.notify(key)
        return ok

    def mark_effect(self, key: str, *, owner: str, fence: int) -> bool:
        def decide(rec: Record | None, expires: int | None, now: int) -> _Decided[bool]:
            ok, new = decide_mark_effect(rec, owner=owner, fence=fence, now=now)
            return ok, new, expires or now

        return self._transact(key, decide)

    def get(self, key: str) -> Record | None:
        with self._connection(key) as db:
            row = db.execute(
                f"SELECT {_COLUMNS}, expires_at FROM {self._table} WHERE key = ?", (key,)
            ).fetchone()
        return self._live(key, row, self.now_ms())[0]

    # -- watch ---------------------------------------------------------------------------

    def watch(self, key: str, *, fence: int, timeout: float) -> None:
        watch_polling(
            self._wakeup,
            key,
            fence=fence,
            timeout=timeout,
            read=lambda: (self.get(key), self.now_ms()),
            first_poll=_FIRST_POLL,
            poll_interval=self._poll_interval,
        )

    async def awatch(self, key: str, *, fence: int, timeout: float) -> None:
        await awatch_polling(
            self._wakeup,
            key,
            fence=fence,
            timeout=timeout,
            read=lambda: asyncio.to_thread(lambda: (self.get(key), self.now_ms())),
            first_poll=_FIRST_POLL,
            poll_interval=self._poll_interval,
        )

    # -- operator helpers ----------------------------------------------------------------

    def delete(self, key: str) -> bool:
        def body(db: sqlite3.Connection, now: int) -> bool:
            row = db.execute(
                f"SELECT expires_at FROM {self._table} WHERE key = ?", (key,)
            ).fetchone()
            db.execute(f"DELETE FROM {self._table} WHERE key = ?", (key,))
            return row is not None and not _expired(row[0], now)

        existed = self._in_write_txn(key, body)
        if existed:
            self._wakeup.notify(key)
        return existed

    def list(
        self,
        *,
        namespace: str | None = None,
        thread_id: str | None = None,
        limit: int | None = None,
    ) -> list[Record]:
        where, params = self._filter(namespace, thread_id)
        now = self.now_ms()
        with self._connection(None) as db:
            rows = db.execute(
                f"SELECT {_COLUMNS}, expires_at FROM {self._table} "
                f"WHERE expires_at > ?{where} ORDER BY created_at, key LIMIT ?",
                (now, *params, -1 if limit is None else max(0, limit)),
            ).fetchall()
        return [rec for row in rows if (rec := self._live(row[0], row, now)[0]) is not None]

    def purge(self, *, thread_id: str, namespace: str | None = None) -> int:
        where, params = self._filter(namespace, thread_id)

        def body(db: sqlite3.Connection, now: int) -> list[str]:
            rows = db.execute(
                f"SELECT key, expires_at FROM {self._table} WHERE 1{where}", params
            ).fetchall()
            db.execute(f"DELETE FROM {self._table} WHERE 1{where}", params)
            return [k for k, expires in rows if not _expired(expires, now)]

        keys = self._in_write_txn(None, body)
        for key in keys:
            self._wakeup.notify(key)
        return len(keys)

    def close(self) -> None:
        """Close idle connections now and in-use ones when they are returned.

        The store stays usable: the next operation opens a new connection.
        """
        self._check_fork()
        with self._lock:
            idle, self._idle = self._idle, []
            self._generation += 1
        for conn in idle:
            self._dispose(conn)

    # -- the store's clock and facts -----------------------------------------------------

    def now_ms(self) -> int:
        """The store's clock: ``clock()`` in milliseconds (the host clock by default)."""
        return int(self._clock() * 1000)

    async def anow_ms(self) -> int:
        return self.now_ms()

    def describe(self) -> dict[str, Any]:
        """Facts about the file, read without creating or changing it.

        ``kind`` (``"sqlite"``), ``path``, ``table``, ``synchronous``, ``exists``,
        ``journal_mode`` (``None`` when there is no file), ``has_table``, ``size_bytes``
        (the file and its WAL) and ``records`` (live ones). A file SQLite cannot read
        raises :class:`~langchain_idempotent.errors.StoreUnavailableError`.
        """
        facts: dict[str, Any] = {
            "kind": "sqlite",
            "path": self._path,
            "table": self._table,
            "synchronous": self._synchronous,
            "exists": os.path.exists(self._path),
            "journal_mode": None,
            "has_table": False,
            "size_bytes": 0,
            "records": 0,
        }
        if not facts["exists"]:
            return facts
        facts["size_bytes"] = sum(
            os.path.getsize(p) for p in (self._path, self._path + "-wal") if os.path.exists(p)
        )
        read_only = pathlib.Path(self._path).as_uri() + "?mode=ro"
        try:
            db = sqlite3.connect(read_only, uri=True, timeout=self._busy_timeout)
            try:
                journal = db.execute("PRAGMA journal_mode").fetchone()[0]
                facts["journal_mode"] = str(journal).lower()
                facts["has_table"] = (
                    db.execute(
                        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                        (self._table,),
                    ).fetchone()
                    is not None
                )
                if facts["has_table"]:
                    facts["records"] = db.execute(
                        f"SELECT count(*) FROM {self._table} WHERE expires_at > ?",
                        (self.now_ms(),),
                    ).fetchone()[0]
            finally:
                db.close()
        except sqlite3.Error as exc:
            raise StoreUnavailableError(
                f"SQLite idempotency store {self._path} cannot be read: {exc}"
            ) from exc
        return facts

    # -- transactions --------------------------------------------------------------------

    def _transact(
        self,
        key: str,
        decide: Callable[[Record | None, int | None, int], _Decided[_T]],
    ) -> _T:
        """Read ``key``, decide, write the decided record: one ``BEGIN IMMEDIATE`` txn.

        ``decide(record, expires_at, now)`` returns the answer, the record to write
        (``None``: nothing) and its new ``expires_at``.
        """

        def body(db: sqlite3.Connection, now: int) -> _T:
            row = db.execute(
                f"SELECT {_COLUMNS}, expires_at FROM {self._table} WHERE key = ?", (key,)
            ).fetchone()
            rec, expires = self._live(key, row, now)
            answer, new, new_expires = decide(rec, expires, now)
            if new is not None:
                self._write(db, new, new_expires)
            elif row is not None and rec is None:
                db.execute(f"DELETE FROM {self._table} WHERE key = ?", (key,))  # expired
            return answer

        return self._in_write_txn(key, body)

    def _in_write_txn(self, key: str | None, body: Callable[[sqlite3.Connection, int], _T]) -> _T:
        with self._connection(key) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                now = self.now_ms()  # after the write lock: waits never age a decision
                out = body(db, now)
                if next(self._writes) % _SWEEP_EVERY == 0:
                    db.execute(
                        f"DELETE FROM {self._table} WHERE key IN (SELECT key FROM "
                        f"{self._table} WHERE expires_at <= ? ORDER BY expires_at LIMIT ?)",
                        (now, _SWEEP_LIMIT),
                    )
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                raise
            return out

    def _write(self, db: sqlite3.Connection, rec: Record, expires: int) -> None:
        meta = dict(rec.meta)
        db.execute(
            f"INSERT OR REPLACE INTO {self._table} ({_COLUMNS}, namespace, thread_id, "
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

    def _live(self, key: str, row: Any, now: int) -> tuple[Record | None, int | None]:
        """Decode a row with its expiry; an expired row is absent."""
        if row is None:
            return None, None
        expires = row[-1]
        if type(expires) is not int:
            raise CorruptRecordError(
                f"record {key!r} in {self._table} has a malformed expires_at {expires!r}", key=key
            )
        if expires <= now:
            return None, None
        return _decode(key, row[:-1], self._table), expires

    def _filter(self, namespace: str | None, thread_id: str | None) -> tuple[str, tuple[str, ...]]:
        where, params = "", []
        if thread_id is not None:
            where += " AND thread_id = ?"
            params.append(thread_id)
        if namespace is not None:
            where += " AND namespace = ?"
            params.append(namespace)
        return where, tuple(params)

    # -- connections ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _connection(self, key: str | None) -> Iterator[sqlite3.Connection]:
        conn: _Conn | None = None
        try:
            conn = self._checkout(key)
            yield conn.db
        except sqlite3.DatabaseError as exc:
            if conn is not None:
                self._checkin(conn, broken=True)
                conn = None
            raise StoreUnavailableError(
                f"SQLite idempotency store {self._path} is unavailable: {exc}", key=key
            ) from exc
        finally:
            if conn is not None:
                self._checkin(conn, broken=False)

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            self._forget_inherited()

    def _forget_inherited(self) -> None:
        """In a forked child: drop (never close) the parent's connections, reset locks."""
        _ABANDONED.extend(conn.db for conn in (*self._idle, *self._busy))
        self._idle, self._busy = [], set()
        self._lock = threading.Lock()
        self._wakeup = _wakeup_for(self._path, self._table)
        self._generation += 1
        self._pid = os.getpid()

    def _checkout(self, key: str | None) -> _Conn:
        self._check_fork()
        with self._lock:
            if self._idle:
                conn = self._idle.pop()
                self._busy.add(conn)
                return conn
            generation = self._generation
        conn = _Conn(self._open(key), self._pid, generation)
        with self._lock:
            self._busy.add(conn)
        return conn

    def _checkin(self, conn: _Conn, *, broken: bool) -> None:
        with self._lock:
            self._busy.discard(conn)
            if (
                not broken
                and conn.pid == self._pid
                and conn.generation == self._generation
                and not conn.db.in_transaction
                and len(self._idle) < _MAX_IDLE
            ):
                self._idle.append(conn)
                return
        self._dispose(conn)

    @staticmethod
    def _dispose(conn: _Conn) -> None:
        if conn.pid != os.getpid():
            _ABANDONED.append(conn.db)
        else:
            with contextlib.suppress(sqlite3.Error):
                conn.db.close()

    def _open(self, key: str | None) -> sqlite3.Connection:
        db = sqlite3.connect(
            self._path,
            timeout=self._busy_timeout,
            isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE ... COMMIT
            check_same_thread=False,  # pooled: used by one thread at a time, closed by any
        )
        try:
            mode = switch_to_wal(db, self._busy_timeout)
            db.execute(f"PRAGMA synchronous = {self._synchronous}")
            if not self._schema_ready:
                self._ensure_schema(db, key)
                self._schema_ready = True
                if str(mode).lower() != "wal":
                    _log.warning(
                        "SQLite idempotency store %s runs in journal_mode=%s, not WAL: still "
                        "correct, but readers wait for writers",
                        self._path,
                        mode,
                    )
        except BaseException:
            db.close()
            raise
        return db

    def _ensure_schema(self, db: sqlite3.Connection, key: str | None) -> None:
        t = self._table
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                f"CREATE TABLE IF NOT EXISTS {_SCHEMA_TABLE} "
                "(name TEXT PRIMARY KEY, version INTEGER NOT NULL)"
            )
            row = db.execute(f"SELECT version FROM {_SCHEMA_TABLE} WHERE name = ?", (t,)).fetchone()
            if row is not None and row[0] == 1:  # version 2 adds the side-effect mark
                db.execute(f"ALTER TABLE {t} ADD COLUMN effect TEXT NOT NULL DEFAULT 'unmarked'")
                db.execute(f"UPDATE {_SCHEMA_TABLE} SET version = ? WHERE name = ?", (2, t))
                row = (2,)
            if row is not None and row[0] != SCHEMA_VERSION:
                raise StoreUnavailableError(
                    f"table {t} in {self._path} has schema version {row[0]!r}; this "
                    f"langchain-idempotent reads version {SCHEMA_VERSION}. Upgrade the library "
                    "or use another table.",
                    key=key,
                )
            db.execute(
                f"CREATE TABLE IF NOT EXISTS {t} ("
                "key TEXT PRIMARY KEY NOT NULL, state TEXT NOT NULL, owner TEXT NOT NULL, "
                "fence INTEGER NOT NULL, lease_until INTEGER NOT NULL, "
                "fingerprint TEXT NOT NULL, attempt INTEGER NOT NULL, payload BLOB, "
                "created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, "
                "version INTEGER NOT NULL, meta TEXT NOT NULL, "
                "effect TEXT NOT NULL DEFAULT 'unmarked', namespace TEXT, thread_id TEXT, "
                "expires_at INTEGER NOT NULL)"
            )
            db.execute(f"CREATE INDEX IF NOT EXISTS {t}_by_thread ON {t} (thread_id, namespace)")
            db.execute(f"CREATE INDEX IF NOT EXISTS {t}_by_namespace ON {t} (namespace)")
            db.execute(f"CREATE INDEX IF NOT EXISTS {t}_by_expiry ON {t} (expires_at)")
            if row is None:
                db.execute(
                    f"INSERT INTO {_SCHEMA_TABLE} (name, version) VALUES (?, ?)",
                    (t, SCHEMA_VERSION),
                )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise


class _Conn:
    """A pooled connection with the process and pool generation that opened it."""

    __slots__ = ("db", "generation", "pid")

    def __init__(self, db: sqlite3.Connection, pid: int, generation: int) -> None:
        self.db = db
        self.pid = pid
        self.generation = generation


def _decode(key: str, row: Any, table: str) -> Record:
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


def _expired(expires: object, now: int) -> bool:
    return type(expires) is int and expires <= now


def _restore(
    path: str,
    table: str,
    busy_timeout: float,
    synchronous: Synchronous,
    poll_interval: float,
    clock: Callable[[], float],
) -> SqliteIdempotencyStore:
    return SqliteIdempotencyStore(
        path,
        table=table,
        busy_timeout=busy_timeout,
        synchronous=synchronous,
        poll_interval=poll_interval,
        clock=clock,
    )


def switch_to_wal(db: sqlite3.Connection, timeout: float) -> str:
    """``PRAGMA journal_mode = WAL``, retried for up to ``timeout`` seconds: while another
    connection switches a new file to WAL, SQLite answers "database is locked" at once,
    without waiting in the busy handler. Returns the journal mode in effect."""
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


def _wakeup_for(path: str, table: str) -> Wakeup:
    with _WAKEUPS_LOCK:
        return _WAKEUPS.setdefault((path, table), Wakeup())


def _after_fork_in_child() -> None:
    global _WAKEUPS_LOCK
    _WAKEUPS_LOCK = threading.Lock()  # another thread may have held it at fork()
    _WAKEUPS.clear()  # the parent's waiters are not here; their locks may be held
    for store in list(_STORES):
        store._forget_inherited()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
