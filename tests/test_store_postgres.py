"""The PostgreSQL store: the shared contract, plus what only a server with SQL shows."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from langchain_idempotent.stores.postgres import PostgresIdempotencyStore
from langchain_idempotent.testing import StoreContractTests
from tests.support.postgres_fixtures import pg_server, pg_table, pg_url

__all__ = ["pg_server", "pg_table", "pg_url"]  # fixtures used by this module


class TestPostgresStoreContract(StoreContractTests):
    @pytest.fixture
    async def store(self, pg_url: str, pg_table: str) -> AsyncIterator[PostgresIdempotencyStore]:
        s = PostgresIdempotencyStore.from_url(pg_url, table=pg_table)
        yield s
        await s.aclose()
