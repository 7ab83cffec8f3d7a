"""The PostgreSQL store: the shared contract, plus what only a server with SQL shows."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langchain_idempotent.core.record import Claim, ClaimOutcome, Completion
from langchain_idempotent.core.store import ClaimRequest, CompleteRequest, Held
from langchain_idempotent.errors import StoreUnavailableError
from langchain_idempotent.stores.postgres import PostgresIdempotencyStore
from langchain_idempotent.stores.postgres import _listen as pg_listen
from langchain_idempotent.stores.postgres import _sql as pg_sql
from langchain_idempotent.stores.postgres import _store as pg_store
from langchain_idempotent.testing import StoreContractTests
from tests.support.postgres_fixtures import pg_server, pg_table, pg_url
from tests.support.redis_servers import free_port

__all__ = ["pg_server", "pg_table", "pg_url"]  # fixtures used by this module


class TestPostgresStoreContract(StoreContractTests):
    # The store's clock is the server's (no test can move it): lease expiry is waited out
    # in real time, on leases of tens of ms (a round trip here is well under 1 ms).
    short_lease_ms = 60
    expiry_margin_ms = 25
    # A watch past a lease's deadline: still well under its 5 s timeout (a hang), with room
    # for a loaded CI machine running the other suites beside this one.
    late_return_s = 3.0

    picklable = True

    @pytest.fixture
    async def store(self, pg_url: str, pg_table: str) -> AsyncIterator[PostgresIdempotencyStore]:
        s = PostgresIdempotencyStore.from_url(pg_url, table=pg_table)
        yield s
        await s.aclose()

    @pytest.fixture
    async def second_store(
        self, pg_url: str, pg_table: str, monkeypatch: pytest.MonkeyPatch
    ) -> AsyncIterator[PostgresIdempotencyStore]:
        # It never polls within a test: a waiter on it is woken through LISTEN/NOTIFY.
        monkeypatch.setattr(pg_listen, "_FIRST_POLL", 30.0)
        s = PostgresIdempotencyStore.from_url(pg_url, table=pg_table, poll_interval=30.0)
        yield s
        await s.aclose()

    @pytest.fixture
    def corruptions(self, pg_url: str, pg_table: str) -> dict[str, Callable[[str], None]]:
        def unknown_version(key: str) -> None:
            sql(pg_url, f"UPDATE {pg_table} SET version = 99 WHERE key = %s", key)

        return {"unknown format version": unknown_version}

    @pytest.fixture
    def newer_schema(self, pg_url: str, pg_table: str) -> Callable[[], PostgresIdempotencyStore]:
        def mark() -> PostgresIdempotencyStore:
            sql(
                pg_url,
                "UPDATE langchain_idempotent_layout SET version = 99 WHERE table_name = %s",
                pg_table,
            )
            return PostgresIdempotencyStore.from_url(pg_url, table=pg_table)

        return mark


LONG_MS = 60_000
TTL_MS = 3_600_000


@pytest.fixture
def store(pg_url: str, pg_table: str) -> Iterator[PostgresIdempotencyStore]:
    s = PostgresIdempotencyStore.from_url(pg_url, table=pg_table)
    yield s
    s.close()


def claim(store: PostgresIdempotencyStore, key: str, owner: str, **kw: Any) -> Claim:
    kw.setdefault("lease_ms", LONG_MS)
    kw.setdefault("ttl_ms", TTL_MS)
    return store.claim(ClaimRequest(key, owner=owner, fingerprint="fp", **kw))


def complete(
    store: PostgresIdempotencyStore, key: str, owner: str, fence: int, payload: bytes, **kw: Any
) -> Completion:
    kw.setdefault("ttl_ms", TTL_MS)
    return store.complete(
        CompleteRequest(
            key, owner=owner, fence=fence, fingerprint="fp", payload=payload, failed=False, **kw
        )
    )


def sql(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, params or None)
        return cur.fetchall() if cur.description else []


# -- schema ------------------------------------------------------------------------------------


def _layout(url: str, table: str) -> list[tuple[Any, ...]]:
    """What setup() made of ``table``: its layout row, columns, indexes and functions (with
    their oids, so that a function dropped and created again shows)."""
    return sql(
        url,
        "SELECT 'row', version::text FROM langchain_idempotent_layout WHERE table_name = %s "
        "UNION ALL SELECT 'column', column_name || ' ' || data_type "
        "FROM information_schema.columns WHERE table_name = %s "
        "UNION ALL SELECT 'index', indexdef FROM pg_indexes WHERE tablename = %s "
        "UNION ALL SELECT 'function', oid::text || ' ' || prosrc FROM pg_proc "
        "WHERE proname IN (%s, %s) ORDER BY 1, 2",
        table,
        table,
        table,
        f"{table}_claim",
        f"{table}_complete",
    )


def test_setup_records_layout_1_and_setting_it_up_again_changes_nothing(
    store: PostgresIdempotencyStore, pg_url: str, pg_table: str
) -> None:
    store.setup()
    before = _layout(pg_url, pg_table)
    assert ("row", "1") in before and pg_sql.SCHEMA_VERSION == 1
    store.setup()
    fresh = PostgresIdempotencyStore.from_url(pg_url, table=pg_table)
    try:
        fresh.setup()
        assert _layout(pg_url, pg_table) == before
        assert claim(fresh, "k", "a").outcome is ClaimOutcome.ACQUIRED
    finally:
        fresh.close()


def _earlier_build(url: str, table: str) -> None:
    """An earlier development build's marker: today's table and functions, set up and then
    recorded as that build recorded them (a version in langchain_idempotent_schema, no
    layout row), with a completed record."""
    s = PostgresIdempotencyStore.from_url(url, table=table)
    try:
        c = claim(s, "kept", "a")
        complete(s, "kept", "a", c.fence, b"old row")
    finally:
        s.close()
    sql(url, "DELETE FROM langchain_idempotent_layout WHERE table_name = %s", table)
    sql(
        url,
        "CREATE TABLE IF NOT EXISTS langchain_idempotent_schema "
        "(table_name text PRIMARY KEY, version integer NOT NULL)",
    )
    sql(url, "INSERT INTO langchain_idempotent_schema VALUES (%s, 4)", table)


def test_a_table_an_earlier_development_build_set_up_is_refused_and_left_as_it_is(
    pg_url: str, pg_table: str
) -> None:
    _earlier_build(pg_url, pg_table)
    before = _layout(pg_url, pg_table)
    s = PostgresIdempotencyStore.from_url(pg_url, table=pg_table)
    try:
        for attempt in (s.setup, lambda: claim(s, "kept", "b"), lambda: s.get("kept")):
            with pytest.raises(StoreUnavailableError) as err:
                attempt()
            message = str(err.value)
            assert "schema version 4 in langchain_idempotent_schema" in message
            assert "earlier development build" in message and "set up again" in message
            assert f"DROP TABLE {pg_table}" in message
        assert _layout(pg_url, pg_table) == before  # no DDL, no layout row, same functions
        assert sql(pg_url, f"SELECT owner, payload FROM {pg_table}") == [("a", b"old row")]
        # The way out: drop it and set up again.
        s.drop()
        assert claim(s, "kept", "b").outcome is ClaimOutcome.ACQUIRED
    finally:
        s.close()
        sql(pg_url, "DELETE FROM langchain_idempotent_schema WHERE table_name = %s", pg_table)


def test_a_table_whose_functions_are_not_this_releases_is_refused_and_left_as_it_is(
    store: PostgresIdempotencyStore, pg_url: str, pg_table: str
) -> None:
    # setup() compares the functions the database holds with a fresh setup's: a claim
    # function of another body (an earlier build's, a hand edit) is never run or replaced.
    store.setup()
    sql(
        pg_url,
        f"CREATE OR REPLACE FUNCTION {pg_table}_complete(p_key text) RETURNS int "
        "LANGUAGE sql AS 'SELECT 1'",
    )
    before = _layout(pg_url, pg_table)
    fresh = PostgresIdempotencyStore.from_url(pg_url, table=pg_table)
    try:
        with pytest.raises(StoreUnavailableError, match=r"functions of table .* are not the ones"):
            fresh.setup()
        assert _layout(pg_url, pg_table) == before
    finally:
        fresh.close()


def test_a_table_dropped_by_hand_is_refused_until_it_is_dropped_whole(
    store: PostgresIdempotencyStore, pg_url: str, pg_table: str
) -> None:
    store.setup()
    sql(pg_url, f"DROP TABLE {pg_table}")  # the layout row and functions stay behind
    fresh = PostgresIdempotencyStore.from_url(pg_url, table=pg_table)
    try:
        with pytest.raises(StoreUnavailableError, match=f"the table '{pg_table}' is missing"):
            fresh.setup()
        fresh.drop()
        assert claim(fresh, "k", "a").outcome is ClaimOutcome.ACQUIRED
    finally:
        fresh.close()


def test_a_replay_is_answered_by_a_plain_read_without_the_claim_function(
    store: PostgresIdempotencyStore, pg_url: str, pg_table: str
) -> None:
    c = claim(store, "done", "a")
    complete(store, "done", "a", c.fence, b"stored")
    # The function now refuses every call: only a claim that needs it can fail.
    sql(
        pg_url,
        f"CREATE OR REPLACE FUNCTION {pg_table}_claim(p_key text, p_owner text, "
        "p_fingerprint text, p_lease_ms bigint, p_ttl_ms bigint, p_takeover boolean, "
        "p_meta jsonb, p_sweep integer, p_boundary boolean, OUT outcome text, "
        "OUT o_fence bigint, OUT o_attempt bigint, OUT retry_after_ms bigint, "
        "OUT failed boolean, OUT payload bytea, OUT reason text, OUT entered boolean) "
        "LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'the claim function was called'; END $$",
    )
    replay = claim(store, "done", "b")
    assert (replay.outcome, replay.payload, replay.fence) == (ClaimOutcome.REPLAY, b"stored", 1)
    with pytest.raises(StoreUnavailableError, match="the claim function was called"):  # mismatch
        store.claim(
            ClaimRequest("done", owner="b", fingerprint="other", lease_ms=LONG_MS, ttl_ms=TTL_MS)
        )
    with pytest.raises(StoreUnavailableError, match="the claim function was called"):
        claim(store, "fresh", "b")


def test_abandon_refuses_a_reason_it_does_not_know(store: PostgresIdempotencyStore) -> None:
    c = claim(store, "k", "a")
    with pytest.raises(ValueError, match="reason must be one of"):
        store.abandon(Held("k", owner="a", fence=c.fence), reason="bored")  # type: ignore[arg-type]
    assert store.renew(Held("k", owner="a", fence=c.fence), lease_ms=LONG_MS)


def test_without_auto_setup_a_missing_table_is_a_store_error_naming_the_key(
    pg_url: str, pg_table: str
) -> None:
    s = PostgresIdempotencyStore.from_url(pg_url, table=pg_table, auto_setup=False)
    try:
        with pytest.raises(StoreUnavailableError) as err:
            claim(s, "the-key", "a")
        assert err.value.key == "the-key"
        assert isinstance(err.value.__cause__, psycopg.Error)
        s.setup()
        assert claim(s, "the-key", "a").outcome is ClaimOutcome.ACQUIRED
    finally:
        s.close()


@pytest.mark.parametrize("table", ["Records", "x-y", "a" * 41, "1abc", ""])
def test_a_table_name_that_is_not_a_plain_lower_case_identifier_is_refused(
    pg_url: str, table: str
) -> None:
    with pytest.raises(ValueError, match="table must be"):
        PostgresIdempotencyStore.from_url(pg_url, table=table)


@pytest.mark.parametrize("table", ["full", "order", "user"])
async def test_a_table_named_by_a_reserved_word_is_refused_at_setup_naming_it(
    pg_url: str, table: str
) -> None:
    s = PostgresIdempotencyStore.from_url(pg_url, table=table, auto_setup=False)
    try:
        with pytest.raises(ValueError, match=f"table '{table}' is a word PostgreSQL reserves"):
            s.setup()
        with pytest.raises(ValueError, match="pass another table="):
            await s.asetup()
    finally:
        await s.aclose()


async def test_drop_removes_the_table_its_functions_and_schema_row_and_the_next_use_sets_up_again(
    pg_url: str, pg_table: str
) -> None:
    s = PostgresIdempotencyStore.from_url(pg_url, table=pg_table)
    try:
        assert claim(s, "k", "a").outcome is ClaimOutcome.ACQUIRED
        s.drop()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            left = conn.execute(
                "SELECT to_regclass(%s), (SELECT count(*) FROM pg_proc WHERE proname LIKE %s), "
                "(SELECT count(*) FROM langchain_idempotent_layout WHERE table_name = %s)",
                (pg_table, f"{pg_table}_%", pg_table),
            ).fetchone()
        assert left == (None, 0, 0)
        assert claim(s, "k", "a").outcome is ClaimOutcome.ACQUIRED  # set up again, empty
        await s.adrop()
        assert s.get("k") is None
    finally:
        await s.aclose()


# -- records -----------------------------------------------------------------------------------


def test_expired_rows_are_purged_by_later_claims_a_bounded_batch_at_a_time(
    store: PostgresIdempotencyStore, pg_url: str, pg_table: str
) -> None:
    store.setup()
    sql(  # 300 records that expired long ago
        pg_url,
        f"INSERT INTO {pg_table} (key, state, owner, fence, lease_until, fingerprint, attempt,"
        " created_at, updated_at, version, meta, expires_at)"
        " SELECT 'old-' || i, 'completed', 'a', 1, 0, 'fp', 1, 1, 1, 1, '{}', 2"
        " FROM generate_series(1, 300) i",
    )

    def rows() -> int:
        return int(sql(pg_url, f"SELECT count(*) FROM {pg_table}")[0][0])

    assert rows() == 300
    fresh = PostgresIdempotencyStore.from_url(pg_url, table=pg_table)  # its own counter
    try:
        for i in range(pg_store._SWEEP_EVERY):
            claim(fresh, f"new-{i}", "a")
        assert rows() == 300 - pg_store._SWEEP_LIMIT + pg_store._SWEEP_EVERY
        for i in range(pg_store._SWEEP_EVERY):
            claim(fresh, f"newer-{i}", "a")
        assert rows() == 2 * pg_store._SWEEP_EVERY
    finally:
        fresh.close()


def test_the_purge_and_list_statements_use_the_indexes(
    store: PostgresIdempotencyStore, pg_url: str, pg_table: str
) -> None:
    for i in range(2000):
        claim(store, f"k{i}", "a", meta={"namespace": f"n{i % 2}", "thread_id": f"t{i}"})
    sql(pg_url, f"ANALYZE {pg_table}")
    q = pg_sql._Queries(pg_table)
    for query, params in (
        q.listing(None, "t7", None),
        q.listing("n1", "t7", 3),
        (f"SELECT key FROM {pg_table} WHERE expires_at <= 5 ORDER BY expires_at LIMIT 256", ()),
    ):
        with psycopg.connect(pg_url, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("SET enable_seqscan = off")  # tiny tables: ask if an index fits
            cur.execute("EXPLAIN " + query, params or None)
            plan = "\n".join(r[0] for r in cur.fetchall())
        assert "Index" in plan, (query, plan)


def test_every_function_documents_its_parameters_and_what_it_returns() -> None:
    source = pg_sql._SCHEMA
    functions = re.findall(
        r"((?:^--[^\n]*\n)+)CREATE OR REPLACE FUNCTION \{t\}_(\w+)\((.*?)\)\s*LANGUAGE",
        source,
        flags=re.MULTILINE | re.DOTALL,
    )
    assert {name for _, name, _ in functions} == {"claim", "complete"}
    for header, name, signature in functions:
        params = re.findall(r"\b(p_\w+)\s+\w+", signature)
        outs = re.findall(r"\bOUT\s+(\w+)", signature)
        assert params and outs, name
        documented = re.findall(r"^--\s+(p_\w+)|\s{2,}(p_\w+)\s", header, flags=re.MULTILINE)
        assert {a or b for a, b in documented} == set(params), name
        returns = header[header.index("-- Returns") :]
        assert all(re.search(rf"\b{out}\b", returns) for out in outs), (name, outs)
    # The statements sent as plain SQL are each a module-level template headed by a
    # comment naming its result.
    source = inspect.getsource(pg_sql)
    section = source[source.index("# -- statements") : source.index("class _Queries")]
    lines = section.splitlines()
    names = [line.split(" = ")[0] for line in lines if re.match(r"_[A-Z_]+ = ", line)]
    assert {"_CLAIM", "_COMPLETE", "_RENEW", "_RELEASE", "_ABANDON", "_GET"} <= set(names)
    assert {"_DELETE", "_PURGE", "_LIST", "_DROP", "_RESERVED", "_PROBE_TABLES"} <= set(names)
    for name in names:
        at = next(i for i, line in enumerate(lines) if line.startswith(f"{name} = "))
        comment = []
        while lines[at - 1].startswith("#"):
            at -= 1
            comment.append(lines[at])
        assert "Returns" in "".join(comment), name


# -- time --------------------------------------------------------------------------------------


def test_the_store_reads_the_servers_clock_never_the_hosts(
    store: PostgresIdempotencyStore, monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> None:
    store.setup()
    server_before = int(sql(pg_url, f"SELECT {pg_sql._NOW}")[0][0])
    host = time.time
    monkeypatch.setattr(time, "time", lambda: host() + 86_400.0)  # the host is a day ahead
    c = claim(store, "k", "a", lease_ms=5_000)
    rec = store.get("k")
    now = store.now_ms()
    monkeypatch.undo()
    server_after = int(sql(pg_url, f"SELECT {pg_sql._NOW}")[0][0])
    assert rec is not None and c.outcome is ClaimOutcome.ACQUIRED
    assert server_before <= rec.created_at <= now <= server_after
    assert rec.lease_until == rec.created_at + 5_000


async def test_anow_ms_is_the_servers_clock(store: PostgresIdempotencyStore, pg_url: str) -> None:
    before = int(sql(pg_url, f"SELECT {pg_sql._NOW}")[0][0])
    now = await store.anow_ms()
    after = int(sql(pg_url, f"SELECT {pg_sql._NOW}")[0][0])
    assert before <= now <= after
    await store.aclose()


# -- wake-ups ----------------------------------------------------------------------------------


def test_a_waiter_without_notifications_still_wakes_by_its_poll_interval(
    pg_url: str, pg_table: str
) -> None:
    waiter = PostgresIdempotencyStore.from_url(pg_url, table=pg_table, poll_interval=0.2)
    try:
        c = claim(waiter, "k", "a")
        # A completion written behind the store's back (no NOTIFY): only polling sees it.
        sql(pg_url, f"UPDATE {pg_table} SET state = 'completed', payload = 'x' WHERE key = 'k'")
        started = time.monotonic()
        waiter.watch("k", fence=c.fence, timeout=10.0)
        assert time.monotonic() - started < 1.0
    finally:
        waiter.close()


# -- pools -------------------------------------------------------------------------------------


def test_the_store_shares_the_pool_of_a_langgraph_postgres_saver(
    pg_url: str, pg_table: str
) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    pool = ConnectionPool(
        pg_url,
        min_size=1,
        max_size=4,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=True,
    )
    try:
        saver = PostgresSaver(pool)  # type: ignore[arg-type]
        saver.setup()
        store = PostgresIdempotencyStore(pool, table=pg_table)
        store.setup()
        config: Any = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        checkpoint = empty_checkpoint()
        saver.put(config, checkpoint, {"source": "input", "step": -1}, {})
        c = claim(store, "k", "a")
        assert complete(store, "k", "a", c.fence, b"r").stored
        assert claim(store, "k", "b").payload == b"r"
        assert saver.get_tuple(config) is not None
        store.close()  # a pool passed in is not the store's to close
        assert not pool.closed
        assert claim(store, "k2", "a").outcome is ClaimOutcome.ACQUIRED
    finally:
        pool.close()


async def test_a_store_on_a_sync_pool_only_serves_async_callers_too(
    pg_url: str, pg_table: str
) -> None:
    pool = ConnectionPool(pg_url, min_size=1, max_size=2, kwargs={"autocommit": True}, open=True)
    try:
        store = PostgresIdempotencyStore(pool, table=pg_table)
        c = await store.aclaim(
            ClaimRequest("k", owner="a", fingerprint="fp", lease_ms=LONG_MS, ttl_ms=TTL_MS)
        )
        assert c.outcome is ClaimOutcome.ACQUIRED
        assert (await store.aget("k")) is not None
    finally:
        pool.close()


async def test_a_store_on_an_async_pool_only_refuses_sync_calls_clearly(
    pg_url: str, pg_table: str
) -> None:
    apool = AsyncConnectionPool(
        pg_url, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False
    )
    await apool.open()
    try:
        store = PostgresIdempotencyStore(apool, table=pg_table)
        c = await store.aclaim(
            ClaimRequest("k", owner="a", fingerprint="fp", lease_ms=LONG_MS, ttl_ms=TTL_MS)
        )
        assert c.outcome is ClaimOutcome.ACQUIRED
        with pytest.raises(TypeError, match="only an AsyncConnectionPool"):
            store.get("k")
    finally:
        await apool.close()


def test_an_unreachable_server_is_a_store_error_naming_the_key() -> None:
    port = free_port()
    s = PostgresIdempotencyStore.from_url(f"postgresql://postgres@127.0.0.1:{port}/x", timeout=1.0)
    try:
        with pytest.raises(StoreUnavailableError) as err:
            claim(s, "k", "a")
        assert err.value.key == "k"
        assert err.value.__cause__ is not None
    finally:
        s.close()


def test_describe_gives_the_facts_without_the_password(pg_url: str, pg_table: str) -> None:
    url = pg_url.replace("postgres@", "postgres:s3cret@")
    s = PostgresIdempotencyStore.from_url(url, table=pg_table)
    try:
        before = s.describe()
        assert before["kind"] == "postgres" and before["has_table"] is False
        claim(s, "k", "a")
        facts = s.describe()
        assert facts["table"] == pg_table and facts["has_table"] is True
        assert facts["schema_version"] == pg_sql.SCHEMA_VERSION
        assert facts["records"] == 1
        assert facts["server_version"].startswith(("1", "2"))
        assert facts["server_version"] == sql(pg_url, "SHOW server_version")[0][0]
        assert facts["fsync"] == sql(pg_url, "SHOW fsync")[0][0]
        assert facts["synchronous_commit"] == sql(pg_url, "SHOW synchronous_commit")[0][0]
        assert "s3cret" not in json.dumps(facts) and "s3cret" not in repr(s)
    finally:
        s.close()


def test_asyncio_run_returns_while_a_pool_connection_attempt_is_in_flight(
    pg_url: str, pg_table: str
) -> None:
    """``asyncio.run`` cancels the tasks its loop leaves behind and waits for them; the
    loop's pool must not leave a worker that swallows that cancellation (psycopg_pool's
    workers do, in the middle of a connection attempt) and wait forever for more work.
    Here every connection attempt stalls (a proxy holds the startup packet), so the
    pool's attempt is still in flight when the first loop ends; later loops connect."""
    from tests.support.faults import FaultProxy

    port = int(pg_url.rsplit(":", 1)[1].split("/", 1)[0])
    with FaultProxy(port) as proxy:
        url = pg_url.replace(f":{port}/", f":{proxy.port}/")
        store = PostgresIdempotencyStore.from_url(url, table=pg_table, timeout=0.5)
        proxy.add_rule(b"", "stall_request", times=None)  # every new connection stalls
        outcomes: list[object] = []

        async def read() -> None:
            try:
                outcomes.append(await store.aget("k"))
            except StoreUnavailableError as exc:
                outcomes.append(exc)

        def runs() -> None:
            asyncio.run(read())  # ends while the pool's connection attempt stalls
            proxy.clear_rules()
            asyncio.run(read())
            asyncio.run(read())

        runner = threading.Thread(target=runs, daemon=True)
        try:
            runner.start()
            runner.join(60)
            assert not runner.is_alive(), "asyncio.run hung cancelling the pool's tasks"
            stalled, *later = outcomes
            assert isinstance(stalled, StoreUnavailableError) and stalled.key == "k"
            assert later == [None, None]
        finally:
            store.close()


def test_each_ended_event_loop_leaves_no_connection_open_on_the_server(
    pg_url: str, pg_table: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A script calling ``asyncio.run`` again and again gets a pool per loop; the end of
    each loop closes its pool's connections (else the server runs out of them)."""
    # psycopg_pool logs a connection attempt the loop's end cancelled as a warning whose
    # exception holds that attempt's socket; pytest keeps log records until the test ends.
    caplog.set_level(logging.ERROR, logger="psycopg.pool")
    app = f"idem-loops-{pg_table}"
    store = PostgresIdempotencyStore.from_url(f"{pg_url}?application_name={app}", table=pg_table)

    def open_connections() -> int:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
            ).fetchone()
            assert row is not None
            return int(row[0])

    try:
        for i in range(6):
            assert asyncio.run(store.aget(f"k{i}")) is None
        deadline = time.monotonic() + 20
        while open_connections() and time.monotonic() < deadline:
            time.sleep(0.05)  # a backend exits a moment after its client closes
        assert open_connections() == 0
    finally:
        store.close()
