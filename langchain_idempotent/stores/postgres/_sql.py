"""The wire contract of the Postgres store: its schema, its functions, its statements, its rows.

- **Schema.** :data:`_MIGRATIONS` holds one entry per schema version; ``setup()`` applies
  those above the version stored for the table in ``langchain_idempotent_schema``
  (:meth:`_Queries.migrations`). Version 1 is the table and its indexes, version 2 the two
  PL/pgSQL functions, ``<table>_claim`` and ``<table>_complete``, which implement the
  decision table of :mod:`langchain_idempotent.protocol` (comments name the rows), version
  3 ``<table>_claim`` again, now also returning a takeover's ``reason`` and inserting an
  absent key without a second look-up. Each
  function is headed by comments naming every parameter and what it returns, like the
  Redis store's Lua scripts.
- **Statements.** :class:`_Queries` builds every statement the store sends, once per
  table: a call of one of the functions, or one plain statement (renew, release, abandon,
  get, delete, purge, list) whose ``WHERE`` is the owner + fence compare where it writes; each
  is preceded by a comment naming its parameters (``%s``, in order) and its result row.
  Every time is the server's clock, :data:`_NOW` (``clock_timestamp()``).
- **Rows.** :func:`_claim_answer`, :func:`_completion`, :func:`_live` and :func:`_decode`
  turn result rows into the protocol's answers and records, and anything they cannot read
  (an unknown format version, state or meta) into
  :class:`~langchain_idempotent.errors.CorruptRecordError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, get_args

from ...errors import CorruptRecordError, StoreUnavailableError
from ...record import (
    FORMAT_VERSION,
    Claim,
    ClaimOutcome,
    Completion,
    Record,
    State,
    UncertainReason,
    abandoned_owner,
)

#: Version of the schema below; kept per table in ``langchain_idempotent_schema``.
SCHEMA_VERSION = 3
_SCHEMA_TABLE = "langchain_idempotent_schema"
_STATES = {s.value: s for s in State}
_REASONS: dict[str, UncertainReason] = {r: r for r in get_args(UncertainReason)}
_COLUMNS = (
    "key, state, owner, fence, lease_until, fingerprint, attempt, payload, "
    "created_at, updated_at, version, meta"
)
#: The server's clock in milliseconds: every lease and expiry is measured on it.
_NOW = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

#: The owners an abandoned record can carry, as an SQL list (record.abandoned_owner).
_ABANDONED_OWNERS = ", ".join(f"'{abandoned_owner(r)}'" for r in get_args(UncertainReason))

# -- schema: one entry per version; setup() applies those above the stored version ---------
#
# ``{t}`` is the table name; ``;;`` lines separate statements (sent one by one, so that
# pools with ``prepare_threshold=0``, like PostgresSaver's, can run them).

_V1 = """
-- Version 1: one row per key. One column per Record field (payload bytea, meta jsonb,
-- times in bigint milliseconds of the server's clock), namespace and thread_id copied out
-- of meta for list / purge, and expires_at: a row past it is absent to every operation.
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
-- Version 2: the two operations that decide (claim, complete), one call each.
--
-- {t}_claim: replay, acquire, take over, or answer busy / mismatch / expired, in one call
-- (protocol.decide_claim).
-- p_key          the record's key              p_owner       the claimant's owner token
-- p_fingerprint  fingerprint of the arguments  p_lease_ms    lease in ms
-- p_ttl_ms       retention in ms (the row is kept max(ttl, lease) past now)
-- p_takeover     true: take over an expired lease ("takeover"); false: answer expired
-- p_meta         the record's meta, a jsonb object of strings (used when a row is created)
-- p_sweep        0, or how many expired rows to delete first (every 64th claim)
-- Returns one row (outcome, o_fence, o_attempt, retry_after_ms, failed, payload):
-- outcome is a ClaimOutcome value, or 'corrupt' for a row of an unknown format version;
-- o_fence / o_attempt the record's (new) fence and attempt; retry_after_ms the rest of a
-- live lease (busy); failed and payload the stored result (replay only, else NULL).
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
-- {t}_complete: store the first result, write-once (protocol.decide_complete), and
-- pg_notify('{t}_wake', md5(key)) when it stores.
-- p_key          the record's key              p_owner       the caller's owner token
-- p_fence        the caller's fence            p_fingerprint fingerprint of the arguments
-- p_payload      the result's bytes            p_failed      true for a terminal failure
-- p_ttl_ms       retention in ms
-- p_meta         the record's meta (used only if the record vanished while the tool ran)
-- p_strict       transactional mode: store only while RUNNING with the caller's owner
--                and fence; otherwise store nothing and answer stale (the caller rolls
--                back its transaction)
-- Returns one row (outcome, stored, stale, failed, payload): outcome 'ok', or 'corrupt'
-- for a row of an unknown format version; stored whether this call wrote the result;
-- stale whether the caller no longer held the lease; failed and payload the result now
-- stored (the earlier one when not stored; NULL when strict refused).
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
-- Version 3: {t}_claim also answers why a takeover's or an expired answer's previous
-- outcome is unknown (Claim.reason), and inserts an absent key (the no-lock read found no
-- row) at once instead of looking it up again under FOR UPDATE first. A new OUT parameter
-- needs the old function dropped.
DROP FUNCTION IF EXISTS {t}_claim(text, text, text, bigint, bigint, boolean, jsonb, integer)
;;
-- {t}_claim: replay, acquire, take over, or answer busy / mismatch / expired, in one call
-- (protocol.decide_claim).
-- p_key          the record's key              p_owner       the claimant's owner token
-- p_fingerprint  fingerprint of the arguments  p_lease_ms    lease in ms
-- p_ttl_ms       retention in ms (the row is kept max(ttl, lease) past now)
-- p_takeover     true: take over an expired lease ("takeover"); false: answer expired
-- p_meta         the record's meta, a jsonb object of strings (used when a row is created)
-- p_sweep        0, or how many expired rows to delete first (every 64th claim)
-- Returns one row (outcome, o_fence, o_attempt, retry_after_ms, failed, payload, reason):
-- outcome is a ClaimOutcome value, or 'corrupt' for a row of an unknown format version;
-- o_fence / o_attempt the record's (new) fence and attempt; retry_after_ms the rest of a
-- live lease (busy); failed and payload the stored result (replay only, else NULL);
-- reason, for takeover and expired only (else NULL), why the previous attempt's outcome
-- is unknown: the reason an abandoned row's owner names ('!cancelled' -> 'cancelled',
-- record.abandoned_reason), else 'lease_expired'.
CREATE OR REPLACE FUNCTION {t}_claim(
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
    -- Absent: insert it at once, no lock to take (ACQUIRED fence 1, attempt 1); a race to
    -- insert it is settled below, as is an expired row (absent too, but overwritten).
    IF NOT FOUND THEN
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
    IF rec.state = 'running' THEN  -- an expired or abandoned lease: the outcome is unknown
        reason := CASE WHEN rec.owner IN ({abandoned}) THEN substr(rec.owner, 2)
                       ELSE 'lease_expired' END;
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
"""

_MIGRATIONS = (_V1, _V2, _V3)
assert len(_MIGRATIONS) == SCHEMA_VERSION


# -- statements ----------------------------------------------------------------------------


class _Queries:
    """Every statement the store sends, built once per table."""

    def __init__(self, table: str) -> None:
        t = table
        self.table = t
        # setup(), in one transaction: lock this table's schema against concurrent setups,
        # make sure the version table exists, read (%s: table name -> version) and write
        # the version (formatted with v).
        self.lock = f"SELECT pg_advisory_xact_lock(hashtext('langchain_idempotent:{t}'))"
        self.schema_table = (
            f"CREATE TABLE IF NOT EXISTS {_SCHEMA_TABLE} "
            "(table_name text PRIMARY KEY, version integer NOT NULL)"
        )
        self.read_version = f"SELECT version FROM {_SCHEMA_TABLE} WHERE table_name = %s"
        # drop(), in one transaction after ``lock``: remove the table, its two functions and
        # its row in the version table (%s: table name). Returns nothing.
        self.drop = (
            f"DROP FUNCTION IF EXISTS {t}_claim, {t}_complete",
            f"DROP TABLE IF EXISTS {t}",
            f"DELETE FROM {_SCHEMA_TABLE} WHERE table_name = %s",
        )
        # reserved: %s a name. Returns a row (its description) when PostgreSQL reserves it
        # as a word that cannot name a table (``full``, ``order``, ``user``), none otherwise.
        self.reserved = (
            "SELECT catdesc FROM pg_get_keywords() WHERE word = %s AND catcode IN ('R', 'T')"
        )
        self.write_version = (
            f"INSERT INTO {_SCHEMA_TABLE} (table_name, version) VALUES ('{t}', {{v}}) "
            "ON CONFLICT (table_name) DO UPDATE SET version = EXCLUDED.version"
        )
        # The functions' parameters, in the order of their header comments (claim: _V3,
        # complete: _V2); their result rows are read by _claim_answer and _completion.
        # claim: %(name)s, the function's parameters by name without p_ (key, owner,
        # fingerprint, lease_ms, ttl_ms, takeover, meta, sweep). Returns its row.
        call_claim = (
            f"SELECT * FROM {t}_claim(%(key)s, %(owner)s, %(fingerprint)s, %(lease_ms)s, "
            f"%(ttl_ms)s, %(takeover)s, %(meta)s, %(sweep)s)"
        )
        self.claim = call_claim
        # replay_or_claim, for a claim that sweeps nothing (sweep 0): the same parameters
        # and the same row as claim, in one statement, but a replay is answered by a plain
        # indexed read and the function is not called at all (the cheapest replay). The
        # read asks what the function's no-lock REPLAY asks: a live row of this format
        # version, done, with the same fingerprint; it returns the function's REPLAY row
        # (outcome 'replay', the row's fence and attempt, retry_after_ms 0, failed,
        # payload, reason NULL). An Append runs its branches in order and LIMIT 1 stops at
        # the first row, so the function runs only when the read found no replay, and then
        # decides everything as before.
        self.replay_or_claim = (
            f"(SELECT 'replay'::text, fence, attempt, 0::bigint, state = 'failed', payload, "
            f"NULL::text FROM {t} WHERE key = %(key)s AND state IN ('completed', 'failed') "
            f"AND fingerprint = %(fingerprint)s AND version = {FORMAT_VERSION} "
            f"AND expires_at > {_NOW}) "
            f"UNION ALL ({call_claim}) LIMIT 1"
        )
        self.complete = f"SELECT * FROM {t}_complete(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
        # renew (protocol.decide_renew): %s lease_ms, lease_ms, key, owner, fence.
        # Returns a row when the caller still owned the lease (extended), none otherwise.
        self.renew = (
            f"WITH c AS (SELECT {_NOW} AS now_ms) "
            f"UPDATE {t} SET lease_until = c.now_ms + %s, updated_at = c.now_ms, "
            f"expires_at = greatest({t}.expires_at, c.now_ms + %s) FROM c "
            f"WHERE key = %s AND state = 'running' AND owner = %s AND fence = %s "
            f"AND expires_at > c.now_ms RETURNING 1"
        )
        # release (protocol.decide_release): %s key, owner, fence. Frees the lease, keeps
        # the fence, wakes the key's waiters. Returns (count): 1 when released, else 0.
        self.release = (
            f"WITH c AS (SELECT {_NOW} AS now_ms), "
            f"u AS (UPDATE {t} SET state = 'free', owner = '', lease_until = 0, "
            f"updated_at = c.now_ms FROM c WHERE key = %s AND state = 'running' "
            f"AND owner = %s AND fence = %s AND expires_at > c.now_ms RETURNING key) "
            f"SELECT count(pg_notify('{t}_wake', md5(u.key))) FROM u"
        )
        # abandon (protocol.decide_abandon): %s abandoned owner (record.abandoned_owner of
        # the reason), key, owner, fence. Ends the lease with the outcome unknown: the row
        # stays running with lease_until 0 and the abandoned owner, so the next claim takes
        # over at once and is told the reason; fence, attempt and retention are kept; wakes
        # the key's waiters. Returns (count): 1 when abandoned, else 0.
        self.abandon = (
            f"WITH c AS (SELECT {_NOW} AS now_ms), "
            f"u AS (UPDATE {t} SET owner = %s, lease_until = 0, updated_at = c.now_ms "
            f"FROM c WHERE key = %s AND state = 'running' AND owner = %s AND fence = %s "
            f"AND expires_at > c.now_ms RETURNING key) "
            f"SELECT count(pg_notify('{t}_wake', md5(u.key))) FROM u"
        )
        # get: %s key. Returns (now_ms, <the record's columns>), the columns NULL when absent
        # or expired: the record and the server's clock in one round trip (watch needs both).
        self.get = (
            f"SELECT c.now_ms, r.{_COLUMNS.replace(', ', ', r.')} "
            f"FROM (SELECT {_NOW} AS now_ms) c "
            f"LEFT JOIN {t} r ON r.key = %s AND r.expires_at > c.now_ms"
        )
        # now_ms: no parameters. Returns (now_ms).
        self.now = f"SELECT {_NOW}"
        # delete (operator action, no owner check): %s key. Wakes the key's waiters.
        # Returns (whether a live record was deleted, notifications sent).
        self.delete = (
            f"WITH c AS (SELECT {_NOW} AS now_ms), "
            f"d AS (DELETE FROM {t} WHERE key = %s RETURNING key, expires_at) "
            f"SELECT coalesce(bool_or(d.expires_at > c.now_ms), false), "
            f"count(pg_notify('{t}_wake', md5(d.key))) FROM d, c"
        )
        # describe: no parameters. Returns (server_version, fsync, synchronous_commit,
        # whether the version table exists, whether this table exists).
        self.probe_tables = (
            f"SELECT current_setting('server_version'), current_setting('fsync'), "
            f"current_setting('synchronous_commit'), "
            f"to_regclass('{_SCHEMA_TABLE}') IS NOT NULL, to_regclass('{t}') IS NOT NULL"
        )
        # describe, when the table exists: no parameters. Returns (rows, expired rows not
        # yet purged, bytes on disk with indexes).
        self.table_facts = (
            f"SELECT count(*), count(*) FILTER (WHERE expires_at <= {_NOW}), "
            f"pg_total_relation_size('{t}') FROM {t}"
        )
        # list: see listing(). Returns one row of the record's columns per live record.
        self._listing = f"SELECT {_COLUMNS} FROM {t} WHERE expires_at > {_NOW}"

    def migrations(self, stored: int) -> list[str]:
        if stored > SCHEMA_VERSION:
            raise StoreUnavailableError(
                f"the table {self.table!r} was written by a newer langchain-idempotent "
                f"(schema version {stored}, this one knows {SCHEMA_VERSION}); upgrade"
            )
        out = []
        for version in range(stored + 1, SCHEMA_VERSION + 1):
            body = _MIGRATIONS[version - 1].format(
                t=self.table, now=_NOW, version=FORMAT_VERSION, abandoned=_ABANDONED_OWNERS
            )
            out += [stmt.strip() for stmt in body.split("\n;;\n")]
            out.append(self.write_version.format(v=version))
        return out

    # list: %s namespace, thread_id, limit, each only when given.
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

    # purge (operator action): %s thread_id, namespace (when given). Wakes the waiters
    # of every deleted key. Returns (live records deleted, notifications sent).
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
    if not meta:
        return "{}"
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
        reason=None if reason is None else _REASONS[reason],
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
