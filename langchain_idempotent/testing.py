"""The store contract: one test suite that every idempotency store runs.

Every store — the three shipped here and any you write — must give the answers of
:mod:`langchain_idempotent.protocol` through both its sync and its ``a``-prefixed async
operations. :class:`StoreContractTests` checks that with explicit tests for each guarantee
(replay, mismatch, busy, owned, takeover, expired, release, renew, write-once completion,
stale owners, TTL, get/list/delete/purge, watch, concurrency, large payloads, odd keys)
and with a model-based property test that runs random operation sequences against the
store and against a pure model built from the protocol functions, asserting identical
answers.

Besides the decision table, the suite holds every store to these rules:

- time is the store's clock, in milliseconds; ``lease_until = now + lease_ms`` and a lease
  ending exactly now has expired;
- a record expires ``ttl_ms`` after the write that set it, but never while its lease is
  live (a TTL shorter than the lease must not let a second caller in);
- ``watch``/``awatch`` return within ``wake_latency_s`` of a completion or release made by
  another thread, task or process; at once when the record is absent, done or at another
  fence; by the lease deadline when nobody finishes; by ``timeout`` otherwise — and not
  before, while nothing changed (a waiter must not spin);
- claims and completions racing from many threads or tasks are serialised: one winner;
- payloads are opaque bytes (``b""`` and 1 MiB included); keys are any ``str``.

Use it from your own test module (needs ``pytest``, ``pytest-asyncio`` and ``hypothesis``)::

    import uuid
    from collections.abc import Iterator

    import pytest

    from langchain_idempotent.testing import StoreContractTests
    from my_package import MyIdempotencyStore


    class TestMyStore(StoreContractTests):
        @pytest.fixture
        def store(self) -> Iterator[MyIdempotencyStore]:
            s = MyIdempotencyStore(prefix=f"test-{uuid.uuid4().hex}:")
            yield s
            s.close()

Timing tests use short leases and the store's own clock; tune ``short_lease_ms``,
``wake_latency_s`` and ``late_return_s`` on the subclass if a backend is slower.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .protocol import decide_claim, decide_complete, decide_release, decide_renew
from .record import FORMAT_VERSION, Claim, ClaimOutcome, Completion, ExpiredPolicy, Record, State
from .stores.base import BaseIdempotencyStore

__all__ = ["StoreContractTests"]

#: A lease that never expires during a test.
LONG_MS = 60_000
#: A retention that never expires during a test.
TTL_MS = 3_600_000
FP = "fp-args-1"
OTHER_FP = "fp-args-2"


def _key(label: str = "k") -> str:
    return f"{label}-{uuid.uuid4().hex}"


def _claim(
    store: BaseIdempotencyStore,
    key: str,
    owner: str,
    *,
    fingerprint: str = FP,
    lease_ms: int = LONG_MS,
    ttl_ms: int = TTL_MS,
    on_expired: ExpiredPolicy = "takeover",
    meta: Mapping[str, str] | None = None,
) -> Claim:
    return store.claim(
        key,
        owner=owner,
        fingerprint=fingerprint,
        lease_ms=lease_ms,
        ttl_ms=ttl_ms,
        on_expired=on_expired,
        meta=meta,
    )


async def _aclaim(
    store: BaseIdempotencyStore,
    key: str,
    owner: str,
    *,
    fingerprint: str = FP,
    lease_ms: int = LONG_MS,
    ttl_ms: int = TTL_MS,
    on_expired: ExpiredPolicy = "takeover",
    meta: Mapping[str, str] | None = None,
) -> Claim:
    return await store.aclaim(
        key,
        owner=owner,
        fingerprint=fingerprint,
        lease_ms=lease_ms,
        ttl_ms=ttl_ms,
        on_expired=on_expired,
        meta=meta,
    )


def _complete(
    store: BaseIdempotencyStore,
    key: str,
    owner: str,
    fence: int,
    payload: bytes,
    *,
    failed: bool = False,
    ttl_ms: int = TTL_MS,
    meta: Mapping[str, str] | None = None,
) -> Completion:
    return store.complete(
        key,
        owner=owner,
        fence=fence,
        fingerprint=FP,
        payload=payload,
        failed=failed,
        ttl_ms=ttl_ms,
        meta=meta,
    )


async def _acomplete(
    store: BaseIdempotencyStore,
    key: str,
    owner: str,
    fence: int,
    payload: bytes,
    *,
    failed: bool = False,
    ttl_ms: int = TTL_MS,
    meta: Mapping[str, str] | None = None,
) -> Completion:
    return await store.acomplete(
        key,
        owner=owner,
        fence=fence,
        fingerprint=FP,
        payload=payload,
        failed=failed,
        ttl_ms=ttl_ms,
        meta=meta,
    )


def _require(rec: Record | None) -> Record:
    assert rec is not None, "expected a record"
    return rec


class StoreContractTests:
    """The guarantees every :class:`BaseIdempotencyStore` gives, sync and async.

    Subclass it (with a ``Test`` prefix so pytest collects it) and provide a
    function-scoped ``store`` fixture that yields a fresh, isolated store — for a server
    store, one with a unique key prefix so parallel runs never see each other::

        class TestSqliteStore(StoreContractTests):
            @pytest.fixture
            def store(self, tmp_path: Path) -> Iterator[SqliteIdempotencyStore]:
                s = SqliteIdempotencyStore(tmp_path / "idem.sqlite")
                yield s
                s.close()

    Async tests are marked ``pytest.mark.asyncio`` and run on a function-scoped loop.
    """

    #: A lease (and TTL) short enough to expire during a test, long enough to outlast the
    #: round trips made while it must still be live.
    short_lease_ms: ClassVar[int] = 150
    #: How late a watcher may return after the completion or release that should wake it.
    wake_latency_s: ClassVar[float] = 0.25
    #: How late a watch may return after its timeout or the lease deadline, or when there
    #: is nothing to wait for: generous, as it only tells a bounded wait from a hang.
    late_return_s: ClassVar[float] = 1.0
    #: Examples per run of the model-based property tests.
    model_examples: ClassVar[int] = 50

    def _sleep_past_lease(self) -> None:
        time.sleep(self.short_lease_ms / 1000 + 0.05)

    async def _asleep_past_lease(self) -> None:
        await asyncio.sleep(self.short_lease_ms / 1000 + 0.05)

    # -- claim: absent, replay, mismatch ----------------------------------------------

    def test_a_first_claim_acquires_fence_1_attempt_1(self, store: BaseIdempotencyStore) -> None:
        key = _key()
        claim = _claim(store, key, "a")
        assert claim.outcome is ClaimOutcome.ACQUIRED
        assert (claim.fence, claim.attempt) == (1, 1)
        assert claim.outcome.runs

    @pytest.mark.asyncio
    async def test_a_first_async_claim_acquires_fence_1_attempt_1(
        self, store: BaseIdempotencyStore
    ) -> None:
        claim = await _aclaim(store, _key(), "a")
        assert claim.outcome is ClaimOutcome.ACQUIRED
        assert (claim.fence, claim.attempt) == (1, 1)

    @pytest.mark.parametrize(
        "payload", [b"", b"0", b"\x00\xff\x00binary", '{"é": "✓"}'.encode()], ids=repr
    )
    @pytest.mark.parametrize("failed", [False, True], ids=["completed", "failed"])
    def test_a_done_key_replays_exactly_the_stored_bytes_and_failed_flag(
        self, store: BaseIdempotencyStore, payload: bytes, failed: bool
    ) -> None:
        key = _key()
        c = _claim(store, key, "a")
        _complete(store, key, "a", c.fence, payload, failed=failed)
        for owner in ("a", "b"):
            replay = _claim(store, key, owner)
            assert replay.outcome is ClaimOutcome.REPLAY
            assert replay.payload == payload
            assert type(replay.payload) is bytes
            assert replay.failed is failed
            assert (replay.fence, replay.attempt) == (1, 1)
            assert not replay.outcome.runs

    @pytest.mark.asyncio
    @pytest.mark.parametrize("failed", [False, True], ids=["completed", "failed"])
    async def test_a_done_key_replays_exactly_the_stored_bytes_async(
        self, store: BaseIdempotencyStore, failed: bool
    ) -> None:
        key = _key()
        c = await _aclaim(store, key, "a")
        await _acomplete(store, key, "a", c.fence, b"", failed=failed)
        replay = await _aclaim(store, key, "b")
        assert replay.outcome is ClaimOutcome.REPLAY
        assert replay.payload == b""
        assert replay.failed is failed

    @pytest.mark.parametrize("state", ["running", "expired", "free", "completed", "failed"])
    def test_another_fingerprint_is_a_mismatch_in_every_state_and_writes_nothing(
        self, store: BaseIdempotencyStore, state: str
    ) -> None:
        key = _key()
        lease = self.short_lease_ms if state == "expired" else LONG_MS
        c = _claim(store, key, "a", lease_ms=lease)
        if state == "expired":
            self._sleep_past_lease()
        elif state == "free":
            assert store.release(key, owner="a", fence=c.fence)
        elif state in ("completed", "failed"):
            _complete(store, key, "a", c.fence, b"result", failed=state == "failed")
        before = _require(store.get(key))
        for owner in ("a", "b"):
            for policy in ("takeover", "raise"):
                m = _claim(store, key, owner, fingerprint=OTHER_FP, on_expired=policy)  # type: ignore[arg-type]
                assert m.outcome is ClaimOutcome.MISMATCH
                assert not m.outcome.runs
                assert m.payload is None
        assert store.get(key) == before

    @pytest.mark.asyncio
    async def test_another_fingerprint_is_a_mismatch_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = await _aclaim(store, key, "a")
        assert (await _aclaim(store, key, "b", fingerprint=OTHER_FP)).outcome is (
            ClaimOutcome.MISMATCH
        )
        await _acomplete(store, key, "a", c.fence, b"r")
        m = await _aclaim(store, key, "b", fingerprint=OTHER_FP)
        assert m.outcome is ClaimOutcome.MISMATCH
        assert m.payload is None

    # -- claim: busy, owned, takeover, expired ----------------------------------------

    def test_a_live_lease_of_another_owner_is_busy_with_the_time_left(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = _claim(store, key, "a", lease_ms=5_000)
        busy = _claim(store, key, "b", lease_ms=5_000)
        assert busy.outcome is ClaimOutcome.BUSY
        assert not busy.outcome.runs
        assert 0 < busy.retry_after_ms <= 5_000
        assert busy.fence == c.fence
        rec = _require(store.get(key))
        assert (rec.owner, rec.fence, rec.attempt) == ("a", 1, 1)

    @pytest.mark.asyncio
    async def test_a_live_lease_of_another_owner_is_busy_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        await _aclaim(store, key, "a", lease_ms=5_000)
        busy = await _aclaim(store, key, "b", lease_ms=5_000)
        assert busy.outcome is ClaimOutcome.BUSY
        assert 0 < busy.retry_after_ms <= 5_000

    def test_a_retried_claim_by_the_owner_is_owned_and_extends_the_lease(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        first = _claim(store, key, "a", lease_ms=5_000)
        before = _require(store.get(key)).lease_until
        time.sleep(0.02)
        again = _claim(store, key, "a", lease_ms=5_000)
        assert again.outcome is ClaimOutcome.OWNED
        assert again.outcome.runs
        assert (again.fence, again.attempt) == (first.fence, first.attempt)
        assert _require(store.get(key)).lease_until > before

    @pytest.mark.asyncio
    async def test_a_retried_claim_by_the_owner_is_owned_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        await _aclaim(store, key, "a", lease_ms=5_000)
        before = _require(await store.aget(key)).lease_until
        await asyncio.sleep(0.02)
        again = await _aclaim(store, key, "a", lease_ms=5_000)
        assert (again.outcome, again.fence, again.attempt) == (ClaimOutcome.OWNED, 1, 1)
        assert _require(await store.aget(key)).lease_until > before

    def test_an_owner_reclaiming_its_own_expired_lease_gets_it_back(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        _claim(store, key, "a", lease_ms=self.short_lease_ms)
        self._sleep_past_lease()
        again = _claim(store, key, "a", on_expired="raise")
        assert (again.outcome, again.fence, again.attempt) == (ClaimOutcome.OWNED, 1, 1)

    def test_an_expired_lease_is_taken_over_with_the_next_fence_and_attempt(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        _claim(store, key, "a", lease_ms=self.short_lease_ms)
        self._sleep_past_lease()
        t = _claim(store, key, "b")
        assert t.outcome is ClaimOutcome.TAKEOVER
        assert t.outcome.runs
        assert (t.fence, t.attempt) == (2, 2)
        rec = _require(store.get(key))
        assert (rec.state, rec.owner, rec.fence, rec.attempt) == (State.RUNNING, "b", 2, 2)
        assert _claim(store, key, "c").outcome is ClaimOutcome.BUSY

    @pytest.mark.asyncio
    async def test_an_expired_lease_is_taken_over_async(self, store: BaseIdempotencyStore) -> None:
        key = _key()
        await _aclaim(store, key, "a", lease_ms=self.short_lease_ms)
        await self._asleep_past_lease()
        t = await _aclaim(store, key, "b")
        assert (t.outcome, t.fence, t.attempt) == (ClaimOutcome.TAKEOVER, 2, 2)

    def test_an_expired_lease_is_reported_and_left_alone_under_report(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        _claim(store, key, "a", lease_ms=self.short_lease_ms)
        self._sleep_past_lease()
        before = _require(store.get(key))
        e = _claim(store, key, "b", on_expired="raise")
        assert e.outcome is ClaimOutcome.EXPIRED
        assert not e.outcome.runs
        assert (e.fence, e.attempt) == (1, 1)
        assert store.get(key) == before
        # The operator (or a takeover policy) can still move on.
        t = _claim(store, key, "b", on_expired="takeover")
        assert (t.outcome, t.fence) == (ClaimOutcome.TAKEOVER, 2)

    @pytest.mark.asyncio
    async def test_an_expired_lease_is_reported_under_report_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        await _aclaim(store, key, "a", lease_ms=self.short_lease_ms)
        await self._asleep_past_lease()
        before = await store.aget(key)
        e = await _aclaim(store, key, "b", on_expired="raise")
        assert (e.outcome, e.fence, e.attempt) == (ClaimOutcome.EXPIRED, 1, 1)
        assert await store.aget(key) == before

    # -- release -----------------------------------------------------------------------

    def test_release_frees_the_key_only_for_the_owner_and_fence(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = _claim(store, key, "a")
        assert not store.release(key, owner="b", fence=c.fence)
        assert not store.release(key, owner="a", fence=c.fence + 1)
        assert not store.release(key, owner="a", fence=c.fence - 1)
        assert _require(store.get(key)).state is State.RUNNING
        assert store.release(key, owner="a", fence=c.fence)
        rec = _require(store.get(key))
        assert (rec.state, rec.fence, rec.attempt) == (State.FREE, 1, 1)
        assert not store.release(key, owner="a", fence=c.fence)
        nxt = _claim(store, key, "b")
        assert (nxt.outcome, nxt.fence, nxt.attempt) == (ClaimOutcome.ACQUIRED, 2, 2)

    @pytest.mark.asyncio
    async def test_release_frees_the_key_only_for_the_owner_and_fence_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = await _aclaim(store, key, "a")
        assert not await store.arelease(key, owner="b", fence=c.fence)
        assert not await store.arelease(key, owner="a", fence=c.fence + 1)
        assert await store.arelease(key, owner="a", fence=c.fence)
        assert not await store.arelease(key, owner="a", fence=c.fence)
        nxt = await _aclaim(store, key, "a")
        assert (nxt.outcome, nxt.fence, nxt.attempt) == (ClaimOutcome.ACQUIRED, 2, 2)

    def test_release_does_nothing_on_a_done_or_absent_key(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        assert not store.release(key, owner="a", fence=1)
        assert store.get(key) is None
        c = _claim(store, key, "a")
        _complete(store, key, "a", c.fence, b"r")
        assert not store.release(key, owner="a", fence=c.fence)
        assert _claim(store, key, "b").outcome is ClaimOutcome.REPLAY

    def test_fences_strictly_increase_over_claim_release_cycles(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        fences = []
        for i in range(6):
            owner = f"o{i % 2}"
            c = _claim(store, key, owner)
            assert c.outcome is ClaimOutcome.ACQUIRED
            fences.append(c.fence)
            assert store.release(key, owner=owner, fence=c.fence)
        assert fences == sorted(set(fences))
        assert fences[0] == 1

    @pytest.mark.asyncio
    async def test_fences_strictly_increase_over_claim_release_cycles_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        fences = []
        for i in range(4):
            c = await _aclaim(store, key, f"o{i}")
            fences.append(c.fence)
            assert await store.arelease(key, owner=f"o{i}", fence=c.fence)
        assert fences == [1, 2, 3, 4]

    # -- renew -------------------------------------------------------------------------

    def test_renew_extends_the_lease_only_for_the_owner_and_fence(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = _claim(store, key, "a", lease_ms=1_000)
        before = _require(store.get(key)).lease_until
        assert not store.renew(key, owner="b", fence=c.fence, lease_ms=30_000)
        assert not store.renew(key, owner="a", fence=c.fence + 1, lease_ms=30_000)
        assert _require(store.get(key)).lease_until == before
        assert store.renew(key, owner="a", fence=c.fence, lease_ms=30_000)
        rec = _require(store.get(key))
        assert rec.lease_until >= before + 20_000
        assert (rec.owner, rec.fence, rec.state) == ("a", 1, State.RUNNING)

    @pytest.mark.asyncio
    async def test_renew_extends_the_lease_only_for_the_owner_and_fence_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = await _aclaim(store, key, "a", lease_ms=1_000)
        before = _require(await store.aget(key)).lease_until
        assert not await store.arenew(key, owner="b", fence=c.fence, lease_ms=30_000)
        assert await store.arenew(key, owner="a", fence=c.fence, lease_ms=30_000)
        assert _require(await store.aget(key)).lease_until >= before + 20_000

    def test_a_renewed_lease_outlives_its_original_deadline(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = _claim(store, key, "a", lease_ms=self.short_lease_ms)
        assert store.renew(key, owner="a", fence=c.fence, lease_ms=LONG_MS)
        self._sleep_past_lease()
        assert _claim(store, key, "b").outcome is ClaimOutcome.BUSY

    def test_renew_fails_on_an_absent_completed_or_released_key(
        self, store: BaseIdempotencyStore
    ) -> None:
        absent, done, freed = _key(), _key(), _key()
        assert not store.renew(absent, owner="a", fence=1, lease_ms=LONG_MS)
        assert store.get(absent) is None
        c = _claim(store, done, "a")
        _complete(store, done, "a", c.fence, b"r")
        assert not store.renew(done, owner="a", fence=c.fence, lease_ms=LONG_MS)
        assert _require(store.get(done)).state is State.COMPLETED
        c = _claim(store, freed, "a")
        assert store.release(freed, owner="a", fence=c.fence)
        assert not store.renew(freed, owner="a", fence=c.fence, lease_ms=LONG_MS)
        assert _require(store.get(freed)).state is State.FREE

    @pytest.mark.asyncio
    async def test_renew_fails_on_a_completed_or_released_key_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        done, freed = _key(), _key()
        c = await _aclaim(store, done, "a")
        await _acomplete(store, done, "a", c.fence, b"r")
        assert not await store.arenew(done, owner="a", fence=c.fence, lease_ms=LONG_MS)
        c = await _aclaim(store, freed, "a")
        assert await store.arelease(freed, owner="a", fence=c.fence)
        assert not await store.arenew(freed, owner="a", fence=c.fence, lease_ms=LONG_MS)

    # -- complete: write-once, stale owners ---------------------------------------------

    def test_completion_is_write_once(self, store: BaseIdempotencyStore) -> None:
        key = _key()
        c = _claim(store, key, "a")
        first = _complete(store, key, "a", c.fence, b"first")
        assert first == Completion(stored=True, stale=False, failed=False, payload=b"first")
        again = _complete(store, key, "a", c.fence, b"second", failed=True)
        assert again == Completion(stored=False, stale=False, failed=False, payload=b"first")
        other = _complete(store, key, "b", c.fence + 1, b"third")
        assert (other.stored, other.stale, other.payload) == (False, True, b"first")
        rec = _require(store.get(key))
        assert (rec.state, rec.payload) == (State.COMPLETED, b"first")

    @pytest.mark.asyncio
    async def test_completion_is_write_once_async(self, store: BaseIdempotencyStore) -> None:
        key = _key()
        c = await _aclaim(store, key, "a")
        first = await _acomplete(store, key, "a", c.fence, b"", failed=True)
        assert first == Completion(stored=True, stale=False, failed=True, payload=b"")
        again = await _acomplete(store, key, "a", c.fence, b"second")
        assert again == Completion(stored=False, stale=False, failed=True, payload=b"")

    def test_a_stale_owner_cannot_renew_or_release_after_a_takeover(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        old = _claim(store, key, "a", lease_ms=self.short_lease_ms)
        self._sleep_past_lease()
        new = _claim(store, key, "b")
        assert new.outcome is ClaimOutcome.TAKEOVER
        assert not store.renew(key, owner="a", fence=old.fence, lease_ms=LONG_MS)
        assert not store.release(key, owner="a", fence=old.fence)
        rec = _require(store.get(key))
        assert (rec.state, rec.owner, rec.fence) == (State.RUNNING, "b", new.fence)
        assert store.renew(key, owner="b", fence=new.fence, lease_ms=LONG_MS)

    @pytest.mark.asyncio
    async def test_a_stale_owner_cannot_renew_or_release_after_a_takeover_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        old = await _aclaim(store, key, "a", lease_ms=self.short_lease_ms)
        await self._asleep_past_lease()
        new = await _aclaim(store, key, "b")
        assert new.outcome is ClaimOutcome.TAKEOVER
        assert not await store.arenew(key, owner="a", fence=old.fence, lease_ms=LONG_MS)
        assert not await store.arelease(key, owner="a", fence=old.fence)
        assert _require(await store.aget(key)).owner == "b"

    def test_a_stale_owners_first_completion_is_stored_and_replayed_to_the_new_owner(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        old = _claim(store, key, "a", lease_ms=self.short_lease_ms)
        self._sleep_past_lease()
        new = _claim(store, key, "b")
        assert new.outcome is ClaimOutcome.TAKEOVER
        late = _complete(store, key, "a", old.fence, b"from-a")
        assert (late.stored, late.stale, late.payload) == (True, True, b"from-a")
        mine = _complete(store, key, "b", new.fence, b"from-b")
        assert (mine.stored, mine.payload) == (False, b"from-a")
        assert not store.renew(key, owner="b", fence=new.fence, lease_ms=LONG_MS)
        assert not store.release(key, owner="b", fence=new.fence)
        replay = _claim(store, key, "c")
        assert (replay.outcome, replay.payload) == (ClaimOutcome.REPLAY, b"from-a")

    @pytest.mark.asyncio
    async def test_a_stale_owners_first_completion_is_stored_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        old = await _aclaim(store, key, "a", lease_ms=self.short_lease_ms)
        await self._asleep_past_lease()
        new = await _aclaim(store, key, "b")
        late = await _acomplete(store, key, "a", old.fence, b"from-a")
        assert (late.stored, late.stale) == (True, True)
        mine = await _acomplete(store, key, "b", new.fence, b"from-b")
        assert (mine.stored, mine.payload) == (False, b"from-a")

    def test_the_new_owners_completion_wins_over_a_later_stale_completion(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        old = _claim(store, key, "a", lease_ms=self.short_lease_ms)
        self._sleep_past_lease()
        new = _claim(store, key, "b")
        mine = _complete(store, key, "b", new.fence, b"from-b")
        assert (mine.stored, mine.stale) == (True, False)
        late = _complete(store, key, "a", old.fence, b"from-a")
        assert (late.stored, late.stale, late.payload) == (False, True, b"from-b")
        assert _require(store.get(key)).payload == b"from-b"

    def test_a_completion_after_release_is_stored_as_stale(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = _claim(store, key, "a")
        assert store.release(key, owner="a", fence=c.fence)
        late = _complete(store, key, "a", c.fence, b"late")
        assert (late.stored, late.stale, late.payload) == (True, True, b"late")
        assert _claim(store, key, "b").payload == b"late"

    def test_a_completion_for_a_vanished_record_is_stored_as_stale(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        done = _complete(store, key, "a", 1, b"orphan", meta={"thread_id": "t"})
        assert (done.stored, done.stale, done.payload) == (True, True, b"orphan")
        rec = _require(store.get(key))
        assert (rec.state, rec.payload, rec.fingerprint) == (State.COMPLETED, b"orphan", FP)
        assert dict(rec.meta) == {"thread_id": "t"}
        replay = _claim(store, key, "b")
        assert (replay.outcome, replay.payload) == (ClaimOutcome.REPLAY, b"orphan")

    # -- retention (TTL) ---------------------------------------------------------------

    def test_a_completed_record_disappears_after_its_ttl_and_runs_again(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = _claim(store, key, "a", ttl_ms=self.short_lease_ms)
        written = time.monotonic()
        _complete(store, key, "a", c.fence, b"r", ttl_ms=self.short_lease_ms)
        rec = store.get(key)
        if rec is None:  # only a stall longer than the TTL excuses a missing record
            assert time.monotonic() - written >= self.short_lease_ms / 1000
        else:
            assert rec.state is State.COMPLETED
        self._sleep_past_lease()
        assert store.get(key) is None
        assert key not in {r.key for r in store.list()}
        again = _claim(store, key, "b")
        assert (again.outcome, again.fence, again.attempt) == (ClaimOutcome.ACQUIRED, 1, 1)

    @pytest.mark.asyncio
    async def test_a_completed_record_disappears_after_its_ttl_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = await _aclaim(store, key, "a", ttl_ms=self.short_lease_ms)
        await _acomplete(store, key, "a", c.fence, b"r", ttl_ms=self.short_lease_ms)
        await self._asleep_past_lease()
        assert await store.aget(key) is None
        assert (await _aclaim(store, key, "b")).outcome is ClaimOutcome.ACQUIRED

    def test_a_live_lease_keeps_its_record_even_when_the_ttl_is_shorter(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = _claim(store, key, "a", lease_ms=LONG_MS, ttl_ms=self.short_lease_ms // 2)
        self._sleep_past_lease()
        assert _claim(store, key, "b").outcome is ClaimOutcome.BUSY
        assert store.renew(key, owner="a", fence=c.fence, lease_ms=LONG_MS)

    # -- get / list / delete / purge ---------------------------------------------------

    def test_get_returns_every_field_of_the_record(self, store: BaseIdempotencyStore) -> None:
        key = _key()
        meta = {"namespace": "ns", "thread_id": "t-1", "tool": "refund"}
        assert store.get(key) is None
        _claim(store, key, "owner-a", lease_ms=5_000, meta=meta)
        rec = _require(store.get(key))
        assert (rec.key, rec.state, rec.owner, rec.fence, rec.attempt) == (
            key,
            State.RUNNING,
            "owner-a",
            1,
            1,
        )
        assert rec.fingerprint == FP
        assert rec.payload is None
        assert rec.lease_until == rec.created_at + 5_000
        assert rec.updated_at == rec.created_at
        assert rec.version == FORMAT_VERSION
        assert dict(rec.meta) == meta
        assert not rec.done
        time.sleep(0.01)
        _complete(store, key, "owner-a", 1, b"\x00done")
        done = _require(store.get(key))
        assert (done.state, done.owner, done.fence, done.attempt) == (
            State.COMPLETED,
            "owner-a",
            1,
            1,
        )
        assert (done.payload, done.lease_until, done.fingerprint) == (b"\x00done", 0, FP)
        assert done.created_at == rec.created_at
        assert done.updated_at > rec.updated_at
        assert dict(done.meta) == meta
        assert done.done

    @pytest.mark.asyncio
    async def test_get_returns_every_field_of_the_record_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        meta = {"namespace": "ns", "thread_id": "t-1"}
        assert await store.aget(key) is None
        c = await _aclaim(store, key, "a", lease_ms=5_000, meta=meta)
        await _acomplete(store, key, "a", c.fence, b"x", failed=True)
        rec = _require(await store.aget(key))
        assert (rec.key, rec.state, rec.owner, rec.fence, rec.payload) == (
            key,
            State.FAILED,
            "a",
            1,
            b"x",
        )
        assert dict(rec.meta) == meta
        assert rec == store.get(key)

    def _populate(self, store: BaseIdempotencyStore) -> tuple[str, str, dict[str, str]]:
        """Four records over two namespaces and two threads; returns (ns, other_ns, keys)."""
        tag = uuid.uuid4().hex[:8]
        ns, other = f"ns_{tag}", f"nsX{tag}"  # "_" must not act as a wildcard
        keys: dict[str, str] = {}
        for name, (n, t) in {
            "ns/t1": (ns, "t1"),
            "ns/t1b": (ns, "t1"),
            "ns/t2": (ns, "t2"),
            "other/t1": (other, "t1"),
        }.items():
            keys[name] = key = _key(name.replace("/", "-"))
            c = _claim(store, key, "a", meta={"namespace": n, "thread_id": t})
            if name != "ns/t1b":
                _complete(store, key, "a", c.fence, name.encode())
        return ns, other, keys

    def test_list_filters_by_namespace_and_thread_id(self, store: BaseIdempotencyStore) -> None:
        ns, _other, keys = self._populate(store)

        def listed(**kw: Any) -> set[str]:
            return {r.key for r in store.list(**kw)}

        assert listed(namespace=ns) == {keys["ns/t1"], keys["ns/t1b"], keys["ns/t2"]}
        assert listed(namespace=ns, thread_id="t1") == {keys["ns/t1"], keys["ns/t1b"]}
        assert listed(namespace=_other, thread_id="t1") == {keys["other/t1"]}
        assert listed(namespace=_other, thread_id="t2") == set()
        assert set(keys.values()) <= listed(thread_id="t1") | listed(thread_id="t2")
        assert set(keys.values()) <= listed()
        limited = store.list(namespace=ns, limit=2)
        assert len(limited) == 2
        assert {r.key for r in limited} <= listed(namespace=ns)
        by_key = {r.key: r for r in store.list(namespace=ns)}
        assert by_key[keys["ns/t1"]].payload == b"ns/t1"
        assert by_key[keys["ns/t1b"]].state is State.RUNNING
        assert dict(by_key[keys["ns/t2"]].meta) == {"namespace": ns, "thread_id": "t2"}

    @pytest.mark.asyncio
    async def test_list_filters_by_namespace_and_thread_id_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        ns, _other, keys = self._populate(store)
        got = {r.key for r in await store.alist(namespace=ns, thread_id="t1")}
        assert got == {keys["ns/t1"], keys["ns/t1b"]}
        assert len(await store.alist(namespace=ns, limit=1)) == 1

    def test_delete_removes_exactly_one_record(self, store: BaseIdempotencyStore) -> None:
        a, b = _key(), _key()
        ca = _claim(store, a, "o")
        _claim(store, b, "o")
        assert store.delete(a)
        assert store.get(a) is None
        assert not store.delete(a)
        assert store.get(b) is not None
        assert not store.renew(a, owner="o", fence=ca.fence, lease_ms=LONG_MS)
        assert _claim(store, a, "p").outcome is ClaimOutcome.ACQUIRED

    @pytest.mark.asyncio
    async def test_delete_removes_exactly_one_record_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        a, b = _key(), _key()
        await _aclaim(store, a, "o")
        await _aclaim(store, b, "o")
        assert await store.adelete(a)
        assert not await store.adelete(a)
        assert await store.aget(a) is None
        assert await store.aget(b) is not None

    def test_purge_deletes_every_record_of_a_thread_and_nothing_else(
        self, store: BaseIdempotencyStore
    ) -> None:
        ns, _other, keys = self._populate(store)
        assert store.purge(thread_id="t1", namespace=ns) == 2
        assert store.get(keys["ns/t1"]) is None
        assert store.get(keys["ns/t1b"]) is None
        assert store.get(keys["ns/t2"]) is not None
        assert store.get(keys["other/t1"]) is not None
        assert store.purge(thread_id="t1", namespace=ns) == 0

    @pytest.mark.asyncio
    async def test_purge_deletes_every_record_of_a_thread_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        ns, _other, keys = self._populate(store)
        assert await store.apurge(thread_id="t2", namespace=ns) == 1
        assert await store.aget(keys["ns/t2"]) is None
        assert await store.aget(keys["ns/t1"]) is not None

    # -- watch -------------------------------------------------------------------------

    def _assert_woken(self, started: float, changed_at: list[float], ended: float) -> None:
        assert changed_at, "watch returned before anything changed"
        assert ended >= changed_at[0], "watch returned before anything changed"
        assert ended - changed_at[0] < self.wake_latency_s, (
            f"watch woke {ended - changed_at[0]:.3f}s after the change"
        )

    def _later(
        self, delay: float, action: Callable[[], object]
    ) -> tuple[threading.Thread, list[float]]:
        at: list[float] = []

        def run() -> None:
            time.sleep(delay)
            at.append(time.monotonic())
            action()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t, at

    def test_watch_returns_promptly_after_a_completion_in_another_thread(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = _claim(store, key, "a")
        t, at = self._later(0.1, lambda: _complete(store, key, "a", c.fence, b"r"))
        started = time.monotonic()
        store.watch(key, fence=c.fence, timeout=5.0)
        ended = time.monotonic()
        t.join()
        self._assert_woken(started, at, ended)
        assert _claim(store, key, "b").payload == b"r"

    def test_watch_returns_promptly_after_a_release_in_another_thread(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = _claim(store, key, "a")
        t, at = self._later(0.1, lambda: store.release(key, owner="a", fence=c.fence))
        started = time.monotonic()
        store.watch(key, fence=c.fence, timeout=5.0)
        ended = time.monotonic()
        t.join()
        self._assert_woken(started, at, ended)

    @pytest.mark.asyncio
    async def test_awatch_returns_promptly_after_a_completion_in_another_task(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = await _aclaim(store, key, "a")
        at: list[float] = []

        async def finish() -> None:
            await asyncio.sleep(0.1)
            at.append(time.monotonic())
            await _acomplete(store, key, "a", c.fence, b"r")

        task = asyncio.create_task(finish())
        started = time.monotonic()
        await store.awatch(key, fence=c.fence, timeout=5.0)
        ended = time.monotonic()
        await task
        self._assert_woken(started, at, ended)

    @pytest.mark.asyncio
    async def test_awatch_returns_promptly_after_a_completion_in_another_thread(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = await _aclaim(store, key, "a")
        t, at = self._later(0.1, lambda: _complete(store, key, "a", c.fence, b"r"))
        started = time.monotonic()
        await store.awatch(key, fence=c.fence, timeout=5.0)
        ended = time.monotonic()
        await asyncio.to_thread(t.join)
        self._assert_woken(started, at, ended)

    def test_watch_returns_at_once_when_the_record_is_done_absent_or_moved_on(
        self, store: BaseIdempotencyStore
    ) -> None:
        done, absent, moved = _key(), _key(), _key()
        c = _claim(store, done, "a")
        _complete(store, done, "a", c.fence, b"r")
        c = _claim(store, moved, "a")
        store.release(moved, owner="a", fence=c.fence)
        _claim(store, moved, "b")  # fence 2 now runs
        for key in (done, absent, moved):
            started = time.monotonic()
            store.watch(key, fence=1, timeout=5.0)
            assert time.monotonic() - started < self.late_return_s, key

    @pytest.mark.asyncio
    async def test_awatch_returns_at_once_when_the_record_is_done_or_absent(
        self, store: BaseIdempotencyStore
    ) -> None:
        done, absent = _key(), _key()
        c = await _aclaim(store, done, "a")
        await _acomplete(store, done, "a", c.fence, b"r")
        for key in (done, absent):
            started = time.monotonic()
            await store.awatch(key, fence=1, timeout=5.0)
            assert time.monotonic() - started < self.late_return_s, key

    def test_watch_returns_by_the_lease_deadline_when_nobody_completes(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = _claim(store, key, "a", lease_ms=self.short_lease_ms)
        started = time.monotonic()
        store.watch(key, fence=c.fence, timeout=5.0)
        waited = time.monotonic() - started
        assert waited < self.short_lease_ms / 1000 + self.late_return_s
        assert _claim(store, key, "b").outcome is ClaimOutcome.TAKEOVER

    @pytest.mark.asyncio
    async def test_awatch_returns_by_the_lease_deadline_when_nobody_completes(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = await _aclaim(store, key, "a", lease_ms=self.short_lease_ms)
        started = time.monotonic()
        await store.awatch(key, fence=c.fence, timeout=5.0)
        waited = time.monotonic() - started
        assert waited < self.short_lease_ms / 1000 + self.late_return_s

    def test_watch_waits_out_its_timeout_while_the_lease_is_live(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = _claim(store, key, "a")
        timeout = self.short_lease_ms / 1000
        started = time.monotonic()
        store.watch(key, fence=c.fence, timeout=timeout)
        waited = time.monotonic() - started
        assert timeout / 2 <= waited < timeout + self.late_return_s

    @pytest.mark.asyncio
    async def test_awatch_waits_out_its_timeout_while_the_lease_is_live(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = await _aclaim(store, key, "a")
        timeout = self.short_lease_ms / 1000
        started = time.monotonic()
        await store.awatch(key, fence=c.fence, timeout=timeout)
        waited = time.monotonic() - started
        assert timeout / 2 <= waited < timeout + self.late_return_s

    # -- concurrency -------------------------------------------------------------------

    def test_concurrent_claims_from_many_threads_acquire_exactly_once(
        self, store: BaseIdempotencyStore
    ) -> None:
        n = 8
        key = _key()
        barrier = threading.Barrier(n)
        outcomes: list[ClaimOutcome] = []
        lock = threading.Lock()

        def claim(i: int) -> None:
            barrier.wait()
            c = _claim(store, key, f"owner-{i}")
            with lock:
                outcomes.append(c.outcome)

        threads = [threading.Thread(target=claim, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert Counter(outcomes) == {ClaimOutcome.ACQUIRED: 1, ClaimOutcome.BUSY: n - 1}

    def test_concurrent_completions_from_many_threads_store_exactly_one_payload(
        self, store: BaseIdempotencyStore
    ) -> None:
        n = 8
        key = _key()
        c = _claim(store, key, "owner-0")
        barrier = threading.Barrier(n)
        results: list[Completion] = []
        lock = threading.Lock()

        def complete(i: int) -> None:
            barrier.wait()
            done = _complete(store, key, f"owner-{i}", c.fence, f"payload-{i}".encode())
            with lock:
                results.append(done)

        threads = [threading.Thread(target=complete, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert len(results) == n
        assert sum(r.stored for r in results) == 1
        assert len({r.payload for r in results}) == 1
        assert _require(store.get(key)).payload == results[0].payload

    @pytest.mark.asyncio
    async def test_concurrent_claims_from_many_tasks_acquire_exactly_once(
        self, store: BaseIdempotencyStore
    ) -> None:
        n = 8
        key = _key()
        claims = await asyncio.gather(*(_aclaim(store, key, f"owner-{i}") for i in range(n)))
        outcomes = Counter(c.outcome for c in claims)
        # One owner (its claim may have been resent after a lost reply: OWNED), the rest busy.
        owners = outcomes[ClaimOutcome.ACQUIRED] + outcomes[ClaimOutcome.OWNED]
        assert (owners, outcomes[ClaimOutcome.BUSY]) == (1, n - 1), outcomes

    @pytest.mark.asyncio
    async def test_concurrent_completions_from_many_tasks_store_exactly_one_payload(
        self, store: BaseIdempotencyStore
    ) -> None:
        n = 8
        key = _key()
        c = await _aclaim(store, key, "owner-0")
        results = await asyncio.gather(
            *(_acomplete(store, key, f"owner-{i}", c.fence, bytes([i])) for i in range(n))
        )
        assert sum(r.stored for r in results) == 1
        assert len({r.payload for r in results}) == 1

    # -- payloads and keys -------------------------------------------------------------

    def test_a_one_megabyte_payload_round_trips(self, store: BaseIdempotencyStore) -> None:
        key = _key()
        payload = bytes(range(256)) * 4096  # 1 MiB, every byte value
        c = _claim(store, key, "a")
        assert _complete(store, key, "a", c.fence, payload).stored
        replay = _claim(store, key, "b")
        assert replay.payload == payload
        assert _require(store.get(key)).payload == payload

    @pytest.mark.asyncio
    async def test_a_one_megabyte_payload_round_trips_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        payload = b"\x00\xff" * (1 << 19)
        c = await _aclaim(store, key, "a")
        assert (await _acomplete(store, key, "a", c.fence, payload)).stored
        assert (await _aclaim(store, key, "b")).payload == payload

    ODD_KEYS: ClassVar[tuple[str, ...]] = (
        "ключ-🔑-鍵",
        "with space\tand\nnewline",
        "a:b|c/d\\e",
        "{tag}}{",
        "*?[glob]",
        "100%_like'\"",
        "x" * 512,
    )

    def test_keys_with_unicode_and_odd_characters_are_distinct_and_work(
        self, store: BaseIdempotencyStore
    ) -> None:
        suffix = uuid.uuid4().hex
        keys = [k + suffix for k in self.ODD_KEYS]
        for i, key in enumerate(keys):
            c = _claim(store, key, "a")
            assert c.outcome is ClaimOutcome.ACQUIRED, key
            _complete(store, key, "a", c.fence, str(i).encode())
        for i, key in enumerate(keys):
            rec = _require(store.get(key))
            assert (rec.key, rec.payload) == (key, str(i).encode())
            assert _claim(store, key, "b").payload == str(i).encode()
        assert set(keys) <= {r.key for r in store.list()}
        assert store.delete(keys[0])
        assert store.get(keys[0]) is None
        assert store.get(keys[1]) is not None

    @pytest.mark.asyncio
    async def test_keys_with_unicode_and_odd_characters_work_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        suffix = uuid.uuid4().hex
        for i, base in enumerate(self.ODD_KEYS):
            key = base + suffix
            c = await _aclaim(store, key, "a")
            await _acomplete(store, key, "a", c.fence, str(i).encode())
            assert (await _aclaim(store, key, "b")).payload == str(i).encode()

    # -- lifecycle ---------------------------------------------------------------------

    def test_a_closed_store_reconnects_on_next_use(self, store: BaseIdempotencyStore) -> None:
        key = _key()
        c = _claim(store, key, "a")
        store.close()
        assert _complete(store, key, "a", c.fence, b"after-close").stored
        store.close()
        store.close()
        assert _claim(store, key, "b").payload == b"after-close"

    @pytest.mark.asyncio
    async def test_a_closed_store_reconnects_on_next_use_async(
        self, store: BaseIdempotencyStore
    ) -> None:
        key = _key()
        c = await _aclaim(store, key, "a")
        await store.aclose()
        assert (await _acomplete(store, key, "a", c.fence, b"after-close")).stored
        await store.aclose()
        assert (await _aclaim(store, key, "b")).payload == b"after-close"

    # -- model-based: random operation sequences against the pure protocol -----------------

    def test_random_operation_sequences_agree_with_the_protocol_model(
        self, store: BaseIdempotencyStore
    ) -> None:
        @settings(
            max_examples=self.model_examples,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(ops=_OPS)
        def run(ops: list[_Op]) -> None:
            _Harness(store, None).run(ops)

        run()

    @pytest.mark.asyncio
    async def test_random_sync_and_async_operation_sequences_agree_with_the_protocol_model(
        self, store: BaseIdempotencyStore
    ) -> None:
        loop = asyncio.get_running_loop()

        def on_loop(coro: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=30)

        @settings(
            max_examples=self.model_examples,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(ops=_OPS)
        def run(ops: list[_Op]) -> None:
            _Harness(store, on_loop).run(ops)

        await asyncio.to_thread(run)


# -- the model and its harness ------------------------------------------------------------

_Kind = Literal["claim", "renew", "complete", "release"]
_PAYLOADS = (b"", b"r1", b"\x00\xff", b"result-3")


@dataclass(frozen=True)
class _Op:
    kind: _Kind
    key: int
    owner: int
    #: ``None``: the fence this owner was last granted on this key (0 if none).
    fence: int | None
    other_fingerprint: bool
    report: bool
    payload: int
    failed: bool
    via_async: bool


_KINDS: tuple[_Kind, ...] = ("claim",) * 3 + ("renew", "release", "release", "complete")
_FENCES = (None, None, None, 0, 1, 2, 3)
_RADIX = (len(_KINDS), 2, 3, len(_FENCES), len(_PAYLOADS), 2, 2, 2, 8)


def _decode(n: int) -> _Op:
    """One operation from one integer (one draw per step keeps generation cheap)."""
    n = n * 2654435761 % 2**32  # spread hypothesis' small integers over every digit
    digits = []
    for radix in _RADIX:
        n, digit = divmod(n, radix)
        digits.append(digit)
    kind, key, owner, fence, payload, failed, report, via_async, other = digits
    return _Op(
        kind=_KINDS[kind],
        key=key,
        owner=owner,
        fence=_FENCES[fence],
        other_fingerprint=other == 7,
        report=bool(report),
        payload=payload,
        failed=bool(failed),
        via_async=bool(via_async),
    )


_OPS = st.lists(st.integers(0, 2**32 - 1).map(_decode), min_size=5, max_size=30)


class _Model:
    """The protocol applied to a dict, with a clock that never reaches a lease deadline."""

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}
        self.now = 1_000_000

    def apply(self, op: _Op, key: str, owner: str, fence: int, meta: Mapping[str, str]) -> object:
        self.now += 1
        rec = self.records.get(key)
        answer: object
        new: Record | None
        if op.kind == "claim":
            answer, new = decide_claim(
                rec,
                key=key,
                owner=owner,
                fingerprint=OTHER_FP if op.other_fingerprint else FP,
                now=self.now,
                lease_ms=LONG_MS,
                on_expired="raise" if op.report else "takeover",
                meta=meta,
            )
        elif op.kind == "renew":
            answer, new = decide_renew(
                rec, owner=owner, fence=fence, now=self.now, lease_ms=LONG_MS
            )
        elif op.kind == "release":
            answer, new = decide_release(rec, owner=owner, fence=fence, now=self.now)
        else:
            answer, new = decide_complete(
                rec,
                key=key,
                owner=owner,
                fence=fence,
                fingerprint=FP,
                payload=_PAYLOADS[op.payload],
                failed=op.failed,
                now=self.now,
                meta=meta,
            )
        if new is not None:
            self.records[key] = new
        return answer


class _Harness:
    """Runs one operation sequence on a store and on the model; every answer must agree."""

    def __init__(self, store: BaseIdempotencyStore, run_async: Callable[[Any], Any] | None) -> None:
        self.store = store
        self.run_async = run_async
        self.model = _Model()
        tag = uuid.uuid4().hex
        self.keys = [f"model-{tag}-{i}" for i in range(2)]
        self.meta = [{"namespace": f"model-{tag}", "thread_id": f"t{i}"} for i in range(2)]
        self.granted: dict[tuple[int, int], int] = {}

    def run(self, ops: list[_Op]) -> None:
        try:
            for step, op in enumerate(ops):
                self.step(step, op)
        finally:
            for key in self.keys:
                self.store.delete(key)

    def step(self, step: int, op: _Op) -> None:
        key, owner, meta = self.keys[op.key], f"owner-{op.owner}", self.meta[op.key]
        fence = self.granted.get((op.owner, op.key), 0) if op.fence is None else op.fence
        want = self.model.apply(op, key, owner, fence, meta)
        got = self._call(op, key, owner, fence, meta)
        where = f"step {step}: {op} (fence {fence})"
        if isinstance(want, Claim):
            assert isinstance(got, Claim), where
            assert (got.outcome, got.fence, got.attempt, got.failed, got.payload) == (
                want.outcome,
                want.fence,
                want.attempt,
                want.failed,
                want.payload,
            ), f"{where}: store {got}, model {want}"
            if want.outcome is ClaimOutcome.BUSY:
                assert 0 < got.retry_after_ms <= LONG_MS, where
            if want.outcome.runs:
                self.granted[(op.owner, op.key)] = want.fence
        else:
            assert got == want, f"{where}: store {got!r}, model {want!r}"
        self._same_record(self.store.get(key), self.model.records.get(key), where)

    def _call(self, op: _Op, key: str, owner: str, fence: int, meta: Mapping[str, str]) -> object:
        s = self.store
        fp = OTHER_FP if op.other_fingerprint else FP
        policy: ExpiredPolicy = "raise" if op.report else "takeover"
        payload = _PAYLOADS[op.payload]
        if op.via_async and self.run_async is not None:
            if op.kind == "claim":
                return self.run_async(
                    s.aclaim(
                        key,
                        owner=owner,
                        fingerprint=fp,
                        lease_ms=LONG_MS,
                        ttl_ms=TTL_MS,
                        on_expired=policy,
                        meta=meta,
                    )
                )
            if op.kind == "renew":
                return self.run_async(s.arenew(key, owner=owner, fence=fence, lease_ms=LONG_MS))
            if op.kind == "release":
                return self.run_async(s.arelease(key, owner=owner, fence=fence))
            return self.run_async(
                s.acomplete(
                    key,
                    owner=owner,
                    fence=fence,
                    fingerprint=FP,
                    payload=payload,
                    failed=op.failed,
                    ttl_ms=TTL_MS,
                    meta=meta,
                )
            )
        if op.kind == "claim":
            return _claim(s, key, owner, fingerprint=fp, on_expired=policy, meta=meta)
        if op.kind == "renew":
            return s.renew(key, owner=owner, fence=fence, lease_ms=LONG_MS)
        if op.kind == "release":
            return s.release(key, owner=owner, fence=fence)
        return _complete(s, key, owner, fence, payload, failed=op.failed, meta=meta)

    @staticmethod
    def _same_record(got: Record | None, want: Record | None, where: str) -> None:
        if want is None:
            assert got is None, f"{where}: store has {got}, model has nothing"
            return
        assert got is not None, f"{where}: store lost the record, model has {want}"
        assert (
            got.key,
            got.state,
            got.owner,
            got.fence,
            got.attempt,
            got.fingerprint,
            got.payload,
            got.version,
            dict(got.meta),
            got.lease_until > 0,
        ) == (
            want.key,
            want.state,
            want.owner,
            want.fence,
            want.attempt,
            want.fingerprint,
            want.payload,
            want.version,
            dict(want.meta),
            want.lease_until > 0,
        ), f"{where}: store {got}, model {want}"
        assert got.created_at <= got.updated_at, where
