"""Transactional mode: the tool's writes and its completion commit together, or neither.

:meth:`PostgresIdempotencyStore.transaction` (``atransaction``) checks a connection out of
the store's pool and turns ``autocommit`` off; the engine hands it to the tool through
``get_idempotency_context().connection``. :meth:`PostgresTransaction.complete` calls
``<table>_complete`` with ``p_strict`` *in that transaction*: it stores the completion only
while the caller still owns the lease at its fence (checked under the record's row lock),
and then commits; otherwise it rolls back, the tool's writes with it. A worker that dies
or raises never commits. Either way the connection goes back to its pool with its
``autocommit`` as it was.
"""

from __future__ import annotations

import contextlib
from typing import Any

from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from ...core.record import Completion
from ...core.store import CompleteRequest
from ...errors import CorruptRecordError, StoreUnavailableError
from ._ops import complete_params
from ._pools import _ERRORS
from ._sql import _completion, _Queries

__all__ = ["AsyncPostgresTransaction", "PostgresTransaction"]


def _unknown_commit(key: str, exc: BaseException) -> StoreUnavailableError:
    """The connection failed while completing: whether the transaction committed is unknown
    (a retry replays it, or takes over)."""
    return StoreUnavailableError(
        f"PostgreSQL: the transactional completion failed ({exc}); whether it committed is unknown",
        key=key,
    )


class _Transaction:
    """What both transactions keep: the connection, its pool, its ``autocommit`` before
    the transaction (given back with it), and whether the transaction has ended."""

    def __init__(self, queries: _Queries, pool: Any, conn: Any) -> None:
        self._q, self._pool, self.connection = queries, pool, conn
        self._autocommit = conn.autocommit
        self._done = False

    def _ending(self) -> bool:
        """``True`` the first time only: the caller ends the transaction."""
        done, self._done = self._done, True
        return not done

    def _reusable(self) -> bool:
        """Whether the connection can take its ``autocommit`` back (it is still open)."""
        return not self.connection.broken and not self.connection.closed


class PostgresTransaction(_Transaction):
    """A transaction a tool writes in; the completion commits with it or not at all.

    ``connection`` is a psycopg ``Connection`` in a transaction (``autocommit`` off until
    the transaction ends): run the tool's statements on it and do not commit.
    :meth:`complete` writes the completion in the same transaction only if the caller
    still owns the lease at its fence (checked under the record's row lock, so a takeover
    either happened before — refused, everything rolled back — or waits and then replays
    this result) and commits; :meth:`rollback` undoes everything. Either returns the
    connection to the pool.
    """

    _pool: ConnectionPool[Any]

    def __init__(self, queries: _Queries, pool: ConnectionPool[Any], conn: Any) -> None:
        super().__init__(queries, pool, conn)
        try:
            if conn.autocommit:
                conn.autocommit = False
        except _ERRORS as exc:
            self._finish()
            raise StoreUnavailableError(f"PostgreSQL: {exc}") from exc

    def complete(self, request: CompleteRequest) -> Completion:
        """Write the completion and commit, or roll back when the lease is no longer ours.

        Raises :class:`StoreUnavailableError` when the connection fails: whether the
        transaction committed is then unknown (a retry replays it, or takes over).
        """
        conn, q, key = self.connection, self._q, request.key
        try:
            with conn.cursor(row_factory=tuple_row) as cur:
                cur.execute(q.complete, complete_params(request, strict=True))
                answer = _completion(key, cur.fetchone(), q.table)
            if answer.stored:
                conn.commit()
            else:
                conn.rollback()
            return answer
        except CorruptRecordError:
            self.rollback()
            raise
        except _ERRORS as exc:
            self.rollback()
            raise _unknown_commit(key, exc) from exc
        finally:
            self._finish()

    def rollback(self) -> None:
        """Undo the tool's writes; nothing is recorded. Idempotent."""
        if self._done:
            return
        with contextlib.suppress(*_ERRORS):
            self.connection.rollback()
        self._finish()

    def _finish(self) -> None:
        if not self._ending():
            return
        with contextlib.suppress(*_ERRORS):
            if self._reusable():
                self.connection.autocommit = self._autocommit
        with contextlib.suppress(*_ERRORS):
            self._pool.putconn(self.connection)


class AsyncPostgresTransaction(_Transaction):
    """The async twin of :class:`PostgresTransaction` (``connection`` is an
    ``AsyncConnection``)."""

    _pool: AsyncConnectionPool[Any]

    async def begin(self) -> AsyncPostgresTransaction:
        try:
            if self.connection.autocommit:
                await self.connection.set_autocommit(False)
        except _ERRORS as exc:
            await self._finish()
            raise StoreUnavailableError(f"PostgreSQL: {exc}") from exc
        return self

    async def complete(self, request: CompleteRequest) -> Completion:
        conn, q, key = self.connection, self._q, request.key
        try:
            async with conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(q.complete, complete_params(request, strict=True))
                answer = _completion(key, await cur.fetchone(), q.table)
            if answer.stored:
                await conn.commit()
            else:
                await conn.rollback()
            return answer
        except CorruptRecordError:
            await self.rollback()
            raise
        except _ERRORS as exc:
            await self.rollback()
            raise _unknown_commit(key, exc) from exc
        finally:
            await self._finish()

    async def rollback(self) -> None:
        if self._done:
            return
        with contextlib.suppress(*_ERRORS):
            await self.connection.rollback()
        await self._finish()

    async def _finish(self) -> None:
        if not self._ending():
            return
        with contextlib.suppress(*_ERRORS):
            if self._reusable():
                await self.connection.set_autocommit(self._autocommit)
        with contextlib.suppress(*_ERRORS):
            await self._pool.putconn(self.connection)
