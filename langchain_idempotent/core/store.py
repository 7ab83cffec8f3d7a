"""The store protocol: seven record operations, a batched claim, a watch, the store's
clock, and operator helpers.

Every operation has an ``a``-prefixed async twin. The default async twins run the sync
operation in a worker thread; stores with a native async client override them.

A claim and a completion are values: :meth:`~BaseIdempotencyStore.claim` takes a
:class:`ClaimRequest` (``claim_many`` a sequence of them) and
:meth:`~BaseIdempotencyStore.complete` a :class:`CompleteRequest`, built once per call by
the engine. A new field of either touches the value, the protocol and each backend's
encoding, not every signature. What a holder does with its lease (renew, release,
abandon, the side-effect mark) takes the :class:`Held` lease: key, owner token, fence.

Stores never raise for an expected "no" (busy, lost lease, already completed): those are
return values. They raise :class:`~langchain_idempotent.errors.StoreUnavailableError`
when the backend cannot be reached and
:class:`~langchain_idempotent.errors.CorruptRecordError` when a record cannot be read.

Durations are integer milliseconds here; the engine converts user-facing seconds.
"""

from __future__ import annotations

import asyncio
import builtins
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._frozen import fast_init
from .protocol import decide_claim, decide_complete
from .record import Claim, Completion, ExpiredPolicy, Record, UncertainReason

__all__ = ["BaseIdempotencyStore", "ClaimRequest", "CompleteRequest", "Held"]


@fast_init
@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One claim (:meth:`BaseIdempotencyStore.claim`, one of a batch for
    :meth:`~BaseIdempotencyStore.claim_many`): take ``key`` for ``owner`` with a lease of
    ``lease_ms``, a record kept ``ttl_ms``, a payload ``fingerprint``; ``on_expired`` says
    what an expired lease means, ``meta`` is stored with a new record, ``boundary``: the
    tool marks its side effect (:meth:`~BaseIdempotencyStore.mark_effect`)."""

    key: str
    owner: str
    fingerprint: str
    lease_ms: int
    ttl_ms: int
    on_expired: ExpiredPolicy = "takeover"
    meta: Mapping[str, str] | None = None
    boundary: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValueError("a ClaimRequest needs a non-empty string key")
        if not isinstance(self.owner, str) or not self.owner:
            raise ValueError(f"ClaimRequest for {self.key!r} needs a non-empty owner token")

    def decide(self, rec: Record | None, now: int) -> tuple[Claim, Record | None]:
        """:func:`~langchain_idempotent.core.protocol.decide_claim` for this request at ``now``:
        the answer and the record to write (for stores that decide in Python)."""
        return decide_claim(
            rec,
            key=self.key,
            owner=self.owner,
            fingerprint=self.fingerprint,
            now=now,
            lease_ms=self.lease_ms,
            on_expired=self.on_expired,
            meta=self.meta,
            boundary=self.boundary,
        )


@fast_init
@dataclass(frozen=True, slots=True)
class CompleteRequest:
    """One completion (:meth:`BaseIdempotencyStore.complete`): store ``payload`` (a result,
    or with ``failed`` a stored failure) once for ``key``, as ``owner`` at ``fence``, kept
    ``ttl_ms``; ``fingerprint`` and ``meta`` go into a record that expired meanwhile."""

    key: str
    owner: str
    fence: int
    fingerprint: str
    payload: bytes
    failed: bool
    ttl_ms: int
    meta: Mapping[str, str] | None = None

    def decide(self, rec: Record | None, now: int) -> tuple[Completion, Record | None]:
        """:func:`~langchain_idempotent.core.protocol.decide_complete` for this request at
        ``now``: the answer and the record to write (for stores that decide in Python)."""
        return decide_complete(
            rec,
            key=self.key,
            owner=self.owner,
            fence=self.fence,
            fingerprint=self.fingerprint,
            payload=self.payload,
            failed=self.failed,
            now=now,
            meta=self.meta,
        )


@dataclass(frozen=True, slots=True)
class Held:
    """A lease as its holder names it: the ``key``, the ``owner`` token it was claimed with
    and the ``fence`` the claim answered. Only the current holder's renew, release,
    abandon or side-effect mark takes effect."""

    key: str
    owner: str
    fence: int


class BaseIdempotencyStore(ABC):
    """Where leases and memoized results live. See :mod:`langchain_idempotent.core.protocol`."""

    # -- record operations -------------------------------------------------------------

    @abstractmethod
    def claim(self, request: ClaimRequest) -> Claim:
        """Replay, acquire, take over (or retry), or report busy / mismatch / expired —
        atomically."""

    def claim_many(self, requests: Sequence[ClaimRequest]) -> builtins.list[Claim]:
        """Every request's :meth:`claim`, in order, answered as sequential claims would be
        (the same key twice: the second sees the first's record). This default claims one
        by one; stores that can override it with one round trip (one lock hold, one
        transaction, one pipeline, one statement). A store error raises for the whole
        batch; the claims made before it stand (their leases expire or are released)."""
        return [self.claim(r) for r in requests]

    @abstractmethod
    def renew(self, held: Held, lease_ms: int) -> bool:
        """Extend the lease to ``lease_ms`` from now; ``False`` when ``held`` is no longer
        the current holder."""

    @abstractmethod
    def complete(self, request: CompleteRequest) -> Completion:
        """Store the result once; later completions get the stored payload back."""

    @abstractmethod
    def release(self, held: Held) -> bool:
        """Free the key after a retryable error; only for the current owner and fence."""

    @abstractmethod
    def abandon(
        self, held: Held, reason: UncertainReason = "cancelled", error_type: str | None = None
    ) -> bool:
        """Give the key up with its outcome unknown (the owner was cancelled mid-tool, or
        its tool raised after its effect may have begun); only for the current owner and
        fence. The record stays ``RUNNING`` with its lease ended, so the next claim is a
        TAKEOVER told ``reason`` (and ``error_type``, the exception's type, with reason
        ``"error"``: carried in the owner,
        :func:`~langchain_idempotent.core.record.abandoned_owner`).
        Wakes waiters like a release. The engine passes ``error_type`` only when it has one."""

    def mark_effect(self, held: Held) -> bool:
        """Record, before the tool's side effect starts, that its attempt entered the
        side-effect block; only for the current owner and fence (``False``: the lease is
        lost, the effect must not start). One atomic write."""
        raise NotImplementedError(
            f"{type(self).__name__} has no mark_effect(): it cannot record a side-effect "
            "boundary, so side_effect() / boundary=True cannot be used with it"
        )

    @abstractmethod
    def get(self, key: str) -> Record | None:
        """The record under ``key``, or ``None``."""

    def watch(self, key: str, *, fence: int, timeout: float) -> None:
        """Block until the record stops being RUNNING at ``fence``, its lease passes, or
        ``timeout`` seconds.

        May return early; the engine re-claims after every wake-up. This default polls
        with backoff, judging the lease on the store's clock (:meth:`now_ms`); stores
        override it with a real notification.
        """
        deadline = time.monotonic() + timeout
        delay = 0.002
        while True:
            rec = self.get(key)
            if rec is None or not rec.lease_live(self.now_ms()) or rec.fence != fence:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)

    @abstractmethod
    def now_ms(self) -> int:
        """The store's clock in milliseconds: the clock its lease deadlines are written on
        (a Redis server's ``TIME``; the ``clock`` a memory or SQLite store was given)."""

    # -- operator helpers (CLI) -------------------------------------------------------

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """JSON-able facts about the backend for ``langchain-idempotent doctor``.

        Always has ``"kind"`` (``"memory"``, ``"sqlite"``, ``"redis"``, ...); the other keys
        are the store's own (see each store). Never a secret: no password, no URL with one.
        Reads only; raises :class:`~langchain_idempotent.errors.StoreUnavailableError` when
        the backend cannot be reached.
        """

    @abstractmethod
    def delete(self, key: str) -> bool:
        """Remove one record (operator action). ``True`` if it existed."""

    @abstractmethod
    def list(
        self,
        *,
        namespace: str | None = None,
        thread_id: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Record]:
        """Records, optionally filtered by namespace and thread id (from their meta)."""

    def purge(self, *, thread_id: str, namespace: str | None = None) -> int:
        """Delete every record of a thread. Returns how many were deleted."""
        n = 0
        for rec in self.list(namespace=namespace, thread_id=thread_id):
            n += self.delete(rec.key)
        return n

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. The store may be used again afterwards (it reconnects)."""

    # -- async twins ------------------------------------------------------------------

    async def aclaim(self, request: ClaimRequest) -> Claim:
        return await asyncio.to_thread(self.claim, request)

    async def aclaim_many(self, requests: Sequence[ClaimRequest]) -> builtins.list[Claim]:
        """:meth:`claim_many` for async callers; this default awaits :meth:`aclaim` in order."""
        return [await self.aclaim(r) for r in requests]

    async def arenew(self, held: Held, lease_ms: int) -> bool:
        return await asyncio.to_thread(self.renew, held, lease_ms)

    async def acomplete(self, request: CompleteRequest) -> Completion:
        return await asyncio.to_thread(self.complete, request)

    async def arelease(self, held: Held) -> bool:
        return await asyncio.to_thread(self.release, held)

    async def aabandon(
        self, held: Held, reason: UncertainReason = "cancelled", error_type: str | None = None
    ) -> bool:
        return await asyncio.to_thread(self.abandon, held, reason, error_type)

    async def amark_effect(self, held: Held) -> bool:
        return await asyncio.to_thread(self.mark_effect, held)

    async def aget(self, key: str) -> Record | None:
        return await asyncio.to_thread(self.get, key)

    async def awatch(self, key: str, *, fence: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.002
        while True:
            rec = await self.aget(key)
            if rec is None or not rec.lease_live(await self.anow_ms()) or rec.fence != fence:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)

    @abstractmethod
    async def anow_ms(self) -> int:
        """:meth:`now_ms` for async callers (never blocks the event loop on I/O)."""

    async def adelete(self, key: str) -> bool:
        return await asyncio.to_thread(self.delete, key)

    async def alist(
        self,
        *,
        namespace: str | None = None,
        thread_id: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Record]:
        return await asyncio.to_thread(
            self.list, namespace=namespace, thread_id=thread_id, limit=limit
        )

    async def apurge(self, *, thread_id: str, namespace: str | None = None) -> int:
        return await asyncio.to_thread(self.purge, thread_id=thread_id, namespace=namespace)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)
