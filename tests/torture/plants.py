"""Planted store bugs (``--plant NAME``), to show the checker catches what it must.

Each plant wraps the real store of the run and breaks one rule of the protocol using the
store's own operations, so the same bug runs against every backend. Nothing here touches
the library; a plant exists only inside a torture run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from langchain_idempotent.core.record import Claim, ClaimOutcome, Completion, State
from langchain_idempotent.core.store import (
    BaseIdempotencyStore,
    ClaimRequest,
    CompleteRequest,
    Held,
)


class Planted:
    """Forwards everything to ``store`` except the operation the plant breaks."""

    def __init__(self, store: BaseIdempotencyStore) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


class ClaimIgnoresLiveLease(Planted):
    """A claim that finds another owner's live lease takes the key anyway (as if absent)."""

    def claim(self, request: ClaimRequest) -> Claim:
        got = self.store.claim(request)
        if got.outcome is ClaimOutcome.BUSY:
            self.store.delete(request.key)
            got = self.store.claim(request)
        return got


class CompleteOverwrites(Planted):
    """Completion is not write-once: a later completion replaces the stored result."""

    def complete(self, request: CompleteRequest) -> Completion:
        got = self.store.complete(request)
        if not got.stored:
            self.store.delete(request.key)
            got = self.store.complete(request)
            got = replace(got, stale=False)
        return got


class ReleaseWithoutOwnerCheck(Planted):
    """Release frees the key whoever asks (the reference approach's unconditional DEL)."""

    def release(self, held: Held) -> bool:
        if self.store.release(held):
            return True
        rec = self.store.get(held.key)
        if rec is None or rec.state is not State.RUNNING:
            return False
        return self.store.release(Held(held.key, rec.owner, rec.fence))


class RenewWithoutFenceCheck(Planted):
    """Renew extends whatever lease is on the key, a stale owner's call included."""

    def renew(self, held: Held, lease_ms: int) -> bool:
        if self.store.renew(held, lease_ms):
            return True
        rec = self.store.get(held.key)
        if rec is None or rec.state is not State.RUNNING or rec.owner.startswith("!"):
            return False
        return self.store.renew(Held(held.key, rec.owner, rec.fence), lease_ms)


class CompleteAcksWithoutWriting(Planted):
    """Acknowledges a completion it never wrote (a write lost after the reply)."""

    def complete(self, request: CompleteRequest) -> Completion:
        return Completion(stored=True, stale=False, failed=request.failed, payload=request.payload)


PLANTS: dict[str, Callable[[BaseIdempotencyStore], Planted]] = {
    "claim-ignores-live-lease": ClaimIgnoresLiveLease,
    "complete-overwrites": CompleteOverwrites,
    "release-without-owner-check": ReleaseWithoutOwnerCheck,
    "renew-without-fence-check": RenewWithoutFenceCheck,
    "complete-acks-without-writing": CompleteAcksWithoutWriting,
}
