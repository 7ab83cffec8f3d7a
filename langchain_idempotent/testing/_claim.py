"""Claims: acquire, replay, mismatch, busy, owned, takeover and expired."""

from __future__ import annotations

import pytest

from ..core.record import ClaimOutcome, State
from ._faces import LONG_MS, OTHER_FP, ContractBase, Face, new_key, require


class ClaimContract(ContractBase):
    # -- absent, done, another fingerprint ---------------------------------------------

    async def test_a_first_claim_acquires_fence_1_attempt_1(self, face: Face) -> None:
        claim = await face.claim(new_key(), "a")
        assert claim.outcome is ClaimOutcome.ACQUIRED
        assert (claim.fence, claim.attempt) == (1, 1)
        assert claim.outcome.runs

    @pytest.mark.parametrize(
        "payload", [b"", b"0", b"\x00\xff\x00binary", '{"é": "✓"}'.encode()], ids=repr
    )
    @pytest.mark.parametrize("failed", [False, True], ids=["completed", "failed"])
    async def test_a_done_key_replays_exactly_the_stored_bytes_and_failed_flag(
        self, face: Face, payload: bytes, failed: bool
    ) -> None:
        key = new_key()
        c = await face.claim(key, "a")
        await face.complete(key, "a", c.fence, payload, failed=failed)
        for owner in ("a", "b"):
            replay = await face.claim(key, owner)
            assert replay.outcome is ClaimOutcome.REPLAY
            assert replay.payload == payload
            assert type(replay.payload) is bytes
            assert replay.failed is failed
            assert (replay.fence, replay.attempt) == (1, 1)
            assert not replay.outcome.runs

    @pytest.mark.parametrize("state", ["running", "expired", "free", "completed", "failed"])
    async def test_another_fingerprint_is_a_mismatch_in_every_state_and_writes_nothing(
        self, face: Face, state: str
    ) -> None:
        key = new_key()
        lease = self.short_lease_ms if state == "expired" else LONG_MS
        c = await face.claim(key, "a", lease_ms=lease)
        if state == "expired":
            await self.sleep_past_lease(face)
        elif state == "free":
            assert await face.release(key, owner="a", fence=c.fence)
        elif state in ("completed", "failed"):
            await face.complete(key, "a", c.fence, b"result", failed=state == "failed")
        before = require(await face.get(key))
        for owner in ("a", "b"):
            for policy in ("takeover", "raise"):
                m = await face.claim(key, owner, fingerprint=OTHER_FP, on_expired=policy)  # type: ignore[arg-type]
                assert m.outcome is ClaimOutcome.MISMATCH
                assert not m.outcome.runs
                assert m.payload is None
        assert await face.get(key) == before

    # -- a running key: busy, owned ----------------------------------------------------

    async def test_a_live_lease_of_another_owner_is_busy_with_the_time_left(
        self, face: Face
    ) -> None:
        key = new_key()
        c = await face.claim(key, "a", lease_ms=5_000)
        busy = await face.claim(key, "b", lease_ms=5_000)
        assert busy.outcome is ClaimOutcome.BUSY
        assert not busy.outcome.runs
        assert 0 < busy.retry_after_ms <= 5_000
        assert busy.fence == c.fence
        rec = require(await face.get(key))
        assert (rec.owner, rec.fence, rec.attempt) == ("a", 1, 1)

    async def test_a_retried_claim_by_the_owner_is_owned_and_extends_the_lease(
        self, face: Face
    ) -> None:
        key = new_key()
        first = await face.claim(key, "a", lease_ms=5_000)
        before = require(await face.get(key)).lease_until
        await self.pass_time(face, 20)
        again = await face.claim(key, "a", lease_ms=5_000)
        assert (again.outcome, again.fence, again.attempt) == (ClaimOutcome.OWNED, 1, 1)
        assert again.outcome.runs
        assert (again.fence, again.attempt) == (first.fence, first.attempt)
        assert require(await face.get(key)).lease_until > before

    # -- an expired lease: owned, takeover, expired ------------------------------------

    async def test_an_owner_reclaiming_its_own_expired_lease_gets_it_back(self, face: Face) -> None:
        key, _ = await self.expired(face)
        again = await face.claim(key, "a", on_expired="raise")
        assert (again.outcome, again.fence, again.attempt) == (ClaimOutcome.OWNED, 1, 1)

    async def test_an_expired_lease_is_taken_over_with_the_next_fence_and_attempt(
        self, face: Face
    ) -> None:
        key, _ = await self.expired(face)
        t = await face.claim(key, "b")
        assert t.outcome is ClaimOutcome.TAKEOVER
        assert t.outcome.runs
        assert (t.fence, t.attempt) == (2, 2)
        rec = require(await face.get(key))
        assert (rec.state, rec.owner, rec.fence, rec.attempt) == (State.RUNNING, "b", 2, 2)
        assert (await face.claim(key, "c")).outcome is ClaimOutcome.BUSY

    async def test_an_expired_lease_is_reported_and_left_alone_when_on_expired_is_raise(
        self, face: Face
    ) -> None:
        key, _ = await self.expired(face)
        before, e = await self.claim_raising(face, key)
        assert not e.outcome.runs
        assert (e.fence, e.attempt) == (1, 1)
        assert await face.get(key) == before
        # The operator (or a takeover policy) can still move on.
        t = await face.claim(key, "b", on_expired="takeover")
        assert (t.outcome, t.fence) == (ClaimOutcome.TAKEOVER, 2)
