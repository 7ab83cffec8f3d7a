"""``PostgresIdempotencyStore``: many hosts, one PostgreSQL — and exactly-once for its writes.

Spec:

- **Record.** One row per key in ``table`` (default ``idempotency_records``): one column per
  :class:`~langchain_idempotent.record.Record` field (``payload`` ``bytea``, ``meta``
  ``jsonb``, times ``bigint`` milliseconds), plus ``namespace`` and ``thread_id`` copied out
  of ``meta`` and indexed (``list`` / ``purge`` are index lookups), and ``expires_at``.
  ``state`` is constrained to the four states.
- **Protocol.** Each operation is **one round trip**: claim and complete are one call of a
  server-side PL/pgSQL function (``<table>_claim``, ``<table>_complete``) that locks the
  row (``SELECT ... FOR UPDATE``; a race to insert an absent key is settled by the primary
  key and retried inside the function), applies the decision table of
  :mod:`langchain_idempotent.protocol` exactly and writes the row; renew and release are
  one ``UPDATE`` whose ``WHERE`` is the owner + fence compare, and so is abandon (the row
  stays ``running`` with its lease ended and ``owner`` naming the reason, so the next claim
  is a takeover told why). Completion is write-once.
  Every write compares owner and fence, except :meth:`~PostgresIdempotencyStore.delete` and
  ``purge`` (operator actions). A row of an unknown format ``version`` is refused with
  :class:`~langchain_idempotent.errors.CorruptRecordError` before anything is decided.
- **Time.** The server's clock, ``clock_timestamp()``, read after the row lock is taken, so
  a lock wait never ages a decision; :meth:`~PostgresIdempotencyStore.now_ms` reads it too.
- **Retention.** A claim keeps the row ``max(ttl, lease)`` past now, a completion ``ttl``
  past now, a renewal at least ``lease`` past now, a release does not change it. A row past
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
  sleeps past the lease deadline it last read.
- **Schema.** :meth:`~PostgresIdempotencyStore.setup` creates and migrates the table, its
  indexes and functions under a transaction-scoped advisory lock, and records the schema
  version per table in ``langchain_idempotent_schema`` (like ``PostgresSaver.setup()``). A
  table at a newer version is refused with
  :class:`~langchain_idempotent.errors.StoreUnavailableError`. With ``auto_setup=True``
  (default) the first operation of a store object runs it once; pass ``False`` when the
  application's role may not run DDL and call ``setup()`` at deploy time instead.
- **Connections.** :meth:`~PostgresIdempotencyStore.from_url` builds and owns a
  ``psycopg_pool.ConnectionPool`` (opened on first sync use) and an ``AsyncConnectionPool``
  per event loop (on first async use), autocommit, closed by ``close()``/``aclose()`` and
  reopened on next use, and rebuilt in a child after ``fork()``. A pool passed in (sync
  and/or async, e.g. the one of a LangGraph ``PostgresSaver``: ``autocommit=True`` is best,
  ``row_factory`` may be anything) is used as it is and never closed by the store. With
  only a sync pool, the async operations run the sync ones in a worker thread; with only
  an async pool, the sync ones are refused with a clear error. Statements are prepared by
  psycopg after a few uses (``prepare_threshold``), so a hot operation is one
  ``Bind/Execute`` message.
- **Errors.** Every psycopg / pool error (refused or dropped connection, pool timeout,
  server shutdown, a missing table) becomes
  :class:`~langchain_idempotent.errors.StoreUnavailableError` with the key, chained with
  ``raise ... from``, at one boundary (:meth:`_sync` / :meth:`_async`). An operation that
  failed because its *connection* broke (a terminated backend, a restarted server) is
  retried once on another connection after the pool has dropped its broken idle ones;
  that is safe because every operation is idempotent for the same owner: a repeated claim
  is ``OWNED`` with the same fence, a repeated completion finds its own payload stored.
- **Transactions.** :meth:`~PostgresIdempotencyStore.transaction` (and ``atransaction``)
  opens a transaction on a pooled connection for a tool to write on; its ``complete``
  writes the completion *in that transaction* only if the caller still owns the lease at
  its fence (checked under the record's row lock) and commits, or rolls everything back.
  No transaction is held open across a tool's run in the normal mode.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import hashlib
import itertools
import json
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolClosed, PoolTimeout

from ..errors import CorruptRecordError, StoreUnavailableError
from ..record import (
    FORMAT_VERSION,
    Claim,
    ClaimOutcome,
    Completion,
    ExpiredPolicy,
    Record,
    State,
    UncertainReason,
)
from ._wakeup import Wakeup
from .base import BaseIdempotencyStore

__all__ = ["AsyncPostgresTransaction", "PostgresIdempotencyStore", "PostgresTransaction"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: Version of the schema below; kept per table in ``langchain_idempotent_schema``.
SCHEMA_VERSION = 3
_SCHEMA_TABLE = "langchain_idempotent_schema"
# Lower case only: the name is used unquoted (in function and channel names too).
_TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,39}")
_SWEEP_EVERY = 64
_SWEEP_LIMIT = 256
_FIRST_POLL = 0.002
_STATES = {s.value: s for s in State}
_COLUMNS = (
    "key, state, owner, fence, lease_until, fingerprint, attempt, payload, "
    "created_at, updated_at, version, meta"
)
_NOW = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
_BROKEN = (psycopg.OperationalError, psycopg.InterfaceError)
_ERRORS = (psycopg.Error, PoolTimeout, PoolClosed)

# -- schema: one entry per version; setup() applies those above the stored version ---------
#
# Version 1: the table and its indexes. Version 2: the claim and complete functions.
# Version 3: claim answers the takeover's reason (abandoned rows, issue 12).
# ``{t}`` is the table name; ``;;`` lines separate statements (sent one by one, so that
# pools with ``prepare_threshold=0``, like PostgresSaver's, can run them). The functions
# implement protocol.py's table; comments name the rows they implement.

_V1 = """
CREATE TABLE IF NOT EXISTS {t} (
    key          text PRIMARY KEY,
    state        text NOT NULL CHECK (state IN ('running', 'completed', 'failed', 'free')),
    owner        text NOT NULL,
    fence        bigint NOT NULL,
    lease_until  bigint NOT NULL,
    fingerprint  text NOT NULL,
    attempt      bigint NOT NULL,
    payload      bytea,
    created_at   bigint NOT NULL,
    updated_at   bigint NOT NULL,
    version      integer NOT NULL,
    meta         jsonb NOT NULL DEFAULT '{{}}',
    namespace    text,
    thread_id    text,
    expires_at   bigint NOT NULL
)
;;
CREATE INDEX IF NOT EXISTS {t}_expires_at ON {t} (expires_at)
;;
CREATE INDEX IF NOT EXISTS {t}_thread ON {t} (thread_id, namespace)
;;
CREATE INDEX IF NOT EXISTS {t}_namespace ON {t} (namespace)
"""

_V2 = """
-- claim: returns (outcome, fence, attempt, retry_after_ms, failed, payload).
-- outcome is a ClaimOutcome value, or 'corrupt' for a row of an unknown format version.
CREATE OR REPLACE FUNCTION {t}_claim(
    p_key text, p_owner text, p_fingerprint text, p_lease_ms bigint, p_ttl_ms bigint,
    p_takeover boolean, p_meta jsonb, p_sweep integer,
    OUT outcome text, OUT o_fence bigint, OUT o_attempt bigint, OUT retry_after_ms bigint,
    OUT failed boolean, OUT payload bytea)
LANGUAGE plpgsql AS $fn$
DECLARE
    now_ms bigint;
    rec {t}%ROWTYPE;
BEGIN
    retry_after_ms := 0; failed := false;
    IF p_sweep > 0 THEN  -- the occasional bounded purge of expired rows
        DELETE FROM {t} WHERE key IN (
            SELECT s.key FROM {t} s WHERE s.expires_at <= {now}
            ORDER BY s.expires_at LIMIT p_sweep FOR UPDATE SKIP LOCKED);
    END IF;
    -- Fast path, no row lock: the answers that write nothing (MISMATCH, REPLAY, BUSY) from
    -- a plain read. Done rows never change; a running row read just before it changed
    -- only sends a waiter to watch and claim again, as if it had asked a moment earlier.
    SELECT * INTO rec FROM {t} WHERE key = p_key;
    now_ms := {now};
    IF FOUND AND rec.expires_at > now_ms AND rec.version = {version} THEN
        o_fence := rec.fence; o_attempt := rec.attempt;
        IF rec.fingerprint <> p_fingerprint THEN
            outcome := 'mismatch';
            RETURN;
        END IF;
        IF rec.state IN ('completed', 'failed') THEN
            outcome := 'replay'; failed := rec.state = 'failed'; payload := rec.payload;
            RETURN;
        END IF;
        IF rec.state = 'running' AND rec.owner <> p_owner AND rec.lease_until > now_ms THEN
            outcome := 'busy'; retry_after_ms := rec.lease_until - now_ms;
            RETURN;
        END IF;
    END IF;
    -- Everything else writes: lock the row (or settle the race to insert it) and decide.
    LOOP
        SELECT * INTO rec FROM {t} WHERE key = p_key FOR UPDATE;
        now_ms := {now};  -- after the lock
        IF NOT FOUND OR rec.expires_at <= now_ms THEN
            -- absent (an expired row is absent, and overwritten) -> ACQUIRED fence 1, attempt 1
            IF FOUND THEN
                DELETE FROM {t} WHERE key = p_key;
            END IF;
            INSERT INTO {t} (key, state, owner, fence, lease_until, fingerprint, attempt,
                             payload, created_at, updated_at, version, meta, namespace,
                             thread_id, expires_at)
            VALUES (p_key, 'running', p_owner, 1, now_ms + p_lease_ms, p_fingerprint, 1,
                    NULL, now_ms, now_ms, {version}, p_meta, p_meta->>'namespace',
                    p_meta->>'thread_id', now_ms + greatest(p_ttl_ms, p_lease_ms))
            ON CONFLICT (key) DO NOTHING;
            IF FOUND THEN
                outcome := 'acquired'; o_fence := 1; o_attempt := 1;
                RETURN;
            END IF;
            CONTINUE;  -- another claim inserted it first: decide on its row
        END IF;
        EXIT;
    END LOOP;
    o_fence := rec.fence; o_attempt := rec.attempt;
    IF rec.version <> {version} THEN
        outcome := 'corrupt';
        RETURN;
    END IF;
    IF rec.fingerprint <> p_fingerprint THEN  -- fingerprint differs -> MISMATCH
        outcome := 'mismatch';
        RETURN;
    END IF;
    IF rec.state IN ('completed', 'failed') THEN  -- done -> REPLAY
        outcome := 'replay'; failed := rec.state = 'failed'; payload := rec.payload;
        RETURN;
    END IF;
    IF rec.state = 'running' AND rec.owner = p_owner THEN  -- the claimant -> OWNED
        UPDATE {t} SET lease_until = now_ms + p_lease_ms, updated_at = now_ms,
                       expires_at = now_ms + greatest(p_ttl_ms, p_lease_ms)
        WHERE key = p_key;
        outcome := 'owned';
        RETURN;
    END IF;
    IF rec.state = 'running' AND rec.lease_until > now_ms THEN  -- live lease -> BUSY
        outcome := 'busy'; retry_after_ms := rec.lease_until - now_ms;
        RETURN;
    END IF;
    IF rec.state = 'running' AND NOT p_takeover THEN  -- expired, policy "raise" -> EXPIRED
        outcome := 'expired';
        RETURN;
    END IF;
    -- FREE -> ACQUIRED; expired, policy "takeover" -> TAKEOVER: fence + 1, attempt + 1
    outcome := CASE WHEN rec.state = 'free' THEN 'acquired' ELSE 'takeover' END;
    o_fence := rec.fence + 1; o_attempt := rec.attempt + 1;
    UPDATE {t} SET state = 'running', owner = p_owner, fence = o_fence, attempt = o_attempt,
                   lease_until = now_ms + p_lease_ms, payload = NULL, updated_at = now_ms,
                   expires_at = now_ms + greatest(p_ttl_ms, p_lease_ms)
    WHERE key = p_key;
END
$fn$
;;
-- complete: returns (outcome, stored, stale, failed, payload); outcome 'ok' or 'corrupt'.
-- p_strict (transactional mode): store only while RUNNING with the caller's owner and
-- fence; otherwise store nothing and answer stale (the caller rolls back).
CREATE OR REPLACE FUNCTION {t}_complete(
    p_key text, p_owner text, p_fence bigint, p_fingerprint text, p_payload bytea,
    p_failed boolean, p_ttl_ms bigint, p_meta jsonb, p_strict boolean,
    OUT outcome text, OUT stored boolean, OUT stale boolean, OUT failed boolean,
    OUT payload bytea)
LANGUAGE plpgsql AS $fn$
DECLARE
    now_ms bigint;
    rec {t}%ROWTYPE;
    mine boolean;
BEGIN
    outcome := 'ok';
    LOOP
        SELECT * INTO rec FROM {t} WHERE key = p_key FOR UPDATE;
        now_ms := {now};
        IF NOT FOUND OR rec.expires_at <= now_ms THEN
            -- the record vanished while the tool ran: ours is the only result (stale)
            IF p_strict THEN
                stored := false; stale := true; failed := false; payload := NULL;
                RETURN;
            END IF;
            IF FOUND THEN
                DELETE FROM {t} WHERE key = p_key;
            END IF;
            INSERT INTO {t} (key, state, owner, fence, lease_until, fingerprint, attempt,
                             payload, created_at, updated_at, version, meta, namespace,
                             thread_id, expires_at)
            VALUES (p_key, CASE WHEN p_failed THEN 'failed' ELSE 'completed' END, p_owner,
                    p_fence, 0, p_fingerprint, 1, p_payload, now_ms, now_ms, {version},
                    p_meta, p_meta->>'namespace', p_meta->>'thread_id', now_ms + p_ttl_ms)
            ON CONFLICT (key) DO NOTHING;
            IF FOUND THEN
                PERFORM pg_notify('{t}_wake', md5(p_key));
                stored := true; stale := true; failed := p_failed; payload := p_payload;
                RETURN;
            END IF;
            CONTINUE;
        END IF;
        EXIT;
    END LOOP;
    IF rec.version <> {version} THEN
        outcome := 'corrupt';
        RETURN;
    END IF;
    IF rec.state IN ('completed', 'failed') THEN  -- write-once: the stored payload wins
        stored := false; stale := NOT (rec.owner = p_owner AND rec.fence = p_fence);
        failed := rec.state = 'failed'; payload := rec.payload;
        RETURN;
    END IF;
    mine := rec.state = 'running' AND rec.owner = p_owner AND rec.fence = p_fence;
    IF p_strict AND NOT mine THEN
        stored := false; stale := true; failed := false; payload := NULL;
        RETURN;
    END IF;
    UPDATE {t} SET state = CASE WHEN p_failed THEN 'failed' ELSE 'completed' END,
                   owner = p_owner, fence = greatest(rec.fence, p_fence), lease_until = 0,
                   payload = p_payload, updated_at = now_ms, expires_at = now_ms + p_ttl_ms
    WHERE key = p_key;
    PERFORM pg_notify('{t}_wake', md5(p_key));
    stored := true; stale := NOT mine; failed := p_failed; payload := p_payload;
END
$fn$
"""


_V3 = """
-- Version 3: the claim function also answers why a takeover's outcome is unknown (the
-- output row changes, so the function is dropped and created again).
DROP FUNCTION IF EXISTS {t}_claim(text, text, text, bigint, bigint, boolean, jsonb, integer)
;;
-- claim: returns (outcome, fence, attempt, retry_after_ms, failed, payload, reason).
-- outcome is a ClaimOutcome value, or 'corrupt' for a row of an unknown format version;
-- reason (TAKEOVER, EXPIRED): 'lease_expired', or the reason an abandoned row's owner
-- names ('!cancelled' -> 'cancelled', record.abandoned_owner).
CREATE FUNCTION {t}_claim(
    p_key text, p_owner text, p_fingerprint text, p_lease_ms bigint, p_ttl_ms bigint,
    p_takeover boolean, p_meta jsonb, p_sweep integer,
    OUT outcome text, OUT o_fence bigint, OUT o_attempt bigint, OUT retry_after_ms bigint,
    OUT failed boolean, OUT payload bytea, OUT reason text)
LANGUAGE plpgsql AS $fn$
DECLARE
    now_ms bigint;
    rec {t}%ROWTYPE;
BEGIN
    retry_after_ms := 0; failed := false;
    IF p_sweep > 0 THEN  -- the occasional bounded purge of expired rows
        DELETE FROM {t} WHERE key IN (
            SELECT s.key FROM {t} s WHERE s.expires_at <= {now}
            ORDER BY s.expires_at LIMIT p_sweep FOR UPDATE SKIP LOCKED);
    END IF;
    -- Fast path, no row lock: the answers that write nothing (MISMATCH, REPLAY, BUSY) from
    -- a plain read. Done rows never change; a running row read just before it changed
    -- only sends a waiter to watch and claim again, as if it had asked a moment earlier.
    SELECT * INTO rec FROM {t} WHERE key = p_key;
    now_ms := {now};
    IF FOUND AND rec.expires_at > now_ms AND rec.version = {version} THEN
        o_fence := rec.fence; o_attempt := rec.attempt;
        IF rec.fingerprint <> p_fingerprint THEN
            outcome := 'mismatch';
            RETURN;
        END IF;
        IF rec.state IN ('completed', 'failed') THEN
            outcome := 'replay'; failed := rec.state = 'failed'; payload := rec.payload;
            RETURN;
        END IF;
        IF rec.state = 'running' AND rec.owner <> p_owner AND rec.lease_until > now_ms THEN
            outcome := 'busy'; retry_after_ms := rec.lease_until - now_ms;
            RETURN;
        END IF;
    END IF;
    -- Everything else writes: lock the row (or settle the race to insert it) and decide.
    LOOP
        SELECT * INTO rec FROM {t} WHERE key = p_key FOR UPDATE;
        now_ms := {now};  -- after the lock
        IF NOT FOUND OR rec.expires_at <= now_ms THEN
            -- absent (an expired row is absent, and overwritten) -> ACQUIRED fence 1, attempt 1
            IF FOUND THEN
                DELETE FROM {t} WHERE key = p_key;
            END IF;
            INSERT INTO {t} (key, state, owner, fence, lease_until, fingerprint, attempt,
                             payload, created_at, updated_at, version, meta, namespace,
                             thread_id, expires_at)
            VALUES (p_key, 'running', p_owner, 1, now_ms + p_lease_ms, p_fingerprint, 1,
                    NULL, now_ms, now_ms, {version}, p_meta, p_meta->>'namespace',
                    p_meta->>'thread_id', now_ms + greatest(p_ttl_ms, p_lease_ms))
            ON CONFLICT (key) DO NOTHING;
            IF FOUND THEN
                outcome := 'acquired'; o_fence := 1; o_attempt := 1;
                RETURN;
            END IF;
            CONTINUE;  -- another claim inserted it first: decide on its row
        END IF;
        EXIT;
    END LOOP;
    o_fence := rec.fence; o_attempt := rec.attempt;
    IF rec.version <> {version} THEN
        outcome := 'corrupt';
        RETURN;
    END IF;
    IF rec.fingerprint <> p_fingerprint THEN  -- fingerprint differs -> MISMATCH
        outcome := 'mismatch';
        RETURN;
    END IF;
    IF rec.state IN ('completed', 'failed') THEN  -- done -> REPLAY
        outcome := 'replay'; failed := rec.state = 'failed'; payload := rec.payload;
        RETURN;
    END IF;
    IF rec.state = 'running' AND rec.owner = p_owner THEN  -- the claimant -> OWNED
        UPDATE {t} SET lease_until = now_ms + p_lease_ms, updated_at = now_ms,
                       expires_at = now_ms + greatest(p_ttl_ms, p_lease_ms)
        WHERE key = p_key;
        outcome := 'owned';
        RETURN;
    END IF;
    IF rec.state = 'running' AND rec.lease_until > now_ms THEN  -- live lease -> BUSY
        outcome := 'busy'; retry_after_ms := rec.lease_until - now_ms;
        RETURN;
    END IF;
    reason := CASE WHEN rec.owner IN ('!cancelled', '!lease_lost', '!lease_expired')
                   THEN substr(rec.owner, 2) ELSE 'lease_expired' END;
    IF rec.state = 'running' AND NOT p_takeover THEN  -- expired, policy "raise" -> EXPIRED
        outcome := 'expired';
        RETURN;
    END IF;
    -- FREE -> ACQUIRED; expired, policy "takeover" -> TAKEOVER: fence + 1, attempt + 1
    outcome := CASE WHEN rec.state = 'free' THEN 'acquired' ELSE 'takeover' END;
    IF rec.state = 'free' THEN
        reason := NULL;
    END IF;
    o_fence := rec.fence + 1; o_attempt := rec.attempt + 1;
    UPDATE {t} SET state = 'running', owner = p_owner, fence = o_fence, attempt = o_attempt,
                   lease_until = now_ms + p_lease_ms, payload = NULL, updated_at = now_ms,
                   expires_at = now_ms + greatest(p_ttl_ms, p_lease_ms)
    WHERE key = p_key;
END
$fn$
"""

_MIGRATIONS = (_V1, _V2, _V3)
assert len(_MIGRATIONS) == SCHEMA_VERSION


def _hash(key: str) -> str:
    return hashlib.md5(key.encode(), usedforsecurity=False).hexdigest()


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
        self._pool_options = dict(_pool_options or {})
        self._user_pool = pool
        self._user_apool = async_pool
        self._own_pool: ConnectionPool[Any] | None = None
        self._own_apools: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, AsyncConnectionPool[Any]
        ] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._ready = False
        self._claims = itertools.count(1)
        self._wakeup = Wakeup()
        self._listener: _Listener | None = None
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
        parts = urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ValueError(f"not a postgresql:// URL: {url!r}")
        options: dict[str, Any] = {}
        libpq: list[str] = []
        for item in filter(None, parts.query.split("&")):
            name, _, value = item.partition("=")
            if name == "table":
                options["table"] = value
            elif name == "poll_interval":
                options["poll_interval"] = float(value)
            else:
                libpq.append(item)
        conninfo = urlunsplit(parts._replace(scheme="postgresql", query="&".join(libpq)))
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
                self._pool_options,
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
        """Create or migrate the table, its indexes and functions (idempotent)."""

        def run(cur: psycopg.Cursor[Any]) -> None:
            conn = cur.connection
            with conn.transaction():
                for stmt in self._q.migrations(self._stored_version(cur)):
                    cur.execute(stmt)

        self._sync(None, run, setup=False)
        self._ready = True

    async def asetup(self) -> None:
        """The async twin of :meth:`setup`."""

        async def run(cur: psycopg.AsyncCursor[Any]) -> None:
            conn = cur.connection
            async with conn.transaction():
                await cur.execute(self._q.lock)
                await cur.execute(self._q.schema_table)
                await cur.execute(self._q.read_version, (self._table,))
                row = await cur.fetchone()
                for stmt in self._q.migrations(row[0] if row else 0):
                    await cur.execute(stmt)

        await self._async(None, run, setup=False)
        self._ready = True

    def _stored_version(self, cur: psycopg.Cursor[Any]) -> int:
        cur.execute(self._q.lock)
        cur.execute(self._q.schema_table)
        cur.execute(self._q.read_version, (self._table,))
        row = cur.fetchone()
        return int(row[0]) if row else 0

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
    ) -> Claim:
        params = self._claim_params(key, owner, fingerprint, lease_ms, ttl_ms, on_expired, meta)

        def run(cur: psycopg.Cursor[Any]) -> Any:
            cur.execute(self._q.claim, params)
            return cur.fetchone()

        return _claim_answer(key, self._sync(key, run), self._table)

    async def aclaim(
        self,
        key: str,
        *,
        owner: str,
        fingerprint: str,
        lease_ms: int,
        ttl_ms: int,
        on_expired: ExpiredPolicy = "takeover",
        meta: Mapping[str, str] | None = None,
    ) -> Claim:
        params = self._claim_params(key, owner, fingerprint, lease_ms, ttl_ms, on_expired, meta)

        async def run(cur: psycopg.AsyncCursor[Any]) -> Any:
            await cur.execute(self._q.claim, params)
            return await cur.fetchone()

        return _claim_answer(key, await self._async(key, run), self._table)

    def _claim_params(
        self,
        key: str,
        owner: str,
        fingerprint: str,
        lease_ms: int,
        ttl_ms: int,
        on_expired: ExpiredPolicy,
        meta: Mapping[str, str] | None,
    ) -> tuple[Any, ...]:
        if on_expired not in ("takeover", "raise"):
            raise ValueError(f'on_expired must be "takeover" or "raise", got {on_expired!r}')
        sweep = _SWEEP_LIMIT if next(self._claims) % _SWEEP_EVERY == 0 else 0
        return (key, owner, fingerprint, int(lease_ms), int(ttl_ms),
                on_expired == "takeover", _meta(meta), sweep)  # fmt: skip

    def renew(self, key: str, *, owner: str, fence: int, lease_ms: int) -> bool:
        def run(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute(self._q.renew, (int(lease_ms), int(lease_ms), key, owner, fence))
            return cur.fetchone() is not None

        return self._sync(key, run)

    async def arenew(self, key: str, *, owner: str, fence: int, lease_ms: int) -> bool:
        async def run(cur: psycopg.AsyncCursor[Any]) -> bool:
            await cur.execute(self._q.renew, (int(lease_ms), int(lease_ms), key, owner, fence))
            return await cur.fetchone() is not None

        return await self._async(key, run)

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
        params = (key, owner, fence, fingerprint, payload, failed, int(ttl_ms), _meta(meta), False)

        def run(cur: psycopg.Cursor[Any]) -> Any:
            cur.execute(self._q.complete, params)
            return cur.fetchone()

        return _completion(key, self._sync(key, run), self._table)

    async def acomplete(
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
        params = (key, owner, fence, fingerprint, payload, failed, int(ttl_ms), _meta(meta), False)

        async def run(cur: psycopg.AsyncCursor[Any]) -> Any:
            await cur.execute(self._q.complete, params)
            return await cur.fetchone()

        return _completion(key, await self._async(key, run), self._table)

    def release(self, key: str, *, owner: str, fence: int) -> bool:
        def run(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute(self._q.release, (key, owner, fence))
            row = cur.fetchone()
            return bool(row and row[0])

        return self._sync(key, run)

    async def arelease(self, key: str, *, owner: str, fence: int) -> bool:
        async def run(cur: psycopg.AsyncCursor[Any]) -> bool:
            await cur.execute(self._q.release, (key, owner, fence))
            row = await cur.fetchone()
            return bool(row and row[0])

        return await self._async(key, run)

    def abandon(
        self, key: str, *, owner: str, fence: int, reason: UncertainReason = "cancelled"
    ) -> bool:
        def run(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute(self._q.abandon, (reason, key, owner, fence))
            row = cur.fetchone()
            return bool(row and row[0])

        return self._sync(key, run)

    async def aabandon(
        self, key: str, *, owner: str, fence: int, reason: UncertainReason = "cancelled"
    ) -> bool:
        async def run(cur: psycopg.AsyncCursor[Any]) -> bool:
            await cur.execute(self._q.abandon, (reason, key, owner, fence))
            row = await cur.fetchone()
            return bool(row and row[0])

        return await self._async(key, run)

    def get(self, key: str) -> Record | None:
        return self._probe_sync(key)[0]

    async def aget(self, key: str) -> Record | None:
        return (await self._probe_async(key))[0]

    def _probe_sync(self, key: str) -> tuple[Record | None, int]:
        """The live record under ``key`` and the server's clock, in one round trip."""

        def run(cur: psycopg.Cursor[Any]) -> Any:
            cur.execute(self._q.get, (key,))
            return cur.fetchone()

        return _live(key, self._sync(key, run), self._table)

    async def _probe_async(self, key: str) -> tuple[Record | None, int]:
        async def run(cur: psycopg.AsyncCursor[Any]) -> Any:
            await cur.execute(self._q.get, (key,))
            return await cur.fetchone()

        return _live(key, await self._async(key, run), self._table)

    def now_ms(self) -> int:
        """The server's clock (``clock_timestamp()``) in milliseconds."""

        def run(cur: psycopg.Cursor[Any]) -> int:
            cur.execute(self._q.now)
            return int(cur.fetchone()[0])  # type: ignore[index]

        return self._sync(None, run)

    async def anow_ms(self) -> int:
        async def run(cur: psycopg.AsyncCursor[Any]) -> int:
            await cur.execute(self._q.now)
            return int((await cur.fetchone())[0])  # type: ignore[index]

        return await self._async(None, run)

    def describe(self) -> dict[str, Any]:
        """Facts for ``doctor``: server version, table, schema version, row counts.

        Never the password (the URL is shown without it).
        """

        def run(cur: psycopg.Cursor[Any]) -> dict[str, Any]:
            info = cur.connection.info
            cur.execute(self._q.probe_tables)
            server_version, has_schema, has_table = cur.fetchone()  # type: ignore[misc]
            schema_version = records = expired = size = None
            if has_schema:
                cur.execute(self._q.read_version, (self._table,))
                row = cur.fetchone()
                schema_version = row[0] if row else None
            if has_table:
                cur.execute(self._q.table_facts)
                records, expired, size = cur.fetchone()  # type: ignore[misc]
            return {
                "kind": "postgres",
                "url": _redact(self._conninfo),
                "host": info.host,
                "port": info.port,
                "database": info.dbname,
                "user": info.user,
                "server_version": server_version,
                "table": self._table,
                "has_table": bool(has_table),
                "schema_version": schema_version,
                "expected_schema_version": SCHEMA_VERSION,
                "records": records,
                "expired_records": expired,
                "size_bytes": size,
            }

        return self._sync(None, run, setup=False)

    # -- watch ---------------------------------------------------------------------------

    def watch(self, key: str, *, fence: int, timeout: float) -> None:
        deadline = time.monotonic() + max(0.0, timeout)
        self._ensure_listener()
        probe = _Probe(fence)
        topic = _hash(key)

        def changed() -> bool:
            return probe.update(*self._probe_sync(key))

        delay = _FIRST_POLL
        changed()  # learn the lease deadline before choosing the first sleep
        while not probe.changed:
            wait = probe.slice(deadline, delay)
            if wait is None:
                return
            self._wakeup.wait(topic, changed, wait)
            delay = min(delay * 2, self._poll_interval)

    async def awatch(self, key: str, *, fence: int, timeout: float) -> None:
        deadline = time.monotonic() + max(0.0, timeout)
        await asyncio.to_thread(self._ensure_listener)  # once per store and process
        probe = _Probe(fence)
        topic = _hash(key)

        async def changed() -> bool:
            return probe.update(*await self._probe_async(key))

        delay = _FIRST_POLL
        await changed()
        while not probe.changed:
            wait = probe.slice(deadline, delay)
            if wait is None:
                return
            await self._wakeup.await_(topic, changed, wait)
            delay = min(delay * 2, self._poll_interval)

    def _ensure_listener(self) -> None:
        self._check_fork()
        with self._lock:
            listener = self._listener
            if listener is None or not listener.alive:
                if self._conninfo is None and self._user_pool is None:
                    return  # nothing to LISTEN with: waiters poll
                listener = self._listener = _Listener(self)
        listener.wait_listening()

    def _listen_conninfo(self) -> tuple[str, dict[str, Any]]:
        if self._conninfo is not None:
            return self._conninfo, {}
        assert self._user_pool is not None
        with self._user_pool.connection() as conn:
            return conn.info.dsn, {"password": conn.info.password}

    # -- operator helpers ----------------------------------------------------------------

    def delete(self, key: str) -> bool:
        def run(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute(self._q.delete, (key,))
            row = cur.fetchone()
            return bool(row and row[0])

        return self._sync(key, run)

    async def adelete(self, key: str) -> bool:
        async def run(cur: psycopg.AsyncCursor[Any]) -> bool:
            await cur.execute(self._q.delete, (key,))
            row = await cur.fetchone()
            return bool(row and row[0])

        return await self._async(key, run)

    def list(
        self,
        *,
        namespace: str | None = None,
        thread_id: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Record]:
        query, params = self._q.listing(namespace, thread_id, limit)

        def run(cur: psycopg.Cursor[Any]) -> Any:
            cur.execute(query, params)
            return cur.fetchall()

        return self._records(self._sync(None, run))

    async def alist(
        self,
        *,
        namespace: str | None = None,
        thread_id: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Record]:
        query, params = self._q.listing(namespace, thread_id, limit)

        async def run(cur: psycopg.AsyncCursor[Any]) -> Any:
            await cur.execute(query, params)
            return await cur.fetchall()

        return self._records(await self._async(None, run))

    def _records(self, rows: Any) -> builtins.list[Record]:
        out = []
        for row in rows:
            try:
                out.append(_decode(row, self._table))
            except CorruptRecordError as exc:
                _log.warning("skipping an unreadable record: %s", exc)
        return out

    def purge(self, *, thread_id: str, namespace: str | None = None) -> int:
        query, params = self._q.purging(thread_id, namespace)

        def run(cur: psycopg.Cursor[Any]) -> int:
            cur.execute(query, params)
            return int(cur.fetchone()[0])  # type: ignore[index]

        return self._sync(None, run)

    async def apurge(self, *, thread_id: str, namespace: str | None = None) -> int:
        query, params = self._q.purging(thread_id, namespace)

        async def run(cur: psycopg.AsyncCursor[Any]) -> int:
            await cur.execute(query, params)
            return int((await cur.fetchone())[0])  # type: ignore[index]

        return await self._async(None, run)

    def close(self) -> None:
        """Close the pools this store owns and its listener; they reopen on next use.

        Pools passed in are left open (their owner closes them).
        """
        with self._lock:
            pool, self._own_pool = self._own_pool, None
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop()
        if pool is not None and self._pid == os.getpid():
            pool.close()

    async def aclose(self) -> None:
        """Close this loop's owned async pool too (and what :meth:`close` closes)."""
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
            apool = self._own_apools.pop(loop, None)
            if apool is not None:
                await apool.close()
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
        return PostgresTransaction(self, pool, conn)

    async def atransaction(self) -> AsyncPostgresTransaction:
        """The async twin of :meth:`transaction` (an ``AsyncConnection``)."""
        pool = await self._async_pool(None)
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
        return await AsyncPostgresTransaction(self, pool, conn).begin()

    # -- the error boundary and the pools ----------------------------------------------

    def _sync(
        self, key: str | None, run: Callable[[psycopg.Cursor[Any]], _T], *, setup: bool = True
    ) -> _T:
        pool = self._sync_pool(key)
        if setup:
            self._maybe_setup(key)
        for attempt in (1, 2):
            broken = False
            try:
                with pool.connection() as conn:
                    try:
                        with conn.cursor(row_factory=tuple_row) as cur:
                            result = run(cur)
                        if not conn.autocommit:
                            conn.commit()
                        return result
                    except _BROKEN:
                        broken = conn.broken or conn.closed
                        raise
            except CorruptRecordError:
                raise
            except _ERRORS as exc:
                if broken and attempt == 1:
                    with contextlib.suppress(*_ERRORS):
                        pool.check()  # drop the idle connections the same fault broke
                    continue
                raise StoreUnavailableError(f"PostgreSQL: {exc}", key=key) from exc
        raise AssertionError("unreachable")

    async def _async(
        self,
        key: str | None,
        run: Callable[[psycopg.AsyncCursor[Any]], Awaitable[_T]],
        *,
        setup: bool = True,
    ) -> _T:
        pool = await self._async_pool(key)
        if pool is None:  # only a sync pool was given
            return await asyncio.to_thread(self._run_sync_twin, key, run)
        if setup:
            await self._amaybe_setup(key)
        for attempt in (1, 2):
            broken = False
            try:
                async with pool.connection() as conn:
                    try:
                        async with conn.cursor(row_factory=tuple_row) as cur:
                            result = await run(cur)
                        if not conn.autocommit:
                            await conn.commit()
                        return result
                    except _BROKEN:
                        broken = conn.broken or conn.closed
                        raise
            except CorruptRecordError:
                raise
            except _ERRORS as exc:
                if broken and attempt == 1:
                    with contextlib.suppress(*_ERRORS):
                        await pool.check()
                    continue
                raise StoreUnavailableError(f"PostgreSQL: {exc}", key=key) from exc
        raise AssertionError("unreachable")

    def _run_sync_twin(
        self, key: str | None, run: Callable[[psycopg.AsyncCursor[Any]], Awaitable[_T]]
    ) -> _T:
        """Drive an async operation's callback on a sync cursor (only a sync pool given).

        The callbacks only await the cursor, which completes at once here, so one
        ``send(None)`` runs each to its end.
        """

        def sync_run(cur: psycopg.Cursor[Any]) -> _T:
            coro = run(_SyncCursor(cur))  # type: ignore[arg-type]
            try:
                coro.send(None)  # type: ignore[attr-defined]
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            raise RuntimeError("an async store callback awaited something besides its cursor")

        return self._sync(key, sync_run)

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

    def _check_fork(self) -> None:
        if self._pid != os.getpid():  # a forked child: never touch the parent's sockets
            self._pid = os.getpid()
            self._own_pool = None
            self._own_apools = weakref.WeakKeyDictionary()
            self._listener = None
            self._wakeup = Wakeup()
            self._lock = threading.Lock()

    def _sync_pool(self, key: str | None) -> ConnectionPool[Any]:
        self._check_fork()
        if self._user_pool is not None:
            return self._user_pool
        if self._conninfo is None:
            raise TypeError(
                "this PostgresIdempotencyStore was given only an AsyncConnectionPool; sync "
                "operations need a ConnectionPool too (pass pool=..., or use from_url)"
            )
        with self._lock:
            if self._own_pool is None:
                self._own_pool = ConnectionPool(
                    self._conninfo,
                    kwargs={"autocommit": True},
                    open=False,
                    name=f"idempotency-{self._table}",
                    **self._pool_options,
                )
                try:
                    self._own_pool.open(wait=False)
                except _ERRORS as exc:
                    self._own_pool = None
                    raise StoreUnavailableError(f"PostgreSQL: {exc}", key=key) from exc
            return self._own_pool

    async def _async_pool(self, key: str | None) -> AsyncConnectionPool[Any] | None:
        self._check_fork()
        if self._user_apool is not None:
            return self._user_apool
        if self._conninfo is None:
            return None
        loop = asyncio.get_running_loop()
        apool = self._own_apools.get(loop)
        if apool is None:
            apool = AsyncConnectionPool(
                self._conninfo,
                kwargs={"autocommit": True},
                open=False,
                name=f"idempotency-{self._table}-async",
                **self._pool_options,
            )
            try:
                await apool.open(wait=False)
            except _ERRORS as exc:
                raise StoreUnavailableError(f"PostgreSQL: {exc}", key=key) from exc
            self._own_apools[loop] = apool
        return apool


class _SyncCursor:
    """A sync cursor behind the async cursor methods the store's callbacks await."""

    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self._cur = cur
        self.connection = cur.connection

    async def execute(self, query: Any, params: Any = None) -> None:
        self._cur.execute(query, params)

    async def fetchone(self) -> Any:
        return self._cur.fetchone()

    async def fetchall(self) -> Any:
        return self._cur.fetchall()


# -- transactional mode ---------------------------------------------------------------------


class PostgresTransaction:
    """A transaction a tool writes in; the completion commits with it or not at all.

    ``connection`` is a psycopg ``Connection`` in a transaction (``autocommit`` off until
    the transaction ends): run the tool's statements on it and do not commit.
    :meth:`complete` writes the completion in the same transaction only if the caller
    still owns the lease at its fence (checked under the record's row lock, so a takeover
    either happened before — refused, everything rolled back — or waits and then replays
    this result) and commits; :meth:`rollback` undoes everything. Either returns the
    connection to the pool.
    """

    def __init__(
        self, store: PostgresIdempotencyStore, pool: ConnectionPool[Any], conn: Any
    ) -> None:
        self._store, self._pool, self.connection = store, pool, conn
        self._autocommit = conn.autocommit
        self._done = False
        try:
            if conn.autocommit:
                conn.autocommit = False
        except _ERRORS as exc:
            self._finish()
            raise StoreUnavailableError(f"PostgreSQL: {exc}") from exc

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
        """Write the completion and commit, or roll back when the lease is no longer ours.

        Raises :class:`StoreUnavailableError` when the connection fails: whether the
        transaction committed is then unknown (a retry replays it, or takes over).
        """
        conn, q = self.connection, self._store._q
        try:
            with conn.cursor(row_factory=tuple_row) as cur:
                cur.execute(
                    q.complete,
                    (key, owner, fence, fingerprint, payload, failed, int(ttl_ms), _meta(meta),
                     True),
                )  # fmt: skip
                answer = _completion(key, cur.fetchone(), self._store._table)
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
            raise StoreUnavailableError(
                f"PostgreSQL: the transactional completion failed ({exc}); whether it "
                "committed is unknown",
                key=key,
            ) from exc
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
        if self._done:
            return
        self._done = True
        conn = self.connection
        with contextlib.suppress(*_ERRORS):
            if not conn.broken and not conn.closed:
                conn.autocommit = self._autocommit
        with contextlib.suppress(*_ERRORS):
            self._pool.putconn(conn)


class AsyncPostgresTransaction:
    """The async twin of :class:`PostgresTransaction` (``connection`` is an
    ``AsyncConnection``)."""

    def __init__(
        self, store: PostgresIdempotencyStore, pool: AsyncConnectionPool[Any], conn: Any
    ) -> None:
        self._store, self._pool, self.connection = store, pool, conn
        self._autocommit = conn.autocommit
        self._done = False
        self._begun = False

    async def begin(self) -> AsyncPostgresTransaction:
        try:
            if self.connection.autocommit:
                await self.connection.set_autocommit(False)
        except _ERRORS as exc:
            await self._finish()
            raise StoreUnavailableError(f"PostgreSQL: {exc}") from exc
        return self

    async def complete(
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
        conn, q = self.connection, self._store._q
        try:
            async with conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(
                    q.complete,
                    (key, owner, fence, fingerprint, payload, failed, int(ttl_ms), _meta(meta),
                     True),
                )  # fmt: skip
                answer = _completion(key, await cur.fetchone(), self._store._table)
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
            raise StoreUnavailableError(
                f"PostgreSQL: the transactional completion failed ({exc}); whether it "
                "committed is unknown",
                key=key,
            ) from exc
        finally:
            await self._finish()

    async def rollback(self) -> None:
        if self._done:
            return
        with contextlib.suppress(*_ERRORS):
            await self.connection.rollback()
        await self._finish()

    async def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        conn = self.connection
        with contextlib.suppress(*_ERRORS):
            if not conn.broken and not conn.closed:
                await conn.set_autocommit(self._autocommit)
        with contextlib.suppress(*_ERRORS):
            await self._pool.putconn(conn)


# -- SQL ------------------------------------------------------------------------------------


class _Queries:
    """Every statement the store sends, built once per table."""

    def __init__(self, table: str) -> None:
        t = table
        self.table = t
        self.lock = f"SELECT pg_advisory_xact_lock(hashtext('langchain_idempotent:{t}'))"
        self.schema_table = (
            f"CREATE TABLE IF NOT EXISTS {_SCHEMA_TABLE} "
            "(table_name text PRIMARY KEY, version integer NOT NULL)"
        )
        self.read_version = f"SELECT version FROM {_SCHEMA_TABLE} WHERE table_name = %s"
        self.write_version = (
            f"INSERT INTO {_SCHEMA_TABLE} (table_name, version) VALUES ('{t}', {{v}}) "
            "ON CONFLICT (table_name) DO UPDATE SET version = EXCLUDED.version"
        )
        self.claim = f"SELECT * FROM {t}_claim(%s, %s, %s, %s, %s, %s, %s, %s)"
        self.complete = f"SELECT * FROM {t}_complete(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
        self.renew = (
            f"WITH c AS (SELECT {_NOW} AS now_ms) "
            f"UPDATE {t} SET lease_until = c.now_ms + %s, updated_at = c.now_ms, "
            f"expires_at = greatest({t}.expires_at, c.now_ms + %s) FROM c "
            f"WHERE key = %s AND state = 'running' AND owner = %s AND fence = %s "
            f"AND expires_at > c.now_ms RETURNING 1"
        )
        self.release = (
            f"WITH c AS (SELECT {_NOW} AS now_ms), "
            f"u AS (UPDATE {t} SET state = 'free', owner = '', lease_until = 0, "
            f"updated_at = c.now_ms FROM c WHERE key = %s AND state = 'running' "
            f"AND owner = %s AND fence = %s AND expires_at > c.now_ms RETURNING key) "
            f"SELECT count(pg_notify('{t}_wake', md5(u.key))) FROM u"
        )
        # abandon (protocol.decide_abandon): stays running, lease ended, owner names the reason.
        self.abandon = (
            f"WITH c AS (SELECT {_NOW} AS now_ms), "
            f"u AS (UPDATE {t} SET owner = '!' || %s, lease_until = 0, "
            f"updated_at = c.now_ms FROM c WHERE key = %s AND state = 'running' "
            f"AND owner = %s AND fence = %s AND expires_at > c.now_ms RETURNING key) "
            f"SELECT count(pg_notify('{t}_wake', md5(u.key))) FROM u"
        )
        self.get = (
            f"SELECT c.now_ms, r.{_COLUMNS.replace(', ', ', r.')} "
            f"FROM (SELECT {_NOW} AS now_ms) c "
            f"LEFT JOIN {t} r ON r.key = %s AND r.expires_at > c.now_ms"
        )
        self.now = f"SELECT {_NOW}"
        self.delete = (
            f"WITH c AS (SELECT {_NOW} AS now_ms), "
            f"d AS (DELETE FROM {t} WHERE key = %s RETURNING key, expires_at) "
            f"SELECT coalesce(bool_or(d.expires_at > c.now_ms), false), "
            f"count(pg_notify('{t}_wake', md5(d.key))) FROM d, c"
        )
        self.probe_tables = (
            f"SELECT current_setting('server_version'), "
            f"to_regclass('{_SCHEMA_TABLE}') IS NOT NULL, to_regclass('{t}') IS NOT NULL"
        )
        self.table_facts = (
            f"SELECT count(*), count(*) FILTER (WHERE expires_at <= {_NOW}), "
            f"pg_total_relation_size('{t}') FROM {t}"
        )
        self._listing = f"SELECT {_COLUMNS} FROM {t} WHERE expires_at > {_NOW}"

    def migrations(self, stored: int) -> list[str]:
        if stored > SCHEMA_VERSION:
            raise StoreUnavailableError(
                f"the table {self.table!r} was written by a newer langchain-idempotent "
                f"(schema version {stored}, this one knows {SCHEMA_VERSION}); upgrade"
            )
        out = []
        for version in range(stored + 1, SCHEMA_VERSION + 1):
            body = _MIGRATIONS[version - 1].format(t=self.table, now=_NOW, version=FORMAT_VERSION)
            out += [stmt.strip() for stmt in body.split("\n;;\n")]
            out.append(self.write_version.format(v=version))
        return out

    def listing(
        self, namespace: str | None, thread_id: str | None, limit: int | None
    ) -> tuple[str, tuple[Any, ...]]:
        query, params = self._listing, list[Any]()
        if namespace is not None:
            query += " AND namespace = %s"
            params.append(namespace)
        if thread_id is not None:
            query += " AND thread_id = %s"
            params.append(thread_id)
        query += " ORDER BY created_at, key"
        if limit is not None:
            query += " LIMIT %s"
            params.append(max(0, limit))
        return query, tuple(params)

    def purging(self, thread_id: str, namespace: str | None) -> tuple[str, tuple[Any, ...]]:
        t = self.table
        where, params = "thread_id = %s", [thread_id]
        if namespace is not None:
            where += " AND namespace = %s"
            params.append(namespace)
        query = (
            f"WITH c AS (SELECT {_NOW} AS now_ms), "
            f"d AS (DELETE FROM {t} WHERE {where} RETURNING key, expires_at) "
            f"SELECT count(*) FILTER (WHERE d.expires_at > c.now_ms), "
            f"count(pg_notify('{t}_wake', md5(d.key))) FROM d, c"
        )
        return query, tuple(params)


# -- rows to answers ---------------------------------------------------------------------------


def _meta(meta: Mapping[str, str] | None) -> str:
    return json.dumps(dict(meta or {}), ensure_ascii=False, sort_keys=True)


def _corrupt(key: str, table: str, why: str) -> CorruptRecordError:
    return CorruptRecordError(
        f"the record for this key in PostgreSQL table {table!r} cannot be read ({why}); it "
        "was not executed. Inspect it, then delete it (langchain-idempotent delete KEY) to "
        "run the call again",
        key=key,
    )


def _claim_answer(key: str, row: Any, table: str) -> Claim:
    outcome, fence, attempt, retry_after, failed, payload, reason = row
    if outcome == "corrupt":
        raise _corrupt(key, table, "unknown format version")
    return Claim(
        ClaimOutcome(outcome),
        fence=int(fence),
        attempt=int(attempt),
        retry_after_ms=int(retry_after),
        failed=bool(failed),
        payload=None if payload is None else bytes(payload),
        reason=reason,
    )


def _completion(key: str, row: Any, table: str) -> Completion:
    outcome, stored, stale, failed, payload = row
    if outcome == "corrupt":
        raise _corrupt(key, table, "unknown format version")
    return Completion(
        stored=bool(stored),
        stale=bool(stale),
        failed=bool(failed),
        payload=None if payload is None else bytes(payload),
    )


def _live(key: str, row: Any, table: str) -> tuple[Record | None, int]:
    now = int(row[0])
    if row[1] is None:
        return None, now
    return _decode(row[1:], table), now


def _decode(row: Any, table: str) -> Record:
    key, state, owner, fence, lease_until, fp, attempt, payload, created, updated, ver, meta = row
    if ver != FORMAT_VERSION:
        raise _corrupt(key, table, f"unknown format version {ver!r}")
    if state not in _STATES:
        raise _corrupt(key, table, f"unknown state {state!r}")
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise _corrupt(key, table, "meta is not an object of strings")
    return Record(
        key=key,
        state=_STATES[state],
        owner=owner,
        fence=int(fence),
        lease_until=int(lease_until),
        fingerprint=fp,
        attempt=int(attempt),
        payload=None if payload is None else bytes(payload),
        created_at=int(created),
        updated_at=int(updated),
        version=int(ver),
        meta=dict(meta),
    )


class _Probe:
    """One watch: whether the record changed and when its lease ends (monotonic)."""

    def __init__(self, fence: int) -> None:
        self.fence = fence
        self.changed = False
        self.lease_end = float("inf")

    def update(self, rec: Record | None, now: int) -> bool:
        if rec is None or not rec.lease_live(now) or rec.fence != self.fence:
            self.changed = True
        else:
            self.lease_end = time.monotonic() + (rec.lease_until - now) / 1000 + 0.001
        return self.changed

    def slice(self, deadline: float, delay: float) -> float | None:
        now = time.monotonic()
        if now >= deadline:
            return None
        return max(0.0, min(deadline - now, self.lease_end - now, delay))


class _Listener:
    """A thread with its own connection, ``LISTEN <table>_wake``, waking this process."""

    def __init__(self, store: PostgresIdempotencyStore) -> None:
        self._store = store
        self._channel = f"{store._table}_wake"
        self._listening = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"idempotency-listen-{store._table}", daemon=True
        )
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def wait_listening(self, timeout: float = 2.0) -> None:
        """Wait (bounded) until LISTEN is in effect; waiters poll if it never is."""
        self._listening.wait(timeout)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            try:
                conninfo, extra = self._store._listen_conninfo()
                with psycopg.connect(conninfo, autocommit=True, connect_timeout=5, **extra) as conn:
                    conn.execute(f"LISTEN {self._channel}")
                    self._listening.set()
                    backoff = 0.05
                    wakeup = self._store._wakeup
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            wakeup.notify(note.payload)
            except Exception as exc:  # reconnect with backoff; waiters poll meanwhile
                self._listening.clear()
                _log.debug("idempotency listener reconnecting: %s", exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)


def _redact(conninfo: str | None) -> str | None:
    if conninfo is None:
        return None
    parts = urlsplit(conninfo)
    if parts.password is None:
        return conninfo
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


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
