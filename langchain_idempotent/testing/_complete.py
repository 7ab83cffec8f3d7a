"""Completions: write-once, stale completions kept only when first, and retention (TTL)."""

from __future__ import annotations

import time

import pytest

from ..core.record import ClaimOutcome, Completion, State
from ._faces import FP, LONG_MS, ContractBase, Face, new_key, require


class CompleteContract(ContractBase):
    # -- write-once --------------------------------------------------------------------

    @pytest.mark.parametrize(
        ("payload", "failed"), [(b"first", False), (b"", True)], ids=["completed", "failed"]
    )
    async def test_completion_is_write_once(self, face: Face, payload: bytes, failed: bool) -> None:
        key = new_key()
        c = await face.claim(key, "a")
        first = await face.complete(key, "a", c.fence, payload, failed=failed)
        assert first == Completion(stored=True, stale=False, failed=failed, payload=payload)
        again = await face.complete(key, "a", c.fence, b"second", failed=not failed)
        assert again == Completion(stored=False, stale=False, failed=failed, payload=payload)
        other = await face.complete(key, "b", c.fence + 1, b"third")
        assert (other.stored, other.stale, other.payload) == (False, True, payload)
        rec = require(await face.get(key))
        assert (rec.state, rec.payload) == (State.FAILED if failed else State.COMPLETED, payload)

    # -- stale completions -------------------------------------------------------------

    async def test_a_stale_owners_first_completion_is_stored_and_replayed_to_the_new_owner(
        self, face: Face
    ) -> None:
        key, old, new = await self.taken_over(face)
        late = await face.complete(key, "a", old.fence, b"from-a")
        assert (late.stored, late.stale, late.payload) == (True, True, b"from-a")
        mine = await face.complete(key, "b", new.fence, b"from-b")
        assert (mine.stored, mine.payload) == (False, b"from-a")
        assert not await face.renew(key, owner="b", fence=new.fence, lease_ms=LONG_MS)
        assert not await face.release(key, owner="b", fence=new.fence)
        await self.assert_replays(face, key, b"from-a")

    async def test_the_new_owners_completion_wins_over_a_later_stale_completion(
        self, face: Face
    ) -> None:
        key, old, new = await self.taken_over(face)
        mine = await face.complete(key, "b", new.fence, b"from-b")
        assert (mine.stored, mine.stale) == (True, False)
        await self.assert_late_completion_refused(face, key, old.fence, kept=b"from-b")

    async def test_a_completion_after_release_is_stored_as_stale(self, face: Face) -> None:
        key = new_key()
        c = await face.claim(key, "a")
        assert await face.release(key, owner="a", fence=c.fence)
        late = await face.complete(key, "a", c.fence, b"late")
        assert (late.stored, late.stale, late.payload) == (True, True, b"late")
        assert (await face.claim(key, "b")).payload == b"late"

    async def test_a_completion_for_a_vanished_record_is_stored_as_stale(self, face: Face) -> None:
        key = new_key()
        done = await face.complete(key, "a", 1, b"orphan", meta={"thread_id": "t"})
        assert (done.stored, done.stale, done.payload) == (True, True, b"orphan")
        rec = require(await face.get(key))
        assert (rec.state, rec.payload, rec.fingerprint) == (State.COMPLETED, b"orphan", FP)
        assert dict(rec.meta) == {"thread_id": "t"}
        await self.assert_replays(face, key, b"orphan")

    # -- retention (TTL) ---------------------------------------------------------------

    async def test_a_completed_record_disappears_after_its_ttl_and_runs_again(
        self, face: Face
    ) -> None:
        key = new_key()
        c = await face.claim(key, "a", ttl_ms=self.short_lease_ms)
        written = time.monotonic()
        await face.complete(key, "a", c.fence, b"r", ttl_ms=self.short_lease_ms)
        rec = await face.get(key)
        if rec is None:  # only a stall longer than the TTL excuses a missing record
            assert time.monotonic() - written >= self.short_lease_ms / 1000
        else:
            assert rec.state is State.COMPLETED
        await self.sleep_past_lease(face)
        assert await face.get(key) is None
        assert key not in {r.key for r in await face.list()}
        again = await face.claim(key, "b")
        assert (again.outcome, again.fence, again.attempt) == (ClaimOutcome.ACQUIRED, 1, 1)

    async def test_a_live_lease_keeps_its_record_even_when_the_ttl_is_shorter(
        self, face: Face
    ) -> None:
        key = new_key()
        c = await face.claim(key, "a", lease_ms=LONG_MS, ttl_ms=self.short_lease_ms // 2)
        await self.sleep_past_lease(face)
        assert (await face.claim(key, "b")).outcome is ClaimOutcome.BUSY
        assert await face.renew(key, owner="a", fence=c.fence, lease_ms=LONG_MS)
