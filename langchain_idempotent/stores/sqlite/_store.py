"""``SqliteIdempotencyStore``: one file, durable, shared by the processes of one host.

Spec:

- **Protocol.** Every record operation is one ``BEGIN IMMEDIATE`` transaction: read the row,
  apply the pure decision of :mod:`langchain_idempotent.core.protocol`, write the record it
  returns, commit. ``BEGIN IMMEDIATE`` takes SQLite's write lock before the read, so threads
  and processes on one host never interleave a read-decide-write. Lock waits are bounded by
  ``busy_timeout`` seconds (default 30). Release, abandon and the side-effect mark are
  written once for this store and the memory store (:mod:`.._deciding`).
- **Time.** The host clock (``clock``, seconds; default :func:`time.time`; ``now_ms()``
  reads it), read *after* the write lock is taken. One host, one clock: the store is for
  processes on one machine.
- **Retention.** A claim keeps the row ``max(ttl, lease)`` past now, a completion ``ttl``
  past now, a renewal at least ``lease`` past now, a release or an abandon does not change
  it. A row
  past its expiry is absent to every operation; every 64th write transaction deletes up
  to 256 expired rows through the ``expires_at`` index (never a full-table scan per call).
- **Columns.** One per :class:`~langchain_idempotent.core.record.Record` field (``meta`` as JSON
  text, ``payload`` as a BLOB), plus ``namespace`` and ``thread_id`` copied out of ``meta``
  and indexed, so ``list`` and ``purge`` by thread or namespace are index lookups. A row
  with an unknown format ``version`` or ill-typed columns raises
  :class:`~langchain_idempotent.errors.CorruptRecordError`; it is never half-read. An
  operator can still ``delete`` it.
- **Schema.** Created on first connect, its layout version kept per table in
  ``langchain_idempotent_layout``. One layout, version 1; a table of another version (a
  newer release's) or with no row there (an earlier development build's) is refused with
  :class:`~langchain_idempotent.errors.StoreUnavailableError` and left as it is. Columns,
  schema and the place for future migrations: :mod:`._schema`.
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
  connections; the parent's are never used *or closed* in the child (SQLite forbids both)
  (:mod:`._connections`).
- **Wake-ups.** ``watch`` wakes at once for a completion, release, abandon or delete made through
  any store object of this process on the same key, and polls the file with backoff
  (2 ms doubling up to ``poll_interval``, default 50 ms) for changes made by other
  processes. It never sleeps past the lease deadline it last read.
- ``":memory:"`` is refused: each connection would see its own empty database. Use
  :class:`~langchain_idempotent.stores.memory.InMemoryIdempotencyStore` or a temporary file.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import logging
import os
import re
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any, Literal, TypeAlias, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from ...core._durations import to_seconds
from ...core.protocol import decide_renew
from ...core.record import Claim, Completion, Record
from ...core.store import ClaimRequest, CompleteRequest, Held
from ...errors import StoreUnavailableError
from .._deciding import DecidesInPython, Decision
from .._filters import meta_filter
from .._wakeup import Poller, Wakeup
from ._connections import Pool
from ._describe import describe_file
from ._schema import COLUMNS, ensure_schema, expired, live, rollback, write_row

__all__ = ["SqliteIdempotencyStore"]

_log = logging.getLogger("langchain_idempotent.stores.sqlite")
_T = TypeVar("_T")

_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_SWEEP_EVERY = 64
_SWEEP_LIMIT = 256
_FIRST_POLL = 0.002

# Every store of this process, to forget its inherited connections in a forked child.
_STORES: weakref.WeakSet[SqliteIdempotencyStore] = weakref.WeakSet()
# One wake-up hub per (file, table) in this process, shared by every store object on it.
_WAKEUPS: dict[tuple[str, str], Wakeup] = {}
_WAKEUPS_LOCK = threading.Lock()

Synchronous = Literal["NORMAL", "FULL"]
#: What a decision inside a transaction returns: the answer, the record to write (``None``:
#: nothing), and that record's new ``expires_at``.
_Decided: TypeAlias = tuple[_T, Record | None, int]


class SqliteIdempotencyStore(DecidesInPython):
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
        self._pool = Pool(
            self._path,
            busy_timeout=self._busy_timeout,
            synchronous=self._synchronous,
            prepare=self._prepare,
        )
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

    def claim(self, request: ClaimRequest) -> Claim:
        return self._in_write_txn(request.key, lambda db, now: self._claim_in(db, request, now))

    def claim_many(self, requests: Sequence[ClaimRequest]) -> builtins.list[Claim]:
        """Every claim in one ``BEGIN IMMEDIATE`` transaction, in order, at one clock
        reading taken under the write lock: one commit (one fsync) for the batch."""
        if not requests:
            return []

        def body(db: sqlite3.Connection, now: int) -> builtins.list[Claim]:
            return [self._claim_in(db, r, now) for r in requests]

        return self._in_write_txn(requests[0].key, body)

    async def aclaim_many(self, requests: Sequence[ClaimRequest]) -> builtins.list[Claim]:
        return await asyncio.to_thread(self.claim_many, requests)

    def _claim_in(self, db: sqlite3.Connection, r: ClaimRequest, now: int) -> Claim:
        def decide(rec: Record | None, expires: int | None, now: int) -> _Decided[Claim]:
            answer, new = r.decide(rec, now)
            return answer, new, now + max(r.ttl_ms, r.lease_ms)

        return self._decide_in(db, r.key, now, decide)

    def renew(self, held: Held, lease_ms: int) -> bool:
        def decide(rec: Record | None, expires: int | None, now: int) -> _Decided[bool]:
            ok, new = decide_renew(
                rec, owner=held.owner, fence=held.fence, now=now, lease_ms=lease_ms
            )
            return ok, new, max(expires or 0, now + lease_ms)

        return self._transact(held.key, decide)

    def complete(self, request: CompleteRequest) -> Completion:
        def decide(rec: Record | None, expires: int | None, now: int) -> _Decided[Completion]:
            answer, new = request.decide(rec, now)
            return answer, new, now + request.ttl_ms

        answer = self._transact(request.key, decide)
        self._wakeup.notify(request.key)
        return answer

    def get(self, key: str) -> Record | None:
        with self._connection(key) as db:
            row = db.execute(
                f"SELECT {COLUMNS}, expires_at FROM {self._table} WHERE key = ?", (key,)
            ).fetchone()
        return live(key, row, self.now_ms(), self._table)[0]

    # -- watch ---------------------------------------------------------------------------

    def _poller(self) -> Poller:
        return Poller(self._wakeup, _FIRST_POLL, self._poll_interval)

    def _read(self, key: str) -> tuple[Record | None, int]:
        return self.get(key), self.now_ms()

    def watch(self, key: str, *, fence: int, timeout: float) -> None:
        self._poller().watch(key, fence=fence, timeout=timeout, read=lambda: self._read(key))

    async def awatch(self, key: str, *, fence: int, timeout: float) -> None:
        await self._poller().awatch(
            key, fence=fence, timeout=timeout, read=lambda: asyncio.to_thread(self._read, key)
        )

    # -- operator helpers ----------------------------------------------------------------

    def delete(self, key: str) -> bool:
        def body(db: sqlite3.Connection, now: int) -> bool:
            row = db.execute(
                f"SELECT expires_at FROM {self._table} WHERE key = ?", (key,)
            ).fetchone()
            db.execute(f"DELETE FROM {self._table} WHERE key = ?", (key,))
            return row is not None and not expired(row[0], now)

        existed = self._in_write_txn(key, body)
        return self._woken(key, existed)

    def list(
        self,
        *,
        namespace: str | None = None,
        thread_id: str | None = None,
        limit: int | None = None,
    ) -> list[Record]:
        where, params = meta_filter(namespace, thread_id, "?")
        now = self.now_ms()
        with self._connection(None) as db:
            rows = db.execute(
                f"SELECT {COLUMNS}, expires_at FROM {self._table} "
                f"WHERE expires_at > ?{where} ORDER BY created_at, key LIMIT ?",
                (now, *params, -1 if limit is None else max(0, limit)),
            ).fetchall()
        return [rec for row in rows if (rec := live(row[0], row, now, self._table)[0]) is not None]

    def purge(self, *, thread_id: str, namespace: str | None = None) -> int:
        where, params = meta_filter(namespace, thread_id, "?")

        def body(db: sqlite3.Connection, now: int) -> list[str]:
            rows = db.execute(
                f"SELECT key, expires_at FROM {self._table} WHERE 1{where}", params
            ).fetchall()
            db.execute(f"DELETE FROM {self._table} WHERE 1{where}", params)
            return [k for k, expires in rows if not expired(expires, now)]

        keys = self._in_write_txn(None, body)
        for key in keys:
            self._wakeup.notify(key)
        return len(keys)

    def close(self) -> None:
        """Close idle connections now and in-use ones when they are returned.

        The store stays usable: the next operation opens a new connection.
        """
        self._check_fork()
        self._pool.close()

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
        raises :class:`~langchain_idempotent.errors.StoreUnavailableError`
        (:mod:`._describe`).
        """
        return describe_file(
            self._path,
            self._table,
            synchronous=self._synchronous,
            busy_timeout=self._busy_timeout,
            now_ms=self.now_ms,
        )

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

        return self._in_write_txn(key, lambda db, now: self._decide_in(db, key, now, decide))

    def _keeping_expiry(self, key: str, decide: Decision) -> bool:
        """:meth:`_transact` for a decision that leaves the row's ``expires_at`` as it is
        (release, abandon, the side-effect mark): ``decide(record, now)``."""

        def keep(rec: Record | None, expires: int | None, now: int) -> _Decided[bool]:
            ok, new = decide(rec, now)
            return ok, new, expires or now

        return self._transact(key, keep)

    def _decide_in(
        self,
        db: sqlite3.Connection,
        key: str,
        now: int,
        decide: Callable[[Record | None, int | None, int], _Decided[_T]],
    ) -> _T:
        """Inside a write transaction: read ``key``, decide, write the decided record (an
        expired row nothing replaces is deleted)."""
        row = db.execute(
            f"SELECT {COLUMNS}, expires_at FROM {self._table} WHERE key = ?", (key,)
        ).fetchone()
        rec, expires = live(key, row, now, self._table)
        answer, new, new_expires = decide(rec, expires, now)
        if new is not None:
            write_row(db, self._table, new, new_expires)
        elif row is not None and rec is None:
            db.execute(f"DELETE FROM {self._table} WHERE key = ?", (key,))  # expired
        return answer

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
                rollback(db)
                raise
            return out

    # -- connections ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _connection(self, key: str | None) -> Iterator[sqlite3.Connection]:
        conn = None
        try:
            self._check_fork()
            conn = self._pool.checkout(key)
            yield conn.db
        except sqlite3.DatabaseError as exc:
            if conn is not None:
                self._pool.checkin(conn, broken=True)
                conn = None
            raise StoreUnavailableError(
                f"SQLite idempotency store {self._path} is unavailable: {exc}", key=key
            ) from exc
        finally:
            if conn is not None:
                self._pool.checkin(conn, broken=False)

    def _check_fork(self) -> None:
        if self._pool.forked:
            self._forget_inherited()

    def _forget_inherited(self) -> None:
        """In a forked child: the pool drops (never closes) the parent's connections."""
        self._pool.forget_inherited()
        self._wakeup = _wakeup_for(self._path, self._table)

    def _prepare(self, db: sqlite3.Connection, key: str | None, journal_mode: str) -> None:
        """Every new connection: set the schema up (or check it) on this store's first one."""
        if self._schema_ready:
            return
        ensure_schema(db, self._path, self._table, key)
        self._schema_ready = True
        if journal_mode.lower() != "wal":
            _log.warning(
                "SQLite idempotency store %s runs in journal_mode=%s, not WAL: still "
                "correct, but readers wait for writers",
                self._path,
                journal_mode,
            )


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
