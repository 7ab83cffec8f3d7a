"""The in-memory store runs the shared store contract."""

from __future__ import annotations

import pytest

from langchain_idempotent.stores import InMemoryIdempotencyStore
from langchain_idempotent.testing import StoreContractTests


class TestInMemoryStore(StoreContractTests):
    @pytest.fixture
    def store(self) -> InMemoryIdempotencyStore:
        return InMemoryIdempotencyStore()
