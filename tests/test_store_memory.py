"""The in-memory store runs the shared store contract, on its own injectable clock."""

from __future__ import annotations

import pytest

from langchain_idempotent.core.record import Claim, ClaimOutcome
from langchain_idempotent.core.store import ClaimRequest, CompleteRequest
from langchain_idempotent.stores import InMemoryIdempotencyStore
from langchain_idempotent.testing import FakeClock, StoreContractTests


class TestInMemoryStore(StoreContractTests):
    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock(ticking=True)

    @pytest.fixture
    def store(self, clock: FakeClock) -> InMemoryIdempotencyStore:
        return InMemoryIdempotencyStore(clock=clock)


def test_leases_and_retention_follow_the_stores_clock_not_the_wall_clock() -> None:
    clock = FakeClock()
    store = InMemoryIdempotencyStore(clock=clock)

    def claim(owner: str) -> Claim:
        return store.claim(
            ClaimRequest("k", owner=owner, fingerprint="fp", lease_ms=1_000, ttl_ms=5_000)
        )

    assert claim("a").outcome is ClaimOutcome.ACQUIRED
    clock.now += 0.999
    busy = claim("b")
    assert (busy.outcome, busy.retry_after_ms) == (ClaimOutcome.BUSY, 1)
    clock.now += 0.001
    taken = claim("b")
    assert (taken.outcome, taken.fence) == (ClaimOutcome.TAKEOVER, 2)
    store.complete(
        CompleteRequest(
            "k", owner="b", fence=2, fingerprint="fp", payload=b"r", failed=False, ttl_ms=5_000
        )
    )
    clock.now += 4.999
    assert store.get("k") is not None
    clock.now += 0.001
    assert store.get("k") is None
    assert store.list() == []
