"""Shared fixtures: throwaway Redis servers (see ``tests/support/redis_servers.py``).

Tests never touch a Redis they did not start: ``redis_server`` is one ``redis-server`` on
a free loopback port for the whole session, and ``redis_store`` gives each test a store
with its own key prefix on it; ``any_store`` runs a test on memory, SQLite and Redis.
Tests that need a server skip, with the reason, when ``redis-server`` is not on PATH.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from langchain_idempotent import InMemoryIdempotencyStore
from langchain_idempotent.stores.base import BaseIdempotencyStore
from langchain_idempotent.stores.redis import RedisIdempotencyStore
from langchain_idempotent.stores.sqlite import SqliteIdempotencyStore
from tests.support.redis_servers import RedisServer, redis_server_available


def _require_redis() -> None:
    if not redis_server_available():
        pytest.skip("redis-server is not on PATH (install redis-server to run Redis tests)")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One throwaway ``redis-server`` for the session (killed and removed afterwards)."""
    _require_redis()
    server = RedisServer()
    yield server
    server.close()


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix no other test uses."""
    return f"test-{uuid.uuid4().hex[:12]}:"


@pytest.fixture
async def redis_store(
    redis_server: RedisServer, redis_prefix: str
) -> AsyncIterator[RedisIdempotencyStore]:
    """A ``RedisIdempotencyStore.from_url`` on ``redis_server`` with a fresh prefix.

    Async so that its teardown closes the async client on the test's own event loop.
    """
    store = RedisIdempotencyStore.from_url(redis_server.url, prefix=redis_prefix)
    yield store
    await store.aclose()


@pytest.fixture(params=["memory", "sqlite", "redis"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BaseIdempotencyStore]:
    """The same test on each store: in memory, SQLite in a temporary file, and Redis
    (``redis_store``; skipped without ``redis-server``). For ``async def`` tests."""
    if request.param == "memory":
        yield InMemoryIdempotencyStore()
    elif request.param == "sqlite":
        store = SqliteIdempotencyStore(str(tmp_path / "records.db"))
        yield store
        store.close()
    else:
        yield request.getfixturevalue("redis_store")
