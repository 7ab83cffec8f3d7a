"""Abandon: a cancelled owner (or one whose tool raised after its effect may have begun)
leaves its key uncertain, so the next claim is a takeover that is told why — never a clean
first run."""

from __future__ import annotations

import asyncio
import time

import pytest

from ..core.record import ClaimOutcome, State
from ._faces import LONG_MS, ContractBase, Face, new_key, require, run_inline


class AbandonContract(ContractBase):
    async def test_an_abandoned_key_is_taken_over_at_once_and_told_it_was_cancelled(
        self, face: Face
    ) -> None:
        key, c = await self.abandoned(face, lease_ms=LONG_MS)
        rec = require(await face.get(key))
        assert rec.state is State.RUNNING
        assert rec.uncertain(await face.now_ms())
        assert (rec.fence, rec.attempt) == (c.fence, c.attempt)
        taken = await face.claim(key, "b")
        assert taken.outcome is ClaimOutcome.TAKEOVER
        assert (taken.fence, taken.attempt) == (c.fence + 1, c.attempt + 1)
        assert taken.reason == "cancelled"
        assert not require(await face.get(key)).uncertain(await face.now_ms())

    @pytest.mark.parametrize("reason", ["cancelled", "lease_lost", "lease_expired", "error"])
    async def test_the_reason_given_to_abandon_is_the_one_the_next_claim_is_told(
        self, face: Face, reason: str
    ) -> None:
        key = new_key()
        c = await face.claim(key, "a")
        assert await face.abandon(key, owner="a", fence=c.fence, reason=reason)  # type: ignore[arg-type]
        assert (await face.claim(key, "b")).reason == reason

    async def test_an_error_abandon_hands_the_exception_type_to_the_next_claim(
        self, face: Face
    ) -> None:
        key = new_key()
        c = await face.claim(key, "a", boundary=True)
        assert await face.mark_effect(key, owner="a", fence=c.fence)
        assert await face.abandon(
            key, owner="a", fence=c.fence, reason="error", error_type="httpx.ReadTimeout"
        )
        rec = require(await face.get(key))
        assert (rec.state, rec.owner, rec.effect) == (
            State.RUNNING,
            "!error:httpx.ReadTimeout",
            "entered",
        )
        expired = await face.claim(key, "b", on_expired="raise")
        assert (expired.outcome, expired.reason, expired.error_type, expired.entered) == (
            ClaimOutcome.EXPIRED,
            "error",
            "httpx.ReadTimeout",
            True,
        )
        taken = await face.claim(key, "b")
        assert (taken.outcome, taken.reason, taken.error_type, taken.entered) == (
            ClaimOutcome.TAKEOVER,
            "error",
            "httpx.ReadTimeout",
            True,
        )
        # Taken over, the error is the past attempt's: a later expiry says lease_expired.
        assert await face.abandon(key, owner="b", fence=taken.fence, reason="lease_expired")
        again = await face.claim(key, "c")
        assert (again.reason, again.error_type, again.entered) == ("lease_expired", None, True)
        # Other reasons carry no error type.
        key2, _ = await self.abandoned(face)
        assert (await face.claim(key2, "b")).error_type is None

    @pytest.mark.parametrize(
        ("reason", "error_type"),
        [("cancelled", "TimeoutError"), ("error", ""), ("bored", None)],
    )
    async def test_abandon_refuses_an_unknown_reason_or_a_misplaced_error_type(
        self, face: Face, reason: str, error_type: str | None
    ) -> None:
        key = new_key()
        c = await face.claim(key, "a")
        before = require(await face.get(key))
        with pytest.raises(ValueError, match=r"reason must be one of|error_type is the type"):
            await face.abandon(
                key,
                owner="a",
                fence=c.fence,
                reason=reason,  # type: ignore[arg-type]
                error_type=error_type,
            )
        assert require(await face.get(key)) == before

    async def test_an_abandoned_key_under_on_expired_raise_is_expired_and_stays_uncertain(
        self, face: Face
    ) -> None:
        key, c = await self.abandoned(face)
        _, expired = await self.claim_raising(face, key)
        assert (expired.fence, expired.reason) == (c.fence, "cancelled")

    async def test_an_expired_lease_is_taken_over_with_reason_lease_expired(
        self, face: Face
    ) -> None:
        _, _, taken = await self.taken_over(face)
        assert taken.reason == "lease_expired"
        key, _ = await self.expired(face)
        _, expired = await self.claim_raising(face, key)
        assert expired.reason == "lease_expired"

    async def test_a_released_or_fresh_key_is_not_uncertain(self, face: Face) -> None:
        key = new_key()
        first = await face.claim(key, "a")
        assert first.reason is None
        assert await face.release(key, owner="a", fence=first.fence)
        assert not require(await face.get(key)).uncertain(await face.now_ms())
        again = await face.claim(key, "b")
        assert (again.outcome, again.reason) == (ClaimOutcome.ACQUIRED, None)

    @pytest.mark.parametrize("who", ["other owner", "old fence", "free", "completed", "absent"])
    async def test_only_the_owner_at_its_fence_can_abandon_a_running_key(
        self, face: Face, who: str
    ) -> None:
        key = new_key()
        if who == "absent":
            assert not await face.abandon(key, owner="a", fence=1)
            assert await face.get(key) is None
            return
        c = await face.claim(key, "a")
        owner, fence = "a", c.fence
        if who == "other owner":
            owner = "b"
        elif who == "old fence":
            fence = c.fence - 1
        elif who == "free":
            assert await face.release(key, owner="a", fence=c.fence)
        else:
            await face.complete(key, "a", c.fence, b"r")
        before = require(await face.get(key))
        assert not await face.abandon(key, owner=owner, fence=fence)
        assert require(await face.get(key)) == before

    async def test_the_owner_that_abandoned_can_no_longer_renew_release_or_abandon(
        self, face: Face
    ) -> None:
        key, c = await self.abandoned(face)
        assert not await face.renew(key, owner="a", fence=c.fence)
        assert not await face.release(key, owner="a", fence=c.fence)
        assert not await face.abandon(key, owner="a", fence=c.fence)

    async def test_a_result_stored_after_a_takeover_cannot_be_overwritten_by_the_late_owner(
        self, face: Face
    ) -> None:
        key, c = await self.abandoned(face)
        taken = await face.claim(key, "b")
        stored = await face.complete(key, "b", taken.fence, b"reconciled")
        assert stored.stored and not stored.stale
        await self.assert_late_completion_refused(face, key, c.fence, kept=b"reconciled")

    async def test_abandon_wakes_a_watcher_promptly(self, face: Face) -> None:
        key = new_key()
        c = await face.claim(key, "a")
        changed_at: list[float] = []

        def give_up() -> None:
            time.sleep(0.1)
            changed_at.append(time.monotonic())
            run_inline(face.sync.abandon(key, owner="a", fence=c.fence))

        waker = asyncio.get_running_loop().run_in_executor(None, give_up)
        await face.watch(key, fence=c.fence, timeout=5.0)
        ended = time.monotonic()
        await waker
        self.assert_woken(changed_at, ended)
        assert (await face.claim(key, "b")).outcome is ClaimOutcome.TAKEOVER
