"""The SQLite store's connections: opened lazily, pooled, never touched again after ``fork()``.

- :class:`Pool` opens a connection on demand (``isolation_level=None``: every transaction
  is an explicit ``BEGIN IMMEDIATE ... COMMIT``), switched to WAL (:func:`switch_to_wal`)
  with the store's ``synchronous`` setting, and keeps at most 8 idle ones. Each is used by
  one thread at a time. :meth:`Pool.close` closes the idle ones now and the busy ones when
  they come back (a generation count tells them apart); the pool stays usable.
- **Fork.** A connection opened in a parent is never used *or closed* in the child (SQLite
  forbids both; closing can delete files from under the parent): :meth:`Pool.forget_inherited`
  drops them into a module-level list that keeps them referenced for good.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable

__all__ = ["Pool", "switch_to_wal"]

_MAX_IDLE = 8

# Connections inherited across fork(): the child must neither use nor close them (closing
# can delete files from under the parent), so they are kept referenced here for good.
_ABANDONED: list[sqlite3.Connection] = []


class _Conn:
    """A pooled connection with the process and pool generation that opened it."""

    __slots__ = ("db", "generation", "pid")

    def __init__(self, db: sqlite3.Connection, pid: int, generation: int) -> None:
        self.db = db
        self.pid = pid
        self.generation = generation


class Pool:
    """Connections to ``path``. ``prepare(db, key, journal_mode)`` runs on every new
    connection before it is handed out (the store creates its schema there, once); a
    connection it fails on is closed."""

    def __init__(
        self,
        path: str,
        *,
        busy_timeout: float,
        synchronous: str,
        prepare: Callable[[sqlite3.Connection, str | None, str], None],
    ) -> None:
        self._path = path
        self._busy_timeout = busy_timeout
        self._synchronous = synchronous
        self._prepare = prepare
        self._generation = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._idle: list[_Conn] = []
        self._busy: set[_Conn] = set()

    @property
    def forked(self) -> bool:
        """Whether this process is a child of the one that built (or last reset) the pool."""
        return self._pid != os.getpid()

    def checkout(self, key: str | None) -> _Conn:
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

    def checkin(self, conn: _Conn, *, broken: bool) -> None:
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
        _dispose(conn)

    def close(self) -> None:
        """Close idle connections now and busy ones when they are checked in."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._generation += 1
        for conn in idle:
            _dispose(conn)

    def forget_inherited(self) -> None:
        """In a forked child: drop (never close) the parent's connections, reset the lock."""
        _ABANDONED.extend(conn.db for conn in (*self._idle, *self._busy))
        self._idle, self._busy = [], set()
        self._lock = threading.Lock()
        self._generation += 1
        self._pid = os.getpid()

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
            self._prepare(db, key, mode)
        except BaseException:
            db.close()
            raise
        return db


def _dispose(conn: _Conn) -> None:
    if conn.pid != os.getpid():
        _ABANDONED.append(conn.db)
    else:
        with contextlib.suppress(sqlite3.Error):
            conn.db.close()


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
