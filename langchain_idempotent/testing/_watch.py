"""Watch: woken promptly by a completion or release, at once when there is nothing to wait
for, by the lease deadline or the timeout otherwise — and never before, while nothing
changed (a waiter must not spin)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from ..core.record import ClaimOutcome
from ..core.store import BaseIdempotencyStore
from ._faces import ContractBase, Face, new_key, run_inline


class WatchContract(ContractBase):
    @staticmethod
    def _later(delay: float, action: Callable[[], object]) -> tuple[threading.Thread, list[float]]:
        """Run ``action`` on another thread after ``delay`` s; the list gets its start time."""
        at: list[float] = []

        def run() -> None:
            time.sleep(delay)
            at.append(time.monotonic())
            action()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t, at

    # -- woken by another caller -------------------------------------------------------

    async def test_watch_returns_promptly_after_a_completion_in_another_thread(
        self, face: Face
    ) -> None:
        key = new_key()
        c = await face.claim(key, "a")
        t, at = self._later(0.1, lambda: run_inline(face.sync.complete(key, "a", c.fence, b"r")))
        await face.watch(key, fence=c.fence, timeout=5.0)
        ended = time.monotonic()
        await asyncio.to_thread(t.join)
        self.assert_woken(at, ended)
        assert (await face.claim(key, "b")).payload == b"r"

    async def test_watch_returns_promptly_after_a_release_in_another_thread(
        self, face: Face
    ) -> None:
        key = new_key()
        c = await face.claim(key, "a")
        t, at = self._later(
            0.1, lambda: run_inline(face.sync.release(key, owner="a", fence=c.fence))
        )
        await face.watch(key, fence=c.fence, timeout=5.0)
        ended = time.monotonic()
        await asyncio.to_thread(t.join)
        self.assert_woken(at, ended)

    async def test_awatch_returns_promptly_after_a_completion_in_another_task(
        self, store: BaseIdempotencyStore
    ) -> None:
        # Async only: a sync watch holds the loop, so no task could finish meanwhile.
        face = Face(store, "async")
        key = new_key()
        c = await face.claim(key, "a")
        at: list[float] = []

        async def finish() -> None:
            await asyncio.sleep(0.1)
            at.append(time.monotonic())
            await face.complete(key, "a", c.fence, b"r")

        task = asyncio.create_task(finish())
        await face.watch(key, fence=c.fence, timeout=5.0)
        ended = time.monotonic()
        await task
        self.assert_woken(at, ended)

    # -- nothing to wait for, or nobody finishing --------------------------------------

    async def test_watch_returns_at_once_when_the_record_is_done_absent_or_moved_on(
        self, face: Face
    ) -> None:
        done, absent, moved = new_key(), new_key(), new_key()
        c = await face.claim(done, "a")
        await face.complete(done, "a", c.fence, b"r")
        c = await face.claim(moved, "a")
        await face.release(moved, owner="a", fence=c.fence)
        await face.claim(moved, "b")  # fence 2 now runs
        for key in (done, absent, moved):
            waited = await self.watched_for(face, key, fence=1, timeout=5.0)
            assert waited < self.late_return_s, (
                f"watch of {key} waited {waited:.3f}s with nothing to wait for (late_return_s "
                f"= {self.late_return_s}s, timeout 5s)"
            )

    async def test_watch_returns_by_the_lease_deadline_when_nobody_completes(
        self, face: Face
    ) -> None:
        key = new_key()
        c = await face.claim(key, "a", lease_ms=self.short_lease_ms)
        waited = await self.watched_for(face, key, fence=c.fence, timeout=5.0)
        deadline = self.short_lease_ms / 1000
        assert waited < deadline + self.late_return_s, (
            f"watch waited {waited:.3f}s past a {deadline}s lease nobody renewed "
            f"(late_return_s = {self.late_return_s}s, timeout 5s)"
        )
        assert (await face.claim(key, "b")).outcome is ClaimOutcome.TAKEOVER

    async def test_watch_waits_out_its_timeout_while_the_lease_is_live(self, face: Face) -> None:
        key = new_key()
        c = await face.claim(key, "a")
        timeout = self.short_lease_ms / 1000
        waited = await self.watched_for(face, key, fence=c.fence, timeout=timeout)
        assert timeout / 2 <= waited < timeout + self.late_return_s, (
            f"watch of a live lease waited {waited:.3f}s for a {timeout}s timeout (at least "
            f"half of it, late_return_s = {self.late_return_s}s over it)"
        )
