"""Transactional mode: the tool's writes and its completion record commit together.

A tool wrapped with ``transactional=True`` writes on ``get_idempotency_context().connection``
(a psycopg connection in an open transaction); the engine writes the completion in that
same transaction, and commits only while the run still owns the lease. Crash and pause
faults (SIGKILL, SIGSTOP) are in ``tests/faults/test_postgres.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from langchain_core.tools import tool

from langchain_idempotent import (
    InMemoryIdempotencyStore,
    get_idempotency_context,
    idempotency_scope,
    idempotent,
)
from langchain_idempotent.core.record import State
from langchain_idempotent.errors import LeaseLostError
from langchain_idempotent.stores.postgres import PostgresIdempotencyStore
from tests.support.postgres_fixtures import pg_server, pg_table, pg_url

__all__ = ["pg_server", "pg_table", "pg_url"]


class Declined(Exception):
    """A terminal failure of the credit tool."""


@pytest.fixture
def accounts(pg_url: str, pg_table: str) -> Iterator[str]:
    """A fresh ``credits`` table (named after the test's records table)."""
    name = f"{pg_table}_credits"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (account text NOT NULL, amount int NOT NULL)")
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {name}")


@pytest.fixture
async def store(pg_url: str, pg_table: str) -> AsyncIterator[PostgresIdempotencyStore]:
    s = PostgresIdempotencyStore.from_url(pg_url, table=pg_table)
    yield s
    await s.aclose()


def credits(url: str, table: str) -> list[tuple[str, int]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [(a, n) for a, n in conn.execute(f"SELECT account, amount FROM {table}")]


def credit_tool(table: str, *, fail: list[BaseException] | None = None, runs: list[str]) -> Any:
    @tool
    def credit(account: str, amount: int) -> str:
        """Credit an account."""
        ctx = get_idempotency_context()
        assert ctx is not None and isinstance(ctx.connection, psycopg.Connection)
        ctx.connection.execute(f"INSERT INTO {table} VALUES (%s, %s)", (account, amount))
        runs.append(account)
        if fail:
            raise fail.pop(0)
        return f"credited {amount} to {account}"

    return credit


def test_the_tools_writes_commit_with_the_record_and_a_retry_replays(
    store: PostgresIdempotencyStore, accounts: str, pg_url: str
) -> None:
    runs: list[str] = []
    wrapped = idempotent(credit_tool(accounts, runs=runs), store, transactional=True)
    with idempotency_scope("order-1"):
        first = wrapped.invoke({"account": "A", "amount": 5})
        again = wrapped.invoke({"account": "A", "amount": 5})
    assert first == again == "credited 5 to A"
    assert runs == ["A"]
    assert credits(pg_url, accounts) == [("A", 5)]
    [rec] = store.list()
    assert rec.state is State.COMPLETED


def test_a_retryable_error_rolls_the_writes_back_and_the_retry_commits_once(
    store: PostgresIdempotencyStore, accounts: str, pg_url: str
) -> None:
    runs: list[str] = []
    fail: list[BaseException] = [RuntimeError("network blip")]
    wrapped = idempotent(credit_tool(accounts, fail=fail, runs=runs), store, transactional=True)
    with idempotency_scope("order-1"):
        with pytest.raises(RuntimeError, match="network blip"):
            wrapped.invoke({"account": "A", "amount": 5})
        assert credits(pg_url, accounts) == []
        assert wrapped.invoke({"account": "A", "amount": 5}) == "credited 5 to A"
    assert runs == ["A", "A"]
    assert credits(pg_url, accounts) == [("A", 5)]


def test_a_terminal_error_rolls_the_writes_back_and_is_recorded_and_replayed(
    store: PostgresIdempotencyStore, accounts: str, pg_url: str
) -> None:
    runs: list[str] = []
    fail: list[BaseException] = [Declined("card declined")]
    wrapped = idempotent(
        credit_tool(accounts, fail=fail, runs=runs),
        store,
        transactional=True,
        terminal_exceptions=(Declined,),
    )
    with idempotency_scope("order-1"):
        for _ in range(2):
            with pytest.raises(Declined, match="card declined"):
                wrapped.invoke({"account": "A", "amount": 5})
    assert runs == ["A"]
    assert credits(pg_url, accounts) == []
    [rec] = store.list()
    assert rec.state is State.FAILED


def test_a_run_superseded_before_its_commit_rolls_back_and_records_nothing(
    store: PostgresIdempotencyStore, accounts: str, pg_url: str, pg_table: str
) -> None:
    @tool
    def credit(account: str, amount: int) -> str:
        """Credit an account, while another worker takes the call over."""
        ctx = get_idempotency_context()
        assert ctx is not None
        ctx.connection.execute(f"INSERT INTO {accounts} VALUES (%s, %s)", (account, amount))
        with psycopg.connect(pg_url, autocommit=True) as other:  # a takeover elsewhere
            other.execute(
                f"UPDATE {pg_table} SET owner = 'other-worker', fence = fence + 1 WHERE key = %s",
                (ctx.key,),
            )
        return "credited"

    wrapped = idempotent(credit, store, transactional=True)
    with idempotency_scope("order-1"), pytest.raises(LeaseLostError, match="rolled back"):
        wrapped.invoke({"account": "A", "amount": 5})
    assert credits(pg_url, accounts) == []
    [rec] = store.list()
    assert (rec.state, rec.owner, rec.fence) == (State.RUNNING, "other-worker", 2)


async def test_an_async_tool_gets_an_async_connection_and_commits_with_the_record(
    store: PostgresIdempotencyStore, accounts: str, pg_url: str
) -> None:
    runs: list[str] = []

    @tool
    async def credit(account: str, amount: int) -> str:
        """Credit an account."""
        ctx = get_idempotency_context()
        assert ctx is not None and isinstance(ctx.connection, psycopg.AsyncConnection)
        await ctx.connection.execute(f"INSERT INTO {accounts} VALUES (%s, %s)", (account, amount))
        runs.append(account)
        return f"credited {amount}"

    wrapped = idempotent(credit, store, transactional=True)
    with idempotency_scope("order-1"):
        assert await wrapped.ainvoke({"account": "A", "amount": 5}) == "credited 5"
        assert await wrapped.ainvoke({"account": "A", "amount": 5}) == "credited 5"
    assert runs == ["A"]
    assert credits(pg_url, accounts) == [("A", 5)]


def test_without_transactional_mode_the_context_has_no_connection(
    store: PostgresIdempotencyStore,
) -> None:
    seen: list[Any] = []

    @tool
    def probe(x: int) -> int:
        """Look at the context."""
        ctx = get_idempotency_context()
        assert ctx is not None
        seen.append(ctx.connection)
        return x

    with idempotency_scope("s"):
        assert idempotent(probe, store).invoke({"x": 1}) == 1
    assert seen == [None]


def test_transactional_mode_is_refused_on_a_store_without_transactions() -> None:
    @tool
    def noop(x: int) -> int:
        """Nothing."""
        return x

    with pytest.raises(ValueError, match=r"transactional=True needs .*InMemoryIdempotencyStore"):
        idempotent(noop, InMemoryIdempotencyStore(), transactional=True)


def test_only_a_store_that_opens_transactions_is_a_transactional_store(
    pg_url: str, pg_table: str
) -> None:
    from langchain_idempotent.core._transactional import TransactionalStore, check_store
    from langchain_idempotent.stores.memory import InMemoryIdempotencyStore

    store = PostgresIdempotencyStore.from_url(pg_url, table=pg_table)
    try:
        assert check_store(store) is store and isinstance(store, TransactionalStore)
    finally:
        store.close()
    with pytest.raises(ValueError, match="InMemoryIdempotencyStore cannot"):
        check_store(InMemoryIdempotencyStore())
