"""``InMemoryIdempotencyStore``: one process, for tests and notebooks.

Spec: the record protocol of :mod:`langchain_idempotent.core.protocol`, applied under one lock
per store (thread-safe; the async twins never block the loop for longer than the lock).
Records expire ``ttl_ms`` after their last write. Waiters are woken in-process the moment
a key completes or is released. Nothing survives the process. Release, abandon and the
side-effect mark are written once for this store and SQLite (:mod:`._deciding`).
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..core.protocol import decide_renew
from ..core.record import Claim, Completion, Record, State, UncertainReason
from ..core.store import ClaimRequest, CompleteRequest, Held
from ._deciding import DecidesInPython, Decision
from ._wakeup import Wakeup

__all__ = ["InMemoryIdempotencyStore"]


class InMemoryIdempotencyStore(DecidesInPython):
    """Records in a dict. ``clock`` returns seconds (default :func:`time.time`)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._records: dict[str, tuple[Record, int]] = {}  # key -> (record, expires_at)
        self._wakeup = Wakeup()

    def now_ms(self) -> int:
        """The store's clock: ``clock()`` in milliseconds."""
        return int(self._clock() * 1000)

    async def anow_ms(self) -> int:
        return self.now_ms()

    def describe(self) -> dict[str, Any]:
        """``{"kind": "memory", "records": <live records>}``: the records of this object,
        in this process."""
        with self._lock:
            now = self.now_ms()
            live = sum(1 for _, expires in self._records.values() if expires > now)
        return {"kind": "memory", "records": live}

    def _read(self, key: str, now: int) -> Record | None:
        entry = self._records.get(key)
        if entry is None:
            return None
        if entry[1] <= now:
            del self._records[key]
            return None
        return entry[0]

    def claim(self, request: ClaimRequest) -> Claim:
        with self._lock:
            return self._claim(request, self.now_ms())

    def claim_many(self, requests: Sequence[ClaimRequest]) -> builtins.list[Claim]:
        """Every claim under one hold of the lock, in order, at one clock reading."""
        with self._lock:
            now = self.now_ms()
            return [self._claim(r, now) for r in requests]

    def _claim(self, r: ClaimRequest, now: int) -> Claim:
        """One claim, the lock held."""
        answer, new = r.decide(self._read(r.key, now), now)
        if new is not None:
            self._records[r.key] = (new, now + max(r.ttl_ms, r.lease_ms))
        return answer

    def renew(self, held: Held, lease_ms: int) -> bool:
        key = held.key
        with self._lock:
            now = self.now_ms()
            entry = self._records.get(key)
            ok, new = decide_renew(
                self._read(key, now), owner=held.owner, fence=held.fence, now=now, lease_ms=lease_ms
            )
            if new is not None and entry is not None:
                self._records[key] = (new, max(entry[1], now + lease_ms))
            return ok

    def complete(self, request: CompleteRequest) -> Completion:
        key = request.key
        with self._lock:
            now = self.now_ms()
            answer, new = request.decide(self._read(key, now), now)
            if new is not None:
                self._records[key] = (new, now + request.ttl_ms)
        self._wakeup.notify(key)
        return answer

    def _keeping_expiry(self, key: str, decide: Decision) -> bool:
        """Under the lock: ``decide(record, now)`` on the live record, and write the record
        it decides with the expiry kept (release, abandon, the side-effect mark)."""
        with self._lock:
            now = self.now_ms()
            entry = self._records.get(key)
            ok, new = decide(self._read(key, now), now)
            if new is not None and entry is not None:
                self._records[key] = (new, entry[1])
            return ok

    def get(self, key: str) -> Record | None:
        with self._lock:
            return self._read(key, self.now_ms())

    def _changed(self, key: str, fence: int) -> bool:
        with self._lock:
            now = self.now_ms()
            rec = self._read(key, now)
            return rec is None or not rec.lease_live(now) or rec.fence != fence

    def _until_lease_end(self, key: str, timeout: float) -> float:
        """Never sleep past the lease: an expired lease is a change nobody announces."""
        rec = self.get(key)
        if rec is not None and rec.state is State.RUNNING:
            return min(timeout, max(0.0, (rec.lease_until - self.now_ms()) / 1000) + 0.001)
        return timeout

    def watch(self, key: str, *, fence: int, timeout: float) -> None:
        timeout = self._until_lease_end(key, timeout)
        self._wakeup.wait(key, lambda: self._changed(key, fence), timeout)

    async def awatch(self, key: str, *, fence: int, timeout: float) -> None:
        timeout = self._until_lease_end(key, timeout)

        async def changed() -> bool:
            return self._changed(key, fence)

        await self._wakeup.await_(key, changed, timeout)

    def delete(self, key: str) -> bool:
        with self._lock:
            existed = self._records.pop(key, None) is not None
        return self._woken(key, existed)

    def list(
        self,
        *,
        namespace: str | None = None,
        thread_id: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Record]:
        with self._lock:
            now = self.now_ms()
            out = [
                rec
                for rec, expires in self._records.values()
                if expires > now
                and (namespace is None or rec.meta.get("namespace") == namespace)
                and (thread_id is None or rec.meta.get("thread_id") == thread_id)
            ]
        out.sort(key=lambda r: r.created_at)
        return out[:limit] if limit is not None else out

    # The async twins: every operation is a short critical section, so run it inline.

    async def aclaim(self, request: ClaimRequest) -> Claim:
        return self.claim(request)

    async def aclaim_many(self, requests: Sequence[ClaimRequest]) -> builtins.list[Claim]:
        return self.claim_many(requests)

    async def arenew(self, held: Held, lease_ms: int) -> bool:
        return self.renew(held, lease_ms)

    async def acomplete(self, request: CompleteRequest) -> Completion:
        return self.complete(request)

    async def arelease(self, held: Held) -> bool:
        return self.release(held)

    async def aabandon(
        self, held: Held, reason: UncertainReason = "cancelled", error_type: str | None = None
    ) -> bool:
        return self.abandon(held, reason, error_type)

    async def amark_effect(self, held: Held) -> bool:
        return self.mark_effect(held)

    async def aget(self, key: str) -> Record | None:
        return self.get(key)

    async def adelete(self, key: str) -> bool:
        return self.delete(key)

    async def alist(
        self,
        *,
        namespace: str | None = None,
        thread_id: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Record]:
        return self.list(namespace=namespace, thread_id=thread_id, limit=limit)
