"""Pytest fixtures for PostgreSQL tests: one throwaway cluster per session.

Import them into a test module (``from tests.support.postgres_fixtures import
pg_server, pg_url``). ``IDEMPOTENCY_TEST_PG_URL`` names an existing server to use instead
(tests that must stop or restart the server skip then). Without the PostgreSQL binaries
the tests skip with the reason.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from .postgres_server import PostgresServer, postgres_unavailable_reason

__all__ = ["pg_server", "pg_table", "pg_url"]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer | None]:
    """The session's throwaway cluster (``None`` when ``IDEMPOTENCY_TEST_PG_URL`` is set)."""
    if os.environ.get("IDEMPOTENCY_TEST_PG_URL"):
        yield None
        return
    reason = postgres_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    server = PostgresServer()
    yield server
    server.close()


@pytest.fixture(scope="session")
def pg_url(pg_server: PostgresServer | None) -> str:
    return os.environ.get("IDEMPOTENCY_TEST_PG_URL") or pg_server.url  # type: ignore[union-attr]


@pytest.fixture
def pg_table() -> str:
    """A table name no other test uses."""
    return f"idem_{uuid.uuid4().hex[:12]}"
