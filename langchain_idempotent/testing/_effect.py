"""The side-effect mark: a claim with ``boundary`` starts its attempt ``before`` the effect,
``mark_effect`` (owner and fence checked) records that the effect may be crossing, and an
expired or abandoned attempt that never entered its block is a clean RETRY — never an
uncertain takeover — while one that entered is taken over (or expired) as always, and the
takeover keeps the key uncertain until a completion or a release."""

from __future__ import annotations

import pytest

from ..core.record import ClaimOutcome, ExpiredPolicy, State
from ._faces import ContractBase, Face, new_key, require


class EffectContract(ContractBase):
    async def test_a_claim_with_a_boundary_starts_its_attempt_before_the_effect(
        self, face: Face
    ) -> None:
        marked, unmarked = new_key(), new_key()
        await face.claim(marked, "a", boundary=True)
        await face.claim(unmarked, "a")
        assert require(await face.get(marked)).effect == "before"
        assert require(await face.get(unmarked)).effect == "unmarked"

    async def test_only_the_owner_at_its_fence_marks_the_effect_and_nothing_else_changes(
        self, face: Face
    ) -> None:
        key = new_key()
        c = await face.claim(key, "a", boundary=True)
        assert not await face.mark_effect(key, owner="b", fence=c.fence)
        assert not await face.mark_effect(key, owner="a", fence=c.fence + 1)
        assert not await face.mark_effect(new_key("absent"), owner="a", fence=1)
        before = require(await face.get(key))
        assert before.effect == "before"
        assert await face.mark_effect(key, owner="a", fence=c.fence)
        after = require(await face.get(key))
        assert after.effect == "entered"
        keep = ("state", "owner", "fence", "attempt", "lease_until", "fingerprint", "payload")
        assert [getattr(after, f) for f in keep] == [getattr(before, f) for f in keep]

    async def test_a_done_or_released_attempt_cannot_be_marked(self, face: Face) -> None:
        done, free = new_key(), new_key()
        c = await face.claim(done, "a", boundary=True)
        await face.complete(done, "a", c.fence, b"r")
        assert not await face.mark_effect(done, owner="a", fence=c.fence)
        c = await face.claim(free, "a", boundary=True)
        assert await face.release(free, owner="a", fence=c.fence)
        assert not await face.mark_effect(free, owner="a", fence=c.fence)
        assert require(await face.get(free)).state is State.FREE

    @pytest.mark.parametrize("policy", ["takeover", "raise"])
    async def test_an_expired_attempt_that_never_entered_its_block_is_a_clean_retry(
        self, face: Face, policy: ExpiredPolicy
    ) -> None:
        key, c = await self.expired(face, boundary=True)
        retry = await face.claim(key, "b", on_expired=policy, boundary=True)
        assert retry.outcome is ClaimOutcome.RETRY
        assert retry.outcome.runs
        assert (retry.fence, retry.attempt, retry.reason) == (c.fence + 1, 2, "lease_expired")
        rec = require(await face.get(key))
        assert (rec.owner, rec.effect) == ("b", "before")
        assert not await face.mark_effect(key, owner="a", fence=c.fence)

    @pytest.mark.parametrize("policy", ["takeover", "raise"])
    async def test_an_expired_attempt_that_entered_its_block_stays_uncertain(
        self, face: Face, policy: ExpiredPolicy
    ) -> None:
        key = new_key()
        c = await face.claim(key, "a", lease_ms=self.short_lease_ms, boundary=True)
        assert await face.mark_effect(key, owner="a", fence=c.fence)
        await self.sleep_past_lease(face)
        got = await face.claim(key, "b", on_expired=policy, boundary=True)
        want = ClaimOutcome.TAKEOVER if policy == "takeover" else ClaimOutcome.EXPIRED
        assert (got.outcome, got.entered, got.reason) == (want, True, "lease_expired")
        assert require(await face.get(key)).effect == "entered"  # a takeover inherits it

    @pytest.mark.parametrize("mark", [True, False])
    async def test_a_taker_that_dies_before_its_own_block_leaves_the_key_uncertain(
        self, face: Face, mark: bool
    ) -> None:
        # a's effect may have happened (entered, or unmarked); b takes over and dies (or its
        # claim reply is lost) before its own block: c must take over and reconcile again,
        # not retry as if no attempt had ever run.
        key = new_key()
        a = await face.claim(key, "a", lease_ms=self.short_lease_ms, boundary=mark)
        if mark:
            assert await face.mark_effect(key, owner="a", fence=a.fence)
        await self.sleep_past_lease(face)
        b = await face.claim(key, "b", lease_ms=self.short_lease_ms, boundary=True)
        assert b.outcome is ClaimOutcome.TAKEOVER
        await self.sleep_past_lease(face)
        c = await face.claim(key, "c", boundary=True)
        assert (c.outcome, c.entered) == (ClaimOutcome.TAKEOVER, mark)
        assert (c.fence, c.attempt) == (a.fence + 2, 3)
        assert require(await face.get(key)).effect == ("entered" if mark else "unmarked")

    @pytest.mark.parametrize("mark", [True, False], ids=["entered", "unmarked"])
    async def test_a_takeover_given_back_unsettled_is_taken_over_again_not_retried(
        self, face: Face, mark: bool
    ) -> None:
        # The engine abandons a takeover whose reconcile hook failed, "so the next claimant
        # asks again": that claimant must be told the outcome is unknown (no lease waited).
        key = new_key()
        a = await face.claim(key, "a", boundary=mark)
        if mark:
            assert await face.mark_effect(key, owner="a", fence=a.fence)
        assert await face.abandon(key, owner="a", fence=a.fence)
        b = await face.claim(key, "b", boundary=True)
        assert (b.outcome, b.entered) == (ClaimOutcome.TAKEOVER, mark)
        assert await face.abandon(key, owner="b", fence=b.fence, reason="lease_expired")
        c = await face.claim(key, "c", on_expired="raise", boundary=True)
        assert (c.outcome, c.fence, c.reason, c.entered) == (
            ClaimOutcome.EXPIRED,
            b.fence,
            "lease_expired",
            mark,
        )
        d = await face.claim(key, "d", boundary=True)
        assert (d.outcome, d.fence, d.entered) == (ClaimOutcome.TAKEOVER, b.fence + 1, mark)

    async def test_an_unmarked_attempt_is_taken_over_as_uncertain_as_ever(self, face: Face) -> None:
        key, _ = await self.expired(face)
        got = await face.claim(key, "b", boundary=True)
        assert (got.outcome, got.entered) == (ClaimOutcome.TAKEOVER, False)

    async def test_an_attempt_cancelled_before_its_block_is_retried_and_told_why(
        self, face: Face
    ) -> None:
        key, _ = await self.abandoned(face, boundary=True)
        retry = await face.claim(key, "b", on_expired="raise")
        assert (retry.outcome, retry.reason) == (ClaimOutcome.RETRY, "cancelled")
        assert require(await face.get(key)).effect == "unmarked"
