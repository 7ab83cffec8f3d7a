"""``wait_timeout=None``: a duplicate waits as long as the owner keeps renewing its lease,
and no longer than that lease once the owner is gone."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from datetime import timedelta

import pytest

from langchain_idempotent import (
    IdempotencyEvent,
    InMemoryIdempotencyStore,
    InProgressError,
    OutcomeUnknownError,
    Policy,
)
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.store import ClaimRequest


def test_wait_timeout_none_means_no_deadline_and_other_values_are_unchanged() -> None:
    assert Policy(wait_timeout=None).wait_timeout_s == math.inf
    assert Policy(wait_timeout=math.inf).wait_timeout_s == math.inf
    assert Policy(wait_timeout=timedelta(seconds=2)).wait_timeout_s == 2
    assert Policy().wait_timeout_s == 60
    with pytest.raises(ValueError, match="wait_timeout"):
        Policy(wait_timeout=-1)


def _owner_runs_for(engine: Engine, seconds: float, runs: list[str]) -> threading.Thread:
    def act() -> str:
        runs.append("owner")
        time.sleep(seconds)
        return "refunded"

    thread = threading.Thread(
        target=engine.run, args=("k",), kwargs={"fingerprint": "f", "action": act}
    )
    thread.start()
    return thread


def _wait_claimed(store: InMemoryIdempotencyStore) -> None:
    deadline = time.monotonic() + 5
    while store.get("k") is None:
        assert time.monotonic() < deadline, "the owner never claimed"
        time.sleep(0.005)


def test_a_duplicate_waits_past_many_leases_while_the_owner_renews_and_gets_its_result() -> None:
    store = InMemoryIdempotencyStore()
    owner = Engine(store, Policy(lease=0.3))  # renewed every 0.1 s
    runs: list[str] = []
    thread = _owner_runs_for(owner, 1.5, runs)  # five leases long
    _wait_claimed(store)
    events: list[IdempotencyEvent] = []
    waiter = Engine(store, Policy(lease=0.3, wait_timeout=None), on_event=events.append)
    result = waiter.run("k", fingerprint="f", action=lambda: runs.append("waiter") or "ran")
    thread.join()
    assert result == "refunded"
    assert runs == ["owner"]
    assert [e.kind for e in events] == ["wait", "replay"]


def test_a_finite_wait_timeout_gives_up_on_the_same_long_renewed_owner() -> None:
    store = InMemoryIdempotencyStore()
    runs: list[str] = []
    thread = _owner_runs_for(Engine(store, Policy(lease=0.3)), 1.5, runs)
    _wait_claimed(store)
    waiter = Engine(store, Policy(lease=0.3, wait_timeout=0.5))
    with pytest.raises(InProgressError):
        waiter.run("k", fingerprint="f", action=lambda: "ran")
    thread.join()
    assert runs == ["owner"]


def test_an_owner_that_died_holds_an_unbounded_waiter_only_until_its_lease_expires() -> None:
    store = InMemoryIdempotencyStore()
    # A dead owner: it claimed and will never renew, complete or release.
    store.claim(ClaimRequest("k", owner="dead", fingerprint="f", lease_ms=400, ttl_ms=60_000))
    events: list[IdempotencyEvent] = []
    waiter = Engine(store, Policy(lease=5, wait_timeout=None), on_event=events.append)
    started = time.monotonic()
    assert waiter.run("k", fingerprint="f", action=lambda: "ran") == "ran"
    assert time.monotonic() - started < 3  # bounded by the dead owner's 0.4 s lease
    assert [e.kind for e in events] == ["wait", "takeover", "complete"]


def test_an_unbounded_waiter_raises_outcome_unknown_after_a_dead_owner_when_told_to() -> None:
    store = InMemoryIdempotencyStore()
    store.claim(ClaimRequest("k", owner="dead", fingerprint="f", lease_ms=300, ttl_ms=60_000))
    waiter = Engine(store, Policy(lease=5, wait_timeout=None, on_expired="raise"))
    with pytest.raises(OutcomeUnknownError):
        waiter.run("k", fingerprint="f", action=lambda: "ran")


async def test_the_async_path_waits_while_the_owner_renews() -> None:
    store = InMemoryIdempotencyStore()
    owner = Engine(store, Policy(lease=0.3))
    runs: list[str] = []

    async def act() -> str:
        runs.append("owner")
        await asyncio.sleep(1.2)
        return "refunded"

    async def duplicate() -> str:
        runs.append("waiter")
        return "ran"

    first = asyncio.create_task(owner.arun("k", fingerprint="f", action=act))
    while store.get("k") is None:
        await asyncio.sleep(0.005)
    waiter = Engine(store, Policy(lease=0.3, wait_timeout=None))
    assert await waiter.arun("k", fingerprint="f", action=duplicate) == "refunded"
    assert await first == "refunded"
    assert runs == ["owner"]
