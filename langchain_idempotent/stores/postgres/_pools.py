"""The Postgres store's connections: its pools, and the one place its errors are translated.

- **Pools.** :class:`_Pools` holds the pools a store was given, as they are (never
  closed by the store), or builds and owns them from a conninfo: one
  ``psycopg_pool.ConnectionPool`` opened on first sync use and one ``AsyncConnectionPool``
  per event loop on first async use, both autocommit, closed by ``close()`` / ``aclose()``
  and reopened on next use. After ``fork()`` the store calls :meth:`_Pools.forget`: the
  child builds its own and never touches the parent's sockets.
- **A loop's end.** ``asyncio.run`` ends by cancelling the tasks its loop still has and
  waiting for them. psycopg_pool's worker tasks swallow a cancellation that arrives in
  the middle of a connection attempt and wait for more work, so that wait never ended
  (a script or notebook calling ``asyncio.run`` again and again hung at exit). Each owned
  async pool therefore has a watcher task that, cancelled with the others, closes its
  pool and its idle connections: the close stops the workers. From then on the ending
  loop's operations run on the sync pool in a worker thread (:meth:`_Pools.async_`
  answers ``None``), so no pool with background tasks is opened in a loop that is
  closing.
- **Operations.** Each store operation is described once, as an :class:`Op`: a generator
  of the statements it sends, that is sent what each fetched and returns the answer.
  :func:`run_sync` / :func:`run_async` are its two drivers, the only code that awaits.
- **Errors.** :func:`run_sync` / :func:`run_async` run one operation on a cursor of a
  pooled connection. Every psycopg / pool error becomes
  :class:`~langchain_idempotent.errors.StoreUnavailableError` with the key, chained with
  ``raise ... from``, there and only there. An operation that failed because its
  *connection* broke (a terminated backend, a restarted server) runs once more on another
  connection after the pool has dropped its broken idle ones: every operation is
  idempotent for the same owner, so a repeat is safe.
- **Cursors.** An operation runs on the one cursor :func:`_cursor` keeps per connection,
  reused across operations: a fresh cursor would set up its adapters, dumpers and
  loaders again on every operation (about 15 µs of a 65 µs replay, measured). A cursor is
  used only while its connection is checked out, so by one thread or task at a time.
- **One pool for both.** With only a sync pool, an async operation runs the same
  :class:`Op` through :func:`run_sync` in a worker thread (see ``_store._arun``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import weakref
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolClosed, PoolTimeout

from ...core._drive import adrive, drive
from ...errors import StoreUnavailableError
from ._compat import idle_connections

_T = TypeVar("_T")
#: Errors that mean the connection itself broke (worth one more try on another).
_BROKEN = (psycopg.OperationalError, psycopg.InterfaceError)
#: Every error run_sync / run_async turn into StoreUnavailableError.
_ERRORS = (psycopg.Error, PoolTimeout, PoolClosed)
#: The reused cursor of each connection, by ``id`` (checked by identity, so a new
#: connection at a recycled address gets its own); see :func:`_cursor`.
_CURSORS: dict[int, Any] = {}
#: Past this many, the cursors of closed connections are dropped (then all, if need be).
_CURSORS_MAX = 256


def _cursor(conn: Any) -> Any:
    """The reused ``tuple_row`` cursor of ``conn`` (a sync or an async connection)."""
    cur = _CURSORS.get(id(conn))
    if cur is None or cur.connection is not conn or cur.closed:
        if len(_CURSORS) >= _CURSORS_MAX:
            for ident, old in list(_CURSORS.items()):
                if old.connection.closed:
                    _CURSORS.pop(ident, None)
            if len(_CURSORS) >= _CURSORS_MAX:
                _CURSORS.clear()
        cur = _CURSORS[id(conn)] = conn.cursor(row_factory=tuple_row)
    return cur


class _Pools:
    """The pools of one store object in one process: given ones, or owned ones."""

    def __init__(
        self,
        pool: ConnectionPool[Any] | None,
        async_pool: AsyncConnectionPool[Any] | None,
        *,
        conninfo: str | None,
        options: Mapping[str, Any],
        table: str,
    ) -> None:
        self.user = pool
        self.user_async = async_pool
        self.conninfo = conninfo
        self.options = dict(options)
        self._table = table
        self._lock = threading.Lock()
        self._own: ConnectionPool[Any] | None = None
        self._own_async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopPool] = (
            weakref.WeakKeyDictionary()
        )
        #: Whether a direct connection (:meth:`_check`) once succeeded.
        self._reached = False
        #: Loops whose tasks were cancelled (``asyncio.run`` ending them): no new pool.
        self._ending: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

    def _check(self, key: str | None) -> None:
        """Connect once, directly, before the first owned pool opens: a wrong host,
        database, user or password is then named in the error at once, where a pool would
        only log it and time out after ``timeout`` seconds."""
        try:
            psycopg.connect(self.conninfo or "", **self._connect_kwargs()).close()
        except psycopg.OperationalError as exc:
            raise self._unreachable(key, exc) from exc
        self._reached = True

    async def _acheck(self, key: str | None) -> None:
        """The async twin of :meth:`_check`."""
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.conninfo or "", **self._connect_kwargs()
            )
        except psycopg.OperationalError as exc:
            raise self._unreachable(key, exc) from exc
        await conn.close()
        self._reached = True

    def _unreachable(self, key: str | None, exc: Exception) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"PostgreSQL: cannot connect to {_redact(self.conninfo)}: {exc}", key=key
        )

    def _connect_kwargs(self) -> dict[str, Any]:
        """``connect_timeout`` as the pool's ``timeout``, unless the URL sets its own."""
        if "connect_timeout" in conninfo_to_dict(self.conninfo or ""):
            return {"autocommit": True}
        timeout = float(self.options.get("timeout", 5.0))
        return {"autocommit": True, "connect_timeout": max(2, math.ceil(timeout))}

    def forget(self) -> None:
        """In a forked child: drop the parent's owned pools without closing them."""
        self._own = None
        self._own_async = weakref.WeakKeyDictionary()
        self._ending = weakref.WeakSet()
        self._lock = threading.Lock()

    def sync(self, key: str | None) -> ConnectionPool[Any]:
        if self.user is not None:
            return self.user
        if self.conninfo is None:
            raise TypeError(
                "this PostgresIdempotencyStore was given only an AsyncConnectionPool; sync "
                "operations need a ConnectionPool too (pass pool=..., or use from_url)"
            )
        with self._lock:
            if self._own is None:
                if not self._reached:
                    self._check(key)
                self._own = ConnectionPool(
                    self.conninfo,
                    kwargs={"autocommit": True},
                    open=False,
                    name=f"idempotency-{self._table}",
                    **self.options,
                )
                try:
                    self._own.open(wait=False)
                except _ERRORS as exc:
                    self._own = None
                    raise StoreUnavailableError(f"PostgreSQL: {exc}", key=key) from exc
            return self._own

    async def async_(self, key: str | None) -> AsyncConnectionPool[Any] | None:
        """This loop's async pool; ``None`` when only a sync pool was given, or when this
        loop is ending (its operations then run on the sync pool, in a thread)."""
        if self.user_async is not None:
            return self.user_async
        if self.conninfo is None:
            return None
        loop = asyncio.get_running_loop()
        own = self._own_async.get(loop)
        if own is not None:
            return own.pool
        if loop in self._ending:
            return None
        if not self._reached:
            await self._acheck(key)
        apool = AsyncConnectionPool(
            self.conninfo,
            kwargs={"autocommit": True},
            open=False,
            name=f"idempotency-{self._table}-async",
            **self.options,
        )
        try:
            await apool.open(wait=False)
        except _ERRORS as exc:
            raise StoreUnavailableError(f"PostgreSQL: {exc}", key=key) from exc
        own = self._own_async[loop] = _LoopPool(apool, loop.create_future())
        own.watcher = loop.create_task(
            self._close_when_cancelled(loop, own), name=f"idempotency-{self._table}-async-end"
        )
        return apool

    def ending(self) -> bool:
        """Whether the running loop is ending (see *A loop's end* above)."""
        return asyncio.get_running_loop() in self._ending

    async def _close_when_cancelled(self, loop: asyncio.AbstractEventLoop, own: _LoopPool) -> None:
        """Wait until ``aclose()`` closes ``own`` or the loop cancels this task; then close
        the pool (its workers ignore that cancellation) and let no new one open here."""
        try:
            await own.closed
        except asyncio.CancelledError:
            self._ending.add(loop)
            if self._own_async.get(loop) is own:
                del self._own_async[loop]
            # The workers cancelled along with this task make close() raise
            # CancelledError from its wait for them, before it closes the idle
            # connections: those are taken first (psycopg_pool's idle deque, via _compat) and closed
            # here, else each ended loop would leave one open on the server.
            idle = idle_connections(own.pool)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await own.pool.close()
            for conn in idle:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await conn.close()
            raise

    def listen_conninfo(self) -> tuple[str, dict[str, Any]]:
        """Where a ``LISTEN`` connection connects to: the URL, or the given pool's server."""
        if self.conninfo is not None:
            return self.conninfo, {}
        assert self.user is not None
        with self.user.connection() as conn:
            return conn.info.dsn, {"password": conn.info.password}

    @property
    def can_listen(self) -> bool:
        return self.conninfo is not None or self.user is not None

    def close(self, *, same_process: bool) -> None:
        """Close the owned sync pool (not in a forked child: the parent's sockets)."""
        with self._lock:
            pool, self._own = self._own, None
        if pool is not None and same_process:
            pool.close()

    async def aclose_loop(self) -> None:
        """Close the running loop's owned async pool, if any."""
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
            own = self._own_async.pop(loop, None)
            if own is not None:
                if not own.closed.done():
                    own.closed.set_result(None)  # its watcher returns
                await own.pool.close()


class _LoopPool:
    """One loop's owned async pool, and the task that closes it when the loop ends."""

    def __init__(self, pool: AsyncConnectionPool[Any], closed: asyncio.Future[None]) -> None:
        self.pool = pool
        #: Done when ``aclose()`` closed the pool (the watcher then just returns).
        self.closed = closed
        #: Held here: the loop keeps only a weak reference to its tasks.
        self.watcher: asyncio.Task[None] | None = None


@dataclass(frozen=True)
class Stmt:
    """One statement of an operation: its text, its parameters, and what to fetch after it
    (``"one"``: a row or ``None``; ``"all"``: the rows; ``"none"``: nothing)."""

    query: str
    params: Any = None
    fetch: Literal["one", "all", "none"] = "one"


#: Yielded by an operation's steps instead of a :class:`Stmt`: it is sent the connection's
#: ``info`` (host, port, database, user), for ``describe``.
CONN_INFO: Final = object()


@dataclass(frozen=True)
class Op(Generic[_T]):
    """One store operation, written once for both drivers.

    ``steps()`` makes a generator that yields the :class:`Stmt` to send (or
    :data:`CONN_INFO`), is sent what each fetched, and returns the operation's answer; no
    I/O of its own, so :func:`run_sync` and :func:`run_async` cannot disagree. A fresh
    generator is made for a retry on another connection. ``atomic`` runs every statement in
    one transaction (setup, drop).
    """

    steps: Callable[[], Generator[Any, Any, _T]]
    atomic: bool = False


def single(stmt: Stmt, decode: Callable[[Any], _T]) -> Op[_T]:
    """An operation of one statement, whose fetched result ``decode`` turns into the answer."""

    def steps() -> Generator[Any, Any, _T]:
        return decode((yield stmt))

    return Op(steps)


def _on(conn: psycopg.Connection[Any], op: Op[_T]) -> _T:
    """``op`` on ``conn`` (in one transaction if atomic), committed; no retry."""
    cur = _cursor(conn)

    def perform(step: Any) -> Any:
        if step is CONN_INFO:
            return cur.connection.info
        cur.execute(step.query, step.params)
        fetch = step.fetch
        return cur.fetchone() if fetch == "one" else cur.fetchall() if fetch == "all" else None

    if op.atomic:
        with conn.transaction():
            result = drive(op.steps(), perform)
    else:
        result = drive(op.steps(), perform)
    if not conn.autocommit:
        conn.commit()
    return result


async def _aon(conn: psycopg.AsyncConnection[Any], op: Op[_T]) -> _T:
    """:func:`_on` on an async connection."""
    cur = _cursor(conn)

    async def perform(step: Any) -> Any:
        if step is CONN_INFO:
            return cur.connection.info
        await cur.execute(step.query, step.params)
        if step.fetch == "one":
            return await cur.fetchone()
        return await cur.fetchall() if step.fetch == "all" else None

    if op.atomic:
        async with conn.transaction():
            result = await adrive(op.steps(), perform)
    else:
        result = await adrive(op.steps(), perform)
    if not conn.autocommit:
        await conn.commit()
    return result


def _broke(
    exc: Exception, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None
) -> bool:
    """Whether ``exc`` broke ``conn`` (the server gone, the socket closed): then another
    connection is worth one more try."""
    return isinstance(exc, _BROKEN) and conn is not None and (conn.broken or conn.closed)


def run_sync(pool: ConnectionPool[Any], key: str | None, op: Op[_T]) -> _T:
    """Run one operation on a pooled connection, its errors translated; an operation whose
    connection the error broke is tried once more on another (the idle connections the
    same fault broke are dropped first)."""
    for again in (True, False):
        conn: psycopg.Connection[Any] | None = None
        try:
            with pool.connection() as conn:
                return _on(conn, op)
        except _ERRORS as exc:
            if not (again and _broke(exc, conn)):
                raise StoreUnavailableError(f"PostgreSQL: {exc}", key=key) from exc
        with contextlib.suppress(*_ERRORS):
            pool.check()
    raise AssertionError("unreachable")


async def run_async(pool: AsyncConnectionPool[Any], key: str | None, op: Op[_T]) -> _T:
    """The async twin of :func:`run_sync`."""
    for again in (True, False):
        aconn: psycopg.AsyncConnection[Any] | None = None
        try:
            async with pool.connection() as aconn:
                return await _aon(aconn, op)
        except _ERRORS as exc:
            if not (again and _broke(exc, aconn)):
                raise StoreUnavailableError(f"PostgreSQL: {exc}", key=key) from exc
        with contextlib.suppress(*_ERRORS):
            await pool.check()
    raise AssertionError("unreachable")


def _parse_url(url: str) -> tuple[str, dict[str, Any]]:
    """``postgresql://`` / ``postgres://`` URL -> (libpq conninfo, store options).

    Query parameters go to libpq, except ``table`` and ``poll_interval``, which are the
    store's options of the same name (percent-decoded: ``?table=ho3%5Fzz`` is ``ho3_zz``).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"not a postgresql:// URL: {url!r}")
    options: dict[str, Any] = {}
    libpq: list[str] = []
    for item in filter(None, parts.query.split("&")):
        name, _, value = item.partition("=")
        if name == "table":
            options["table"] = unquote(value)
        elif name == "poll_interval":
            options["poll_interval"] = float(unquote(value))
        else:
            libpq.append(item)
    return urlunsplit(parts._replace(scheme="postgresql", query="&".join(libpq))), options


def _redact(conninfo: str | None) -> str | None:
    """``conninfo`` without its password (for repr, describe and logs)."""
    if conninfo is None:
        return None
    parts = urlsplit(conninfo)
    if parts.password is None:
        return conninfo
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))
