"""The wire contract of the Postgres store: its schema, its functions, its statements, its rows.

- **Schema.** :data:`_SCHEMA` is the table (with the side-effect mark, ``effect``), its
  indexes and the two PL/pgSQL functions, ``<table>_claim`` and ``<table>_complete``, which
  implement the decision table of :mod:`langchain_idempotent.core.protocol` (comments name the
  rows). Each function is headed by comments naming every parameter and what it returns,
  like the Redis store's Lua scripts. There is one layout, version 1 (the first release's),
  kept per table in ``langchain_idempotent_layout``; from the next layout on, upgrades are
  the append-only :data:`MIGRATIONS`. ``setup()`` (:func:`._ops.setup_op`, in one
  transaction under an advisory lock) creates a new table, its indexes and functions, and
  checks an existing one: the functions the database holds (every overload, its argument
  names and body) must be the ones below, so no table keeps another claim function; a
  current table is left untouched (no DDL, so a role that does not own the functions can
  still call ``setup()``). It refuses, changing nothing, a table or functions with no
  layout row (an earlier development build's: those kept a version in
  ``langchain_idempotent_schema``), other functions, and a newer version (without advice
  to drop anything: the table holds completed records) (:meth:`_Queries.refusal`).
- **Statements.** One module-level template per statement the store sends (``_CLAIM``,
  ``_RENEW``, ...), formatted once per table by :class:`_Queries`: a call of one of the
  functions, or one plain statement (renew, release, abandon, get, delete, purge, list)
  whose ``WHERE`` is the owner + fence compare where it writes; each is headed by a comment
  naming its parameters (``%s``, in order) and its result row. Every time is the server's
  clock, :data:`_NOW` (``clock_timestamp()``).
- **Rows.** :func:`_claim_answer`, :func:`_completion`, :func:`_live` and :func:`_decode`
  turn result rows into the protocol's answers and records, and anything they cannot read
  (an unknown format version, state or meta) into
  :class:`~langchain_idempotent.errors.CorruptRecordError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, get_args

from ...core.record import (
    FORMAT_VERSION,
    Claim,
    ClaimOutcome,
    Completion,
    EffectMark,
    Record,
    State,
    UncertainReason,
    abandoned_owner,
    parse_reason,
)
from ...errors import CorruptRecordError
from .._filters import meta_filter

#: Upgrades from the first release on, append-only: ``MIGRATIONS[i]`` holds the statements
#: (``{t}``: the table) that take a table from layout version ``i + 1`` to ``i + 2``, to run
#: in setup()'s transaction (the first migration adds that step), each tested from the
#: previous release's recorded layout, after which the function check above still holds.
#: Empty: version 1 is the first release's layout, and no table a development build wrote
#: is upgraded (setup() refuses it).
MIGRATIONS: tuple[tuple[str, ...], ...] = ()
#: Version of the layout below; kept per table in ``langchain_idempotent_layout``.
SCHEMA_VERSION = 1 + len(MIGRATIONS)
_SCHEMA_TABLE = "langchain_idempotent_layout"
#: Where development builds before the first release kept their schema version.
_DEVELOPMENT_TABLE = "langchain_idempotent_schema"
_STATES = {s.value: s for s in State}
_EFFECTS: dict[str, EffectMark] = {e: e for e in get_args(EffectMark)}
_COLUMNS = (
    "key, state, owner, fence, lease_until, fingerprint, attempt, payload, "
    "created_at, updated_at, version, meta, effect"
)
#: The server's clock in milliseconds: every lease and expiry is measured on it.
_NOW = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

#: The owners an abandoned record can carry without an error type, as an SQL list
#: (record.abandoned_owner); an ``error`` abandon also carries one ('!error:httpx.ReadTimeout').
_ABANDONED_OWNERS = ", ".join(f"'{abandoned_owner(r)}'" for r in get_args(UncertainReason))

# -- schema: what setup() converges a table to ----------------------------------------------
#
# ``{t}`` is the table name; ``;;`` lines separate statements (sent one by one, so that
# pools with ``prepare_threshold=0``, like PostgresSaver's, can run them).

_SCHEMA = """
-- The schema (layout version 1): the table, its indexes, and the two functions that decide
-- (claim, complete), one call each.
-- The table: one row per key. One column per Record field (payload bytea, meta jsonb,
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
    effect       text NOT NULL DEFAULT 'unmarked'
                 CHECK (effect IN ('unmarked', 'before', 'entered')),
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
;;
-- {t}_claim: replay, acquire, take over (or retry), or answer busy / mismatch / expired, in
-- one call (protocol.decide_claim).
-- p_key          the record's key              p_owner       the claimant's owner token
-- p_fingerprint  fingerprint of the arguments  p_lease_ms    lease in ms
-- p_ttl_ms       retention in ms (the row is kept max(ttl, lease) past now)
-- p_takeover     true: take over an expired lease ("takeover"); false: answer expired
-- p_meta         the record's meta, a jsonb object of strings (used when a row is created)
-- p_sweep        0, or how many expired rows to delete first (every 64th claim)
-- p_boundary     true: the tool marks its side effect; a new attempt's effect is 'before'
--                (else 'unmarked')
-- Returns one row (outcome, o_fence, o_attempt, retry_after_ms, failed, payload, reason,
-- entered):
-- outcome is a ClaimOutcome value, or 'corrupt' for a row of an unknown format version;
-- o_fence / o_attempt the record's (new) fence and attempt; retry_after_ms the rest of a
-- live lease (busy); failed and payload the stored result (replay only, else NULL);
-- reason, for takeover, retry and expired only (else NULL), why the previous attempt
-- ended: the reason an abandoned row's owner names ('!cancelled' -> 'cancelled',
-- record.abandoned_reason), else 'lease_expired'; entered, for takeover and expired, whether
-- the previous attempt's effect mark was 'entered'. An expired attempt still 'before' its
-- side-effect block is retried ('retry') under either policy: its effect never started.
CREATE OR REPLACE FUNCTION {t}_claim(
    p_key text, p_owner text, p_fingerprint text, p_lease_ms bigint, p_ttl_ms bigint,
    p_takeover boolean, p_meta jsonb, p_sweep integer, p_boundary boolean,
    OUT outcome text, OUT o_fence bigint, OUT o_attempt bigint, OUT retry_after_ms bigint,
    OUT failed boolean, OUT payload bytea, OUT reason text, OUT entered boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    now_ms bigint;
    rec {t}%ROWTYPE;
    absent boolean;
    mark text := CASE WHEN p_boundary THEN 'before' ELSE 'unmarked' END;
BEGIN
    retry_after_ms := 0; failed := false; entered := false;
    IF p_sweep > 0 THEN  -- the occasional bounded purge of expired rows
        -- The clock read once, into a variable: compared with clock_timestamp() itself
        -- (volatile) the index on expires_at is only walked, row by row through the whole
        -- table; compared with a value it is a range scan that stops at the first live row.
        now_ms := {now};
        DELETE FROM {t} WHERE key IN (
            SELECT s.key FROM {t} s WHERE s.expires_at <= now_ms
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
    -- Absent -> ACQUIRED fence 1, attempt 1: insert it at once, no lock to take. Everything
    -- else writes: lock the row and decide. An expired row is absent too: deleted under
    -- the lock, then inserted over; a lost race to insert is decided on the winner's row.
    absent := NOT FOUND;
    LOOP
        IF absent THEN
            INSERT INTO {t} (key, state, owner, fence, lease_until, fingerprint, attempt,
                             payload, created_at, updated_at, version, meta, effect, namespace,
                             thread_id, expires_at)
            VALUES (p_key, 'running', p_owner, 1, now_ms + p_lease_ms, p_fingerprint, 1,
                    NULL, now_ms, now_ms, {version}, p_meta, mark, p_meta->>'namespace',
                    p_meta->>'thread_id', now_ms + greatest(p_ttl_ms, p_lease_ms))
            ON CONFLICT (key) DO NOTHING;
            IF FOUND THEN
                outcome := 'acquired'; o_fence := 1; o_attempt := 1;
                RETURN;
            END IF;
        END IF;
        SELECT * INTO rec FROM {t} WHERE key = p_key FOR UPDATE;
        now_ms := {now};  -- after the lock
        EXIT WHEN FOUND AND rec.expires_at > now_ms;
        IF FOUND THEN
            DELETE FROM {t} WHERE key = p_key;  -- expired
        END IF;
        absent := true;
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
        -- An abandoned row's owner is '!<reason>' (or '!error:<type>', the exception of an
        -- error after the side effect began); the reason is what follows the '!'.
        reason := CASE WHEN rec.owner IN ({abandoned}) OR rec.owner LIKE '!error:_%'
                       THEN substr(rec.owner, 2) ELSE 'lease_expired' END;
    END IF;
    IF rec.state = 'running' THEN
        entered := rec.effect = 'entered';
    END IF;
    IF rec.state = 'running' AND rec.effect <> 'before' AND NOT p_takeover THEN
        outcome := 'expired';  -- expired (not before its effect), policy "raise" -> EXPIRED
        RETURN;
    END IF;
    -- FREE -> ACQUIRED; expired before its effect -> RETRY (both: the new attempt's effect
    -- mark); expired, policy "takeover" -> TAKEOVER, which keeps the mark it found (the key
    -- stays uncertain until a completion or a release); all: fence + 1, attempt + 1
    outcome := CASE WHEN rec.state = 'free' THEN 'acquired'
                    WHEN rec.effect = 'before' THEN 'retry' ELSE 'takeover' END;
    o_fence := rec.fence + 1; o_attempt := rec.attempt + 1;
    UPDATE {t} SET state = 'running', owner = p_owner, fence = o_fence, attempt = o_attempt,
                   lease_until = now_ms + p_lease_ms, payload = NULL, updated_at = now_ms,
                   effect = CASE WHEN outcome = 'takeover' THEN rec.effect ELSE mark END,
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

# -- statements: one template each, formatted per table by _Queries ---------------------------
#
# ``{t}`` is the table, ``{now}`` the server's clock (_NOW), ``{schema}`` the version table.
# Each template is headed by its parameters (``%s`` in order, or ``%(name)s``) and its result.

# setup(), in one transaction: lock this table's schema against concurrent setups.
# No parameters. Returns a row (void).
_LOCK = "SELECT pg_advisory_xact_lock(hashtext('langchain_idempotent:{t}'))"
# setup(): make sure the version table exists. No parameters. Returns nothing.
_SCHEMA_TABLE_DDL = (
    "CREATE TABLE IF NOT EXISTS {schema} (table_name text PRIMARY KEY, version integer NOT NULL)"
)
# setup() and describe(): %s table name. Returns (version), or no row for a new table.
_READ_VERSION = "SELECT version FROM {schema} WHERE table_name = %s"
# describe: no parameters. Returns (table_name) for every table setup() made here.
_KNOWN_TABLES = "SELECT table_name FROM {schema} ORDER BY table_name"
# setup(): no parameters. Returns (signature, name, argument names, body) of every function
# named like this table's two in the current schema, every overload (an earlier build's
# claim function had other arguments).
_FUNCTIONS = (
    "SELECT p.oid::regprocedure::text, p.proname::text, p.proargnames::text[], p.prosrc "
    "FROM pg_proc p WHERE p.proname IN ('{t}_claim', '{t}_complete') "
    "AND p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())"
)
# setup(), after creating the table: %s table name, version. Returns nothing.
_WRITE_VERSION = "INSERT INTO {schema} (table_name, version) VALUES (%s, %s)"
# setup(), for a table with no layout row: %s table name. Returns (whether the table exists,
# whether development builds' version table does).
_FOUND = f"SELECT to_regclass(%s) IS NOT NULL, to_regclass('{_DEVELOPMENT_TABLE}') IS NOT NULL"
# setup(), when development builds' version table exists: %s table name. Returns (version),
# or no row.
_DEVELOPMENT_VERSION = f"SELECT version FROM {_DEVELOPMENT_TABLE} WHERE table_name = %s"
# setup(), first: %s a name. Returns (its description) when PostgreSQL reserves it as a word
# that cannot name a table (``full``, ``order``, ``user``), no row otherwise.
_RESERVED = "SELECT catdesc FROM pg_get_keywords() WHERE word = %s AND catcode IN ('R', 'T')"
# drop(), in one transaction after _LOCK: remove the two functions (every overload, found
# with _FUNCTIONS), then the table, then its row in the version table (%s: table name).
# Returns nothing.
_DROP = (
    "DROP TABLE IF EXISTS {t}",
    "DELETE FROM {schema} WHERE table_name = %s",
)
# claim: %(name)s, the function's parameters by name without p_ (key, owner, fingerprint,
# lease_ms, ttl_ms, takeover, meta, sweep, boundary). Returns the function's row (see
# {t}_claim).
_CLAIM = (
    "SELECT * FROM {t}_claim(%(key)s, %(owner)s, %(fingerprint)s, %(lease_ms)s, "
    "%(ttl_ms)s, %(takeover)s, %(meta)s, %(sweep)s, %(boundary)s)"
)
# replay_or_claim, for a claim that sweeps nothing (sweep 0): the same parameters and the
# same row as _CLAIM, in one statement, but a replay is answered by a plain indexed read and
# the function is not called at all (the cheapest replay). The read asks what the
# function's no-lock REPLAY asks: a live row of this format version, done, with the same
# fingerprint. Returns the function's REPLAY row (outcome 'replay', the row's fence and
# attempt, retry_after_ms 0, failed, payload, reason NULL, entered false). An Append runs
# its branches in order and LIMIT 1 stops at the first row, so the function runs only when
# the read found no replay, and then decides everything as before.
_REPLAY_OR_CLAIM = (
    "(SELECT 'replay'::text, fence, attempt, 0::bigint, state = 'failed', payload, "
    "NULL::text, false FROM {t} WHERE key = %(key)s AND state IN ('completed', 'failed') "
    "AND fingerprint = %(fingerprint)s AND version = {version} AND expires_at > {now}) "
    "UNION ALL (" + _CLAIM + ") LIMIT 1"
)
# claim_many: {t}_claim once per request, in the order given, in one statement. The
# requests come as parallel arrays, unnested WITH ORDINALITY (n: the request's position);
# a LATERAL join calls the function per row, a nested loop over the unnest rows in order.
# The function is VOLATILE, so each call reads with a fresh snapshot and sees what the
# earlier calls of the same statement wrote: the same key twice is two sequential claims.
# %(keys)s, %(owners)s, %(fingerprints)s text[]; %(leases)s, %(ttls)s bigint[] (ms);
# %(takeovers)s, %(boundaries)s boolean[]; %(metas)s jsonb[] (sent as text[]); sweep 0
# (single claims sweep). Returns the function's row per request (see {t}_claim), in
# request order.
_CLAIM_MANY = (
    "SELECT c.* FROM unnest(%(keys)s::text[], %(owners)s::text[], %(fingerprints)s::text[], "
    "%(leases)s::bigint[], %(ttls)s::bigint[], %(takeovers)s::boolean[], "
    "%(metas)s::text[]::jsonb[], %(boundaries)s::boolean[]) "
    "WITH ORDINALITY AS r(key, owner, fingerprint, lease_ms, ttl_ms, takeover, meta, "
    "boundary, n) "
    "CROSS JOIN LATERAL {t}_claim(r.key, r.owner, r.fingerprint, r.lease_ms, r.ttl_ms, "
    "r.takeover, r.meta, 0, r.boundary) AS c ORDER BY r.n"
)
# complete: %s key, owner, fence, fingerprint, payload, failed, ttl_ms, meta, strict (the
# function's parameters in order). Returns the function's row (see {t}_complete).
_COMPLETE = "SELECT * FROM {t}_complete(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
# renew (protocol.decide_renew): %s lease_ms, lease_ms, key, owner, fence.
# Returns a row when the caller still owned the lease (extended), none otherwise.
_RENEW = (
    "WITH c AS (SELECT {now} AS now_ms) "
    "UPDATE {t} SET lease_until = c.now_ms + %s, updated_at = c.now_ms, "
    "expires_at = greatest({t}.expires_at, c.now_ms + %s) FROM c "
    "WHERE key = %s AND state = 'running' AND owner = %s AND fence = %s "
    "AND expires_at > c.now_ms RETURNING 1"
)
# mark_effect (protocol.decide_mark_effect): %s key, owner, fence. The attempt entered its
# side-effect block: effect 'entered', only while running with the caller's owner and fence.
# Returns a row when marked, none otherwise.
_MARK_EFFECT = (
    "WITH c AS (SELECT {now} AS now_ms) "
    "UPDATE {t} SET effect = 'entered', updated_at = c.now_ms FROM c "
    "WHERE key = %s AND state = 'running' AND owner = %s AND fence = %s "
    "AND expires_at > c.now_ms RETURNING 1"
)
# release (protocol.decide_release): %s key, owner, fence. Frees the lease, keeps the
# fence, wakes the key's waiters. Returns (count): 1 when released, else 0.
_RELEASE = (
    "WITH c AS (SELECT {now} AS now_ms), "
    "u AS (UPDATE {t} SET state = 'free', owner = '', lease_until = 0, "
    "updated_at = c.now_ms FROM c WHERE key = %s AND state = 'running' "
    "AND owner = %s AND fence = %s AND expires_at > c.now_ms RETURNING key) "
    "SELECT count(pg_notify('{t}_wake', md5(u.key))) FROM u"
)
# abandon (protocol.decide_abandon): %s abandoned owner (record.abandoned_owner of the
# reason), key, owner, fence. Ends the lease with the outcome unknown: the row stays running
# with lease_until 0 and the abandoned owner, so the next claim takes over at once and is
# told the reason; fence, attempt and retention are kept; wakes the key's waiters.
# Returns (count): 1 when abandoned, else 0.
_ABANDON = (
    "WITH c AS (SELECT {now} AS now_ms), "
    "u AS (UPDATE {t} SET owner = %s, lease_until = 0, updated_at = c.now_ms "
    "FROM c WHERE key = %s AND state = 'running' AND owner = %s AND fence = %s "
    "AND expires_at > c.now_ms RETURNING key) "
    "SELECT count(pg_notify('{t}_wake', md5(u.key))) FROM u"
)
# get: %s key. Returns (now_ms, <the record's columns>), the columns NULL when absent or
# expired: the record and the server's clock in one round trip (watch needs both).
_GET = (
    "SELECT c.now_ms, " + ", ".join(f"r.{c}" for c in _COLUMNS.split(", ")) + " "
    "FROM (SELECT {now} AS now_ms) c LEFT JOIN {t} r ON r.key = %s AND r.expires_at > c.now_ms"
)
# now_ms: no parameters. Returns (now_ms).
_NOW_MS = "SELECT {now}"
# delete (operator action, no owner check): %s key. Wakes the key's waiters.
# Returns (whether a live record was deleted, notifications sent).
_DELETE = (
    "WITH c AS (SELECT {now} AS now_ms), "
    "d AS (DELETE FROM {t} WHERE key = %s RETURNING key, expires_at) "
    "SELECT coalesce(bool_or(d.expires_at > c.now_ms), false), "
    "count(pg_notify('{t}_wake', md5(d.key))) FROM d, c"
)
# purge (operator action): %s thread_id, namespace (when given; {where} holds the test).
# Wakes the waiters of every deleted key. Returns (live records deleted, notifications sent).
_PURGE = (
    "WITH c AS (SELECT {now} AS now_ms), "
    "d AS (DELETE FROM {t} WHERE {where} RETURNING key, expires_at) "
    "SELECT count(*) FILTER (WHERE d.expires_at > c.now_ms), "
    "count(pg_notify('{t}_wake', md5(d.key))) FROM d, c"
)
# list: %s namespace, thread_id, limit, each only when given (see _Queries.listing).
# Returns one row of the record's columns per live record, oldest first.
_LIST = "SELECT {columns} FROM {t} WHERE expires_at > {now}"
# describe: no parameters. Returns (server_version, fsync, synchronous_commit, whether the
# version table exists, whether this table exists). Creates nothing.
_PROBE_TABLES = (
    "SELECT current_setting('server_version'), current_setting('fsync'), "
    "current_setting('synchronous_commit'), "
    "to_regclass('{schema}') IS NOT NULL, to_regclass('{t}') IS NOT NULL"
)
# describe, when the table exists: no parameters. Returns (rows, expired rows not yet
# purged, bytes on disk with indexes).
_TABLE_FACTS = (
    "SELECT count(*), count(*) FILTER (WHERE expires_at <= {now}), "
    "pg_total_relation_size('{t}') FROM {t}"
)


class _Queries:
    """Every statement the store sends, formatted once for one table (templates above)."""

    def __init__(self, table: str) -> None:
        self.table = table

        def f(template: str) -> str:
            return template.format(
                t=table, now=_NOW, schema=_SCHEMA_TABLE, version=FORMAT_VERSION, columns=_COLUMNS
            )

        self.lock, self.schema_table = f(_LOCK), f(_SCHEMA_TABLE_DDL)
        self.read_version, self.write_version = f(_READ_VERSION), f(_WRITE_VERSION)
        self.known_tables = f(_KNOWN_TABLES)
        self.reserved, self.drop = _RESERVED, tuple(f(stmt) for stmt in _DROP)
        self.functions = f(_FUNCTIONS)
        self.found, self.development_version = _FOUND, _DEVELOPMENT_VERSION
        body = _SCHEMA.format(
            t=table, now=_NOW, version=FORMAT_VERSION, abandoned=_ABANDONED_OWNERS
        )
        #: The schema's statements: the table first, then its indexes and functions.
        self._statements = [stmt.strip() for stmt in body.split("\n;;\n")]
        #: (name, argument names, body) of the functions the statements create.
        self._functions = sorted(
            _function_facts(stmt) for stmt in self._statements if "$fn$" in stmt
        )
        self.claim, self.replay_or_claim = f(_CLAIM), f(_REPLAY_OR_CLAIM)
        self.claim_many = f(_CLAIM_MANY)
        self.complete, self.renew, self.mark_effect = f(_COMPLETE), f(_RENEW), f(_MARK_EFFECT)
        self.release, self.abandon = f(_RELEASE), f(_ABANDON)
        self.get, self.now, self.delete = f(_GET), f(_NOW_MS), f(_DELETE)
        self.probe_tables, self.table_facts = f(_PROBE_TABLES), f(_TABLE_FACTS)
        self._list = f(_LIST)
        self._purge = _PURGE.replace("{where}", "{{where}}").format(t=table, now=_NOW)

    def creation(self) -> list[tuple[str, tuple[Any, ...] | None]]:
        """The statements (with parameters) that set up a new table at :data:`SCHEMA_VERSION`."""
        out: list[tuple[str, tuple[Any, ...] | None]] = [(stmt, None) for stmt in self._statements]
        return [*out, (self.write_version, (self.table, SCHEMA_VERSION))]

    def refusal(
        self,
        stored: int | None,
        functions: list[tuple[str, str, list[str] | None, str]],
        has_table: bool = True,
        development: object = None,
    ) -> str | None:
        """Why setup() refuses this table, or ``None`` when it is this layout. ``stored``: the
        layout version it holds (``None``: no row); ``functions``: the rows of
        ``_FUNCTIONS``; whether the table exists; for a table with no row, the version an
        earlier build kept in ``langchain_idempotent_schema`` (``None``: none)."""
        t = self.table
        if stored is not None and stored > SCHEMA_VERSION:
            return (
                f"the table {t!r} was set up by a newer langchain-idempotent (schema "
                f"version {stored}; this one knows versions up to {SCHEMA_VERSION}). Upgrade "
                "langchain-idempotent on this worker to the version the other workers run. "
                "Keep the table: it holds completed records, and deleting them would run "
                "their calls again"
            )
        held = sorted((name, args or [], body) for _, name, args, body in functions)
        if stored == SCHEMA_VERSION and held == self._functions and has_table:
            return None
        if stored == SCHEMA_VERSION and held == self._functions:
            found = f"the table {t!r} is missing (its layout row and functions are there)"
        elif stored == SCHEMA_VERSION:
            found = f"the functions of table {t!r} are not the ones this release installs"
        elif stored is not None:
            found = f"the table {t!r} has schema version {stored!r}, which no release wrote"
        elif development is not None:
            found = f"the table {t!r} has schema version {development!r} in {_DEVELOPMENT_TABLE}"
        elif has_table:
            found = f"the table {t!r} has no layout version in {_SCHEMA_TABLE}"
        else:
            found = f"functions {t}_claim / {t}_complete exist without their table"
        return (
            f"{found}: an earlier development build of langchain-idempotent (or a hand "
            f"edit) set it up, and this release keeps one layout (version {SCHEMA_VERSION} "
            f"in {_SCHEMA_TABLE}) and upgrades none that came before it. It was left as it "
            f"is. Drop it (the store's drop(), or DROP TABLE {t} and DROP FUNCTION "
            f"{t}_claim, {t}_complete) and set up again; its records are then gone, so a "
            "call recorded only there can run again"
        )

    def drops(
        self, functions: list[tuple[str, str, list[str] | None, str]]
    ) -> list[tuple[str, tuple[Any, ...] | None]]:
        """drop(): every function of this table (each overload), the table, its version row."""
        drop_table, forget = self.drop
        out: list[tuple[str, tuple[Any, ...] | None]] = [
            (f"DROP FUNCTION {signature}", None) for signature, *_ in functions
        ]
        return [*out, (drop_table, None), (forget, (self.table,))]

    def listing(
        self, namespace: str | None, thread_id: str | None, limit: int | None
    ) -> tuple[str, tuple[Any, ...]]:
        where, params = meta_filter(namespace, thread_id, "%s")
        query = f"{self._list}{where} ORDER BY created_at, key"
        if limit is None:
            return query, tuple(params)
        return f"{query} LIMIT %s", (*params, max(0, limit))

    def purging(self, thread_id: str, namespace: str | None) -> tuple[str, tuple[Any, ...]]:
        where, params = "thread_id = %s", [thread_id]
        if namespace is not None:
            where += " AND namespace = %s"
            params.append(namespace)
        return self._purge.format(where=where), tuple(params)


def _function_facts(statement: str) -> tuple[str, list[str], str]:
    """(name, argument names, body) of one ``CREATE OR REPLACE FUNCTION`` statement, as
    ``pg_proc`` keeps them (``proname``, ``proargnames``, ``prosrc``)."""
    head, body, _ = statement.split("$fn$")
    signature = head.split("CREATE OR REPLACE FUNCTION", 1)[1]
    name, _, params = signature.partition("(")
    params = params.rsplit(")", 1)[0]
    names = [p.split()[1] if p.split()[0] == "OUT" else p.split()[0] for p in params.split(",")]
    return name.strip(), names, body


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
    outcome, fence, attempt, retry_after, failed, payload, reason, entered = row
    if outcome == "corrupt":
        raise _corrupt(key, table, "unknown format version")
    found = None if reason is None else parse_reason(reason)
    if reason is not None and found is None:
        raise _corrupt(key, table, f"unknown abandon reason {reason!r}")
    return Claim(
        ClaimOutcome(outcome),
        fence=int(fence),
        attempt=int(attempt),
        retry_after_ms=int(retry_after),
        failed=bool(failed),
        payload=None if payload is None else bytes(payload),
        reason=None if found is None else found[0],
        entered=bool(entered),
        error_type=None if found is None else found[1],
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
    (
        key,
        state,
        owner,
        fence,
        lease_until,
        fp,
        attempt,
        payload,
        created,
        updated,
        ver,
        meta,
        effect,
    ) = row
    if ver != FORMAT_VERSION:
        raise _corrupt(key, table, f"unknown format version {ver!r}")
    if state not in _STATES:
        raise _corrupt(key, table, f"unknown state {state!r}")
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise _corrupt(key, table, "meta is not an object of strings")
    if effect not in _EFFECTS:
        raise _corrupt(key, table, f"unknown effect mark {effect!r}")
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
        effect=_EFFECTS[effect],
    )
