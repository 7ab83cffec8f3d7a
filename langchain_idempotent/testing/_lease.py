"""Leases: release and renew only for the owner at its fence; fences only grow."""

from __future__ import annotations

import pytest

from ..core.record import ClaimOutcome, State
from ._faces import LONG_MS, ContractBase, Face, new_key, require


class LeaseContract(ContractBase):
    # -- release -----------------------------------------------------------------------

    @pytest.mark.parametrize("next_owner", ["a", "b"], ids=["same_owner", "another_owner"])
    async def test_release_frees_the_key_only_for_the_owner_and_fence(
        self, face: Face, next_owner: str
    ) -> None:
        key = new_key()
        c = await face.claim(key, "a")
        assert not await face.release(key, owner="b", fence=c.fence)
        assert not await face.release(key, owner="a", fence=c.fence + 1)
        assert not await face.release(key, owner="a", fence=c.fence - 1)
        assert require(await face.get(key)).state is State.RUNNING
        assert await face.release(key, owner="a", fence=c.fence)
        rec = require(await face.get(key))
        assert (rec.state, rec.fence, rec.attempt) == (State.FREE, 1, 1)
        assert not await face.release(key, owner="a", fence=c.fence)
        # A released key is acquired afresh, by its last owner too (not OWNED).
        nxt = await face.claim(key, next_owner)
        assert (nxt.outcome, nxt.fence, nxt.attempt) == (ClaimOutcome.ACQUIRED, 2, 2)

    async def test_release_does_nothing_on_a_done_or_absent_key(self, face: Face) -> None:
        key = new_key()
        assert not await face.release(key, owner="a", fence=1)
        assert await face.get(key) is None
        c = await face.claim(key, "a")
        await face.complete(key, "a", c.fence, b"r")
        assert not await face.release(key, owner="a", fence=c.fence)
        assert (await face.claim(key, "b")).outcome is ClaimOutcome.REPLAY

    async def test_fences_strictly_increase_over_claim_release_cycles(self, face: Face) -> None:
        key = new_key()
        fences = []
        for i in range(6):
            owner = f"o{i % 2}"
            c = await face.claim(key, owner)
            assert c.outcome is ClaimOutcome.ACQUIRED
            fences.append(c.fence)
            assert await face.release(key, owner=owner, fence=c.fence)
        assert fences == [1, 2, 3, 4, 5, 6]

    # -- renew -------------------------------------------------------------------------

    async def test_renew_extends_the_lease_only_for_the_owner_and_fence(self, face: Face) -> None:
        key = new_key()
        c = await face.claim(key, "a", lease_ms=1_000)
        before = require(await face.get(key)).lease_until
        assert not await face.renew(key, owner="b", fence=c.fence, lease_ms=30_000)
        assert not await face.renew(key, owner="a", fence=c.fence + 1, lease_ms=30_000)
        assert require(await face.get(key)).lease_until == before
        assert await face.renew(key, owner="a", fence=c.fence, lease_ms=30_000)
        rec = require(await face.get(key))
        assert rec.lease_until >= before + 20_000
        assert (rec.owner, rec.fence, rec.state) == ("a", 1, State.RUNNING)

    async def test_a_renewed_lease_outlives_its_original_deadline(self, face: Face) -> None:
        key = new_key()
        c = await face.claim(key, "a", lease_ms=self.short_lease_ms)
        assert await face.renew(key, owner="a", fence=c.fence, lease_ms=LONG_MS)
        await self.sleep_past_lease(face)
        assert (await face.claim(key, "b")).outcome is ClaimOutcome.BUSY

    async def test_renew_fails_on_an_absent_completed_or_released_key(self, face: Face) -> None:
        absent, done, freed = new_key(), new_key(), new_key()
        assert not await face.renew(absent, owner="a", fence=1)
        assert await face.get(absent) is None
        c = await face.claim(done, "a")
        await face.complete(done, "a", c.fence, b"r")
        assert not await face.renew(done, owner="a", fence=c.fence)
        assert require(await face.get(done)).state is State.COMPLETED
        c = await face.claim(freed, "a")
        assert await face.release(freed, owner="a", fence=c.fence)
        assert not await face.renew(freed, owner="a", fence=c.fence)
        assert require(await face.get(freed)).state is State.FREE

    # -- stale owners ------------------------------------------------------------------

    async def test_a_stale_owner_cannot_renew_or_release_after_a_takeover(self, face: Face) -> None:
        key, old, new = await self.taken_over(face)
        assert not await face.renew(key, owner="a", fence=old.fence)
        assert not await face.release(key, owner="a", fence=old.fence)
        rec = require(await face.get(key))
        assert (rec.state, rec.owner, rec.fence) == (State.RUNNING, "b", new.fence)
        assert await face.renew(key, owner="b", fence=new.fence)
