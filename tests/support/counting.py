"""A store that counts its round trips: every operation is one call of the store it wraps
(each shipped store answers every operation, ``claim_many`` included, in one round trip)."""

from __future__ import annotations

import builtins
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from langchain_idempotent.core.record import Claim, Completion, Record, UncertainReason
from langchain_idempotent.core.store import (
    BaseIdempotencyStore,
    ClaimRequest,
    CompleteRequest,
    Held,
)


class CountingStore(BaseIdempotencyStore):
    """``inner`` behind a counter of operations by name (``counts["claim_many"]``)."""

    def __init__(self, inner: BaseIdempotencyStore) -> None:
        self.inner = inner
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _count(self, op: str) -> None:
        with self._lock:
            self.counts[op] += 1

    def claims(self) -> tuple[int, int]:
        """``(single claims, batched claims)`` so far, both faces."""
        c = self.counts
        return c["claim"] + c["aclaim"], c["claim_many"] + c["aclaim_many"]

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()

    def claim(self, request: ClaimRequest) -> Claim:
        self._count("claim")
        return self.inner.claim(request)

    async def aclaim(self, request: ClaimRequest) -> Claim:
        self._count("aclaim")
        return await self.inner.aclaim(request)

    def claim_many(self, requests: Sequence[ClaimRequest]) -> builtins.list[Claim]:
        self._count("claim_many")
        return self.inner.claim_many(requests)

    async def aclaim_many(self, requests: Sequence[ClaimRequest]) -> builtins.list[Claim]:
        self._count("aclaim_many")
        return await self.inner.aclaim_many(requests)

    def renew(self, held: Held, lease_ms: int) -> bool:
        self._count("renew")
        return self.inner.renew(held, lease_ms)

    async def arenew(self, held: Held, lease_ms: int) -> bool:
        self._count("arenew")
        return await self.inner.arenew(held, lease_ms)

    def complete(self, request: CompleteRequest) -> Completion:
        self._count("complete")
        return self.inner.complete(request)

    async def acomplete(self, request: CompleteRequest) -> Completion:
        self._count("acomplete")
        return await self.inner.acomplete(request)

    def mark_effect(self, held: Held) -> bool:
        self._count("mark_effect")
        return self.inner.mark_effect(held)

    async def amark_effect(self, held: Held) -> bool:
        self._count("amark_effect")
        return await self.inner.amark_effect(held)

    def release(self, held: Held) -> bool:
        self._count("release")
        return self.inner.release(held)

    async def arelease(self, held: Held) -> bool:
        self._count("arelease")
        return await self.inner.arelease(held)

    def abandon(
        self, held: Held, reason: UncertainReason = "cancelled", error_type: str | None = None
    ) -> bool:
        self._count("abandon")
        return self.inner.abandon(held, reason, error_type)

    async def aabandon(
        self, held: Held, reason: UncertainReason = "cancelled", error_type: str | None = None
    ) -> bool:
        self._count("aabandon")
        return await self.inner.aabandon(held, reason, error_type)

    def get(self, key: str) -> Record | None:
        return self.inner.get(key)

    async def aget(self, key: str) -> Record | None:
        return await self.inner.aget(key)

    def watch(self, key: str, *, fence: int, timeout: float) -> None:
        self._count("watch")
        self.inner.watch(key, fence=fence, timeout=timeout)

    async def awatch(self, key: str, *, fence: int, timeout: float) -> None:
        self._count("awatch")
        await self.inner.awatch(key, fence=fence, timeout=timeout)

    def now_ms(self) -> int:
        return self.inner.now_ms()

    async def anow_ms(self) -> int:
        return await self.inner.anow_ms()

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def delete(self, key: str) -> bool:
        return self.inner.delete(key)

    def list(
        self,
        *,
        namespace: str | None = None,
        thread_id: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Record]:
        return self.inner.list(namespace=namespace, thread_id=thread_id, limit=limit)

    def close(self) -> None:
        self.inner.close()


__all__ = ["CountingStore"]
