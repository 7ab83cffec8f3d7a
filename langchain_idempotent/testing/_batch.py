"""The batched claim: ``claim_many`` answers exactly as the same claims made one by one."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..core.record import Claim, ClaimOutcome, Record
from ..core.store import ClaimRequest
from ._faces import FP, LONG_MS, OTHER_FP, TTL_MS, ContractBase, Face, new_key, require, run_inline


def request(key: str, owner: str, fingerprint: str = FP) -> ClaimRequest:
    return ClaimRequest(key, owner, fingerprint, LONG_MS, TTL_MS, "takeover", {"tool": "t"})


class BatchClaimContract(ContractBase):
    async def test_an_empty_batch_claims_nothing(self, face: Face) -> None:
        assert await face.claim_many([]) == []

    async def test_a_batch_of_new_keys_acquires_each_in_order(self, face: Face) -> None:
        keys = [new_key(f"b{i}") for i in range(5)]
        claims = await face.claim_many([request(k, f"o{i}") for i, k in enumerate(keys)])
        assert [c.outcome for c in claims] == [ClaimOutcome.ACQUIRED] * 5
        for i, k in enumerate(keys):
            rec = require(await face.get(k))
            assert (rec.owner, rec.fence, rec.meta.get("tool")) == (f"o{i}", 1, "t")

    async def test_the_same_key_twice_in_a_batch_is_two_sequential_claims(self, face: Face) -> None:
        key = new_key()
        first, second, again = await face.claim_many(
            [request(key, "a"), request(key, "b"), request(key, "a")]
        )
        assert first.outcome is ClaimOutcome.ACQUIRED
        assert second.outcome is ClaimOutcome.BUSY  # b sees a's lease
        assert again.outcome is ClaimOutcome.OWNED and again.fence == first.fence

    async def test_a_batch_replays_done_keys_with_their_payload_and_runs_the_others(
        self, face: Face
    ) -> None:
        done, fresh, other = new_key("done"), new_key("fresh"), new_key("mismatch")
        c = await face.claim(done, "a")
        await face.complete(done, "a", c.fence, b"stored")
        await face.claim(other, "a")
        claims = await face.claim_many(
            [request(done, "b"), request(fresh, "b"), request(other, "b", OTHER_FP)]
        )
        assert [x.outcome for x in claims] == [
            ClaimOutcome.REPLAY,
            ClaimOutcome.ACQUIRED,
            ClaimOutcome.MISMATCH,
        ]
        assert claims[0].payload == b"stored"

    async def test_a_batch_claims_with_each_requests_boundary_as_one_claim_would(
        self, face: Face
    ) -> None:
        marked, plain = new_key("marked"), new_key("plain")
        r_marked = ClaimRequest(marked, "a", FP, LONG_MS, TTL_MS, boundary=True)
        await face.claim_many([r_marked, request(plain, "a")])
        assert require(await face.get(marked)).effect == "before"
        assert require(await face.get(plain)).effect == "unmarked"

    async def test_a_batch_after_expired_leases_takes_them_over(self, face: Face) -> None:
        keys = [new_key(f"x{i}") for i in range(3)]
        for k in keys:
            await face.claim(k, "a", lease_ms=self.short_lease_ms)
        await self.sleep_past_lease(face)
        claims = await face.claim_many([request(k, "b") for k in keys])
        assert [(c.outcome, c.fence, c.attempt) for c in claims] == [
            (ClaimOutcome.TAKEOVER, 2, 2)
        ] * 3

    async def test_claim_many_agrees_with_sequential_claims_on_random_batches(
        self, face: Face
    ) -> None:
        """Hypothesis: the same prepared records under two sets of keys; one set claimed
        one by one, the other in one batch: identical answers and records. On the async
        face hypothesis runs in a worker thread and every call runs on this loop."""
        loop = asyncio.get_running_loop()

        def drive(call: Coroutine[Any, Any, None]) -> None:
            if face.name == "sync":
                run_inline(call)
            else:
                asyncio.run_coroutine_threadsafe(call, loop).result(timeout=30)

        @settings(
            max_examples=max(10, self.model_examples // 2),
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(case=_CASES)
        def run(case: _Case) -> None:
            drive(_check(face, case))

        if face.name == "sync":
            run()
        else:
            await asyncio.to_thread(run)


@dataclass(frozen=True)
class _Case:
    #: Per key: "absent", "running" (owner o0), "completed", "failed" or "free".
    prepared: tuple[str, ...]
    #: (key index, owner index, other fingerprint).
    batch: tuple[tuple[int, int, bool], ...]


_CASES = st.integers(1, 4).flatmap(
    lambda n: st.builds(
        _Case,
        prepared=st.tuples(
            *[st.sampled_from(["absent", "running", "completed", "failed", "free"])] * n
        ),
        batch=st.lists(
            st.tuples(st.integers(0, n - 1), st.integers(0, 2), st.booleans()),
            min_size=1,
            max_size=8,
        ).map(tuple),
    )
)


async def _prepare(face: Face, key: str, state: str) -> None:
    if state == "absent":
        return
    c = await face.claim(key, "o0")
    if state == "free":
        await face.release(key, owner="o0", fence=c.fence)
    elif state in ("completed", "failed"):
        await face.complete(key, "o0", c.fence, b"p-" + state.encode(), failed=state == "failed")


async def _check(face: Face, case: _Case) -> None:
    run = uuid.uuid4().hex
    one = [f"seq-{run}-{i}" for i in range(len(case.prepared))]
    many = [f"bat-{run}-{i}" for i in range(len(case.prepared))]
    for keys in (one, many):
        for key, state in zip(keys, case.prepared, strict=True):
            await _prepare(face, key, state)

    def requests(keys: list[str]) -> list[ClaimRequest]:
        return [request(keys[k], f"o{o}", OTHER_FP if fp else FP) for k, o, fp in case.batch]

    sequential = [
        await face.claim(
            r.key,
            r.owner,
            fingerprint=r.fingerprint,
            lease_ms=r.lease_ms,
            ttl_ms=r.ttl_ms,
            meta=r.meta,
        )
        for r in requests(one)
    ]
    batched = await face.claim_many(requests(many))
    assert [_answer(c) for c in batched] == [_answer(c) for c in sequential]
    for a, b in zip(one, many, strict=True):
        assert _shape(await face.get(b)) == _shape(await face.get(a))


def _answer(c: Claim) -> tuple[object, ...]:
    return (c.outcome, c.fence, c.attempt, c.failed, c.payload, c.reason, c.entered)


def _shape(rec: Record | None) -> tuple[object, ...] | None:
    """A record without its key and times (the two key sets were written moments apart)."""
    if rec is None:
        return None
    return (
        rec.state,
        rec.owner,
        rec.fence,
        rec.fingerprint,
        rec.attempt,
        rec.payload,
        rec.effect,
    )
