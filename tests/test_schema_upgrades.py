"""Every layout an earlier build left in a database upgrades in place, keeps its completed
records, and then decides as today's code does: the docs/effects.md sequence (A enters its
block and dies, B takes over and dies before its block, C runs with ``reconcile=``) makes
1 refund and asks the hook once. A table of a newer version is refused, without advice to
delete anything.

The layouts are tests/fixtures/schema_history/ (each earlier build's own ``setup()`` run and
dumped by ``python -m tests.fixtures.schema_history.recover``): PostgreSQL versions 2, 3
and 4 of the pre-release builds (3 twice: before and after 3 and 4 were folded) and
version 1 as it was edited in place (before the side-effect mark, with the mark, with the
takeover that keeps its mark, with the single claim INSERT, both), then today's version 5;
SQLite versions 1 and 2.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from langchain_idempotent import Policy, StoreUnavailableError
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.stores.postgres import PostgresIdempotencyStore
from langchain_idempotent.stores.postgres import _sql as pg_sql
from langchain_idempotent.stores.sqlite import _schema as sqlite_schema
from tests.support.effects_sequence import run_sequence
from tests.support.postgres_fixtures import pg_server, pg_url
from tests.support.redis_servers import RedisServer

__all__ = ["pg_server", "pg_url"]  # fixtures used by this module

HISTORY = Path(__file__).resolve().parent / "fixtures" / "schema_history"
PG_LAYOUTS = sorted(p.name for p in (HISTORY / "postgres").glob("*.sql"))
SQLITE_LAYOUTS = sorted(p.name for p in (HISTORY / "sqlite").glob("*.sql"))
#: The layout today's code sets up (the last one recovered); the others are earlier.
PG_CURRENT = PG_LAYOUTS[-1]
#: Version 1 with the side-effect mark but the claim function from before a takeover kept
#: the mark it found (built on the stores-split branch, c805211): the one whose claim
#: function answers C with a free retry.
PG_FORGETFUL = next(n for n in PG_LAYOUTS if "c805211" in n)


def _kept(store: object) -> str:
    """The completed record each layout's own build wrote replays without running."""
    ran: list[int] = []
    value = Engine(store, Policy()).run(  # type: ignore[arg-type]
        "kept-receipt", fingerprint="fp-kept", action=lambda: ran.append(1) or "ran again"
    )
    assert ran == [], "a completed record of the earlier build ran again"
    return str(value)


# -- PostgreSQL ------------------------------------------------------------------------------


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    """A database of its own (each layout has its own ``langchain_idempotent_schema``)."""
    name = f"up_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield pg_url.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def _load_pg(url: str, layout: str, table: str) -> None:
    dump = (HISTORY / "postgres" / layout).read_text().replace("__TABLE__", table)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(dump)  # type: ignore[arg-type]  # the recorded DDL, several statements
        conn.execute(f"UPDATE public.{table} SET expires_at = expires_at + 10::bigint ^ 12")


def _pg(url: str, query: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def _functions(url: str, table: str) -> list[tuple[object, ...]]:
    return _pg(
        url,
        "SELECT proname::text, oid FROM pg_proc WHERE proname IN (%s, %s) ORDER BY 1",
        f"{table}_claim",
        f"{table}_complete",
    )


def test_the_history_holds_every_postgres_layout_and_todays_is_the_last() -> None:
    versions = [re.search(r"-v(\d+)\.sql$", n).group(1) for n in PG_LAYOUTS]  # type: ignore[union-attr]
    assert versions == [
        "2",
        "2",
        "3",
        "4",
        "3",
        "1",
        "1",
        "1",
        "1",
        "1",
        "2",
        "5",
        "1",
        "2",
        "5",
    ], PG_LAYOUTS
    current = (HISTORY / "postgres" / PG_CURRENT).read_text()
    for statement in pg_sql._SCHEMA.split("\n;;\n"):
        if "CREATE OR REPLACE FUNCTION" in statement:
            _, body, _ = statement.split("$fn$")
            body = body.replace("{t}", "__TABLE__").format(
                now=pg_sql._NOW, version=1, abandoned=pg_sql._ABANDONED_OWNERS
            )
            assert body in current, "today's function differs from the last recorded layout"


@pytest.mark.parametrize("layout", PG_LAYOUTS)
def test_every_postgres_layout_upgrades_in_place_and_then_decides_as_today(
    database: str, layout: str, tmp_path: Path
) -> None:
    table = "idem_up"
    _load_pg(database, layout, table)
    store = PostgresIdempotencyStore.from_url(database, table=table)
    try:
        assert _kept(store) == "refunded 140"  # auto_setup upgraded it first
    finally:
        store.close()
    assert _pg(database, "SELECT version FROM langchain_idempotent_schema") == [(5,)]
    before = _functions(database, table)
    assert [name for name, _ in before] == [f"{table}_claim", f"{table}_complete"]
    again = PostgresIdempotencyStore.from_url(database, table=table)
    again.setup()  # a current table: nothing re-created
    again.close()
    assert _functions(database, table) == before

    done = run_sequence("postgres", database, table, tmp_path / "ledger")
    assert done.refunds == ["A"], f"{layout}: {len(done.refunds)} refunds"
    assert done.asked == 1
    assert done.result == "refunded 140"


def test_without_the_upgrade_a_forgetful_claim_function_refunds_twice(
    database: str, tmp_path: Path
) -> None:
    """The failure the upgrade prevents: the same sequence on the kept old claim function
    (every worker with ``auto_setup=False``, as every setup() before this fix left it)."""
    table = "idem_old"
    _load_pg(database, PG_FORGETFUL, table)
    done = run_sequence("postgres", database, table, tmp_path / "ledger", setup=False)
    assert done.refunds == ["A", "C"] and done.asked == 0


def test_a_table_of_a_newer_version_is_refused_without_advice_to_delete_records(
    database: str,
) -> None:
    table = "idem_new"
    _load_pg(database, PG_CURRENT, table)
    _pg(database, "UPDATE langchain_idempotent_schema SET version = 6")
    store = PostgresIdempotencyStore.from_url(database, table=table)
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            store.setup()
    finally:
        store.close()
    message = str(caught.value)
    assert "newer langchain-idempotent (schema version 6" in message
    assert "Upgrade langchain-idempotent" in message
    assert "drop()" not in message and "Keep the table" in message


def test_versions_two_three_and_four_of_the_pre_release_builds_are_older_not_newer() -> None:
    q = pg_sql._Queries("idem_x")
    for stored in (1, 2, 3, 4):
        assert q.upgrade(stored, [])[-1] == (q.write_version, ("idem_x", pg_sql.SCHEMA_VERSION))


# -- Redis -----------------------------------------------------------------------------------

REDIS_SCRIPTS = sorted((HISTORY / "redis").glob("*.lua"))
#: The claim script from before a takeover kept the mark it found.
REDIS_FORGETFUL = next(p for p in REDIS_SCRIPTS if "696aefc" in p.name)


def test_every_earlier_claim_script_has_another_sha_than_todays() -> None:
    from langchain_idempotent.stores.redis._scripts import _CLAIM_SCRIPT

    assert _CLAIM_SCRIPT.sha == hashlib.sha1(_CLAIM_SCRIPT.source.encode()).hexdigest()
    assert REDIS_SCRIPTS[-1].read_text() == _CLAIM_SCRIPT.source  # the history ends today
    for path in REDIS_SCRIPTS[:-1]:
        assert hashlib.sha1(path.read_bytes()).hexdigest() != _CLAIM_SCRIPT.sha, path.name


def test_a_server_holding_every_older_claim_script_runs_todays(
    redis_server: RedisServer, redis_prefix: str, tmp_path: Path
) -> None:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    for path in REDIS_SCRIPTS[:-1]:  # as a server that earlier builds talked to holds them
        sha = client.script_load(path.read_text())
        assert path.name.split("-claim-")[1].startswith(sha[:12])
    client.close()
    done = run_sequence("redis", redis_server.url, redis_prefix, tmp_path / "ledger")
    assert done.refunds == ["A"] and done.asked == 1 and done.result == "refunded 140"


def test_the_older_claim_script_itself_would_refund_twice(
    redis_server: RedisServer, redis_prefix: str, tmp_path: Path
) -> None:
    """What a store that kept calling the older script by its SHA would do."""
    done = run_sequence(
        "redis",
        redis_server.url,
        redis_prefix,
        tmp_path / "ledger",
        claim_lua=str(REDIS_FORGETFUL),
    )
    assert done.refunds == ["A", "C"] and done.asked == 0


# -- SQLite ----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", SQLITE_LAYOUTS)
def test_every_sqlite_layout_upgrades_in_place_and_then_decides_as_today(
    layout: str, tmp_path: Path
) -> None:
    path = tmp_path / "records.db"
    with sqlite3.connect(path) as db:
        db.executescript((HISTORY / "sqlite" / layout).read_text())
        db.execute("UPDATE idempotency_records SET expires_at = expires_at + 1000000000000")
    db.close()
    from langchain_idempotent import SqliteIdempotencyStore

    store = SqliteIdempotencyStore(str(path))
    try:
        assert _kept(store) == "refunded 140"
    finally:
        store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version FROM langchain_idempotent_schema").fetchall() == [
            (sqlite_schema.SCHEMA_VERSION,)
        ]
    db.close()
    done = run_sequence("sqlite", str(path), "idempotency_records", tmp_path / "ledger")
    assert done.refunds == ["A"] and done.asked == 1 and done.result == "refunded 140"


@pytest.mark.parametrize("layout", [n for n in PG_LAYOUTS if n.endswith("-v1.sql")][-1:])
def test_an_upgraded_version_1_table_names_an_error_abandons_exception_type(
    database: str, layout: str
) -> None:
    """The last version-1 layout, upgraded by setup(): its claim function now passes on
    the type of the exception an error after the side effect began was abandoned with."""
    from langchain_idempotent.core.record import ClaimOutcome
    from langchain_idempotent.core.store import ClaimRequest, Held

    table = "idem_err"
    _load_pg(database, layout, table)
    store = PostgresIdempotencyStore.from_url(database, table=table)
    try:
        first = store.claim(ClaimRequest("k", "a", "fp", lease_ms=60_000, ttl_ms=60_000))
        assert store.abandon(Held("k", "a", first.fence), "error", "httpx.ReadTimeout")
        taken = store.claim(ClaimRequest("k", "b", "fp", lease_ms=60_000, ttl_ms=60_000))
        assert (taken.outcome, taken.reason, taken.error_type) == (
            ClaimOutcome.TAKEOVER,
            "error",
            "httpx.ReadTimeout",
        )
    finally:
        store.close()
