"""The Redis store: the shared contract, plus what only Redis shows."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from langchain_idempotent.stores.redis import RedisIdempotencyStore
from langchain_idempotent.testing import StoreContractTests

pytestmark = pytest.mark.redis


class TestRedisStoreContract(StoreContractTests):
    @pytest.fixture
    async def store(
        self, redis_store: RedisIdempotencyStore
    ) -> AsyncIterator[RedisIdempotencyStore]:
        yield redis_store
