"""``PostgresIdempotencyStore``: many hosts, one PostgreSQL — and exactly-once for its writes.

Spec:

- **Record.** One row per key in ``table`` (default ``idempotency_records``): one column per
  :class:`~langchain_idempotent.core.record.Record` field (``payload`` ``bytea``, ``meta``
  ``jsonb``, times ``bigint`` milliseconds), plus ``namespace`` and ``thread_id`` copied out
  of ``meta`` and indexed (``list`` / ``purge`` are index lookups), and ``expires_at``.
  ``state`` is constrained to the four states.
- **Protocol.** Each operation is **one round trip**: claim and complete are one call of a
  server-side PL/pgSQL function (``<table>_claim``, ``<table>_complete``) that locks the
  row (``SELECT ... FOR UPDATE``; a race to insert an absent key is settled by the primary
  key and retried inside the function), applies the decision table of
  :mod:`langchain_idempotent.core.protocol` exactly and writes the row; the claim statement
  reads a REPLAY with a plain indexed ``SELECT`` first, in the same statement, and calls
  the function only when there is none (a replay runs no PL/pgSQL); renew, release and
  abandon are one ``UPDATE`` whose ``WHERE`` is the owner + fence compare (:mod:`._sql`
  holds every function and statement, each headed by its parameters and result).
  Completion is write-once. An abandoned row stays ``running`` with ``lease_until`` 0 and
  an owner naming the reason (:func:`~langchain_idempotent.core.record.abandoned_owner`), and
  a claim's TAKEOVER or EXPIRED answer carries that reason, else ``"lease_expired"``.
  Every write compares owner and fence, except :meth:`~PostgresIdempotencyStore.delete` and
  ``purge`` (operator actions). A row of an unknown format ``version`` is refused with
  :class:`~langchain_idempotent.errors.CorruptRecordError` before anything is decided.
- **Time.** The server's clock, ``clock_timestamp()``, read after the row lock is taken, so
  a lock wait never ages a decision; :meth:`~PostgresIdempotencyStore.now_ms` reads it too.
- **Retention.** A claim keeps the row ``max(ttl, lease)`` past now, a completion ``ttl``
  past now, a renewal at least ``lease`` past now, a release or an abandon does not change
  it. A row past
  its ``expires_at`` is absent to every operation; a claim or completion on that key
  overwrites it, and every 64th claim of a store object also deletes up to 256 expired rows
  through the ``expires_at`` index (``FOR UPDATE SKIP LOCKED``, inside the same function
  call: no scan per call, no extra round trip).
- **Wake-ups.** Completion, release, abandon, delete and purge ``pg_notify('<table>_wake',
  md5(key))`` in the writing transaction (delivered on commit). One listener thread per
  store object and process holds a dedicated connection (never a pooled one) with
  ``LISTEN``, started and confirmed *before* a waiter first reads the record, and wakes the
  waiters of that key in this process. A waiter also re-reads the record every
  ``poll_interval`` seconds (default 1; bounded fallback for a dropped listener) and never
  sleeps past the lease deadline it last read (:mod:`._listen`).
- **Schema.** :meth:`~PostgresIdempotencyStore.setup` creates the table, its indexes and
  functions under a transaction-scoped advisory lock, and records the layout version per
  table in ``langchain_idempotent_layout`` (like ``PostgresSaver.setup()``). One layout,
  version 1; a table at a newer version, one an earlier development build set up, or one
  whose functions are not this release's is refused with
  :class:`~langchain_idempotent.errors.StoreUnavailableError` and left as it is
  (:mod:`._sql`). With ``auto_setup=True``
  (default) the first operation of a store object runs it once; pass ``False`` when the
  application's role may not run DDL and call ``setup()`` at deploy time instead.
- **Connections.** :meth:`~PostgresIdempotencyStore.from_url` builds and owns a
  ``psycopg_pool.ConnectionPool`` (opened on first sync use) and an ``AsyncConnectionPool``
  per event loop (on first async use), autocommit, closed by ``close()``/``aclose()`` and
  reopened on next use, and rebuilt in a child after ``fork()``. A pool passed in (sync
  and/or async, e.g. the one of a LangGraph ``PostgresSaver``: ``autocommit=True`` is best,
  ``row_factory`` may be anything; the store reads through one ``tuple_row`` cursor of its
  own per connection) is used as it is and never closed by the store. With
  only a sync pool, the async operations run the sync ones in a worker thread; with only
  an async pool, the sync ones are refused with a clear error. Statements are prepared by
  psycopg after a few uses (``prepare_threshold``), so a hot operation is one
  ``Bind/Execute`` message (:mod:`._pools`).
- **Errors.** Every psycopg / pool error (refused or dropped connection, pool timeout,
  server shutdown, a missing table) becomes
  :class:`~langchain_idempotent.errors.StoreUnavailableError` with the key, chained with
  ``raise ... from``, in one place (:func:`._pools.run_sync` / ``run_async``). An
  operation that
  failed because its *connection* broke (a terminated backend, a restarted server) is
  retried once on another connection after the pool has dropped its broken idle ones;
  that is safe because every operation is idempotent for the same owner: a repeated claim
  is ``OWNED`` with the same fence, a repeated completion finds its own payload stored.
- **Transactions.** :meth:`~PostgresIdempotencyStore.transaction` (and ``atransaction``)
  opens a transaction on a pooled connection for a tool to write on; its ``complete``
  writes the completion *in that transaction* only if the caller still owns the lease at
  its fence (checked under the record's row lock) and commits, or rolls everything back.
  No transaction is held open across a tool's run in the normal mode (:mod:`._transaction`).
- **Facts.** :meth:`~PostgresIdempotencyStore.describe` reports, for ``doctor``, the
  server's version and its ``fsync`` / ``synchronous_commit`` settings (either off, a
  committed record can be lost in a crash), the table, its schema version, and how many
  rows it holds and how many of them expired and wait to be purged. Never a password.
"""

from __future__ import annotations

import asyncio
import builtins
import itertools
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from psycopg_pool import AsyncConnectionPool, ConnectionPool

from ...core.record import Claim, Completion, Record, UncertainReason
from ...core.store import BaseIdempotencyStore, ClaimRequest, CompleteRequest, Held
from ...errors import StoreUnavailableError
from ._describe import describe_op
from ._listen import _Waiters
from ._ops import (
    abandon_op,
    claim_many_op,
    claim_op,
    complete_op,
    delete_op,
    drop_op,
    list_op,
    mark_effect_op,
    now_op,
    probe_op,
    purge_op,
    release_op,
    renew_op,
    setup_op,
)
from ._pools import _ERRORS, Op, _parse_url, _Pools, _redact, run_async, run_sync
from ._sql import _Queries
from ._transaction import AsyncPostgresTransaction, PostgresTransaction

__all__ = ["PostgresIdempotencyStore"]

_T = TypeVar("_T")

# Lower case only: the name is used unquoted (in function and channel names too).
_TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,39}")
#: Every this many claims of a store object, one also purges expired rows, at most this many.
_SWEEP_EVERY = 64
_SWEEP_LIMIT = 256


class PostgresIdempotencyStore(BaseIdempotencyStore):
    """Records in one PostgreSQL table. See the module docstring for the full contract.

    ``pool`` is a ``psycopg_pool.ConnectionPool`` or ``AsyncConnectionPool``;
    ``async_pool`` adds the async one when ``pool`` is the sync one. Or use
    :meth:`from_url`. ``table`` names the records table (lower-case letters, digits,
    underscores). ``poll_interval`` bounds how long a waiter trusts LISTEN/NOTIFY alone.
    """

    def __init__(
        self,
        pool: ConnectionPool[Any] | AsyncConnectionPool[Any] | None = None,
        *,
        async_pool: AsyncConnectionPool[Any] | None = None,
        table: str = "idempotency_records",
        auto_setup: bool = True,
        poll_interval: float = 1.0,
        _conninfo: str | None = None,
        _pool_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not _TABLE_NAME.fullmatch(table):
            raise ValueError(
                f"table must be a lower-case SQL identifier of at most 40 characters, got {table!r}"
            )
        if pool is None and async_pool is None and _conninfo is None:
            raise ValueError(
                "PostgresIdempotencyStore needs a psycopg_pool ConnectionPool or "
                "AsyncConnectionPool, or use PostgresIdempotencyStore.from_url(...)"
            )
        if isinstance(pool, AsyncConnectionPool):
            if async_pool is not None:
                raise ValueError("pass the sync pool as pool= and the async one as async_pool=")
            pool, async_pool = None, pool
        if pool is not None and not isinstance(pool, ConnectionPool):
            raise TypeError(
                f"pool must be a psycopg_pool.ConnectionPool, got {type(pool).__name__}"
            )
        if async_pool is not None and not isinstance(async_pool, AsyncConnectionPool):
            raise TypeError(
                f"async_pool must be a psycopg_pool.AsyncConnectionPool, "
                f"got {type(async_pool).__name__}"
            )
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        self._table = table
        self._auto_setup = auto_setup
        self._poll_interval = float(poll_interval)
        self._conninfo = _conninfo
        self._pools = _Pools(
            pool, async_pool, conninfo=_conninfo, options=_pool_options or {}, table=table
        )
        self._pid = os.getpid()
        self._ready = False
        self._claims = itertools.count(1)
        self._waiters = self._new_waiters()
        self._q = _Queries(table)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 5.0,
        **kwargs: Any,
    ) -> PostgresIdempotencyStore:
        """A store that owns its pools, from ``postgresql://user@host:port/db?...``.

        ``min_size`` / ``max_size`` size each pool; ``timeout`` bounds the wait for a
        connection (then :class:`StoreUnavailableError`). Query parameters are passed to
        libpq (``sslmode``, ``connect_timeout``, ...), except ``table`` and
        ``poll_interval``, which set the options of the same name; keyword arguments win.
        """
        conninfo, options = _parse_url(url)
        options.update(kwargs)
        return cls(
            _conninfo=conninfo,
            _pool_options={"min_size": min_size, "max_size": max_size, "timeout": timeout},
            **options,
        )

    def __repr__(self) -> str:
        return f"PostgresIdempotencyStore({_redact(self._conninfo)!r}, table={self._table!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        if self._conninfo is None:
            raise TypeError(
                "a PostgresIdempotencyStore built on a pool cannot be pickled; build it "
                "with PostgresIdempotencyStore.from_url(...) to send it to other processes"
            )
        return (
            _restore,
            (
                self._conninfo,
                self._pools.options,
                self._table,
                self._auto_setup,
                self._poll_interval,
            ),
        )

    @property
    def table(self) -> str:
        return self._table

    # -- schema ------------------------------------------------------------------------

    def setup(self) -> None:
        """Create the table, its indexes and functions, or check that they are this
        release's layout (idempotent); anything else is refused, unchanged."""
        self._run(None, setup_op(self._q), setup=False)
        self._ready = True

    async def asetup(self) -> None:
        """The async twin of :meth:`setup`."""
        await self._arun(None, setup_op(self._q), setup=False)
        self._ready = True

    def drop(self) -> None:
        """Remove what :meth:`setup` created — the table with every record, its functions
        and its schema row — for tearing a store down (tests, a per-run table). Irreversible;
        the store sets the table up again on its next use."""
        self._run(None, drop_op(self._q), setup=False)
        self._ready = False

    async def adrop(self) -> None:
        """The async twin of :meth:`drop`."""
        await self._arun(None, drop_op(self._q), setup=False)
        self._ready = False

    # -- record operations: each described once (an Op, :mod:`._ops`), run by _run / _arun

    def claim(self, request: ClaimRequest) -> Claim:
        return self._run(request.key, claim_op(self._q, request, sweep=self._sweep))

    async def aclaim(self, request: ClaimRequest) -> Claim:
        return await self._arun(request.key, claim_op(self._q, request, sweep=self._sweep))

    def claim_many(self, requests: Sequence[ClaimRequest]) -> builtins.list[Claim]:
        """Every claim in one statement (``unnest`` + ``LATERAL`` over the claim function,
        :mod:`._sql`): one round trip, one transaction, answers in request order."""
        if len(requests) < 2:  # one claim: its own statement reads a replay cheapest
            return [self.claim(r) for r in requests]
        return self._run(requests[0].key, claim_many_op(self._q, requests))

    async def aclaim_many(self, requests: Sequence[ClaimRequest]) -> builtins.list[Claim]:
        if len(requests) < 2:
            return [await self.aclaim(r) for r in requests]
        return await self._arun(requests[0].key, claim_many_op(self._q, requests))

    def renew(self, held: Held, lease_ms: int) -> bool:
        return self._run(held.key, renew_op(self._q, held, lease_ms))

    async def arenew(self, held: Held, lease_ms: int) -> bool:
        return await self._arun(held.key, renew_op(self._q, held, lease_ms))

    def complete(self, request: CompleteRequest) -> Completion:
        return self._run(request.key, complete_op(self._q, request))

    async def acomplete(self, request: CompleteRequest) -> Completion:
        return await self._arun(request.key, complete_op(self._q, request))

    def mark_effect(self, held: Held) -> bool:
        return self._run(held.key, mark_effect_op(self._q, held))

    async def amark_effect(self, held: Held) -> bool:
        return await self._arun(held.key, mark_effect_op(self._q, held))

    def release(self, held: Held) -> bool:
        return self._run(held.key, release_op(self._q, held))

    async def arelease(self, held: Held) -> bool:
        return await self._arun(held.key, release_op(self._q, held))

    def abandon(
        self, held: Held, reason: UncertainReason = "cancelled", error_type: str | None = None
    ) -> bool:
        return self._run(held.key, abandon_op(self._q, held, reason, error_type))

    async def aabandon(
        self, held: Held, reason: UncertainReason = "cancelled", error_type: str | None = None
    ) -> bool:
        return await self._arun(held.key, abandon_op(self._q, held, reason, error_type))

    def get(self, key: str) -> Record | None:
        return self._run(key, probe_op(self._q, key))[0]

    async def aget(self, key: str) -> Record | None:
        return (await self._arun(key, probe_op(self._q, key)))[0]

    def now_ms(self) -> int:
        """The server's clock (``clock_timestamp()``) in milliseconds."""
        return self._run(None, now_op(self._q), setup=False)

    async def anow_ms(self) -> int:
        return await self._arun(None, now_op(self._q), setup=False)

    def describe(self) -> dict[str, Any]:
        """Facts for ``doctor``: server version and durability settings (``fsync``,
        ``synchronous_commit``), table, schema version, row counts. Creates nothing.

        Never the password (the URL is shown without it).
        """
        return self._run(None, describe_op(self._q, self._conninfo), setup=False)

    # -- watch ---------------------------------------------------------------------------

    def watch(self, key: str, *, fence: int, timeout: float) -> None:
        self._check_fork()
        self._waiters.watch(key, fence, timeout, lambda: self._run(key, probe_op(self._q, key)))

    async def awatch(self, key: str, *, fence: int, timeout: float) -> None:
        self._check_fork()
        await self._waiters.awatch(
            key, fence, timeout, lambda: self._arun(key, probe_op(self._q, key))
        )

    def _new_waiters(self) -> _Waiters:
        conninfo = self._pools.listen_conninfo if self._pools.can_listen else None
        return _Waiters(self._table, conninfo, self._poll_interval)

    # -- operator helpers ----------------------------------------------------------------

    def delete(self, key: str) -> bool:
        return self._run(key, delete_op(self._q, key))

    async def adelete(self, key: str) -> bool:
        return await self._arun(key, delete_op(self._q, key))

    def list(
        self,
        *,
        namespace: str | None = None,
        thread_id: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Record]:
        return self._run(None, list_op(self._q, namespace, thread_id, limit))

    async def alist(
        self,
        *,
        namespace: str | None = None,
        thread_id: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Record]:
        return await self._arun(None, list_op(self._q, namespace, thread_id, limit))

    def purge(self, *, thread_id: str, namespace: str | None = None) -> int:
        return self._run(None, purge_op(self._q, thread_id, namespace))

    async def apurge(self, *, thread_id: str, namespace: str | None = None) -> int:
        return await self._arun(None, purge_op(self._q, thread_id, namespace))

    def close(self) -> None:
        """Close the pools this store owns and its listener; they reopen on next use.

        Pools passed in are left open (their owner closes them).
        """
        self._waiters.stop()
        self._pools.close(same_process=self._pid == os.getpid())

    async def aclose(self) -> None:
        """Close this loop's owned async pool too (and what :meth:`close` closes)."""
        await self._pools.aclose_loop()
        await asyncio.to_thread(self.close)

    # -- transactions (transactional mode) -------------------------------------------------

    def transaction(self) -> PostgresTransaction:
        """Open a transaction on a pooled connection; see :class:`PostgresTransaction`."""
        pool = self._sync_pool(None)
        self._maybe_setup()
        try:
            conn = pool.getconn()
        except _ERRORS as exc:
            raise StoreUnavailableError(f"PostgreSQL: could not get a connection: {exc}") from exc
        return PostgresTransaction(self._q, pool, conn)

    async def atransaction(self) -> AsyncPostgresTransaction:
        """The async twin of :meth:`transaction` (an ``AsyncConnection``)."""
        pool = await self._async_pool(None)
        if pool is None and self._pools.ending():
            raise StoreUnavailableError(
                "PostgreSQL: this event loop is ending (asyncio.run is cancelling its "
                "tasks); a transaction cannot begin on it"
            )
        if pool is None:
            raise TypeError(
                "transactional mode for async tools needs an AsyncConnectionPool: pass "
                "async_pool= or build the store with PostgresIdempotencyStore.from_url(...)"
            )
        await self._amaybe_setup()
        try:
            conn = await pool.getconn()
        except _ERRORS as exc:
            raise StoreUnavailableError(f"PostgreSQL: could not get a connection: {exc}") from exc
        return await AsyncPostgresTransaction(self._q, pool, conn).begin()

    # -- error translation and the pools (see ._pools) -----------------------------------

    def _run(self, key: str | None, op: Op[_T], *, setup: bool = True) -> _T:
        pool = self._sync_pool(key)
        if setup:
            self._maybe_setup(key)
        return run_sync(pool, key, op)

    async def _arun(self, key: str | None, op: Op[_T], *, setup: bool = True) -> _T:
        pool = await self._async_pool(key)
        if pool is None:  # only a sync pool was given: run the same op on it, in a thread
            return await asyncio.to_thread(self._run, key, op, setup=setup)
        if setup:
            await self._amaybe_setup(key)
        return await run_async(pool, key, op)

    def _maybe_setup(self, key: str | None = None) -> None:
        if self._auto_setup and not self._ready:
            try:
                self.setup()
            except StoreUnavailableError as exc:
                raise StoreUnavailableError(str(exc), key=key) from exc.__cause__

    async def _amaybe_setup(self, key: str | None = None) -> None:
        if self._auto_setup and not self._ready:
            try:
                await self.asetup()
            except StoreUnavailableError as exc:
                raise StoreUnavailableError(str(exc), key=key) from exc.__cause__

    def _sweep(self) -> int:
        """How many expired rows the next claim purges at most: every 64th, 256."""
        return _SWEEP_LIMIT if next(self._claims) % _SWEEP_EVERY == 0 else 0

    def _check_fork(self) -> None:
        if self._pid != os.getpid():  # a forked child: never touch the parent's sockets
            self._pid = os.getpid()
            self._pools.forget()
            self._waiters = self._new_waiters()

    def _sync_pool(self, key: str | None) -> ConnectionPool[Any]:
        self._check_fork()
        return self._pools.sync(key)

    async def _async_pool(self, key: str | None) -> AsyncConnectionPool[Any] | None:
        self._check_fork()
        return await self._pools.async_(key)


def _restore(
    conninfo: str,
    pool_options: dict[str, Any],
    table: str,
    auto_setup: bool,
    poll_interval: float,
) -> PostgresIdempotencyStore:
    return PostgresIdempotencyStore(
        _conninfo=conninfo,
        _pool_options=pool_options,
        table=table,
        auto_setup=auto_setup,
        poll_interval=poll_interval,
    )
