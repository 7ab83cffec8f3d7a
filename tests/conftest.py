"""Shared fixtures: throwaway Redis servers (see ``tests/support/redis_servers.py``); and
what the default run leaves out.

**The default run** (``pytest`` with no path and no ``-m``) is the fast one: unit tests,
the store contract on every store, the graphs, the CLI. It leaves out the long suites,
each run by its own command (README, "Development"; ``.ci/run`` runs them all): the
directories in :data:`LONG_DIRS` (``pytest tests/faults``, ``pytest tests/peer``, ...)
and the tests marked with one of :data:`LONG_MARKERS` (``pytest -m "slow or server"``).
Naming a path (``pytest tests``, ``pytest tests/test_agent_server.py``) or passing ``-m``
runs what it names.

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
from langchain_idempotent.core.store import BaseIdempotencyStore
from langchain_idempotent.stores.redis import RedisIdempotencyStore
from langchain_idempotent.stores.sqlite import SqliteIdempotencyStore
from tests.support.redis_servers import RedisServer, redis_server_available

#: Directories under ``tests/`` that only their own command runs.
LONG_DIRS = ("faults", "peer", "torture")
#: Markers of the tests that only their own command runs: a real ``langgraph dev``
#: (``server``) or a long scenario (``slow``).
LONG_MARKERS = ("slow", "server")
_TESTS = Path(__file__).resolve().parent


def _default_run(config: pytest.Config) -> bool:
    """``pytest`` as typed: no path (pytest took ``testpaths``) and no ``-m``."""
    return config.args_source is pytest.Config.ArgsSource.TESTPATHS and not config.option.markexpr


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if _default_run(config) and collection_path.parent == _TESTS:
        return True if collection_path.name in LONG_DIRS else None
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _default_run(config):
        return
    long = [i for i in items if any(i.get_closest_marker(m) for m in LONG_MARKERS)]
    if long:
        config.hook.pytest_deselected(items=long)
        left_out = set(map(id, long))
        items[:] = [i for i in items if id(i) not in left_out]


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
