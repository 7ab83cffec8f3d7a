"""The two faces of a store, and what every part of the contract shares.

A store answers through its sync operations (``claim``, ``renew``, ...) and through their
``a``-prefixed async twins. Each guarantee of the contract is written once, against a
:class:`Face`: an adapter whose methods are all ``async`` and spell a request by its
fields (``face.claim(key, "a", lease_ms=150)`` is ``store.claim(ClaimRequest(...))``). The
``sync`` face calls ``store.claim(...)`` inline — on the caller's thread, never in a worker —
so its coroutines finish without ever suspending; the ``async`` face awaits
``store.aclaim(...)``. The
``face`` fixture gives every test both, so the async twins are held to exactly the checks
the sync operations are.
"""

from __future__ import annotations

import asyncio
import builtins
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, ClassVar, Literal, ParamSpec, TypeVar

import pytest

from ..core.record import (
    Claim,
    ClaimOutcome,
    Completion,
    ExpiredPolicy,
    Record,
    UncertainReason,
    abandon_kwargs,
)
from ..core.store import BaseIdempotencyStore, ClaimRequest, CompleteRequest, Held
from ._clock import MovableClock

#: A lease that never expires during a test.
LONG_MS = 60_000
#: A retention that never expires during a test.
TTL_MS = 3_600_000
FP = "fp-args-1"
OTHER_FP = "fp-args-2"

FaceName = Literal["sync", "async"]
P = ParamSpec("P")
T = TypeVar("T")


def new_key(label: str = "k") -> str:
    """A key no other test uses."""
    return f"{label}-{uuid.uuid4().hex}"


def require(rec: Record | None) -> Record:
    assert rec is not None, "expected a record"
    return rec


def run_inline(call: Coroutine[Any, Any, T]) -> T:
    """Finish a sync-face call on this thread (it never suspends: no event loop needed)."""
    try:
        call.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    call.close()
    raise RuntimeError("a sync-face call suspended; it must only call the store's sync API")


class Face:
    """One face of a store: its sync operations or their async twins, behind async methods.

    ``claim`` and ``complete`` default to a long lease, a long retention and the
    fingerprint :data:`FP`, so a test spells out only what it is about. ``clock`` is the
    store's movable clock (the contract's ``clock`` fixture), or ``None``: time passes by
    waiting.
    """

    def __init__(
        self, store: BaseIdempotencyStore, name: FaceName, clock: MovableClock | None = None
    ) -> None:
        self.store = store
        self.name: FaceName = name
        self.clock = clock

    def __repr__(self) -> str:
        return f"Face({self.name}, {type(self.store).__name__})"

    @property
    def other(self) -> Face:
        """The store's other face."""
        return Face(self.store, "async" if self.name == "sync" else "sync", self.clock)

    @property
    def sync(self) -> Face:
        """The store's sync face (for a second caller on another thread)."""
        return self if self.name == "sync" else self.other

    async def _call(
        self,
        sync: Callable[P, T],
        async_: Callable[P, Awaitable[T]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        if self.name == "async":
            return await async_(*args, **kwargs)
        return sync(*args, **kwargs)

    # -- record operations -------------------------------------------------------------

    async def claim(
        self,
        key: str,
        owner: str,
        *,
        fingerprint: str = FP,
        lease_ms: int = LONG_MS,
        ttl_ms: int = TTL_MS,
        on_expired: ExpiredPolicy = "takeover",
        meta: Mapping[str, str] | None = None,
        boundary: bool = False,
    ) -> Claim:
        request = ClaimRequest(
            key, owner, fingerprint, lease_ms, ttl_ms, on_expired, meta, boundary
        )
        return await self._call(self.store.claim, self.store.aclaim, request)

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> builtins.list[Claim]:
        s = self.store
        return await self._call(s.claim_many, s.aclaim_many, requests)

    async def renew(self, key: str, *, owner: str, fence: int, lease_ms: int = LONG_MS) -> bool:
        s = self.store
        return await self._call(s.renew, s.arenew, Held(key, owner, fence), lease_ms)

    async def complete(
        self,
        key: str,
        owner: str,
        fence: int,
        payload: bytes,
        *,
        failed: bool = False,
        fingerprint: str = FP,
        ttl_ms: int = TTL_MS,
        meta: Mapping[str, str] | None = None,
    ) -> Completion:
        request = CompleteRequest(key, owner, fence, fingerprint, payload, failed, ttl_ms, meta)
        return await self._call(self.store.complete, self.store.acomplete, request)

    async def release(self, key: str, *, owner: str, fence: int) -> bool:
        s = self.store
        return await self._call(s.release, s.arelease, Held(key, owner, fence))

    async def abandon(
        self,
        key: str,
        *,
        owner: str,
        fence: int,
        reason: UncertainReason = "cancelled",
        error_type: str | None = None,
    ) -> bool:
        s = self.store
        uncertain = abandon_kwargs(reason, error_type)
        return await self._call(s.abandon, s.aabandon, Held(key, owner, fence), **uncertain)

    async def mark_effect(self, key: str, *, owner: str, fence: int) -> bool:
        s = self.store
        return await self._call(s.mark_effect, s.amark_effect, Held(key, owner, fence))

    async def get(self, key: str) -> Record | None:
        return await self._call(self.store.get, self.store.aget, key)

    async def watch(self, key: str, *, fence: int, timeout: float) -> None:
        s = self.store
        await self._call(s.watch, s.awatch, key, fence=fence, timeout=timeout)

    # -- operator helpers --------------------------------------------------------------

    async def delete(self, key: str) -> bool:
        return await self._call(self.store.delete, self.store.adelete, key)

    async def list(self, **filters: Any) -> builtins.list[Record]:
        """``store.list(**filters)``: the store's own keywords (``namespace``, ``thread_id``,
        ``limit``), passed on as they are."""
        return await self._call(self.store.list, self.store.alist, **filters)

    async def purge(self, *, thread_id: str, namespace: str | None = None) -> int:
        s = self.store
        return await self._call(s.purge, s.apurge, thread_id=thread_id, namespace=namespace)

    async def close(self) -> None:
        await self._call(self.store.close, self.store.aclose)

    async def now_ms(self) -> int:
        return await self._call(self.store.now_ms, self.store.anow_ms)

    # -- concurrency -------------------------------------------------------------------

    async def race(self, n: int, call: Callable[[int], Coroutine[Any, Any, T]]) -> builtins.list[T]:
        """``call(0)`` .. ``call(n - 1)`` at once: ``n`` threads released together by a
        barrier (sync face), or ``n`` tasks on this loop (async face). Results in order."""
        if self.name == "async":
            return builtins.list(await asyncio.gather(*(call(i) for i in range(n))))
        barrier = threading.Barrier(n)
        results: dict[int, T] = {}
        errors: builtins.list[BaseException] = []

        def run(i: int) -> None:
            try:
                barrier.wait()
                results[i] = run_inline(call(i))
            except BaseException as exc:  # reported below, on the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        if errors:
            raise errors[0]
        assert len(results) == n, f"{n - len(results)} of {n} racing calls never returned"
        return [results[i] for i in range(n)]


class ContractBase:
    """What every part of :class:`~langchain_idempotent.testing.StoreContractTests` shares:
    the timing knobs a subclass may tune, the hooks it may provide (``clock``,
    ``second_store``, ``corruptions``, ``newer_schema``) and the ``face`` fixture built on
    its ``store``."""

    pytestmark: ClassVar[builtins.list[pytest.MarkDecorator]] = [pytest.mark.asyncio]

    #: A lease (and TTL) short enough to expire during a test, long enough to outlast the
    #: round trips made while it must still be live.
    short_lease_ms: ClassVar[int] = 150
    #: How late a watcher may return after the completion, release or abandon that should
    #: wake it. Generous (a store wakes its waiters in milliseconds when the machine is
    #: quiet): it tells a woken watcher from one that ran to its 5 s timeout, also on a
    #: loaded machine, and is no benchmark.
    wake_latency_s: ClassVar[float] = 1.5
    #: How late a watch may return after its timeout or the lease deadline, or when there
    #: is nothing to wait for: generous, as it only tells a bounded wait from a hang.
    late_return_s: ClassVar[float] = 1.0
    #: Examples per run of the model-based property tests.
    model_examples: ClassVar[int] = 50
    #: How long past a lease's end a test waits before it counts on the lease having
    #: passed, when it waits in real time (no ``clock``): covers the store's clock ticking
    #: apart from this host's (a server's ``TIME``) and a round trip.
    expiry_margin_ms: ClassVar[int] = 50

    @pytest.fixture
    def clock(self) -> MovableClock | None:
        """The store's clock, if a test can move it: override this fixture to return the
        :class:`~langchain_idempotent.testing.FakeClock` (``ticking=True``) your ``store``
        fixture passes as the store's ``clock``, and lease expiry, takeovers and retention
        are tested by moving it, without sleeping. ``None`` (the default): the store reads a
        clock no test can move (a server's), and those tests wait the short lease out in
        real time (keep ``short_lease_ms`` small, tens of ms, if the store is fast).
        Wake-up and watch-timeout tests always run in real time: they measure it."""
        return None

    @pytest.fixture(params=["sync", "async"])
    def face(
        self,
        request: pytest.FixtureRequest,
        store: BaseIdempotencyStore,
        clock: MovableClock | None,
    ) -> Face:
        """The store behind its sync operations, then behind their async twins."""
        name: FaceName = request.param
        return Face(store, name, clock)

    def assert_woken(self, changed_at: builtins.list[float], ended: float) -> None:
        """A watch that ended at ``ended`` was woken by the change made at ``changed_at[0]``:
        not before it, and within ``wake_latency_s`` (the message gives the figure)."""
        assert changed_at, "watch returned before anything changed"
        assert ended >= changed_at[0], "watch returned before anything changed"
        late = ended - changed_at[0]
        assert late < self.wake_latency_s, (
            f"watch woke {late:.3f}s after the change, later than wake_latency_s = "
            f"{self.wake_latency_s}s (its timeout was 5s): not woken by the change, or a store "
            "slower than that (raise wake_latency_s on the subclass)"
        )

    async def watched_for(self, face: Face, key: str, *, fence: int, timeout: float) -> float:
        """``face.watch(key, ...)``; returns how long it took (seconds, this host's clock)."""
        started = time.monotonic()
        await face.watch(key, fence=fence, timeout=timeout)
        return time.monotonic() - started

    async def pass_time(self, face: Face, ms: int) -> None:
        """Let ``ms`` milliseconds pass on the store's clock: move it (``clock``) or wait."""
        if face.clock is not None:
            face.clock.advance(ms)
        else:
            await asyncio.sleep(ms / 1000)

    async def sleep_past_lease(self, face: Face) -> None:
        """Let a ``short_lease_ms`` lease (or retention) taken just now pass."""
        if face.clock is not None:
            face.clock.advance(self.short_lease_ms)
        else:
            await asyncio.sleep((self.short_lease_ms + self.expiry_margin_ms) / 1000)

    async def abandoned(
        self, face: Face, *, lease_ms: int = LONG_MS, boundary: bool = False
    ) -> tuple[str, Claim]:
        """A new key that owner ``a`` claimed and then abandoned (reason ``cancelled``).
        Returns the key and ``a``'s claim."""
        key = new_key()
        c = await face.claim(key, "a", lease_ms=lease_ms, boundary=boundary)
        assert await face.abandon(key, owner="a", fence=c.fence)
        return key, c

    async def expired(self, face: Face, *, boundary: bool = False) -> tuple[str, Claim]:
        """A new key that owner ``a`` claimed on a short lease, now passed. Returns the key
        and ``a``'s claim."""
        key = new_key()
        c = await face.claim(key, "a", lease_ms=self.short_lease_ms, boundary=boundary)
        await self.sleep_past_lease(face)
        return key, c

    async def claim_raising(self, face: Face, key: str) -> tuple[Record, Claim]:
        """Owner ``b`` claims ``key`` with ``on_expired="raise"``: it is told ``EXPIRED``
        and the record keeps its state, owner and fence. Returns the record as it was
        before, and the claim."""
        before = require(await face.get(key))
        got = await face.claim(key, "b", on_expired="raise")
        assert got.outcome is ClaimOutcome.EXPIRED
        after = require(await face.get(key))
        assert (after.state, after.owner, after.fence) == (before.state, before.owner, before.fence)
        return before, got

    async def assert_late_completion_refused(
        self, face: Face, key: str, fence: int, kept: bytes
    ) -> None:
        """Owner ``a``'s completion at ``fence``, come too late, is refused as stale and
        ``kept`` stays the stored payload."""
        late = await face.complete(key, "a", fence, b"late")
        assert (late.stored, late.stale, late.payload) == (False, True, kept)
        assert require(await face.get(key)).payload == kept

    async def assert_replays(self, face: Face, key: str, payload: bytes) -> None:
        """A new caller's claim of ``key`` replays ``payload``."""
        replay = await face.claim(key, "replayer")
        assert (replay.outcome, replay.payload) == (ClaimOutcome.REPLAY, payload)

    async def taken_over(self, face: Face) -> tuple[str, Claim, Claim]:
        """A new key that owner ``a`` claimed on a short lease, and owner ``b`` took over
        once the lease passed. Returns the key and both claims: ``(key, a's, b's)``."""
        key, old = await self.expired(face)
        new = await face.claim(key, "b")
        assert new.outcome is ClaimOutcome.TAKEOVER
        return key, old, new
